"""Training an LLM agent with any registered credit method.

The loop only wires the parts together, once per update:

    tasks -> rollout (factual groups) -> credit (the registered method; may run twins /
          value rollouts) -> PPO-clip + KL loss on generated tokens -> AdamW step

A run directory holds ``config.json`` (:mod:`.config`), ``metrics.jsonl`` (one line per
update), ``episodes.jsonl`` (each update's factual episodes with their credit, and their twins:
:mod:`twice_envs.agents.records`) and ``checkpoint/state.pt`` (:mod:`.checkpoint`), from which ``resume``
continues exactly. Training into a folder that already holds a run needs ``resume`` or
``overwrite``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import random
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np

from twice_envs.agents.credit import predictor as pred
from twice_envs.agents.credit.registry import (
    CreditContext,
    CreditMethod,
    Runners,
    check_env,
    factual_group_size,
    get_method,
    run_credit,
)
from twice_envs.agents.rollout.episodes import rollout
from twice_envs.agents.rollout.twins import annotate_credit, llm_runners
from twice_envs.agents.training.checkpoint import (
    TrainState,
    clear_prefix_cache,
    load_checkpoint,
    save_checkpoint,
)
from twice_envs.agents.training.config import (
    TrainConfig,
    credit_settings,
    sampling_config,
)
from twice_envs.agents.training.critic import make_critic
from twice_envs.agents.training.evaluate import evaluate, indexed_split_size, make_tasks
from twice_envs.agents.training.gold_answer import answer_probs
from twice_envs.agents.sampling.choice import choosing
from twice_envs.agents.training.choice_loss import choice_logprobs
from twice_envs.agents.training.loss import LossConfig, pack_micro_batches, packed_length, ppo_loss, token_logprobs
from twice_envs.agents.types import measure_means
from twice_envs.agents.records import RUN_EPISODES, append_lines, batch_lines, keep_batches, write_lines
from twice_envs.errors import DataFormatError, TwiceError
from twice_envs.keys import credit_rng
from twice_envs.trajectory import atomic_write_text


class RunExistsError(TwiceError, FileExistsError):
    """The run directory already holds a run, and neither resume nor overwrite was asked for."""


def _seed_torch(seed: int) -> None:
    import torch

    torch.manual_seed(seed)
    random.seed(seed)


def credit_generator(seed: int, update: int) -> np.random.Generator:
    """The generator of every coin the credit step of update ``update`` (0-based) draws
    (:func:`twice_envs.keys.credit_rng`).

    It is keyed by the run's seed and the update, apart from the run's generator, which draws
    the tasks, the noise seeds and the minibatch order. So a method's coins (Twice's and CRR's
    branch coins, the tree methods' nodes, the predictor's SGD order) leave the run's generator
    where every other method leaves it: two methods run from one seed that train on the same
    number of episodes per update (GRPO, GiGPO, Twice, CRR) draw the same tasks with the same
    luck at every update, and their training metrics pair update by update. A method that
    trains on more episodes (``grpo-2x``, a method that grows the batch) draws more minibatch
    keys, so it shares the first update's tasks only. Resuming needs no state for it."""
    return credit_rng(seed, update)


def _lr_lambda(warmup: int):
    return lambda step: min(1.0, (step + 1) / max(1, warmup))


def init_state(config: TrainConfig, policy) -> TrainState:
    """Freeze a reference copy of ``policy`` and build the optimiser."""
    import torch

    if config.threads:
        torch.set_num_threads(config.threads)
    _seed_torch(config.seed)
    reference = copy.deepcopy(policy.model).eval()
    for p in reference.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW(policy.model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(config.warmup_steps))
    # a method that needs a critic gets one per run, copied from the initial policy (restored on resume)
    critic = make_critic(policy, config) if "critic" in get_method(config.method).needs else None
    return TrainState(policy, reference, opt, sched, pred.PredictorState(), np.random.default_rng(config.seed),
                      critic=critic)


