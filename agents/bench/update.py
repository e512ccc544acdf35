"""``twice bench update``: the policy update's forward and backward passes, with and without the padding mask.

A training batch is right-padded (:func:`~twice_envs.agents.training.loss.pack`), so a causal LM needs no
padding mask: the causal mask alone keeps every real token from reading a pad
(:func:`~twice_envs.agents.training.loss.causal_attention_mask`). This bench rolls out one batch of the
env with its start model, packs it into the micro-batches the trainer would form (sorted by length, as
:func:`~twice_envs.agents.training.trainer.policy_update` splits it), and times the update's passes
(the reference's forward without gradient, the policy's forward and backward) both ways, after one
untimed pass of each, alternating the order from one repeat to the next so that a slow spell of a
shared machine falls on both. It
reports the ratio of the two times with a 95% bootstrap interval over the repeats, and the largest
difference between the two ways' log-probs of the generated tokens.
"""

from __future__ import annotations

import argparse
import copy
import time
from typing import Sequence

import numpy as np

from twice_envs import progress
from twice_envs.agents.bench.output import stderr_log, write_json
from twice_envs.agents.models.load import load_policy, shipped_model_config
from twice_envs.agents.models.recipes import model_for_env
from twice_envs.agents.rollout.episodes import rollout
from twice_envs.agents.stats import bootstrap_ci
from twice_envs.agents.training.config import sampling_config
from twice_envs.agents.training.evaluate import indexed_split_size, make_tasks
from twice_envs.agents.training.loss import pack_micro_batches, packed_length, token_logprobs

WAYS = ("padding mask", "causal only")
"""The two ways timed: the padding mask passed to every forward (the baseline), and a right-padded
batch run with the causal mask alone (the trainer's way)."""


def micro_batches(episodes, micro_batch: int, pad_id: int) -> list:
    """The episodes packed as the trainer packs them (sorted by length, ``micro_batch`` to a batch), with
    advantages of 1 (the passes' cost does not depend on them)."""
    order = np.argsort([packed_length(e) for e in episodes], kind="stable")
    return pack_micro_batches(episodes, [np.ones(len(e.turns)) for e in episodes], order, micro_batch, pad_id)


def time_passes(model, reference, batches, padding_mask: bool) -> tuple[float, list]:
    """Seconds for the update's passes over ``batches`` (the reference's forward without gradient, the
    policy's forward and backward; no optimiser step, so the weights stay as they are), and the policy's
    log-probs of each batch."""
    import torch

    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    out = []
    for b in batches:
        with torch.no_grad():
            token_logprobs(reference, b, padding_mask=padding_mask)
        lp = token_logprobs(model, b, padding_mask=padding_mask)
        (lp * b.loss_mask).sum().backward()
        out.append(lp.detach())
    return time.perf_counter() - t0, out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="twice bench update", description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="WebShop-v0")
    parser.add_argument("--model", default=None, help="a shipped model or a model folder (default: the env's own)")
    parser.add_argument("--tasks", type=int, default=4, help="training tasks rolled out (default 4)")
    parser.add_argument("--group", type=int, default=4, help="episodes per task (default 4)")
    parser.add_argument("--micro-batch", type=int, default=16,
                        help="episodes per forward pass (default 16), as TrainConfig.micro_batch counts them: a model "
                             "with a history window packs a row per turn, so its passes hold many more rows")
    parser.add_argument("--repeats", type=int, default=6, help="timed repeats of each way (default 6)")
    parser.add_argument("--max-turns", type=int, default=None, help="turn cap of the rollout (default: the model's)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as a training run on CPU)")
    parser.add_argument("--seed", type=int, default=0, help="noise seed of the rollout")
    parser.add_argument("--out", default="runs/bench_update", help="folder of update.json")
    parser.add_argument("--quick", action="store_true", help="2 tasks x 2 episodes, 2 repeats")
    progress.add_argument(parser)
    args = parser.parse_args(argv)
    progress.apply(args)
    if args.quick:
        args.tasks, args.group, args.repeats = 2, 2, 2
    for flag in ("tasks", "group", "micro_batch", "repeats", "threads", "max_turns"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    import torch

    torch.set_num_threads(args.threads)
    log = stderr_log("update")
    name = args.model or model_for_env(args.env)
    config = shipped_model_config(name, args.env)
    policy = load_policy(name)
    log(f"rolling out {args.tasks} tasks x {args.group} on {args.env} with {name}")
    indexed = indexed_split_size(config, config.train_split) is not None
    episodes = rollout(policy, args.env, make_tasks(range(args.tasks), config.train_split, indexed),
                       group_size=args.group, sampling=sampling_config(config), env_kwargs=config.env_kwargs,
                       noise_seed=args.seed, max_turns=args.max_turns or config.max_turns, window=config.window)
    batches = micro_batches(episodes, args.micro_batch, getattr(policy, "pad_id", 0))
    model = policy.model.train()
    reference = copy.deepcopy(model).eval()
    positions = sum(b.input_ids.numel() for b in batches)
    real = sum(int(b.attention_mask.sum()) for b in batches)
    seconds = {w: [] for w in WAYS}
    logps = {}
    for way in WAYS:  # one untimed pass each: the first pass of a process pays one-off costs (allocations)
        time_passes(model, reference, batches, way == WAYS[0])
    for r in range(args.repeats):
        for way in (WAYS if r % 2 == 0 else WAYS[::-1]):
            secs, logps[way] = time_passes(model, reference, batches, way == WAYS[0])
            seconds[way].append(secs)
        log(f"repeat {r + 1}/{args.repeats}: " + ", ".join(f"{w} {seconds[w][-1]:.2f}s" for w in WAYS))
    diff = max(float((a - b)[m.loss_mask > 0].abs().max())
               for a, b, m in zip(logps[WAYS[0]], logps[WAYS[1]], batches))
    base, new = (np.asarray(seconds[w]) for w in WAYS)
    ratio = bootstrap_ci(lambda a, b: float(b.sum() / a.sum()), base, new)
    result = {
        "env": args.env, "model": name, "episodes": len(episodes), "turns": sum(len(e.turns) for e in episodes),
        "micro_batches": len(batches),
        "positions": positions, "real_tokens": real, "generated_tokens": sum(b.num_tokens for b in batches),
        "threads": args.threads, "seconds": seconds, "ratio": ratio.as_dict(),
        "significant": bool(ratio.hi < 1 or ratio.lo > 1), "max_abs_logprob_diff": diff,
    }
    print(f"{args.env}, model {name}: {len(episodes)} episodes in {len(batches)} micro-batches of up to "
          f"{args.micro_batch}, {real} tokens ({100 * (1 - real / positions):.1f}% of the positions padding), "
          f"{result['generated_tokens']} scored; {args.threads} thread(s), {args.repeats} repeats")
    for w in WAYS:
        print(f"  {w:13}: {np.mean(seconds[w]):.2f}s per update's passes (min {min(seconds[w]):.2f}s)")
    print(f"  causal only / padding mask: x{ratio.value:.2f} [{ratio.lo:.2f}, {ratio.hi:.2f}] (95% bootstrap over "
          f"repeats){'' if result['significant'] else ', not significant'}; largest log-prob difference {diff:.1e}")
    write_json(args.out, "update.json", result)
    return 0
