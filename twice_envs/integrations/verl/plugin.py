"""verl plugin: importing this module registers the estimators, the agent loop and the trainer.

verl imports it from its driver and workers, either through the ``verl.plugins``
entry point or ``VERL_USE_EXTERNAL_MODULES=twice_envs.integrations.verl.plugin``.
Each part registers on its own, so a machine without verl's TransferQueue (needed only
by the trainer) still gets the estimators and the agent loop.
"""

from __future__ import annotations

import importlib
import logging

from twice_envs.integrations.verl import estimators

estimators.register()
importlib.import_module("twice_envs.integrations.verl.agent_loop")  # registers on import

try:
    from twice_envs.integrations.verl import trainer
except ImportError as exc:  # transfer_queue comes with verl's verl-core extra
    logging.getLogger(__name__).warning("twice_envs trainer not registered: %s (install verl[verl-core])", exc)
else:
    trainer.register()
