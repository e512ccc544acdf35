"""The cost of keyed sampling inside vLLM: keyed requests against an engine with no processor.

Run as a script (vLLM starts worker processes, so the engines are created under
``if __name__ == "__main__"``)::

    python -m twice_envs.agents.bench.vllm --model PATH [--batch 8] [--tokens 64] [--repeats 2]

``twice bench sampler --vllm PATH`` runs it. Both engines get the same settings (dtype,
context length, eager mode, no prefix caching, seed); the plain engine samples with vLLM's
own sampler at the same temperature and top-p. Every request generates exactly
``--tokens`` tokens (``ignore_eos``), so tokens/s compare like for like. Prints one
``VLLM_BENCH {json}`` line.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from typing import Optional, Sequence

from twice_envs.agents.sampling.vllm import keyed_extra_args
from twice_envs.agents.sampling.vllm_engine import make_vllm_processor_class
from twice_envs.keys import NoiseKey


def _engine(model: str, processor: Optional[type]):
    from vllm import LLM

    kwargs = dict(model=model, dtype="float32", max_model_len=1024, enforce_eager=True, enable_prefix_caching=False,
                  seed=0)
    if processor is not None:
        kwargs["logits_processors"] = [processor]
    return LLM(**kwargs)


def _prompts(batch: int) -> list[list[int]]:
    # fixed token ids (no tokenizer work in the timing); distinct per row
    return [[1 + (7 * b + i) % 400 for i in range(24)] for b in range(batch)]


def _time(llm, params, batch: int, repeats: int) -> list[float]:
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=p) for p in _prompts(batch)]
    llm.generate(prompts, params, use_tqdm=False)  # warm-up
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        secs = time.perf_counter() - t0
        rates.append(sum(len(o.outputs[0].token_ids) for o in outs) / secs)
    return rates


def measure(model: str, batch: int = 8, tokens: int = 64, repeats: int = 2, temperature: float = 1.0,
            top_p: float = 1.0) -> dict:
    """Generated tokens/s of keyed requests and of an engine without the processor (same settings)."""
    import vllm
    from vllm import SamplingParams

    cls = make_vllm_processor_class()
    keyed_params = [SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=1.0, top_p=1.0, top_k=0,
                                   extra_args=keyed_extra_args(NoiseKey(500 + b, 0, 0), temperature=temperature,
                                                               top_p=top_p))
                    for b in range(batch)]
    plain_params = SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=temperature, top_p=top_p, seed=0)
    result = {"vllm": vllm.__version__, "processor": cls.__name__, "batch": batch, "tokens": tokens}
    llm = _engine(model, cls)
    result["keyed_tok_s"] = _time(llm, keyed_params, batch, repeats)
    del llm
    gc.collect()
    llm = _engine(model, None)
    result["plain_tok_s"] = _time(llm, plain_params, batch, repeats)
    del llm
    gc.collect()
    # best of the repeats: other processes only ever slow a run down
    k, p = max(result["keyed_tok_s"]), max(result["plain_tok_s"])
    result["overhead_pct"] = 100.0 * (p - k) / p
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m twice_envs.agents.bench.vllm", description=measure.__doc__)
    parser.add_argument("--model", required=True, help="a local Hugging Face model directory")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--top-p", type=float, default=1.0)
    args = parser.parse_args(argv)
    res = measure(args.model, args.batch, args.tokens, args.repeats, top_p=args.top_p)
    print("VLLM_BENCH " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
