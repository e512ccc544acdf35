"""Every registered twice env served through OpenEnv (``pip install 'twice-envs[openenv]'``).

* :mod:`.server` -- ``twice serve ENV_ID``: OpenEnv's ``create_app`` for the env, with a bearer
  token, request size limits and idle timeouts in front (:mod:`.guard`); :class:`~.server.ServeConfig`,
  :func:`~.server.serve`, :class:`~.server.ServerThread`.
* :mod:`.environment` -- the env as an OpenEnv ``Environment``: one env per session, seeds honoured.
* :mod:`.models` -- the typed action (text) and observation (text, done, reward, metadata with the
  env's info, the noise key and the digest).
* :mod:`.client` -- :class:`~.client.TwiceEnvClient`, a typed client for one ``/ws`` session.
* :mod:`.cli` -- the ``twice serve`` command.

This package imports nothing itself, so it can be found without openenv installed; each module
that needs openenv raises :class:`~twice_envs.errors.MissingExtra` naming the extra.
"""