def policy_update(state: TrainState, episodes, advantages, config: TrainConfig) -> dict:
    """PPO-clip + KL on the factual episodes: ``config.minibatches`` AdamW steps. A turn chosen among listed
    candidates enters as one decision (:func:`choice_ppo_loss`), its tokens out of the token loss.

    Returns the loss, its policy-gradient and KL parts, the clipped share of tokens and
    ``grad_norm``, the gradient norm before clipping to ``config.max_grad_norm`` (each a mean
    over the minibatches)."""
    import torch

    if config.micro_batch is not None and config.micro_batch < 1:
        raise ValueError(f"micro_batch must be >= 1 or None, got {config.micro_batch}")
    lcfg = LossConfig(config.clip_eps, config.kl_coef, config.temperature, config.top_p)
    model = state.policy.model
    pad = getattr(state.policy, "pad_id", 0)
    # minibatches of similar lengths waste little padding (random order within a length)
    lengths = [packed_length(e) for e in episodes]
    order = np.lexsort((state.rng.random(len(episodes)), lengths))
    chunks = [c for c in np.array_split(order, max(1, min(config.minibatches, len(episodes)))) if len(c)]
    agg = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "clip_frac": 0.0, "grad_norm": 0.0}
    for chunk in chunks:
        # micro-batches: the gradients of one minibatch accumulate, each loss divided by the minibatch's tokens
        micro = pack_micro_batches(episodes, advantages, chunk, config.micro_batch or len(chunk), pad)
        n = max(sum(b.num_units for b in micro), 1)
        state.optimizer.zero_grad(set_to_none=True)
        for batch in micro:
            with torch.no_grad():
                ref = token_logprobs(state.reference, batch, config.temperature, config.top_p)
            new = token_logprobs(model, batch, config.temperature, config.top_p)
            loss, stats = ppo_loss(new, batch.old_logprobs, ref, batch.advantages, batch.loss_mask, lcfg, n)
            if batch.choices:  # chosen turns: one decision each (choice_loss)
                loss_c, stats_c = choice_ppo_loss(state, batch, lcfg, n)
                loss = loss + loss_c
                stats = {k: stats[k] + stats_c[k] for k in stats}
            loss.backward()
            agg["loss"] += float(loss.detach()) / len(chunks)
            for k in ("pg_loss", "kl", "clip_frac"):
                agg[k] += stats[k] / len(chunks)
        # the norm before clipping (mean over the minibatches): above max_grad_norm, the step was shrunk
        agg["grad_norm"] += float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)) / len(chunks)
        state.optimizer.step()
        state.scheduler.step()
    clear_prefix_cache(state.policy)
    return agg


def choice_ppo_loss(state: TrainState, batch, lcfg: LossConfig, n: int):
    """The PPO-clip + KL terms of ``batch``'s chosen turns (:mod:`.choice_loss`), each one unit of ``n``."""
    import torch

    tok = state.policy.tokenizer
    encode = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    with torch.no_grad():
        ref = choice_logprobs(state.reference, batch.input_ids, batch.choices, encode, tok.eos_token_id)
    new = choice_logprobs(state.policy.model, batch.input_ids, batch.choices, encode, tok.eos_token_id)
    old = torch.tensor([float(c.choice["logprob"]) for c in batch.choices], dtype=new.dtype)
    adv = torch.tensor([c.advantage for c in batch.choices], dtype=new.dtype)
    return ppo_loss(new, old, ref, adv, torch.ones_like(new), lcfg, n)


def mixed_group_share(episodes) -> float:
    """Share of the task groups whose episodes did not all end with the same return.

    Outcome-based credit (GRPO's, and GiGPO's episode term) is zero on every episode of a
    group whose returns are all equal: the share says how much of an update carries outcome signal."""
    returns = _returns_by_group(episodes)
    return sum(len(r) > 1 for r in returns.values()) / max(len(returns), 1)


def keep_mixed_groups(episodes) -> list:
    """The episodes of the task groups whose returns differ (DAPO's dynamic-sampling filter): on the
    others GRPO's credit, and GiGPO's episode term, are zero."""
    returns = _returns_by_group(episodes)
    return [ep for ep in episodes if len(returns[ep.group]) > 1]


def _returns_by_group(episodes) -> dict:
    returns: dict = {}
    for ep in episodes:
        returns.setdefault(ep.group, set()).add(round(float(ep.utility), 9))
    return returns


def renumber_groups(episodes, first: int) -> list:
    """``episodes`` with their groups renumbered from ``first`` (a further batch joins an update's
    episodes under group ids of its own); each episode keeps its own noise in its trajectory."""
    return [replace(ep, group=ep.group + first) for ep in episodes]


def sample_batch(state: TrainState, config: TrainConfig, pool: int, indexed: bool, sampling) -> tuple[list, int]:
    """Draw ``questions_per_update`` tasks and a noise seed from the run's generator and roll out
    ``group_size x rollouts`` episodes of each; returns the episodes and the noise seed."""
    if config.task_ids:  # a fixed set of tasks (an overfit test), named by split and index
        ids = np.asarray(config.task_ids)
        idx, indexed = ids[state.rng.choice(len(ids), size=min(config.questions_per_update, len(ids)),
                                            replace=False)], True
    else:
        idx = state.rng.choice(pool, size=min(config.questions_per_update, pool), replace=False)
    noise_seed = int(state.rng.integers(0, 2**62))
    group_size = factual_group_size(config.method, config.group_size)
    episodes = rollout(state.policy, config.env, make_tasks(idx, config.train_split, indexed),
                       group_size=group_size, sampling=sampling, env_kwargs=config.env_kwargs,
                       noise_seed=noise_seed, max_turns=config.max_turns, window=config.window)
    return episodes, noise_seed


