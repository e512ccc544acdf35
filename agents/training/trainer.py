"""Training an LLM agent with GRPO, Twice, CRR or VinePPO credit.

The loop only wires the parts together, once per update:

    tasks -> rollout (factual groups) -> credit (method; may run twins / value rollouts)
          -> PPO-clip + KL loss on generated tokens -> AdamW step

Everything that matters for reproducibility lives in :class:`TrainConfig`; a run
directory holds ``config.json``, ``metrics.jsonl`` (one line per update), and
``checkpoint/state.pt`` (model, optimiser, scheduler, predictor and every RNG state, as
tensors and plain values only), from which ``--resume`` continues exactly. Checkpoints
are read with ``torch.load(..., weights_only=True)``, so a crafted file cannot run code.
Training into a folder that already holds a run needs ``resume`` or ``overwrite``.

``twice train --env SearchQA-v0 --model tiny --method twice`` uses the CPU defaults
for the tiny model; any other model gets the published defaults (:func:`published_config`).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import random
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from twice_envs.agents.credit import predictor as pred
from twice_envs.agents.credit.ablations import ABLATIONS, apply_ablations
from twice_envs.agents.credit.gigpo import gigpo_credit
from twice_envs.agents.twins import METHODS as TWIN_METHODS
from twice_envs.agents.twins import CreditResult, credit_step
from twice_envs.agents.credit.twice import TwiceConfig
from twice_envs.errors import DataFormatError, TwiceError
from twice_envs.trajectory import atomic_write_text

#: Credit methods ``twice train`` accepts.
METHODS = TWIN_METHODS[:1] + ("gigpo",) + TWIN_METHODS[1:]


class CheckpointError(TwiceError, ValueError):
    """A checkpoint file is missing, unreadable, or holds more than tensors and plain values."""


class RunExistsError(TwiceError, FileExistsError):
    """The run directory already holds a run, and neither resume nor overwrite was asked for."""


@dataclass
class TrainConfig:
    """One training run. Defaults are the CPU settings for the tiny model (see :func:`cpu_config`)."""

    env: str = "SearchQA-v0"
    """Registered env id."""
    env_kwargs: dict = field(default_factory=dict)
    """Keyword arguments for ``twice_envs.make``."""
    model: str = "tiny"
    """``tiny``, ``smollm2-135m`` or a local Hugging Face model directory."""
    method: str = "twice"
    """Credit: grpo, gigpo, twice, crr or vineppo."""
    ablations: tuple[str, ...] = ()
    """Twice ablation flags (see :mod:`twice_envs.agents.credit.ablations`)."""
    updates: int = 30
    """Policy updates (one batch of questions each)."""
    questions_per_update: int = 8
    """Tasks per update (published: 256)."""
    group_size: int = 5
    """Episodes per task (G; published: 5)."""
    max_turns: Optional[int] = 4
    """Turn cap per episode (None: the env's own limit; SearchQA caps searches at 4 itself)."""
    window: Optional[int] = None
    """Turns of history in the model's context (None: the whole episode; the first prompt,
    which holds the task, is always kept). Use the window the model was trained with."""
    max_new_tokens: int = 128
    """Tokens per turn at most (published: 500; the tiny model's quoted reasoning takes up to about 110)."""
    temperature: float = 1.0
    """Sampling temperature (published: 1)."""
    top_p: float = 1.0
    """Nucleus mass (published: 1)."""
    lr: float = 2e-4
    """Peak AdamW learning rate (published: 1e-6 for real models)."""
    warmup_steps: int = 3
    """Optimiser steps of linear learning-rate warm-up."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    minibatches: int = 2
    """Optimiser steps per update (the batch's episodes are split into this many minibatches)."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm."""
    clip_eps: float = 0.2
    """PPO clip epsilon."""
    kl_coef: float = 0.001
    """KL-to-reference weight."""
    twice: TwiceConfig = field(default_factory=TwiceConfig)
    """Twin-credit settings (also CRR's budget)."""
    vine_k: int = 2
    """VinePPO rollouts per state."""
    seed: int = 0
    """Seed of task sampling, coins, noise seeds and torch."""
    train_split: str = "train"
    """Split the training tasks come from."""
    dev_split: str = "dev"
    """Split for evaluation."""
    task_pool: Optional[int] = None
    """Training tasks are drawn from the first ``task_pool`` of the split (None: all)."""
    indexed_tasks: bool = True
    """Name tasks by the reset options ``{"split", "index"}`` where the env has splits
    (SearchQA); envs without them get tasks by reset seed only."""
    eval_questions: int = 40
    """Dev questions for the greedy evaluation."""
    eval_every: int = 0
    """Evaluate every N updates (0: only when asked)."""
    checkpoint_every: int = 10
    """Write a checkpoint every N updates (and at the end)."""
    out_dir: str = "runs/run"
    """Run directory (config, metrics, checkpoint)."""
    threads: int = 1
    """torch CPU threads (0: torch's default; the tiny model runs fastest on one)."""

    def to_json(self) -> dict:
        d = asdict(self)
        d["ablations"] = list(self.ablations)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "TrainConfig":
        d = dict(d)
        d["twice"] = TwiceConfig(**d.get("twice", {}))
        d["ablations"] = tuple(d.get("ablations", ()))
        return cls(**d)


def cpu_config(**overrides: Any) -> TrainConfig:
    """CPU defaults for the tiny model: 8 questions x G=5 per update, 128-token turns, lr 2e-4.

    Sized so that a few dozen updates of GRPO and Twice fit in minutes on two cores.
    """
    return replace(TrainConfig(), **overrides)


def published_config(**overrides: Any) -> TrainConfig:
    """The method's published settings for real models (256 questions, G = 5, lr 1e-6, 500-token turns)."""
    base = TrainConfig(
        questions_per_update=256, group_size=5, max_turns=None, max_new_tokens=500, temperature=1.0, top_p=1.0,
        lr=1e-6, warmup_steps=10, minibatches=4, updates=200, eval_questions=500, eval_every=10,
        checkpoint_every=10, threads=0,
    )
    return replace(base, **overrides)


# ----------------------------------------------------------------------------- state


@dataclass
class TrainState:
    """Everything that changes during training (what a checkpoint holds)."""

    policy: Any
    reference: Any
    optimizer: Any
    scheduler: Any
    predictor: pred.PredictorState
    rng: np.random.Generator
    update: int = 0


def _seed_torch(seed: int) -> None:
    import torch

    torch.manual_seed(seed)
    random.seed(seed)


def _lr_lambda(warmup: int):
    return lambda step: min(1.0, (step + 1) / max(1, warmup))


def init_state(config: TrainConfig, policy=None) -> TrainState:
    """Load the model (unless given), freeze a reference copy and build the optimiser."""
    import torch

    if config.threads:
        torch.set_num_threads(config.threads)
    _seed_torch(config.seed)
    if policy is None:
        from twice_envs.agents.models import load_policy

        policy = load_policy(config.model)
    reference = copy.deepcopy(policy.model).eval()
    for p in reference.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW(policy.model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(config.warmup_steps))
    return TrainState(policy, reference, opt, sched, pred.PredictorState(), np.random.default_rng(config.seed))


CHECKPOINT_FORMAT = 1
"""Version of the layout :func:`save_checkpoint` writes (stored under ``"format"``)."""

_CHECKPOINT_KEYS = ("model", "optimizer", "scheduler", "predictor", "rng", "torch_rng", "python_rng", "update")


def save_checkpoint(state: TrainState, path: os.PathLike) -> None:
    """Atomically write model, optimiser, scheduler, predictor and RNG states to ``path/state.pt``.

    Only tensors and plain values (dicts, lists, tuples, numbers, strings) go in, so the
    file loads with ``torch.load(weights_only=True)``.
    """
    import torch

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    blob = {
        "format": CHECKPOINT_FORMAT,
        "model": state.policy.model.state_dict(),
        "optimizer": state.optimizer.state_dict(),
        "scheduler": state.scheduler.state_dict(),
        "predictor": state.predictor.to_json(),
        "rng": state.rng.bit_generator.state,
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
        "update": state.update,
    }
    tmp = path / "state.pt.tmp"
    torch.save(blob, tmp)
    os.replace(tmp, path / "state.pt")


def read_checkpoint(file: os.PathLike) -> dict:
    """The contents of a ``state.pt`` written by :func:`save_checkpoint`, loaded without running code.

    Raises :class:`CheckpointError` naming the file when it is missing, truncated, not a
    torch file, holds objects other than tensors and plain values (a pickle that would
    run code is refused, never executed), or lacks a checkpoint's fields.
    """
    import pickle

    import torch

    file = Path(file)
    if not file.is_file():
        raise CheckpointError(f"{file}: no checkpoint file there")
    try:
        blob = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(f"{file}: refused to load: it holds objects other than tensors and plain values "
                              f"(not a checkpoint written by twice train; loading it could run code): "
                              f"{_unpickler_reason(exc)}") from None
    except Exception as exc:  # torch raises RuntimeError, EOFError, zipfile errors... for damaged files
        raise CheckpointError(f"{file}: not a readable checkpoint ({type(exc).__name__}: {exc})") from None
    if not isinstance(blob, dict):
        raise CheckpointError(f"{file}: not a checkpoint (holds a {type(blob).__name__}, expected a dict)")
    missing = [k for k in _CHECKPOINT_KEYS if k not in blob]
    if missing:
        raise CheckpointError(f"{file}: not a complete checkpoint (missing {', '.join(missing)})")
    if blob.get("format", CHECKPOINT_FORMAT) != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{file}: checkpoint format {blob['format']!r}; this version reads {CHECKPOINT_FORMAT}")
    return blob


def _unpickler_reason(exc: Exception) -> str:
    # torch's message is mostly advice to load unsafely; keep only what it found in the file
    text = str(exc)
    tail = text.split("WeightsUnpickler error:", 1)[-1]
    first = next((line.strip() for line in tail.splitlines() if line.strip()), type(exc).__name__)
    return first.split(". Please")[0].rstrip(".")


def load_checkpoint(state: TrainState, path: os.PathLike) -> TrainState:
    """Restore a checkpoint written by :func:`save_checkpoint` (``path`` is its folder) into ``state``."""
    import torch

    blob = read_checkpoint(Path(path) / "state.pt")
    state.policy.model.load_state_dict(blob["model"])
    state.optimizer.load_state_dict(blob["optimizer"])
    state.scheduler.load_state_dict(blob["scheduler"])
    state.predictor = pred.PredictorState.from_json(blob["predictor"])
    state.rng.bit_generator.state = blob["rng"]
    torch.set_rng_state(blob["torch_rng"])
    random.setstate(blob["python_rng"])
    state.update = int(blob["update"])
    _clear_prefix_cache(state.policy)
    return state


def _clear_prefix_cache(policy) -> None:
    # Cached key/values were computed by the old weights: never reuse them after a step.
    cache = getattr(policy, "prefix_cache", None)
    if cache is not None:
        cache.clear()


# ----------------------------------------------------------------------------- tasks and eval


def split_size(env_id: str, env_kwargs: dict, split: str) -> Optional[int]:
    """Number of tasks in ``split`` when the env exposes it (SearchQA), else None."""
    import twice_envs

    env = twice_envs.make(env_id, **env_kwargs)
    res = getattr(env.unwrapped, "resources", None)
    qs = getattr(res, "questions", None)
    return len(qs[split]) if qs is not None and split in qs else None


def make_tasks(indices: Sequence[int], split: str, indexed: bool) -> list:
    from twice_envs.agents.rollout import Task

    return [Task(int(i), {"split": split, "index": int(i)} if indexed else {}) for i in indices]


def sampling_config(config: TrainConfig, *, greedy: bool = False):
    from twice_envs.agents.policy import SamplingConfig

    return SamplingConfig(temperature=config.temperature, top_p=config.top_p, max_new_tokens=config.max_new_tokens,
                          greedy=greedy, key_mode=effective_twice(config).key_mode)


def effective_twice(config: TrainConfig) -> TwiceConfig:
    return apply_ablations(config.twice, config.ablations)


def evaluate(policy, config: TrainConfig, *, questions: Optional[int] = None, split: Optional[str] = None) -> dict:
    """Greedy decoding on the dev split: EM and F1 overall and per dataset."""
    from twice_envs.agents.rollout import rollout

    split = split or config.dev_split
    n = questions if questions is not None else config.eval_questions
    size = split_size(config.env, config.env_kwargs, split) if config.indexed_tasks else None
    n = min(n, size) if size else n
    tasks = make_tasks(range(n), split, size is not None)
    eps = rollout(policy, config.env, tasks, group_size=1, sampling=sampling_config(config, greedy=True),
                  env_kwargs=config.env_kwargs, noise_seed=12345, max_turns=config.max_turns, window=config.window)
    return summarize_eval(eps)


def _dataset_of(ep) -> str:
    d = ep.info.get("dataset")
    if d:
        return str(d)
    tid = str(ep.info.get("task_id", ""))
    return tid.split("_")[0] if "_" in tid else ep.env_id


def summarize_eval(episodes) -> dict:
    """EM (with its 95% Wilson interval), F1 and the count of ``episodes``, overall and per dataset;
    ``outcomes`` holds each episode's EM in order, so that two evaluations on the same questions
    pair up."""
    def em(ep):
        return float(ep.info.get("em", ep.utility > 0))

    def f1(ep):
        return float(ep.info.get("f1", em(ep)))

    from twice_envs.agents.games_bench import wilson

    ems = [em(e) for e in episodes]
    out = {"em": float(np.mean(ems)), "em_ci": list(wilson(sum(ems), len(ems))),
           "f1": float(np.mean([f1(e) for e in episodes])), "n": len(episodes), "outcomes": ems, "per_dataset": {}}
    for name in sorted({_dataset_of(e) for e in episodes}):
        sel = [e for e in episodes if _dataset_of(e) == name]
        out["per_dataset"][name] = {"em": float(np.mean([em(e) for e in sel])), "f1": float(np.mean([f1(e) for e in sel])),
                                    "n": len(sel)}
    return out


# ----------------------------------------------------------------------------- one update


def policy_update(state: TrainState, episodes, advantages, config: TrainConfig) -> dict:
    """PPO-clip + KL on the factual episodes: ``config.minibatches`` AdamW steps."""
    import torch

    from twice_envs.agents.loss import LossConfig, pack, ppo_loss, token_logprobs
    from twice_envs.agents.sequence import pack_segments

    lcfg = LossConfig(config.clip_eps, config.kl_coef, config.temperature, config.top_p)
    model = state.policy.model
    pad = getattr(state.policy, "pad_id", 0)
    # minibatches of similar lengths waste little padding (random order within a length)
    lengths = [sum(len(seg[0]) for seg in pack_segments(e)) for e in episodes]
    order = np.lexsort((state.rng.random(len(episodes)), lengths))
    chunks = [c for c in np.array_split(order, max(1, min(config.minibatches, len(episodes)))) if len(c)]
    agg = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "clip_frac": 0.0}
    for chunk in chunks:
        batch = pack([episodes[i] for i in chunk], [advantages[i] for i in chunk], pad_id=pad)
        n = max(batch.num_tokens, 1)
        with torch.no_grad():
            ref = token_logprobs(state.reference, batch, config.temperature, config.top_p)
        new = token_logprobs(model, batch, config.temperature, config.top_p)
        loss, stats = ppo_loss(new, batch.old_logprobs, ref, batch.advantages, batch.loss_mask, lcfg, n)
        state.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        state.optimizer.step()
        state.scheduler.step()
        agg["loss"] += float(loss.detach()) / len(chunks)
        for k in ("pg_loss", "kl", "clip_frac"):
            agg[k] += stats[k] / len(chunks)
    _clear_prefix_cache(state.policy)
    return agg


def method_credit(method: str, policy, episodes, **kwargs) -> CreditResult:
    """Per-turn advantages of ``episodes`` under ``method`` (keyword arguments as :func:`credit_step`).

    GiGPO needs no auxiliary rollouts; every other method runs what it needs through
    :func:`credit_step`. The integrations (verl, TRL) call this too.
    """
    if method == "gigpo":
        return CreditResult(gigpo_credit(episodes))
    return credit_step(method, policy, episodes, **kwargs)


def mixed_group_share(episodes) -> float:
    """Share of the task groups whose episodes did not all end with the same return.

    Outcome-based credit (GRPO's, and GiGPO's episode term) is zero on every episode of a
    group whose returns are all equal: the share says how much of an update carries outcome signal."""
    returns: dict = {}
    for ep in episodes:
        returns.setdefault(ep.group, set()).add(round(float(ep.utility), 9))
    return sum(len(r) > 1 for r in returns.values()) / max(len(returns), 1)


def train_update(state: TrainState, config: TrainConfig, pool: int, indexed: bool = True) -> dict:
    """One update: sample tasks, roll out, compute credit, step the optimiser; returns its metrics."""
    from twice_envs.agents.rollout import rollout

    t0 = time.perf_counter()
    u = state.update
    tcfg = effective_twice(config)
    sampling = sampling_config(config)
    idx = state.rng.choice(pool, size=min(config.questions_per_update, pool), replace=False)
    noise_seed = int(state.rng.integers(0, 2**62))
    episodes = rollout(state.policy, config.env, make_tasks(idx, config.train_split, indexed),
                       group_size=config.group_size, sampling=sampling, env_kwargs=config.env_kwargs,
                       noise_seed=noise_seed, max_turns=config.max_turns, window=config.window)
    t1 = time.perf_counter()
    credit = method_credit(config.method, state.policy, episodes, config=tcfg, sampling=sampling, rng=state.rng,
                           update=u, noise_seed=noise_seed, predictor_state=state.predictor, vine_k=config.vine_k)
    if credit.predictor_state is not None:
        state.predictor = credit.predictor_state
    t2 = time.perf_counter()
    loss_stats = policy_update(state, episodes, credit.advantages, config)
    t3 = time.perf_counter()
    state.update += 1
    gen = sum(e.num_generated_tokens for e in episodes)
    m = {
        "update": u + 1,
        "method": config.method,
        "reward": float(np.mean([e.utility for e in episodes])),
        "em": float(np.mean([float(e.info.get("em", e.utility > 0)) for e in episodes])),
        "generated_tokens": gen,
        "aux_tokens": int(credit.aux_tokens),
        "realised_beta": credit.aux_tokens / max(gen, 1),
        "turns_per_episode": float(np.mean([len(e.turns) for e in episodes])),
        "mixed_groups": mixed_group_share(episodes),
        # turns holding no admissible action (the env flags them); benchmarks report the share
        "turns": sum(len(e.turns) for e in episodes),
        "invalid_turns": sum(t.invalid for e in episodes for t in e.turns),
        "lr": float(state.scheduler.get_last_lr()[0]),
        "time_rollout": t1 - t0,
        "time_credit": t2 - t1,
        "time_update": t3 - t2,
        "time": t3 - t0,
    }
    m["invalid_share"] = m["invalid_turns"] / max(m["turns"], 1)
    for k in ("rho", "self_twin_share", "tie_share", "same_evidence_share", "mean_q", "branched_share",
              "predictor_auc", "discordance", "twins", "cost_scale", "rho_per_decision", "sigma_hat",
              "twin_term_q50", "twin_term_q90", "twin_term_q99", "twin_term_max"):
        if k in credit.stats:
            m[k] = credit.stats[k]
    m.update(loss_stats)
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in m.items()}


