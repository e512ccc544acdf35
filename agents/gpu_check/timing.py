"""Section (c): the keyed sampler's share of generation time (a measurement, no criterion).

``HFPolicy.generate`` with the keyed processor against the same loop with plain multinomial
sampling (:class:`PlainSampler`) and with greedy argmax, on the same prompts with every row
generating the same number of tokens; and one sampling step alone (:func:`sampler_step_times`).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from twice_envs import noise
from twice_envs.agents.gpu_check.context import Context
from twice_envs.agents.gpu_check.report import Section, skip
from twice_envs.agents.gpu_check.tokens import make_requests
from twice_envs.agents.sampling.policy import SamplingConfig
from twice_envs.agents.sampling.processor import force_tokens

class PlainSampler:
    """Unkeyed sampling for the timing baseline: ``softmax(logits / T)``, one multinomial draw per row."""

    def __init__(self, temperature: float = 1.0, seed: int = 0):
        self.temperature = temperature
        self.seed = seed
        self.gen = None

    def __call__(self, input_ids, scores):
        if self.gen is None or self.gen.device != scores.device:
            self.gen = torch.Generator(device=scores.device).manual_seed(self.seed)
        probs = torch.softmax(scores.float() / self.temperature, dim=-1)
        return force_tokens(scores, torch.multinomial(probs, 1, generator=self.gen)[:, 0])


def _greedy(input_ids, scores):
    return scores


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_generate(policy, requests, sampling, processor, device: str) -> tuple[float, int]:
    """Seconds of one ``policy.generate`` (synchronised) and the tokens it generated."""
    _sync(device)
    t0 = time.perf_counter()
    gens = policy.generate(requests, sampling, processor=processor)
    _sync(device)
    return time.perf_counter() - t0, sum(len(g.token_ids) for g in gens)


def time_step(fn, device: str, iters: int) -> float:
    """Median seconds of ``fn()`` over ``iters`` synchronised calls (after one warm-up)."""
    fn()
    times = []
    for _ in range(iters):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def sampler_step_times(policy, requests, sampling, device: str, iters: int) -> dict:
    """Median seconds of one sampling step alone, on random logits of the batch's shape: the keyed
    kernel (``keyed_choice``), the keyed processor's step (key rows, choice, statistics, advance),
    plain multinomial sampling and argmax."""
    logits = torch.randn(len(requests), policy.vocab_size, device=device) * 4
    proc = policy.new_processor(requests, sampling)
    rows = proc.key_rows().to(device)
    gen = torch.Generator(device=device).manual_seed(0)

    def proc_step():
        proc.advance(proc.choose(logits))

    threads = torch.get_num_threads()
    if policy.num_threads:
        torch.set_num_threads(policy.num_threads)  # as generate() runs
    try:
        return {
            "keyed_choice (kernel)": time_step(lambda: noise.keyed_choice(logits, rows), device, iters),
            "keyed processor step": time_step(proc_step, device, iters),
            "plain multinomial": time_step(
                lambda: torch.multinomial(torch.softmax(logits, -1), 1, generator=gen), device, iters),
            "argmax": time_step(lambda: logits.argmax(-1), device, iters),
        }
    finally:
        torch.set_num_threads(threads)


def section_timing(ctx: Context, sec: dict, deadline: float) -> None:
    """(c): generate() with the keyed processor against plain sampling and greedy, same lengths."""
    if not ctx.device:
        return skip(sec, "no CUDA")
    z = ctx.sizes
    dev = ctx.device
    sec["status"] = "INFO"
    sec["criterion"] = "none (measurement): keyed / plain and keyed / greedy time ratios, sampler share"
    policy = ctx.policy(dev, "float32")
    saved_eos = policy.eos_ids
    policy.eos_ids = set()  # every row generates max_new_tokens: the same lengths in every variant
    results = {"dtype": "float32", "max_new_tokens": z.c_tokens, "reps": z.c_reps, "batches": {}}
    sec["results"] = results
    try:
        for batch in z.c_batches:
            if time.monotonic() > deadline - 5:
                sec["lines"].append(f"time budget reached before batch {batch}")
                break
            requests = make_requests(ctx.tokenizer(), batch)
            keyed = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=z.c_tokens)
            keyed_p = SamplingConfig(temperature=1.0, top_p=0.95, max_new_tokens=z.c_tokens)
            variants = {"keyed": (keyed, None), "keyed top-p 0.95": (keyed_p, None),
                        "plain sampling": (keyed, PlainSampler()), "greedy": (keyed, _greedy)}
            times = {k: [] for k in variants}
            tokens = {}
            for rep in range(z.c_reps + 1):  # the first round warms up
                for name, (sampling, proc) in variants.items():
                    if hasattr(proc, "gen"):
                        proc.gen = None
                    s0 = policy.stats.sampler_seconds
                    secs, n = time_generate(policy, requests, sampling, proc, dev)
                    if rep:
                        times[name].append(secs)
                        tokens[name] = n
                        if name == "keyed":
                            results.setdefault("_sampler_s", {}).setdefault(batch, []).append(
                                (policy.stats.sampler_seconds - s0) / secs)
            med = {k: float(np.median(v)) for k, v in times.items()}
            row = {"seconds": {k: round(v, 4) for k, v in med.items()}, "tokens": tokens,
                   "tokens_per_s": {k: round(tokens[k] / med[k], 1) for k in med},
                   "keyed_over_plain": round(med["keyed"] / med["plain sampling"], 3),
                   "keyed_over_greedy": round(med["keyed"] / med["greedy"], 3),
                   "keyed_top_p_over_plain": round(med["keyed top-p 0.95"] / med["plain sampling"], 3),
                   "sampler_share_vs_greedy": round(max(0.0, (med["keyed"] - med["greedy"]) / med["keyed"]), 3)}
            step = sampler_step_times(policy, requests, keyed, dev, z.step_iters)
            row["step_ms"] = {k: round(1e3 * v, 3) for k, v in step.items()}
            results["batches"][str(batch)] = row
            sec["lines"].append(
                f"batch {batch}: generate of {z.c_tokens} tokens/row: keyed {med['keyed']:.3f} s, keyed top-p "
                f"{med['keyed top-p 0.95']:.3f} s, plain {med['plain sampling']:.3f} s, greedy {med['greedy']:.3f} s; "
                f"keyed/plain {row['keyed_over_plain']:.2f}x, keyed/greedy {row['keyed_over_greedy']:.2f}x, "
                f"sampler share {100 * row['sampler_share_vs_greedy']:.1f}%")
            sec["lines"].append("         one step: " + ", ".join(f"{k} {v:.2f} ms" for k, v in row["step_ms"].items()))
    finally:
        policy.eos_ids = saved_eos
        sampler = results.pop("_sampler_s", {})
        if sampler:
            results["policy_sampler_share"] = {str(b): round(float(np.median(v)), 3) for b, v in sampler.items()}
            sec["lines"].append("HFPolicy's own sampler timer, share of keyed generate (on CUDA it also waits for "
                                "the forward pass): " + ", ".join(f"batch {b}: {100 * v:.1f}%"
                                                                  for b, v in results["policy_sampler_share"].items()))


TIMING = Section("c", "keyed sampler's share of generation time (batch {batches})", section_timing,
                 gpu_budget_s=600, cpu_budget_s=60)
