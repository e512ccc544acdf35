"""vLLM and transformers emit the same keyed tokens for the same model, keys and contexts (up to near ties),
through each of vLLM's model runners.

One vLLM batch holds every key mode, requests of different lengths (with ``max_num_seqs=4`` they join
as others leave), turns re-sent mid-way as prompt + output so far (``twice_prompt_len``: the rest of
the turn must be the uninterrupted one) and an unkeyed greedy request (declined by the processor).
The engine loads ``TwiceKeyedProcessor`` by name; it must build
``TwiceKeyedLogitsProcessor`` in the V1 model runner and ``TwiceKeyedV2LogitsProcessor`` in Model
Runner V2. On a machine without a GPU, Model Runner V2 runs with Triton's interpreter (see
``vllm_generate.py``). Skipped when vLLM is not installed, unless ``TWICE_REQUIRE_VLLM=1`` (the sidecar
``tests/sidecar/vllm_cpu.sh`` sets it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from twice_envs._deps import available

pytestmark = pytest.mark.vllm

REQUIRED = os.environ.get("TWICE_REQUIRE_VLLM") == "1"
TAU, TOP_P, N, CUT = 1.0, 0.95, 16, 5
QUESTIONS = ["Who wrote Hamlet?", "Name a river in France.", "What is 2 + 3?", "Say hello.",
             "List three colours,\none per line.", "Count to five."]
LENGTHS = [N, 10, N, 7, N, 12]  # shorter requests leave the batch early
PROCESSOR = {"v1": "TwiceKeyedLogitsProcessor", "v2": "TwiceKeyedV2LogitsProcessor"}


@pytest.fixture(scope="module")
def reference():
    """The transformers side: the policy, the requests and their keyed (and one greedy) generations."""
    from twice_envs import noise
    from twice_envs.agents.models.load import resolve_model_dir
    from twice_envs.agents.rollout.context import initial_prompt_ids
    from twice_envs.agents.sampling.policy import GenerationRequest, HFPolicy, SamplingConfig
    from twice_envs.keys import NoiseKey

    model = os.environ.get("TWICE_VLLM_MODEL") or str(resolve_model_dir("smollm2-135m"))
    policy = HFPolicy.from_pretrained(model)
    policy.eos_ids = set()
    modes = [noise.KEY_MODES[i % 4] for i in range(len(QUESTIONS))]  # every key mode, in one vLLM batch
    reqs = [GenerationRequest(initial_prompt_ids(policy.tokenizer, q), NoiseKey(100 + i, i % 2, i % 3))
            for i, q in enumerate(QUESTIONS)]
    hf = [None] * len(reqs)
    for mode in noise.KEY_MODES:  # one transformers call per key mode; vLLM takes the mode per request
        idx = [i for i in range(len(reqs)) if modes[i] == mode]
        gens = policy.generate([reqs[i] for i in idx],
                               SamplingConfig(temperature=TAU, top_p=TOP_P, max_new_tokens=N, key_mode=mode))
        for i, g in zip(idx, gens):
            hf[i] = g.token_ids
    greedy = policy.generate([reqs[0]], SamplingConfig(max_new_tokens=N, greedy=True))[0].token_ids
    # rows: the six turns, four of them re-sent after CUT tokens (one per key mode), one greedy request
    rows = [dict(prompt=r.prompt_ids, key=list(r.noise_key[:3]), mode=modes[i], max_tokens=LENGTHS[i], src=i, skip=0)
            for i, r in enumerate(reqs)]
    rows += [dict(prompt=reqs[i].prompt_ids + hf[i][:CUT], key=list(reqs[i].noise_key[:3]), mode=modes[i],
                  max_tokens=N - CUT, prompt_len=len(reqs[i].prompt_ids), src=i, skip=CUT) for i in range(4)]
    rows.append(dict(prompt=reqs[0].prompt_ids, key=None, mode="line", max_tokens=N, src=None, skip=0))
    return dict(model=model, policy=policy, reqs=reqs, modes=modes, hf=hf, greedy=greedy, rows=rows)


def _expected(ref, row) -> list[int]:
    if row["src"] is None:
        return ref["greedy"][: row["max_tokens"]]
    return ref["hf"][row["src"]][row["skip"]: row["skip"] + row["max_tokens"]]


def _near_tie(ref, row, got: list[int]) -> bool:
    """Whether the first difference from the transformers tokens is a near tie of the scores it compares."""
    from twice_envs import noise
    from twice_envs.agents.sampling.policy import SamplingConfig

    want = _expected(ref, row)
    k = next(j for j, (a, b) in enumerate(zip(want, got)) if a != b)
    policy = ref["policy"]
    with torch.no_grad():
        logits = policy.model(input_ids=torch.tensor([row["prompt"] + want[:k]])).logits[0, -1].double()
    if row["src"] is None:
        score = logits
    else:
        src = row["src"]
        done = ref["hf"][src][: row["skip"] + k]  # the turn's tokens before this one
        proc = policy.new_processor([ref["reqs"][src]], SamplingConfig(temperature=TAU, top_p=TOP_P,
                                                                       key_mode=ref["modes"][src]))
        for t in done:
            proc.advance(torch.tensor([t]))
        s = noise.sampling_logprobs(logits[None], TAU, TOP_P)[0]
        score = s + noise.gumbel_torch(proc.key_rows(), s.numel(), dtype=torch.float64)[0]
    return abs(float(score[want[k]] - score[got[k]])) < 1e-2


@pytest.mark.skipif(not available("vllm") and not REQUIRED, reason="vLLM is not installed")
@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_vllm_and_transformers_emit_the_same_tokens(reference, runner):
    if runner == "v2" and not torch.cuda.is_available() and not available("triton"):
        pytest.skip("Model Runner V2 needs Triton (on CPU: its interpreter)")
    ref = reference
    spec = {"model": ref["model"], "runner": runner, "max_num_seqs": 4, "temperature": TAU, "top_p": TOP_P,
            "requests": [{k: r.get(k) for k in ("prompt", "key", "mode", "max_tokens", "prompt_len")}
                         for r in ref["rows"]]}
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # vLLM's CPU default (92% of node memory) fails on a shared machine
    res = subprocess.run([sys.executable, str(Path(__file__).with_name("vllm_generate.py")), json.dumps(spec)],
                         capture_output=True, text=True, timeout=1500, env=env)
    # vLLM logs to stdout as well as stderr: a failure shows both
    report = f"exit {res.returncode}\n--- stdout (tail)\n{res.stdout[-4000:]}\n--- stderr (tail)\n{res.stderr[-4000:]}"
    assert res.returncode == 0, report
    lines = {x.split(" ", 1)[0]: x.split(" ", 1)[1] for x in res.stdout.splitlines() if x.startswith("VLLM_")}
    assert {"VLLM_RUNNER", "VLLM_PROCESSORS", "VLLM_TOKENS"} <= set(lines), report
    assert lines["VLLM_RUNNER"] == runner
    built = json.loads(lines["VLLM_PROCESSORS"])
    assert built and set(built) == {PROCESSOR[runner]}, built  # the chooser built this runner's processor
    tokens = json.loads(lines["VLLM_TOKENS"])
    rows = ref["rows"]
    exact = [t == _expected(ref, r) for r, t in zip(rows, tokens)]
    print(f"{runner} ({PROCESSOR[runner]} x{len(built)}): vLLM == transformers token for token on "
          f"{sum(exact)}/{len(rows)} rows (keyed modes {ref['modes']}, 4 resumed after {CUT} tokens, 1 greedy)")
    assert [len(t) for t in tokens] == [r["max_tokens"] for r in rows]
    assert sum(exact) >= len(rows) - 1  # a near tie is rare; more than one would point to a real difference
    for r, t, ok in zip(rows, tokens, exact):
        assert ok or _near_tie(ref, r, t), (r, t, _expected(ref, r))
