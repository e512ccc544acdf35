"""A run folder read back by ``twice eval`` and ``twice audit``.

A run folder may come from elsewhere, so its ``config.json`` is data and passes the trust rule
(:mod:`twice_envs.trust`) before any env is made: the run's env id is looked up in the registry
only (the module of a ``"module:Env-v0"`` id is never imported), and the run's kwargs that name files
or folders (``journal``, ``corpus``, ``*_path``...) reach ``make`` only with ``--trust-kwargs``.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Collection, Optional

from twice_envs.agents.models.load import run_config_file
from twice_envs.agents.training.config import TrainConfig, read_run_config
from twice_envs.registry import resolve_id
from twice_envs.trust import UntrustedInput, check_path_consent, registered_id

#: How the user consents to a run folder's file and folder kwargs, said in the refusal.
CONSENT = "If the run folder is yours, consent with --trust-kwargs."
#: What to do with a run whose env id is not registered, said in the refusal.
ID_HINT = "To play that env anyway, name it yourself with --env (an id you give may name its module)."
#: The help of the ``--trust-kwargs`` flag of the commands that read a run folder.
TRUST_HELP = ("pass the file and folder kwargs the run's config.json names (journal, corpus, data folders) to the "
              "env; without it such a run is refused, since the env would use those paths")


def checked_run_config(
    checkpoint: os.PathLike,
    *,
    env: Optional[str] = None,
    trusted: bool = False,
    exempt: Collection[str] = (),
    kwargs_follow_env: bool = True,
) -> Optional[TrainConfig]:
    """The config of the run whose checkpoint is ``checkpoint``, after the trust rule; None when it has none.

    Its ``env`` is the registry key the check found (``"Env-v0"`` for ``"module:Env-v0"``), so a
    caller that plays the run's env makes it by that key and never imports the module.

    Args:
        checkpoint: the run folder or its ``checkpoint/``.
        env: the env id the caller plays instead of the run's (the user's own choice, so it
            may be of any form ``make`` takes); ``None`` plays the run's, which must then be
            registered (looked up, never imported).
        trusted: the user's consent to the run's file and folder kwargs.
        exempt: kwargs the user names, which replace the run's.
        kwargs_follow_env: whether the run's kwargs go to ``env`` when it is not the run's env
            (``twice eval``: yes; ``twice audit`` drops them).

    Raises:
        UntrustedInput: naming ``config.json`` and the id or the kwargs.
    """
    file = run_config_file(checkpoint)
    if not file.exists():
        return None
    cfg = read_run_config(file)
    if env is None:
        try:
            played = registered_id(cfg.env, str(file))
        except UntrustedInput as exc:
            raise UntrustedInput(f"{exc} {ID_HINT}") from None
        cfg = replace(cfg, env=played)
    elif env == cfg.env or kwargs_follow_env:
        played = resolve_id(env)
    else:
        return cfg
    check_path_consent(played, cfg.env_kwargs, source=str(file), trusted=trusted, exempt=exempt, consent=CONSENT)
    return cfg
