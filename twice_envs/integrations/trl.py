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

Across processes (``accelerate launch``) each process gets its own slice of TRL's
generation batch, and a group may straddle two slices. The batch is addressed globally:
every process gathers the whole batch's prompts, and episode ``j`` of the batch's group
``g`` gets the episode seed ``episode_noise_seed(noise_seed, g, j)`` whichever process
holds it (``noise_seed`` is drawn from the same generator on every process). Every
process steps the envs of the whole batch and computes its credit (GRPO groups, the
branch plan over the batch, the coins) in lockstep, but each generation call is split:
a process generates the turns keyed by the seeds of its own episodes (their factual
turns and their coupled twins; rows on fresh seeds are spread evenly) and the results
are gathered. So each process returns its slice with exactly the seeds, keys, twin
outcomes and advantages of a one-process run of the same batch (the model's numbers
may differ in the last bits with the batch a row is generated in).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

from twice_envs._deps import require
from twice_envs.agents.credit.registry import CreditContext, check_env, get_method, run_credit
from twice_envs.agents.credit.twice import TwiceConfig
from twice_envs.agents.rollout.episodes import Task, rollout
from twice_envs.agents.rollout.twins import annotate_credit, llm_runners
from twice_envs.agents.sampling.policy import HFPolicy, SamplingConfig
from twice_envs.agents.training.gold_answer import answer_probs
from twice_envs.integrations.episodes import response_row, token_advantages
from twice_envs.integrations.trl_env import Env, seed_dataset  # noqa: F401 -- TRL's environment_factory API
from twice_envs.keys import NoiseSchedule, episode_noise_seed

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
    credit: Any = None
    """The method's settings: an instance of its registered config class (None: its defaults), e.g.
    ``TwiceConfig(beta=0.5)`` for ``twice`` and ``crr``."""
    seed: int = 0
    """Seed of the noise seeds and the branch and evidence coins (the same on every process)."""
    dump: Optional[str] = None
    """A directory: each process appends one JSON line per episode it returns to ``rank<r>.jsonl``
    (update, global row, task, episode seed, turn keys, digest, utility, per-turn advantages,
    twins, the processes that generated its turns)."""


@dataclass
class Processes:
    """This process's place among the trainer's processes: TRL's batch slice ``rank`` of ``world``,
    and ``gather`` (a list from every process -> their concatenation, in rank order)."""

    rank: int = 0
    world: int = 1
    gather: Optional[Callable[[list], list]] = None

    def all(self, items: list) -> list:
        return list(items) if self.world == 1 else list(self.gather(list(items)))


