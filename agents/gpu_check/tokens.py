"""Section (b): the keyed sampler emits the same tokens on the device as on the CPU.

:class:`~twice_envs.agents.sampling.policy.HFPolicy` generates the same rows on the CPU in fp32
and on the device in fp32 and bf16, in all four key modes and greedy. In fp32 the tokens must be
identical, except at a position where the two tokens' values are within :data:`TIE_FACTOR` times
the CPU/device logit difference of each other (float error, :func:`explain_divergence`); bf16 is
measured against the CPU's fp32 tokens (the share of identical tokens, each row's first divergence).
"""

from __future__ import annotations

import time

import torch

from twice_envs import noise
from twice_envs.agents.gpu_check.context import Context
from twice_envs.agents.gpu_check.report import Section, skip, worst
from twice_envs.agents.rollout.context import initial_prompt_ids
from twice_envs.agents.sampling.policy import GenerationRequest, SamplingConfig
from twice_envs.keys import NoiseKey

#: First observations of the prompts (chat template applied), in the style of the envs.
PROMPT_TEXTS = (
    ("You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a countertop 1, "
     "a fridge 1 and a sinkbasin 1.\nYour task is to: put a clean apple in the fridge."),
    ("Question: Who founded the company that built the first practical telephone exchange?\n"
     "Answer with <search> query </search> or <answer> text </answer>."),
    "WebShop\nInstruction: i need a pair of waterproof hiking boots for men, size 10, under 80 dollars.\n[Search]",
    ("You arrive at a kitchen. You see a drawer 2, a microwave 1, a stoveburner 3 and a toaster 1.\n"
     "Your task is to: heat some egg and put it in the garbagecan."),
    "Write three short lines about the sea, one per line.",
    ("Question: In which year did the river port named in the passage open?\nPassage: The port opened in 1887 "
     "after the canal was dug."),
    "List the admissible actions you would try first, one per line:\ngo to cabinet 1\nopen drawer 2\nlook",
    "Summarise in one sentence: the search returned two pages, neither naming the founder.",
)
#: Episode seeds of the rows (edge values included).
ROW_SEEDS = (0, 1, (1 << 32) - 1, 1 << 32, 1 << 63, (1 << 64) - 1, 12345, 987654321987)


