"""Twin credit inside verl (``pip install 'twice-envs[verl]'``; checked against verl 0.9.1).

* :mod:`.estimators` -- advantage estimators ``twice``, ``crr`` and ``gigpo``
  (``algorithm.adv_estimator=twice``).
* :mod:`.agent_loop` -- the ``twice_envs`` agent loop: plays any ``twice_envs`` id turn
  by turn with keyed sampling and returns the factual episode with per-turn twin credit.
* :mod:`.trainer` -- the ``twice_envs`` V1 trainer (``trainer.v1.trainer_mode=twice_envs``)
  that hands the agent loop's per-turn fields to the estimators.
* :mod:`.plugin` -- what verl imports to register all of this: the ``verl.plugins``
  entry point ``twice_envs`` (found automatically once the package is installed) or
  ``VERL_USE_EXTERNAL_MODULES=twice_envs.integrations.verl.plugin``.
"""