class ShardedPolicy:
    """A policy whose ``generate`` calls are split across processes and gathered back.

    Every process makes the same calls with the same requests (the rollout runs in
    lockstep); a request belongs to the process that ``owners`` names for its episode seed
    (requests on other seeds are split evenly, in order), each process generates its own and
    every process gets all the results. ``generated_by`` records, per episode seed, which
    processes generated turns keyed by it. Everything else is the wrapped policy's.
    """

    def __init__(self, policy, processes: Processes, owners: dict[int, int]) -> None:
        self.policy = policy
        self.processes = processes
        self.owners = owners
        self.generated_by: dict[int, set[int]] = {}

    def __getattr__(self, name):
        if name == "policy":
            raise AttributeError(name)
        return getattr(self.policy, name)

    def generate(self, requests, sampling, **kwargs):
        if not requests:
            return []
        pr = self.processes
        seeds = [int(r.noise_key.episode_seed) for r in requests]
        others = [i for i, s in enumerate(seeds) if s not in self.owners]
        owner = {i: self.owners[s] for i, s in enumerate(seeds) if s in self.owners}
        owner.update({i: m * pr.world // len(others) for m, i in enumerate(others)})
        mine = [i for i in range(len(requests)) if owner[i] == pr.rank]
        gens = self.policy.generate([requests[i] for i in mine], sampling, **kwargs)
        out: list = [None] * len(requests)
        for i, rank, g in pr.all([(i, pr.rank, g) for i, g in zip(mine, gens)]):
            out[i] = g
            self.generated_by.setdefault(seeds[i], set()).add(rank)
        return out


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
        if config.credit is not None and not isinstance(config.credit, method.config or ()):
            raise ValueError(f"TwinRolloutConfig.credit: the settings of credit method {config.method!r} are "
                             f"{method.config.__name__ if method.config else 'none'}, "
                             f"got {type(config.credit).__name__}")
        self.method = method  # looked up once; the engine below is bound once
        self.settings = config.credit if config.credit is not None else method.settings()
        self.runners = llm_runners(answer_probs)
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
                              key_mode=getattr(self.settings, "key_mode", TwiceConfig.key_mode))

    def policy_for(self, model, tokenizer) -> HFPolicy:
        """The keyed-sampling policy over the trainer's model (built once; it tracks weight updates)."""
        if self._policy is None or self._policy.model is not model:
            device = next(model.parameters()).device
            self._policy = HFPolicy(model, tokenizer, device=str(device))
        return self._policy

    def play(self, policy, prompts: Sequence[Any], *, group_size: Optional[int] = None,
             processes: Optional[Processes] = None) -> dict:
        """Roll out the tasks ``prompts`` name and credit them; returns this process's rows.

        ``prompts`` is the whole batch, every task repeated ``group_size`` times in a row (None:
        consecutive equal prompts form a group). With ``processes``, every process calls this with
        the same batch; process ``rank`` returns rows ``rank * n .. (rank + 1) * n - 1`` (``n`` =
        the batch over ``world``), and generation is split between them (:class:`ShardedPolicy`).
        """
        pr = processes or Processes()
        groups = _groups(list(prompts), group_size)
        size = len(groups[0][1])
        if len(prompts) % pr.world:
            raise ValueError(f"{len(prompts)} rows cannot be split over {pr.world} processes")
        c = self.config
        noise_seed = int(self.rng.integers(0, 2**62))
        if len(set(pr.all([noise_seed]))) != 1:
            raise ValueError("the processes drew different noise seeds: give TwinRolloutConfig the same seed "
                             "on every process")
        n = len(prompts) // pr.world
        # the episode seed of global row b (group b // size, episode b % size) belongs to process b // n
        owners = {episode_noise_seed(noise_seed, b // size, b % size): b // n for b in range(len(prompts))}
        sharded = ShardedPolicy(policy, pr, owners)
        sampling = self.sampling()
        episodes = rollout(sharded, c.env_id, [parse_task(p) for p, _ in groups], group_size=size,
                           sampling=sampling, env_kwargs=c.env_kwargs, noise_seed=noise_seed, max_turns=c.max_turns)
        twins: Optional[list] = [] if c.dump else None
        ctx = CreditContext(policy=sharded, sampling=sampling, rng=self.rng, update=self.update, noise_seed=noise_seed,
                            config=self.settings, predictor_state=self.predictor_state, runners=self.runners,
                            records=twins)
        credit = run_credit(self.method, episodes, ctx)
        if twins is not None:
            annotate_credit(c.method, episodes if credit.episodes is None else credit.episodes, credit)
        if credit.predictor_state is not None:
            self.predictor_state = credit.predictor_state
        local = range(pr.rank * n, (pr.rank + 1) * n)
        mine = [episodes[b] for b in local]
        rows = [response_row(ep) for ep in mine]
        advantages = [credit.advantages[b] for b in local]
        if c.dump:
            self._dump(pr, local, prompts, episodes, advantages, twins, sharded.generated_by)
        self.update += 1
        self.last_episodes = mine
        self.last_aux_tokens = int(credit.aux_tokens)
        return {
            "prompt_ids": [r.prompt_ids for r in rows],
            "completion_ids": [r.response_ids for r in rows],
            "logprobs": [r.logprobs for r in rows],
            "env_mask": [r.mask for r in rows],
            "twin_advantages": [token_advantages(r.turn_of_token, a) for r, a in zip(rows, advantages)],
            "utility": [float(ep.utility) for ep in mine],
            "aux_tokens": [int(credit.aux_tokens)] * len(mine),
        }

    def _dump(self, pr: Processes, local: range, prompts, episodes, advantages, twins, generated_by) -> None:
        os.makedirs(self.config.dump, exist_ok=True)
        with open(os.path.join(self.config.dump, f"rank{pr.rank}.jsonl"), "a") as f:
            for b, adv in zip(local, advantages):
                ep = episodes[b]
                seed = NoiseSchedule.from_json(ep.trajectory["noise"]).episode_seed
                own = [{"turn": int(tw.twin_of[1]), "branch": int(tw.turns[0].noise_key.branch), "pair": int(tw.pair),
                        "seed": int(tw.turns[0].noise_key.episode_seed), "utility": float(tw.utility),
                        "kept": tw.evidence_coin} for tw in twins if tw.twin_of[0] == b]
                f.write(json.dumps({
                    "update": self.update, "row": b, "rank": pr.rank, "task": prompts[b], "group": ep.group,
                    "episode_seed": seed, "keys": [list(t.noise_key.base())[:3] for t in ep.turns],
                    "digest": (ep.trajectory.get("digests") or [""])[-1], "utility": float(ep.utility),
                    "advantages": [float(a) for a in adv], "twins": own,
                    "generated_by": sorted(generated_by.get(seed, ())),
                }) + "\n")

    def __call__(self, prompts: list, trainer) -> dict:
        from accelerate.utils import gather_object

        acc = trainer.accelerator
        model = acc.unwrap_model(trainer.model)
        was_training = model.training
        size = trainer.num_generations if was_training else trainer.num_generations_eval
        pr = Processes(acc.process_index, acc.num_processes, gather_object)
        # TRL hands process r the rows r * n .. (r + 1) * n - 1 of the batch: play the whole batch
        batch = pr.all([list(prompts)])
        if {len(x) for x in batch} != {len(prompts)}:
            raise ValueError(f"the processes got different numbers of rows: {[len(x) for x in batch]}")
        policy = self.policy_for(model, trainer.processing_class)
        model.eval()  # sampling uses the key/value cache, which training mode (checkpointing) turns off
        try:
            return self.play(policy, [p for x in batch for p in x], group_size=size, processes=pr)
        finally:
            model.train(was_training)


def _groups(prompts: list, size: Optional[int]) -> list[tuple[Any, list[int]]]:
    """``(prompt, rows)`` per group: runs of ``size`` rows (None: runs of equal prompts), all of one task."""
    if not prompts:
        raise ValueError("no prompts to play")
    if size is None:
        groups: list[tuple[Any, list[int]]] = []
        for b, p in enumerate(prompts):
            if groups and groups[-1][0] == p:
                groups[-1][1].append(b)
            else:
                groups.append((p, [b]))
    else:
        if len(prompts) % size:
            raise ValueError(f"{len(prompts)} rows do not make groups of num_generations = {size}")
        groups = [(prompts[g], list(range(g, g + size))) for g in range(0, len(prompts), size)]
        for p, rows in groups:
            if any(prompts[b] != p for b in rows):
                raise ValueError(f"rows {rows[0]}..{rows[-1]} should repeat one task (num_generations = {size})")
    sizes = {len(rows) for _, rows in groups}
    if len(sizes) != 1:
        raise ValueError("every task must be repeated equally often (num_generations), "
                         f"got group sizes {sorted(sizes)}")
    return groups


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
