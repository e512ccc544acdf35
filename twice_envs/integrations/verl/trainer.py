"""verl V1 trainer that runs each batch's auxiliary rollouts and hands per-turn credit to the estimators.

:class:`TwinCreditTrainer` (registered as ``twice_envs``; select it with
``trainer.v1.trainer_mode=twice_envs``) is verl's synchronous trainer with two additions:

* **Twin phase, right after generation.** verl's synchronous step samples the finished
  batch from its replay buffer and then puts the rollout replicas to sleep
  (``on_sample_end``). The trainer wraps the replay buffer so that, for a training batch
  and an estimator whose registered method asks for rollouts (:func:`~.estimators.runs_phase`:
  twins, counterfactuals, value rollouts), the sample is followed at once, while the replicas
  are still awake, by the batch's twin phase (:mod:`.twin_phase`): the factual episodes are
  rebuilt from the rows' ``extra_fields``, the method plans over the whole batch (Twice: one
  lambda, the expected accounted twin tokens ``beta`` x the batch's policy tokens), its requests
  are sent to the rollout server through verl's LLM client (:meth:`get_llm_client`, the client
  the agent loops use) with keyed ``extra_args``, and its credit phase gives each turn's
  advantage and, for the twin methods, the discordance predictor fitted on the realised twins.
  Its diagnostics join the step's metrics under ``twice/``.
* **Advantage step.** verl's ``_compute_advantage`` fetches a fixed list of fields from the
  TransferQueue, so an estimator never sees ``extra_fields``. This one fetches them, adds
  each row's credit from the twin phase and calls the estimator with ``extra_fields=``
  (:mod:`.estimators`: the twin phase's advantages, or the credit of a method that asks for no
  rollouts, e.g. GiGPO's ``A^E + omega A^S``). Every other estimator goes through verl's own path.

**Predictor state.** :attr:`TwinCreditTrainer.predictor_state` is fitted on batch ``k``'s
twins and plans batch ``k + 1``; it is saved with each checkpoint
(``global_step_N/twice_predictor.json`` beside verl's, local directory only) and restored
on resume. The update index that the warm-up reads is ``global_steps - 1``.

It runs as verl's synchronous trainer (``trainer.v1.sync`` settings apply; verl reads the
trainer-mode name to choose between its synchronous and asynchronous machinery), with one
sample per step (``parameter_sync_step`` 1) when twins run, since the replicas sleep after the
first sample. KL-in-reward and rollout correction are not combined with twin credit: the
trainer refuses them instead of silently dropping them.
"""

from __future__ import annotations

import copy
import json
import logging
import os
from typing import Optional

import numpy as np
import transfer_queue as tq
from omegaconf import open_dict
from tensordict import TensorDict
from verl.protocol import DataProto
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.workers.utils.padding import response_to_nested

from twice_envs.agents.credit import predictor
from twice_envs.agents.credit.registry import get_method
from twice_envs.integrations.verl import twin_phase as phases
from twice_envs.integrations.verl.estimators import method_settings, runs_phase, verl_estimators

#: the ``trainer.v1.trainer_mode`` that selects :class:`TwinCreditTrainer`
TRAINER_MODE = "twice_envs"
#: the predictor state's file in each ``global_step_N`` checkpoint folder
PREDICTOR_FILE = "twice_predictor.json"

logger = logging.getLogger(__name__)


def _as_list(values) -> list:
    return values.tolist() if hasattr(values, "tolist") else list(values)


def _as_dicts(values) -> list[dict]:
    return [dict(x) if x is not None else {} for x in _as_list(values)]


class TwinPhaseSampler:
    """verl's replay buffer with the trainer's twin phase after every training sample.

    ``sample`` returns the inner buffer's batch unchanged and adds the phase's metrics to its
    metrics; validation samples (``partition_id="val"``) pass through. Everything else is the
    inner buffer's.
    """

    def __init__(self, inner, after_sample) -> None:
        self._inner, self._after_sample = inner, after_sample

    def sample(self, global_steps: int, partition_id: str, batch_size: int):
        batch, metrics = self._inner.sample(global_steps=global_steps, partition_id=partition_id,
                                            batch_size=batch_size)
        if partition_id == "train":
            metrics = {**(metrics or {}), **self._after_sample(batch)}
        return batch, metrics

    def __getattr__(self, name):
        if name in ("_inner", "_after_sample"):  # not yet set (copying, unpickling)
            raise AttributeError(name)
        return getattr(self._inner, name)