# ----------------------------------------------------------------------------- the loop


def train(config: TrainConfig, *, resume: bool = False, overwrite: bool = False, progress: bool = True, policy=None,
          eval_before: bool = False, log=None) -> list[dict]:
    """Run (or resume) a training run; returns the metrics of the updates run now.

    ``resume`` continues from ``out_dir/checkpoint`` (a fresh start when there is none);
    ``overwrite`` replaces a run already in ``out_dir``; with neither, a folder that holds
    a run raises :class:`RunExistsError`. ``progress`` prints one line per update to stderr.
    """
    out = Path(config.out_dir)
    ckpt = out / "checkpoint"
    metrics_path = out / "metrics.jsonl"
    if not resume:
        _check_fresh_run_dir(out, overwrite)
    out.mkdir(parents=True, exist_ok=True)
    state = init_state(config, policy)
    if resume and (ckpt / "state.pt").exists():
        load_checkpoint(state, ckpt)
        kept = [row for row in read_metrics(metrics_path) if row.get("update", 0) <= state.update] \
            if metrics_path.exists() else []
        atomic_write_text(metrics_path, "".join(json.dumps(row) + "\n" for row in kept))
    else:
        if resume:
            print(f"twice train: no checkpoint in {ckpt}; starting from update 0", file=sys.stderr, flush=True)
        # a previous run's checkpoint must not be resumed into this run's metrics later
        (ckpt / "state.pt").unlink(missing_ok=True)
        atomic_write_text(metrics_path, "")
    atomic_write_text(out / "config.json", json.dumps(config.to_json(), indent=1))
    size = split_size(config.env, config.env_kwargs, config.train_split) if config.indexed_tasks else None
    pool = min(x for x in (size, config.task_pool) if x) if (size or config.task_pool) else 1000
    results = []
    if eval_before and state.update == 0:
        ev = evaluate(state.policy, config)
        _append(metrics_path, {"update": 0, "eval": ev})
    while state.update < config.updates:
        m = train_update(state, config, pool, size is not None)
        if config.eval_every and state.update % config.eval_every == 0:
            m["eval"] = evaluate(state.policy, config)
        _append(metrics_path, m)
        results.append(m)
        if state.update % config.checkpoint_every == 0 or state.update == config.updates:
            save_checkpoint(state, ckpt)
        if progress:
            print(progress_line(m, config.updates), file=sys.stderr, flush=True)
        if log:
            log(m)
    return results


