"""Twin credit inside existing trainers (verl, TRL), and the envs served to the env hubs (each an optional extra).

* :mod:`twice_envs.integrations.episodes` -- what both share: an episode as a
  prompt/response token stream with its masks, and per-turn advantages spread over
  the response tokens.
* :mod:`twice_envs.integrations.trl` -- a ``rollout_func`` and a ``GRPOTrainer``
  subclass (``pip install 'twice-envs[trl]'``).
* :mod:`twice_envs.integrations.verl` -- advantage estimators, an agent loop, a
  trainer subclass and a plugin entry point (``pip install 'twice-envs[verl]'``).
* :mod:`twice_envs.integrations.trl_env` -- ``Env(env_id)`` for TRL's ``environment_factory``
  (also ``twice_envs.integrations.trl.Env``), the env owning the data: ``reset(**row)`` reads a
  ``seed`` or ``task`` column.
* :mod:`twice_envs.integrations.openenv` -- ``twice serve``: an OpenEnv server for every env id,
  with fork, twin and restore by validated replay (``pip install 'twice-envs[openenv]'``), and
  ``twice bench serve``.
* :mod:`twice_envs.integrations.verifiers_env` -- ``load_environment(env_id=...)`` for verifiers.
* :mod:`twice_envs.integrations.nemo_gym` -- sessions for a NeMo Gym gymnasium server, with
  export and restore by validated replay.

Nothing in the core, the envs, the wrappers or the agents imports this package.
"""
