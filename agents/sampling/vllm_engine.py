"""The keyed processor for the installed vLLM, and a policy on a vLLM engine that uses it.

:func:`make_vllm_processor_class` picks the V1-interface processor (:mod:`.vllm`) or the
V2-interface one (:mod:`.vllm_v2`) by the installed version and device.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from twice_envs._deps import require
from twice_envs.agents.sampling import vllm as v1
from twice_envs.agents.sampling.policy import Generation
from twice_envs.agents.sampling.vllm import keyed_extra_args
from twice_envs.agents.sampling.vllm_v2 import make_v2_processor_class

#: The first vLLM release whose GPU model runner (V2) takes only V2-interface processors.
V2_MIN_VERSION = (0, 32)


def uses_v2_interface(version: str, device_type: str = "cuda") -> bool:
    """Whether vLLM ``version`` on ``device_type`` runs Model Runner V2 (and needs the V2 processor).

    Model Runner V2 needs Triton on a GPU; vLLM on CPU falls back to the V1 runner.
    """
    parts = []
    for piece in version.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return device_type == "cuda" and tuple(parts) >= V2_MIN_VERSION


def make_vllm_processor_class(interface: Optional[str] = None) -> type:
    """The keyed processor class for the installed vLLM (needs vLLM).

    ``interface`` is ``"v1"``, ``"v2"`` or ``None`` (pick by the installed version and
    device: :func:`uses_v2_interface`). Pass it in ``LLM(..., logits_processors=[cls])``;
    the newline table comes from the model's tokenizer at engine start.
    """
    vllm = require("vllm", "vllm", "the vLLM backend")
    if interface is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        interface = "v2" if uses_v2_interface(vllm.__version__, device) else "v1"
    if interface == "v2":
        return make_v2_processor_class()
    if interface != "v1":
        raise ValueError(f"interface must be 'v1', 'v2' or None, got {interface!r}")
    if v1._VLLMLogitsProcessor is None:
        raise ImportError(f"vLLM {vllm.__version__} has no V1 logits processor interface "
                          "(vllm.v1.sample.logits_processor); use interface='v2'")
    return v1.TwiceKeyedLogitsProcessor


class VLLMPolicy:
    """A :class:`~twice_envs.agents.sampling.policy.Policy` on a vLLM engine with the keyed processor.

    ``model`` is ``None`` (vLLM holds the weights; train with the transformers backend).
    Log-probs are vLLM's raw log-probs of the emitted tokens, which equal the sampling
    distribution's at ``temperature = 1`` and ``top_p = 1``; ``entropy`` is not reported (0).
    Create it under ``if __name__ == "__main__":`` (vLLM starts worker processes).
    """

    def __init__(self, path: str, **engine_kwargs: Any) -> None:
        require("vllm", "vllm", "the vLLM backend")
        from transformers import AutoTokenizer
        from vllm import LLM

        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = None
        engine_kwargs.setdefault("logprobs_mode", "raw_logprobs")
        self.llm = LLM(model=path, logits_processors=[make_vllm_processor_class()], **engine_kwargs)

    def generate(self, requests: Sequence[Any], sampling: Any) -> list:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = [
            SamplingParams(
                max_tokens=sampling.max_new_tokens, temperature=0.0 if sampling.greedy else 1.0, top_p=1.0,
                stop=list(r.stop) or None, include_stop_str_in_output=True, logprobs=0,
                extra_args=None if sampling.greedy else keyed_extra_args(
                    r.noise_key, temperature=sampling.temperature, top_p=sampling.top_p, key_mode=sampling.key_mode,
                    token_counter=r.token_counter),
            )
            for r in requests
        ]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in requests], params,
                                 use_tqdm=False)
        result = []
        for o in outs:
            c = o.outputs[0]
            ids = list(c.token_ids)
            lps = [float(step[t].logprob) if step and t in step else 0.0 for t, step in zip(ids, c.logprobs or [])]
            reason = "stop" if c.finish_reason == "stop" else "length"
            result.append(Generation(c.text, ids, lps + [0.0] * (len(ids) - len(lps)), 0.0, reason))
        return result
