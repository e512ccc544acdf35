"""Benchmarks of the agent layer: ``twice bench sampler`` and ``twice bench rollout``.

Every figure is a ratio against a baseline measured in the same run on the same model
and batch, so machine load shifts both sides alike.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

import torch

from twice_envs import progress
from twice_envs._deps import available
from twice_envs.agents.models.load import load_policy, resolve_model_dir
from twice_envs.agents.models.recipes import trained_env_kwargs, trained_window
from twice_envs.agents.rollout import episodes as R
from twice_envs.agents.rollout.context import initial_prompt_ids
from twice_envs.agents.sampling.policy import GenerationRequest, SamplingConfig
from twice_envs.keys import NoiseKey
from twice_envs.noise import sampling_logprobs
from twice_envs.play import parse_env_kwargs


class PlainSampler:
    """The baseline: ordinary temperature/top-p sampling with ``torch.multinomial`` (same forced-argmax output)."""

    def __init__(self, temperature: float, top_p: float, seed: int = 0) -> None:
        self.temperature, self.top_p = temperature, top_p
        self.gen = torch.Generator().manual_seed(seed)

    def __call__(self, input_ids, scores: torch.Tensor) -> torch.Tensor:
        # the keyed sampler's distribution (float64 nucleus and log-probs), drawn by torch.multinomial
        logp = sampling_logprobs(scores.double(), self.temperature, self.top_p)
        p = logp.exp()
        tokens = torch.multinomial(p, 1, generator=self.gen)
        # the same statistics the keyed sampler records (a policy for RL needs them either way)
        self.logprobs = logp.gather(-1, tokens).squeeze(-1)
        self.entropy = -(p * torch.where(p > 0, logp, torch.zeros_like(logp))).sum(-1)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(-1, tokens, 0.0)


def _prompt(policy) -> list[int]:
    text = ("Answer the question below. If you are missing some knowledge, search with <search> query </search>. "
            "Question: which river flows through the city where the author of the novel was born?")
    return initial_prompt_ids(policy.tokenizer, text)


def _time_generate(policy, batch: int, tokens: int, keyed: bool, sampling) -> float:

    prompt = _prompt(policy)
    reqs = [GenerationRequest(prompt, NoiseKey(1000 + b, 0, 0)) for b in range(batch)]
    proc = None if keyed else PlainSampler(sampling.temperature, sampling.top_p)
    t0 = time.perf_counter()
    gens = policy.generate(reqs, sampling, processor=proc)
    secs = time.perf_counter() - t0
    assert all(len(g.token_ids) == tokens for g in gens)
    return secs


def sampler_main(argv: Sequence[str]) -> int:
    """Keyed vs plain sampling: share of generation time, same model, batch and token count."""
    parser = argparse.ArgumentParser(prog="twice bench sampler", description=sampler_main.__doc__)
    parser.add_argument("--models", default="tiny,smollm2-135m", help="comma-separated models")
    parser.add_argument("--batches", default="8,32")
    parser.add_argument("--tokens", type=int, default=32, help="generated tokens per row")
    parser.add_argument("--repeats", type=int, default=3, help="alternating keyed/plain runs per setting")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads while generating (default: the policy's)")
    parser.add_argument("--quick", action="store_true", help="tiny model, batch 8, 8 tokens, 1 repeat")
    parser.add_argument("--vllm", metavar="MODEL", default=None,
                        help="also measure keyed vs plain sampling inside vLLM on MODEL (needs vLLM; "
                             "batch 8, 64 tokens, 2 repeats) and skip the transformers table when --models is ''")
    progress.add_argument(parser)
    args = parser.parse_args(argv)
    progress.apply(args)
    if args.quick:
        args.models, args.batches, args.tokens, args.repeats = "tiny", "8", 8, 1
    if args.vllm:
        code = _vllm_overhead(args.vllm, args.top_p)
        if code or not args.models:
            return code

    sampling = SamplingConfig(temperature=1.0, top_p=args.top_p, max_new_tokens=args.tokens)
    print(f"keyed vs plain sampling, {args.tokens} tokens per row, top_p {args.top_p}, "
          f"torch threads {torch.get_num_threads()}")
    print(f"{'model':14} {'batch':>5} {'vocab':>7} {'plain s':>9} {'keyed s':>9} {'wall ovh':>9} "
          f"{'sampler ovh':>12} {'keyed sampler share':>20}")
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        policy = load_policy(name)
        policy.prefix_reuse = False
        policy.eos_ids = set()  # equal token counts on both sides
        if args.threads:
            policy.num_threads = args.threads
        for batch in [int(b) for b in args.batches.split(",")]:
            _time_generate(policy, batch, args.tokens, True, sampling)  # warm-up
            plain, keyed, plain_s, keyed_s = [], [], [], []
            for _ in range(args.repeats):
                s0 = policy.stats.sampler_seconds
                plain.append(_time_generate(policy, batch, args.tokens, False, sampling))
                s1 = policy.stats.sampler_seconds
                keyed.append(_time_generate(policy, batch, args.tokens, True, sampling))
                plain_s.append(s1 - s0)
                keyed_s.append(policy.stats.sampler_seconds - s1)
            # minimum over repeats: other processes only ever add time
            p, k = min(plain), min(keyed)
            extra = min(keyed_s) - min(plain_s)
            print(f"{name:14} {batch:5d} {policy.vocab_size:7d} {p:9.3f} {k:9.3f} {100 * (k - p) / p:8.1f}% "
                  f"{100 * extra / p:11.2f}% {100 * min(keyed_s) / k:19.1f}%")
            sys.stdout.flush()
    print("wall ovh = (keyed - plain) / plain generation time (fastest of the repeats, noisy on a busy machine);\n"
          "sampler ovh = (keyed sampler time - plain sampler time) / plain generation time: the cost of the keys,\n"
          "  both samplers doing temperature, nucleus and log-probs (plain: torch.multinomial);\n"
          "keyed sampler share = time inside the keyed sampler / keyed generation time")
    return 0


def _vllm_overhead(model: str, top_p: float) -> int:
    """Runs :mod:`twice_envs.agents.bench.vllm` in a child process (vLLM engines need a main module)."""
    import json
    import os
    import subprocess

    if not available("vllm"):
        print("vLLM is not installed: pip install 'twice-envs[vllm]' (on CPU: see tests/sidecar/vllm_cpu.sh)")
        return 2

    path = str(resolve_model_dir(model))
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # the CPU backend otherwise asks for most of the machine's memory
    cmd = [sys.executable, "-m", "twice_envs.agents.bench.vllm", "--model", path, "--top-p", str(top_p)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    line = next((x for x in res.stdout.splitlines() if x.startswith("VLLM_BENCH ")), None)
    if res.returncode or line is None:
        # vLLM logs to stdout and stderr alike: show both
        print(f"vLLM benchmark failed (exit {res.returncode})\n--- stdout (tail)\n{res.stdout[-4000:]}\n"
              f"--- stderr (tail)\n{res.stderr[-4000:]}")
        return 1
    r = json.loads(line[len("VLLM_BENCH "):])
    print(f"vLLM {r['vllm']} ({r['processor']}), {model}, batch {r['batch']}, {r['tokens']} tokens per row, "
          f"top_p {top_p}:")
    print(f"  keyed requests        {', '.join(f'{x:.1f}' for x in r['keyed_tok_s'])} tokens/s")
    print(f"  no processor (plain)  {', '.join(f'{x:.1f}' for x in r['plain_tok_s'])} tokens/s")
    print(f"  keyed overhead (best of each): {r['overhead_pct']:.1f}%")
    sys.stdout.flush()
    return 0


def rollout_main(argv: Sequence[str]) -> int:
    """Rollout throughput, env vs generation time, and the twin step's cost: with and without prefix
    reuse, and with calls grouped by context length or filled in request order."""
    parser = argparse.ArgumentParser(prog="twice bench rollout", description=rollout_main.__doc__)
    parser.add_argument("--env", default="SearchQA-v0")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--env-kwargs", default="{}",
                        help="JSON object of make kwargs (over those the model was trained with)")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="2 tasks x 2, 24 tokens, 2 turns")
    progress.add_argument(parser)
    args = parser.parse_args(argv)
    progress.apply(args)
    if args.quick:
        args.tasks, args.group, args.max_new_tokens, args.max_turns = 2, 2, 24, 2
    model_dir = resolve_model_dir(args.model)
    env_kwargs = {**trained_env_kwargs(model_dir, args.env), **parse_env_kwargs(parser, args.env_kwargs)}

    policy = load_policy(args.model)
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens)
    tasks = [R.Task(i) for i in range(args.tasks)]
    R.TIMING.update(env_seconds=0.0, generate_seconds=0.0)
    t0 = time.perf_counter()
    eps = R.rollout(policy, args.env, tasks, group_size=args.group, sampling=sampling, max_turns=args.max_turns,
                    env_kwargs=env_kwargs, window=trained_window(model_dir))
    total = time.perf_counter() - t0
    n_tok = sum(e.num_generated_tokens for e in eps)
    env_s, gen_s = R.TIMING["env_seconds"], R.TIMING["generate_seconds"]
    print(f"{args.env}, model {args.model}: {len(eps)} episodes, {sum(len(e.turns) for e in eps)} turns, "
          f"{n_tok} generated tokens in {total:.2f}s")
    print(f"  throughput: {n_tok / total:.1f} generated tokens/s overall, {n_tok / max(gen_s, 1e-9):.1f} in generation")
    print(f"  time share: generation {100 * gen_s / total:.1f}%, env steps {100 * env_s / total:.1f}%, "
          f"other (prompts, records) {100 * (total - gen_s - env_s) / total:.1f}%")

    # one twin per factual turn, run three ways from the same kept prefix cache (the rollout's)
    reqs = [R.BranchRequest(i, t, branch=1) for i, e in enumerate(eps) for t in range(len(e.turns))]
    snap = policy.prefix_cache.snapshot()
    results, turns = {}, {}
    for name, reuse, by_length in (("no reuse", False, True), ("reuse, request order", True, False),
                                   ("reuse, by length", True, True)):
        policy.prefix_reuse = reuse
        policy.prefix_cache.restore(snap)
        before = (policy.stats.prefill_tokens, policy.stats.reused_tokens)
        t0 = time.perf_counter()
        twins = R.branch_rollouts(policy, eps, reqs, sampling=sampling, by_length=by_length)
        secs = time.perf_counter() - t0
        results[name] = (secs, policy.stats.prefill_tokens - before[0], policy.stats.reused_tokens - before[1],
                         sum(t.num_generated_tokens for t in twins), sum(t.self_twin for t in twins))
        turns[name] = [[t.token_ids for t in w.turns] for w in twins]
    policy.prefix_reuse = True
    print(f"  twins: {len(reqs)} coupled twins (one per factual turn), {results['no reuse'][4]} self-twins; "
          f"the same twins all three ways: {len({repr(v) for v in turns.values()}) == 1}")
    for name, (secs, pre, reused, gen, _) in results.items():
        print(f"    {name:22}: {secs:.2f}s, {pre} context tokens computed, {reused} reused, {gen} generated")
    off, order, grouped = (results[k][0] for k in ("no reuse", "reuse, request order", "reuse, by length"))
    print(f"  prefix reuse (calls by length): twin time x{grouped / off:.2f} ({100 * (1 - grouped / off):.1f}% saved), "
          f"context tokens computed x{results['reuse, by length'][1] / max(1, results['no reuse'][1]):.2f}")
    print(f"  calls grouped by context length vs request order (both with reuse): twin time x{grouped / order:.2f}")
    return 0
