"""Twin credit inside TRL's ``GRPOTrainer`` (``pip install 'twice-envs[trl]'``; checked with TRL 1.16).

TRL calls ``rollout_func(prompts, trainer)`` with the prompts of one process, each
already repeated ``num_generations`` times by its sampler. :class:`TwinRollout`
plays the named tasks on a ``twice_envs`` env with the project's keyed sampler
(transformers backend, on the trainer's own model), computes the method's credit
(running twins where the method needs them) and returns

* ``prompt_ids``, ``completion_ids``: one row per episode; the completion holds every
  generated turn and every observation after it;
* ``logprobs``: sampling log-probs of the completion tokens (0 on observations);
* ``env_mask``: 1 on generated tokens, 0 on observation tokens (TRL masks the loss with it);
* ``twin_advantages``: the per-token advantage (the turn's ``A_t``; 0 on observations);
* ``utility``: the episode's outcome, which :func:`env_utility` hands to TRL as the reward.

:class:`TwinCreditGRPOTrainer` replaces TRL's group advantages (one number per
completion) by the ``(B, T)`` per-token ``twin_advantages``. The dataset's ``prompt``
column names tasks (:func:`task_prompt`); :func:`task_dataset` builds one.

TRL decides how many episodes a task gets (``num_generations``), so a method registered
with ``rollouts > 1`` (``grpo-2x``) needs ``num_generations = group size x rollouts``:
:func:`num_generations` computes it. Methods that need a critic trained alongside the
policy (``ppo``) are refused: ``GRPOTrainer`` trains no critic.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from twice_envs._deps import require
from twice_envs.agents.credit.registry import check_env, get_method
from twice_envs.agents.credit.twice import TwiceConfig
from twice_envs.agents.rollout.episodes import Task, rollout
from twice_envs.agents.rollout.twins import credit_step
from twice_envs.agents.sampling.policy import HFPolicy, SamplingConfig
from twice_envs.agents.training.gold_answer import answer_probs
from twice_envs.integrations.episodes import response_row, token_advantages

_trl = require("trl", "trl", "the TRL integration")
_torch = require("torch", "trl", "the TRL integration")


def task_prompt(seed: int, options: Optional[dict] = None) -> str:
    """The dataset prompt that names a task: its reset seed and options, as JSON."""
    return json.dumps({"seed": int(seed), "options": dict(options or {})}, sort_keys=True)


def parse_task(prompt: Any) -> Task:
    """The :class:`~twice_envs.agents.rollout.episodes.Task` a :func:`task_prompt` names (clear error otherwise)."""
    try:
        d = json.loads(prompt)
        return Task(int(d["seed"]), dict(d.get("options") or {}))
    except (TypeError, ValueError, KeyError) as exc:
        raise ValueError(f"a prompt must name a task as task_prompt() writes it, got {str(prompt)[:80]!r}") from exc


def task_dataset(n: int, *, split: Optional[str] = "train", start: int = 0):
    """A ``datasets.Dataset`` of ``n`` task prompts: tasks ``start..start+n-1`` of ``split``
    (``split=None``: reset seeds only, for envs without splits)."""
    datasets = require("datasets", "trl", "task_dataset")
    rows = [task_prompt(i, {"split": split, "index": i} if split else {}) for i in range(start, start + n)]
    return datasets.Dataset.from_dict({"prompt": rows})


def num_generations(method: str, group_size: int) -> int:
    """TRL's ``num_generations`` for ``method`` at ``group_size`` episodes per task: the group size times
    the method's registered ``rollouts`` (``grpo-2x``: 10 for a group of 5)."""
    return int(group_size) * get_method(method).rollouts


def env_utility(completions, utility, **kwargs) -> list[float]:
    """TRL reward function: the env's episode outcome, passed on by :class:`TwinRollout`."""
    return [float(u) for u in utility]


@dataclass
class TwinRolloutConfig:
    """What :class:`TwinRollout` plays and how it credits the turns."""

    env_id: str = "SearchQA-v0"
    """Registered env id."""
    env_kwargs: dict = field(default_factory=dict)
    """Keyword arguments for ``twice_envs.make``."""
    method: str = "twice"
    """Credit method: a registered name (as ``twice train --method``)."""
    max_turns: Optional[int] = 4
    """Turn cap per episode (None: the env's own limit)."""
    max_new_tokens: int = 128
    """Tokens per turn at most (published: 500)."""
    temperature: float = 1.0
    """Sampling temperature; must equal the trainer's ``GRPOConfig.temperature``."""
    top_p: float = 1.0
    """Nucleus mass."""
    twice: TwiceConfig = field(default_factory=TwiceConfig)
    """Twin-credit settings (Twice and CRR)."""
    seed: int = 0
    """Seed of the noise seeds and the branch and evidence coins."""


