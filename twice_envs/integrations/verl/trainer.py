"""verl V1 trainer that gives the ``twice``, ``crr`` and ``gigpo`` estimators the agent loop's per-turn fields.

verl's ``PPOTrainer._compute_advantage`` fetches a fixed list of fields from the
TransferQueue, so an estimator never sees the agent loop's ``extra_fields``.
:class:`TwinCreditTrainer` (registered as ``twice_envs``; select it with
``trainer.v1.trainer_mode=twice_envs``) fetches them as well and calls the estimator
with ``extra_fields=``, so the factual tokens get ``A_t = A_traj + omega A_hat_t / sigma_hat``
(or GiGPO's ``A^E + omega A^S``). Every other estimator goes through verl's own path.

It runs as verl's synchronous trainer (``trainer.v1.sync`` settings apply), because
verl reads the trainer-mode name to choose between its synchronous and asynchronous
machinery. KL-in-reward and rollout correction are not combined with twin credit:
the trainer refuses them instead of silently dropping them.
"""

from __future__ import annotations

import copy

import numpy as np
import transfer_queue as tq
from omegaconf import open_dict
from tensordict import TensorDict
from verl.protocol import DataProto
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.workers.utils.padding import response_to_nested

from twice_envs.integrations.verl.estimators import verl_estimators

#: the ``trainer.v1.trainer_mode`` that selects :class:`TwinCreditTrainer`
TRAINER_MODE = "twice_envs"


def _as_dicts(values) -> list[dict]:
    items = values.tolist() if hasattr(values, "tolist") else list(values)
    return [dict(x) if x is not None else {} for x in items]


class TwinCreditTrainer(PPOTrainerSync):
    """verl's synchronous PPO trainer with per-turn twin credit (see module doc)."""

    def __init__(self, config):
        config = copy.deepcopy(config)
        with open_dict(config):
            config.trainer.v1.trainer_mode = "sync"
        super().__init__(config)

    def _compute_advantage(self, batch, metrics: dict):
        name = self.config.algorithm.adv_estimator
        ours = verl_estimators()
        if name not in ours:
            return super()._compute_advantage(batch, metrics)
        if self.config.algorithm.use_kl_in_reward:
            raise ValueError(f"adv_estimator={name} does not combine with algorithm.use_kl_in_reward")
        if self.config.algorithm.get("rollout_correction", None) is not None:
            raise ValueError(f"adv_estimator={name} does not combine with algorithm.rollout_correction")
        fields = ["uid", "response_mask", "rm_scores", "extra_fields"]
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        extra = _as_dicts(data.pop("extra_fields"))
        response_mask = data["response_mask"]
        padded = DataProto(batch=data.to_padded_tensor())
        uid = np.array(padded.batch.pop("uid").tolist(), dtype=object)
        adv, ret = ours[name](padded.batch["rm_scores"], padded.batch["response_mask"], uid,
                                    self.config.algorithm, extra_fields=extra)
        out = TensorDict({"advantages": response_to_nested(adv, response_mask),
                          "returns": response_to_nested(ret, response_mask)}, batch_size=len(batch))
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=out)


def register() -> None:
    """Register :class:`TwinCreditTrainer` with verl (idempotent)."""
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    if TRAINER_REGISTRY.get(TRAINER_MODE) is not TwinCreditTrainer:
        register_trainer(TRAINER_MODE)(TwinCreditTrainer)