def progress_line(m: dict, total: int) -> str:
    """One line for a finished update: update k/N, reward, EM, tokens, seconds per update (and dev EM if evaluated)."""
    parts = [f"[{m.get('method', 'train')}] update {m['update']}/{total}", f"reward {m['reward']:.3f}"]
    if m.get("em") is not None:
        parts.append(f"EM {m['em']:.3f}")
    if isinstance(m.get("eval"), dict):
        parts.append(f"dev EM {m['eval']['em']:.3f}")
    parts.append(f"tokens {m['generated_tokens']}" + (f" (+{m['aux_tokens']} aux)" if m.get("aux_tokens") else ""))
    parts.append(f"{m['time']:.1f} s/update")
    return "  ".join(parts)


def _check_fresh_run_dir(out: Path, overwrite: bool) -> None:
    # a run is worth protecting once it has a checkpoint or a metrics row
    metrics = out / "metrics.jsonl"
    holds_run = (out / "checkpoint" / "state.pt").exists() or (metrics.exists() and metrics.stat().st_size > 0)
    if holds_run and not overwrite:
        raise RunExistsError(f"{out} already holds a run (metrics.jsonl, checkpoint/): continue it with --resume, "
                             f"start it again with --overwrite, or choose another --out")


def read_metrics(path: os.PathLike) -> list[dict]:
    """The rows of a ``metrics.jsonl``.

    A damaged last line (a crash while it was written) is dropped with a warning; a damaged
    line before it raises :class:`~twice_envs.errors.DataFormatError` naming file and line.
    """
    path = Path(path)
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    rows = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError(f"a JSON {type(row).__name__}, not an object")
        except ValueError as exc:
            if i == len(lines):
                warnings.warn(f"{path}:{i}: dropping a damaged last line (an interrupted write?): {exc}",
                              RuntimeWarning, stacklevel=2)
                break
            raise DataFormatError(path, i, f"not a metrics row: {exc}") from None
        rows.append(row)
    return rows