class TwinRollout:
    """``rollout_func`` for TRL: episodes with the keyed sampler and per-token credit (see module doc)."""

    def __init__(self, config: TwinRolloutConfig = TwinRolloutConfig()) -> None:
        method = get_method(config.method)  # an unknown name raises, naming the registered ones
        if "critic" in method.needs:
            raise ValueError(f"credit method {config.method!r} needs a critic trained with the policy, and TRL's "
                             "GRPOTrainer trains none: train it with twice train")
        if "branches" in method.needs:
            raise ValueError(f"credit method {config.method!r} grows further factual episodes from the batch, and "
                             "TRL fixes the completions per prompt (num_generations): train it with twice train")
        check_env(config.method, config.env_id)
        self.config = config
        self.rng = np.random.default_rng(config.seed)
        self.update = 0
        self.predictor_state = None
        self._policy: Optional[HFPolicy] = None
        #: the episodes and the auxiliary (twin) tokens of the last call (for inspection)
        self.last_episodes: list = []
        self.last_aux_tokens = 0

    def sampling(self) -> SamplingConfig:
        c = self.config
        return SamplingConfig(temperature=c.temperature, top_p=c.top_p, max_new_tokens=c.max_new_tokens,
                              key_mode=c.twice.key_mode)

    def policy_for(self, model, tokenizer) -> HFPolicy:
        """The keyed-sampling policy over the trainer's model (built once; it tracks weight updates)."""
        if self._policy is None or self._policy.model is not model:
            device = next(model.parameters()).device
            self._policy = HFPolicy(model, tokenizer, device=str(device))
        return self._policy

    def play(self, policy, prompts: Sequence[Any]) -> dict:
        """Roll out the tasks ``prompts`` name (consecutive repeats form a group) and credit them."""
        groups: list[tuple[Any, int]] = []
        for p in prompts:
            if groups and groups[-1][0] == p:
                groups[-1] = (p, groups[-1][1] + 1)
            else:
                groups.append((p, 1))
        sizes = {n for _, n in groups}
        if len(sizes) != 1:
            raise ValueError(f"every task must be repeated equally often (num_generations), got group sizes {sorted(sizes)}")
        c = self.config
        noise_seed = int(self.rng.integers(0, 2**62))
        sampling = self.sampling()
        episodes = rollout(policy, c.env_id, [parse_task(p) for p, _ in groups], group_size=sizes.pop(),
                           sampling=sampling, env_kwargs=c.env_kwargs, noise_seed=noise_seed, max_turns=c.max_turns)
        credit = credit_step(c.method, policy, episodes, config=c.twice, sampling=sampling, rng=self.rng,
                               update=self.update, noise_seed=noise_seed, predictor_state=self.predictor_state,
                               answer_probs_fn=answer_probs)
        if credit.predictor_state is not None:
            self.predictor_state = credit.predictor_state
        self.update += 1
        self.last_episodes = episodes
        self.last_aux_tokens = int(credit.aux_tokens)
        rows = [response_row(ep) for ep in episodes]
        return {
            "prompt_ids": [r.prompt_ids for r in rows],
            "completion_ids": [r.response_ids for r in rows],
            "logprobs": [r.logprobs for r in rows],
            "env_mask": [r.mask for r in rows],
            "twin_advantages": [token_advantages(r.turn_of_token, a) for r, a in zip(rows, credit.advantages)],
            "utility": [float(ep.utility) for ep in episodes],
            "aux_tokens": [int(credit.aux_tokens)] * len(episodes),
        }

    def __call__(self, prompts: list, trainer) -> dict:
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        policy = self.policy_for(model, trainer.processing_class)
        model.eval()  # sampling uses the key/value cache, which training mode (checkpointing) turns off
        try:
            return self.play(policy, prompts)
        finally:
            model.train(was_training)


class TwinCreditGRPOTrainer(_trl.GRPOTrainer):
    """``GRPOTrainer`` whose advantages are the rollout's per-token ``twin_advantages`` ``(B, T)``.

    Use it with ``rollout_func=TwinRollout(...)`` and ``reward_funcs=env_utility``. TRL's
    loss takes ``(B, T)`` advantages as they are; observation tokens are masked by the
    ``env_mask`` and their advantage is 0 as well.
    """

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        if any("twin_advantages" not in x for x in inputs):
            raise ValueError("TwinCreditGRPOTrainer needs rollout_func=TwinRollout(...) (no twin_advantages in the batch)")
        width = out["completion_ids"].shape[1]
        adv = _torch.zeros((len(inputs), width), dtype=_torch.float32, device=out["completion_ids"].device)
        for b, x in enumerate(inputs):
            row = x["twin_advantages"][:width]
            adv[b, : len(row)] = _torch.tensor(row, dtype=_torch.float32)
        out["advantages"] = adv
        return out
