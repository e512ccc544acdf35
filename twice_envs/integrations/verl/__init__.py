"""Twin credit inside verl (``pip install 'twice-envs[verl]'``; checked against verl 0.9.1).

* :mod:`.estimators` -- an advantage estimator for every registered credit method verl can
  serve (``algorithm.adv_estimator=twice``), chosen by what the method needs, not by its name.
* :mod:`.agent_loop` -- the ``twice_envs`` agent loop: plays any ``twice_envs`` id turn
  by turn with keyed sampling and returns the factual episode with what its batch's
  twin phase and the estimators need.
* :mod:`.twin_phase` -- one batch's twin phase: the method's plan over the whole batch (Twice:
  one lambda, the discordance predictor carried across batches), its requested rollouts run
  through verl's rollout server, its credit phase.
* :mod:`.trainer` -- the ``twice_envs`` V1 trainer (``trainer.v1.trainer_mode=twice_envs``)
  that runs the twin phase right after each batch's generation and hands the per-turn
  fields to the estimators.
* :mod:`.plugin` -- what verl imports to register all of this: the ``verl.plugins``
  entry point ``twice_envs`` (found automatically once the package is installed) or
  ``VERL_USE_EXTERNAL_MODULES=twice_envs.integrations.verl.plugin``.
"""