class TwinCreditTrainer(PPOTrainerSync):
    """verl's synchronous PPO trainer with a batch twin phase and per-turn twin credit (see module doc)."""

    def __init__(self, config):
        config = copy.deepcopy(config)
        with open_dict(config):
            config.trainer.v1.trainer_mode = "sync"
        self.init_twin_state()
        super().__init__(config)
        if self.runs_twins and self.parameter_sync_step != 1:
            raise ValueError(f"adv_estimator={self.config.algorithm.adv_estimator} runs twins after each batch's "
                             "generation: set trainer.v1.sync.parameter_sync_step=1")

    def init_twin_state(self) -> None:
        """The twin phase's state: the untrained predictor, no pending row results, no server client yet."""
        self.predictor_state = predictor.PredictorState()
        self._twin_rows: dict[str, dict] = {}
        self._llm_client = None
        self._credit_method = None

    def credit_method(self):
        """``(method, settings)``: the estimator's registered method and its settings from
        ``algorithm.<prefix>``, looked up once per run."""
        if self._credit_method is None:
            method = get_method(str(self.config.algorithm.adv_estimator))
            self._credit_method = (method, method_settings(method, self.config.algorithm))
        return self._credit_method

    @property
    def runs_twins(self) -> bool:
        """Whether the configured estimator is a registered method whose requests need the twin phase."""
        return runs_phase(str(self.config.algorithm.adv_estimator))

    # ------------------------------------------------------------------ the twin phase

    def _build_replay_buffer(self):
        return TwinPhaseSampler(super()._build_replay_buffer(), self._after_sample)

    def _after_sample(self, batch) -> dict:
        phase = self.twin_phase(batch) if self.runs_twins else None
        return phases.phase_metrics(phase) if phase is not None else {}

    def _server(self):
        if self._llm_client is None:
            self._llm_client = self.get_llm_client()
        return self._llm_client

    def twin_phase(self, batch) -> Optional[phases.TwinPhase]:
        """Run the method's two phases on a sampled training batch, its requests through verl's server; keep each
        row's credit for the advantage step and the fitted predictor state for the next batch. None when the batch
        is empty."""
        if not len(batch.keys):
            return None
        method, config = self.credit_method()
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["uid", "extra_fields"])
        extra = _as_dicts(data["extra_fields"])
        factual = phases.factual_batch(extra, _as_list(data["uid"]))
        sampling = phases.batch_sampling(extra)
        update = max(int(self.global_steps) - 1, 0)
        state = self.predictor_state
        phase = phases.with_server_policy(
            self._server(), self.tokenizer,
            lambda policy: phases.run_twin_phase(method, factual, config, state, policy, sampling, update=update,
                                                 noise_seed=phases.batch_noise_seed(extra)))
        self.predictor_state = phase.state
        self._twin_rows = dict(zip(batch.keys, phases.row_fields(phase)))
        return phase

    # ------------------------------------------------------------------ the advantage step

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
        if self.runs_twins:
            twin_rows, self._twin_rows = self._twin_rows, {}
            if not any(k in twin_rows for k in batch.keys):
                raise RuntimeError(f"adv_estimator={name}: no twin results for this batch (the twin phase runs "
                                   "when TwinCreditTrainer's replay buffer samples a training batch)")
            # padding rows (added after the twin phase) get none: their response mask is 0
            extra = [{**ef, **twin_rows.get(k, {})} for k, ef in zip(batch.keys, extra)]
        response_mask = data["response_mask"]
        padded = DataProto(batch=data.to_padded_tensor())
        uid = np.array(padded.batch.pop("uid").tolist(), dtype=object)
        adv, ret = ours[name](padded.batch["rm_scores"], padded.batch["response_mask"], uid,
                              self.config.algorithm, extra_fields=extra)
        out = TensorDict({"advantages": response_to_nested(adv, response_mask),
                          "returns": response_to_nested(ret, response_mask)}, batch_size=len(batch))
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=out)

    # ------------------------------------------------------------------ checkpoints

    def _step_folder(self, step: int) -> str:
        trainer = self.config.trainer
        if trainer.get("resume_mode", "auto") == "resume_path" and trainer.get("resume_from_path"):
            return str(trainer.resume_from_path)
        return os.path.join(str(trainer.default_local_dir), f"global_step_{step}")

    def _save_checkpoint(self):
        # written before verl's checkpoint, whose "latest" marker then names a folder that has it
        folder = os.path.join(str(self.config.trainer.default_local_dir), f"global_step_{self.global_steps}")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, PREDICTOR_FILE), "w") as f:
            json.dump(self.predictor_state.to_json(), f)
        return super()._save_checkpoint()

    def _load_checkpoint(self):
        out = super()._load_checkpoint()
        if self.global_steps > 0:
            path = os.path.join(self._step_folder(self.global_steps), PREDICTOR_FILE)
            if os.path.exists(path):
                with open(path) as f:
                    self.predictor_state = predictor.PredictorState.from_json(json.load(f))
            else:
                logger.warning("no %s in the checkpoint: the discordance predictor restarts from its prior", path)
        return out


def register() -> None:
    """Register :class:`TwinCreditTrainer` with verl (idempotent)."""
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    if TRAINER_REGISTRY.get(TRAINER_MODE) is not TwinCreditTrainer:
        register_trainer(TRAINER_MODE)(TwinCreditTrainer)