def make_requests(tokenizer, n: int, *, offset: int = 0):
    """``n`` generation requests: the prompt texts in turn, each row with its own key base."""
    out = []
    for i in range(offset, offset + n):
        ids = initial_prompt_ids(tokenizer, PROMPT_TEXTS[i % len(PROMPT_TEXTS)])
        key = NoiseKey(ROW_SEEDS[i % len(ROW_SEEDS)] ^ (i // len(ROW_SEEDS)), i % 5, i % 3)
        out.append(GenerationRequest(prompt_ids=ids, noise_key=key, stop=(), token_counter=17 * i))
    return out


def compare_rows(ref: list, got: list) -> dict:
    """Token agreement of two generations of the same rows: per row the first position where they
    differ (None: identical), and the share of tokens before the first divergence."""
    first, same, total = [], 0, 0
    for a, b in zip(ref, got):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if n is None and len(a) != len(b):
            n = min(len(a), len(b))
        first.append(n)
        same += len(a) if n is None else n
        total += len(a)
    return {"rows": len(first), "rows_identical": sum(f is None for f in first), "tokens": total,
            "tokens_identical": same, "share_identical": round(same / total, 4) if total else 1.0,
            "first_divergence": first}


def _last_logits(policy, ids: list):
    with torch.no_grad():
        x = torch.tensor([ids], dtype=torch.long, device=policy.device)
        return policy.model(input_ids=x).logits[0, -1].double().cpu()


#: A divergence is float error when the two tokens' values differ by at most this many times the
#: largest CPU/device logit difference (over the temperature). The difference is measured on the
#: common context fed as one row, the generation ran it batched and cached: hence the margin.
TIE_FACTOR = 4.0


def _mass_before(logits, temperature: float, token: int) -> float:
    """Share of the probability mass ranked before ``token`` (the quantity the nucleus compares with top_p)."""
    s = logits.double() / temperature
    p = torch.softmax(s, -1)
    ahead = (s > s[token]) | ((s == s[token]) & (torch.arange(s.numel()) < token))
    return float(p[ahead].sum())


def explain_divergence(ref_policy, dev_policy, request, sampling, ref_tokens: list, dev_tokens: list,
                       pos: int) -> dict:
    """Why two devices' tokens differ at ``pos``: recompute the logits of the common context on
    both, and the gap between the two tokens' values (``s + g`` for keyed sampling, the logit for
    greedy) on the reference. The divergence is float error when the gap is within
    :data:`TIE_FACTOR` times the devices' largest logit difference over the temperature, or when
    a token that one side's nucleus left out sits at the nucleus boundary (the mass ranked before
    it is that close to top_p)."""
    ctx = list(request.prompt_ids) + list(ref_tokens[:pos])
    lr, ld = _last_logits(ref_policy, ctx), _last_logits(dev_policy, ctx)
    err = float((lr - ld).abs().max())
    a = ref_tokens[pos] if pos < len(ref_tokens) else None
    b = dev_tokens[pos] if pos < len(dev_tokens) else None
    rec = {"pos": pos, "ref_token": a, "dev_token": b, "logit_diff_max": err}
    if a is None or b is None:
        rec.update(gap=None, explained=False, note="one side ended (EOS) earlier")
        return rec
    tau = float(sampling.temperature)
    if sampling.greedy:
        gap = float(lr[a] - lr[b])
        in_nucleus = True
    else:
        proc = ref_policy.new_processor([request], sampling)
        for tok in ref_tokens[:pos]:
            proc.advance(torch.tensor([tok]))
        g = noise.gumbel_torch(proc.key_rows(), lr.shape[0], dtype=torch.float64)[0]
        v = lr / tau + g
        gap = float(v[a] - v[b])
        mask = noise.nucleus_mask(lr[None], tau, sampling.top_p)[0]
        in_nucleus = bool(mask[a]) and bool(mask[b])
    tol = TIE_FACTOR * err / tau + 1e-9
    explained = abs(gap) <= tol
    rec.update(gap=gap, tolerance=tol, both_in_nucleus=in_nucleus)
    if not in_nucleus:
        out = b if not bool(mask[b]) else a
        before = _mass_before(lr, tau, out)
        rec["mass_before_outside_token"] = before
        explained = abs(before - sampling.top_p) <= tol  # the mass moves by about the logit error
        rec["note"] = (f"token {out} outside the CPU's nucleus, mass before it {before:.6f} vs top_p {sampling.top_p}")
    rec["explained"] = explained
    return rec


def section_tokens(ctx: Context, sec: dict, deadline: float) -> None:
    """(b): the keyed sampler's tokens on the device (fp32, bf16) against the CPU in fp32."""
    if not ctx.device:
        return skip(sec, "no CUDA")
    z = ctx.sizes
    sec["criterion"] = (f"fp32: tokens identical to the CPU's, except where the two tokens' values at the first "
                        f"divergence are within {TIE_FACTOR:g}x the CPU/device logit difference (float error); bf16: "
                        "measured against the CPU's fp32 tokens (share identical, first divergence), no criterion")
    sec["results"]["model"] = dict(ctx.model_info)
    cpu = ctx.policy("cpu", "float32")
    requests = make_requests(ctx.tokenizer(), z.b_batch)
    sec["results"]["prompt_tokens"] = [len(r.prompt_ids) for r in requests]
    runs = [(m, False) for m in noise.KEY_MODES] + [("line", True)]
    sec["results"]["sampling"] = {"temperature": 1.0, "top_p": 0.95, "max_new_tokens": z.b_tokens}
    by = {"float32": {}, "bfloat16": {}}
    statuses = []
    for mode, greedy in runs:
        name = "greedy" if greedy else mode
        if time.monotonic() > deadline - 10:
            sec["lines"].append(f"time budget reached before {name}")
            statuses.append("FAIL")
            break
        sampling = SamplingConfig(temperature=1.0, top_p=0.95, max_new_tokens=z.b_tokens, key_mode=mode,
                                  greedy=greedy)
        ref = [g.token_ids for g in cpu.generate(requests, sampling)]
        for dtype in ("float32", "bfloat16"):
            dev = ctx.policy(ctx.device, dtype)
            got = [g.token_ids for g in dev.generate(requests, sampling)]
            cmp = compare_rows(ref, got)
            if dtype == "float32":
                cmp["divergences"] = [explain_divergence(cpu, dev, requests[i], sampling, ref[i], got[i], p)
                                      for i, p in enumerate(cmp["first_divergence"]) if p is not None]
                ok = all(d["explained"] for d in cmp["divergences"])
                cmp["status"] = "PASS" if ok else "FAIL"
                statuses.append(cmp["status"])
            by[dtype][name] = cmp
            line = (f"{name:<7} {dtype:<8} {cmp['tokens_identical']}/{cmp['tokens']} tokens identical "
                    f"({100 * cmp['share_identical']:.1f}%), {cmp['rows_identical']}/{cmp['rows']} rows; first "
                    f"divergence {cmp['first_divergence']}")
            if dtype == "float32":
                line += f"  {cmp['status']}"
                for d in cmp["divergences"]:
                    why = "float error" if d["explained"] else "NOT explained"
                    note = f" ({d['note']})" if d.get("note") else ""
                    line += (f"\n          pos {d['pos']}: {d['ref_token']} vs {d['dev_token']}, gap {d['gap']}, "
                             f"logit diff {d['logit_diff_max']:.2e} -> {why}{note}")
            sec["lines"].append(line)
    sec["results"]["fp32_vs_cpu_fp32"] = by["float32"]
    sec["results"]["bf16_vs_cpu_fp32"] = by["bfloat16"]
    if by["bfloat16"]:
        tot = sum(c["tokens"] for c in by["bfloat16"].values())
        same = sum(c["tokens_identical"] for c in by["bfloat16"].values())
        sec["results"]["bf16_share_identical"] = round(same / tot, 4) if tot else 1.0
        sec["lines"].append(f"bf16 overall: {same}/{tot} tokens identical to the CPU's fp32 tokens")
    sec["status"] = worst(statuses) if statuses else "FAIL"


TOKENS = Section("b", "keyed sampler (HFPolicy): device tokens vs CPU fp32, all key modes, fp32 and bf16",
                 section_tokens, gpu_budget_s=600, cpu_budget_s=120)