def _append(path: Path, row: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


# ----------------------------------------------------------------------------- CLI


def _parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("--env", default="SearchQA-v0", help="env id (default SearchQA-v0)")
    p.add_argument("--model", default="tiny", help="tiny, smollm2-135m or a local HF model directory")
    return p


def train_main(argv: Sequence[str]) -> int:
    """``twice train --env ENV --model MODEL --method {grpo,gigpo,twice,crr,vineppo} [--ablation ...]``."""
    from twice_envs.agents.models import resolve_model_dir
    from twice_envs.agents.recipes import trained_env_kwargs, trained_window
    from twice_envs.agents.rollout_cli import parse_env_kwargs

    p = _parser("twice train")
    p.description = "Train an agent with GRPO, GiGPO, Twice, CRR or VinePPO credit (CPU defaults for --model tiny)."
    p.add_argument("--method", choices=METHODS, default="twice")
    p.add_argument("--ablation", action="append", default=[], choices=sorted(ABLATIONS),
                   help="a Twice ablation (repeatable)")
    p.add_argument("--updates", type=int, default=None)
    p.add_argument("--questions", type=int, default=None, help="tasks per update")
    p.add_argument("--group-size", type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--beta", type=float, default=None, help="auxiliary budget (Twice/CRR)")
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--max-turns", type=int, default=None, help="turn cap per episode")
    p.add_argument("--window", type=int, default=None,
                   help="turns of history in the context (default: the window a tiny model was trained with, "
                        "else the whole episode)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="run directory (default runs/METHOD)")
    p.add_argument("--resume", action="store_true", help="continue from the run directory's checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in the run directory")
    p.add_argument("--no-progress", action="store_true", help="no line per update on stderr")
    p.add_argument("--eval-every", type=int, default=None)
    p.add_argument("--env-kwargs", default="{}",
                   help="JSON kwargs for the env, over those a tiny model was trained with (e.g. show_admissible)")
    p.add_argument("--published", action="store_true", help="use the published settings even for the tiny model")
    a = p.parse_args(argv)
    base = cpu_config() if a.model == "tiny" and not a.published else published_config()
    model_dir = resolve_model_dir(a.model)
    env_kwargs = {**trained_env_kwargs(model_dir, a.env), **parse_env_kwargs(p, a.env_kwargs)}
    over: dict[str, Any] = {"env": a.env, "model": a.model, "method": a.method, "ablations": tuple(a.ablation),
                            "seed": a.seed, "env_kwargs": env_kwargs, "window": trained_window(model_dir),
                            "out_dir": a.out or f"runs/{a.method}" + "".join(f"+{x}" for x in a.ablation)}
    for name, key in (("updates", "updates"), ("questions", "questions_per_update"), ("group_size", "group_size"),
                      ("lr", "lr"), ("max_new_tokens", "max_new_tokens"), ("eval_every", "eval_every"),
                      ("max_turns", "max_turns"), ("window", "window")):
        if getattr(a, name) is not None:
            over[key] = getattr(a, name)
    cfg = replace(base, **over)
    if a.beta is not None:
        cfg = replace(cfg, twice=replace(cfg.twice, beta=a.beta))
    if a.resume and a.overwrite:
        p.error("--resume and --overwrite exclude each other")
    train(cfg, resume=a.resume, overwrite=a.overwrite, progress=not a.no_progress)
    print(f"metrics: {Path(cfg.out_dir) / 'metrics.jsonl'}\ncheckpoint: {Path(cfg.out_dir) / 'checkpoint'}")
    return 0


def read_run_config(file: os.PathLike) -> TrainConfig:
    """A run's ``config.json``; a damaged or foreign file raises :class:`~twice_envs.errors.DataFormatError` naming it."""
    file = Path(file)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise DataFormatError(file, None, f"not UTF-8 text ({exc.reason})") from None
    except json.JSONDecodeError as exc:
        raise DataFormatError(file, exc.lineno, f"invalid JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise DataFormatError(file, None, f"expected a JSON object of training settings, found a {type(data).__name__}")
    try:
        return TrainConfig.from_json(data)
    except TypeError as exc:  # unknown or misspelt fields
        raise DataFormatError(file, None, f"not a training config: {exc}") from None


def load_run_policy(checkpoint: os.PathLike, model: Optional[str] = None):
    """A policy with a run's checkpointed weights (``checkpoint`` = run dir or its checkpoint dir)."""
    from twice_envs.agents.models import load_policy

    path = Path(checkpoint)
    if (path / "checkpoint" / "state.pt").exists():
        path = path / "checkpoint"
    state_file = path / "state.pt"
    if not state_file.exists() and str(checkpoint) not in ("tiny", "smollm2-135m"):
        raise CheckpointError(f"no checkpoint at {checkpoint} (expected a run directory or its checkpoint/)")
    # read (and vet) the file before the slow model load
    weights = read_checkpoint(state_file)["model"] if state_file.exists() else None
    cfg_file = path.parent / "config.json"
    cfg = read_run_config(cfg_file) if cfg_file.exists() else TrainConfig()
    policy = load_policy(model or cfg.model)
    if weights is not None:
        policy.model.load_state_dict(weights)
    _clear_prefix_cache(policy)
    return policy, cfg


def eval_main(argv: Sequence[str]) -> int:
    """``twice eval --checkpoint RUN [--env ENV]``: greedy EM and F1 per dataset."""
    p = argparse.ArgumentParser(prog="twice eval", description="Greedy evaluation (EM and F1 per dataset).")
    p.add_argument("--checkpoint", required=True, help="run directory, its checkpoint/, or a model name (tiny)")
    p.add_argument("--env", default=None)
    p.add_argument("--split", default="dev")
    p.add_argument("--questions", type=int, default=None)
    a = p.parse_args(argv)
    if a.checkpoint in ("tiny", "smollm2-135m"):
        from twice_envs.agents.models import load_policy

        policy, cfg = load_policy(a.checkpoint), cpu_config(model=a.checkpoint)
    else:
        policy, cfg = load_run_policy(a.checkpoint)
    if a.env:
        cfg = replace(cfg, env=a.env)
    res = evaluate(policy, cfg, questions=a.questions, split=a.split)
    lo, hi = res["em_ci"]
    print(f"{cfg.env} {a.split}: EM {res['em']:.3f} [95% CI {lo:.3f}, {hi:.3f}]  F1 {res['f1']:.3f}  (n={res['n']})")
    for name, r in res["per_dataset"].items():
        print(f"  {name:<16} EM {r['em']:.3f}  F1 {r['f1']:.3f}  (n={r['n']})")
    return 0