def batch_digest(episodes, noise_seeds) -> str:
    """A short digest of the tasks an update sampled, episode by episode, and of its noise seeds.

    Two runs whose updates have the same digest played the same tasks with the same luck, so a
    training measure of theirs pairs up update by update (``twice bench games`` pairs methods so)."""
    tasks = [[int(e.seed), e.options] for e in episodes]
    blob = json.dumps([tasks, [int(s) for s in noise_seeds]], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def training_pool(config: TrainConfig) -> tuple[int, bool]:
    """The number of training tasks a run draws from, and whether they are named by split and index.

    Indexed tasks (``config.indexed_tasks`` and an env whose reset takes them) come from the first
    ``task_pool`` of the training split (all of it when None); tasks named by reset seed come from the
    first ``task_pool`` seeds (1,000 when None)."""
    size = indexed_split_size(config, config.train_split)
    pool = min(x for x in (size, config.task_pool) if x) if (size or config.task_pool) else 1000
    return pool, size is not None


def train_update(state: TrainState, config: TrainConfig, pool: int, indexed: bool = True,
                 records: list | None = None, *, method: CreditMethod | None = None,
                 runners: Runners | None = None, learn: bool = True) -> dict:
    """One update: sample tasks, roll out, compute credit, step the optimiser; returns its metrics.

    Each task gets ``group_size x rollouts`` episodes, ``rollouts`` being the method's registered multiple
    (``grpo-2x``: 2), and the credit step and the loss see all of them. ``records``: a list that receives
    the update's record lines (its factual episodes with their credit, then their twins). ``method`` and
    ``runners``: the run's method and engine, bound once by :func:`train` (default: looked up now).
    ``learn=False`` stops before the optimiser (no loss statistics): the policy stays as it is, for
    measuring what the update's rollouts and credit cost (``twice bench cost``)."""
    t0 = time.perf_counter()
    u = state.update
    method = method or get_method(config.method)
    runners = runners or llm_runners(answer_probs)
    sampling = sampling_config(config)
    first, noise_seed = sample_batch(state, config, pool, indexed, sampling)
    episodes, sampled, batches, seeds = first, first, 1, [noise_seed]
    if config.filter_groups:  # dynamic sampling: further batches until enough groups carry outcome signal
        episodes = keep_mixed_groups(first)
        while len({e.group for e in episodes}) < config.questions_per_update and batches < config.max_sample_batches:
            more, more_seed = sample_batch(state, config, pool, indexed, sampling)
            seeds.append(more_seed)
            more = renumber_groups(more, first=1 + max(e.group for e in sampled))
            sampled, batches = sampled + more, batches + 1
            episodes = episodes + keep_mixed_groups(more)
        wanted = set(sorted({e.group for e in episodes})[:config.questions_per_update])
        # no group with differing returns in any batch: the first batch as sampled
        episodes = [e for e in episodes if e.group in wanted] or first
    twins = [] if records is not None else None
    t1 = time.perf_counter()
    ctx = CreditContext(policy=state.policy, sampling=sampling, rng=credit_generator(config.seed, u), update=u,
                        noise_seed=noise_seed, config=credit_settings(config), predictor_state=state.predictor,
                        critic=state.critic, runners=runners, records=twins)
    credit = run_credit(method, episodes, ctx)
    if credit.predictor_state is not None:
        state.predictor = credit.predictor_state
    t2 = time.perf_counter()
    # a step that grew further factual episodes (need "branches") returns the batch to train on; the
    # metrics below describe the batch as sampled, the grown episodes' tokens being the step's auxiliary ones
    trained = credit.episodes if credit.episodes is not None else episodes
    if records is not None:
        annotate_credit(config.method, trained, credit)
        records.extend(batch_lines(trained, twins, batch=u + 1, slim=True))
    loss_stats = policy_update(state, trained, credit.advantages, config) if learn else {}
    t3 = time.perf_counter()
    state.update += 1
    gen = sum(e.num_generated_tokens for e in sampled)
    m = {
        "update": u + 1,
        "method": config.method,
        # the batches as sampled (with ``filter_groups``, before the unanimous groups are dropped)
        "reward": float(np.mean([e.utility for e in sampled])),
        # the env's own measures (EM and F1 for SearchQA, success and score for WebShop, success for ALFWorld)
        **measure_means(sampled),
        "measures": list(measure_means(sampled)),
        "generated_tokens": gen,
        "aux_tokens": int(credit.aux_tokens),
        "realised_beta": credit.aux_tokens / max(gen, 1),
        "turns_per_episode": float(np.mean([len(e.turns) for e in sampled])),
        "mixed_groups": mixed_group_share(sampled),
        "sample_batches": batches,
        "batch": batch_digest(sampled, seeds),
        "trained_groups": len({e.group for e in episodes}),
        # turns holding no admissible action (the env flags them); benchmarks report the share
        "turns": sum(len(e.turns) for e in sampled),
        "invalid_turns": sum(t.invalid for e in sampled for t in e.turns),
        # turns chosen among the env's listed actions (``choose``), the rest generated
        "chosen_turns": sum(t.choice is not None for e in sampled for t in e.turns),
        "lr": float(state.scheduler.get_last_lr()[0]),
        "time_rollout": t1 - t0,
        "time_credit": t2 - t1,
        "time_update": t3 - t2,
        "time": t3 - t0,
    }
    m["invalid_share"] = m["invalid_turns"] / max(m["turns"], 1)
    # every scalar statistic the credit step reports (per-decision records such as ``decisions`` stay out)
    m.update({k: (v.item() if isinstance(v, np.generic) else v) for k, v in credit.stats.items()
              if isinstance(v, (bool, int, float, np.generic)) and k not in m})
    m.update(loss_stats)
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in m.items()}


