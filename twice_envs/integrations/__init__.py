"""Twin credit inside existing trainers: verl and TRL (each an optional extra).

* :mod:`twice_envs.integrations.episodes` -- what both share: an episode as a
  prompt/response token stream with its masks, and per-turn advantages spread over
  the response tokens.
* :mod:`twice_envs.integrations.trl` -- a ``rollout_func`` and a ``GRPOTrainer``
  subclass (``pip install 'twice-envs[trl]'``).
* :mod:`twice_envs.integrations.verl` -- advantage estimators, an agent loop, a
  trainer subclass and a plugin entry point (``pip install 'twice-envs[verl]'``).

Nothing in the core, the envs, the wrappers or the agents imports this package.
"""