def train(config: TrainConfig, *, policy, resume: bool = False, overwrite: bool = False, progress: bool = True,
          eval_before: bool = False, log=None) -> list[dict]:
    """Run (or resume) a training run; returns the metrics of the updates run now.

    ``resume`` continues from ``out_dir/checkpoint`` (a fresh start when there is none);
    ``overwrite`` replaces a run already in ``out_dir``; with neither, a folder that holds
    a run raises :class:`RunExistsError`. ``progress`` prints one line per update to stderr.
    """
    check_env(config.method, config.env)  # before any rollout: a method the env cannot serve fails by name
    if config.max_sample_batches < 1:
        raise ValueError(f"max_sample_batches must be >= 1, got {config.max_sample_batches}")
    out = Path(config.out_dir)
    ckpt = out / "checkpoint"
    metrics_path = out / "metrics.jsonl"
    if not resume:
        _check_fresh_run_dir(out, overwrite)
    out.mkdir(parents=True, exist_ok=True)
    state = init_state(config, choosing(policy, config.choose))
    if resume and (ckpt / "state.pt").exists():
        load_checkpoint(state, ckpt)
        kept = [row for row in read_metrics(metrics_path) if row.get("update", 0) <= state.update] \
            if metrics_path.exists() else []
        atomic_write_text(metrics_path, "".join(json.dumps(row) + "\n" for row in kept))
        keep_batches(out / RUN_EPISODES, state.update)
    else:
        if resume:
            print(f"twice train: no checkpoint in {ckpt}; starting from update 0", file=sys.stderr, flush=True)
        # a previous run's checkpoint must not be resumed into this run's metrics later
        (ckpt / "state.pt").unlink(missing_ok=True)
        atomic_write_text(metrics_path, "")
        write_lines(out / RUN_EPISODES, [])
    atomic_write_text(out / "config.json", json.dumps(config.to_json(), indent=1))
    pool, indexed = training_pool(config)
    method, runners = get_method(config.method), llm_runners(answer_probs)  # looked up and bound once per run
    results = []
    if eval_before and state.update == 0:
        ev = evaluate(state.policy, config)
        _append(metrics_path, {"update": 0, "eval": ev})
    while state.update < config.updates:
        lines: list = []
        m = train_update(state, config, pool, indexed, records=lines, method=method, runners=runners)
        append_lines(out / RUN_EPISODES, lines)
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
    parts += [f"{name} {m[name]:.3f}" for name in m.get("measures", ()) if m.get(name) is not None]
    if m.get("invalid_share") is not None:
        parts.append(f"invalid {100 * m['invalid_share']:.1f}%")
    if isinstance(m.get("eval"), dict):
        ev = m["eval"]
        parts.append(f"dev {ev.get('measure', 'em')} {ev[ev.get('measure', 'em')]:.3f}")
    if m.get("sample_batches", 1) > 1:  # dynamic sampling drew further batches
        parts.append(f"trained on {m['trained_groups']} groups of {m['sample_batches']} batches")
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
