"""The keyed processor vLLM loads, and a policy on a vLLM engine that uses it.

:class:`TwiceKeyedProcessor` is the one entry point (``logits_processors=[
"twice_envs.agents.sampling.vllm_engine:TwiceKeyedProcessor"]``): whichever model runner
constructs it, it builds that runner's processor, the V1-interface one (:mod:`.vllm`)
or the V2-interface one (:mod:`.vllm_v2`), chosen by
:func:`~twice_envs.agents.sampling.vllm.engine_runner` from the engine's config.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from twice_envs._deps import require
from twice_envs.agents.sampling import vllm as v1
from twice_envs.agents.sampling import vllm_v2 as v2
from twice_envs.agents.sampling.policy import Generation
from twice_envs.agents.sampling.vllm import (
    RUNNER_NAMES,
    engine_runner,
    keyed_extra_args,
    parse_keyed_args,
    vllm_symbol,
)


def _vllm_version() -> str:
    try:
        import vllm

        return str(vllm.__version__)
    except ImportError:
        return "(not installed)"


def runner_processor_class(runner: str) -> type:
    """The processor class of model runner ``runner`` (``"v1"`` or ``"v2"``) in the installed vLLM.

    Raises ``RuntimeError`` naming the runner when this vLLM has no such interface.
    """
    if runner == "v1":
        if v1._VLLMLogitsProcessor is None:
            raise RuntimeError(f"this engine runs {RUNNER_NAMES['v1']}, but vLLM {_vllm_version()} has no V1 logits "
                               "processor interface (vllm.v1.sample.logits_processor)")
        return v1.TwiceKeyedLogitsProcessor
    if runner == "v2":
        if v2._V2Base is None:
            raise RuntimeError(f"this engine runs {RUNNER_NAMES['v2']}, but vLLM {_vllm_version()} has no V2 logits "
                               "processor interface (vllm.v1.worker.gpu.sample.logits_processor, vLLM >= 0.32): "
                               "install vLLM >= 0.32 or set VLLM_USE_V2_MODEL_RUNNER=0")
        return v2.TwiceKeyedV2LogitsProcessor
    raise ValueError(f"runner must be 'v1' or 'v2', got {runner!r}")


#: The base classes of :class:`TwiceKeyedProcessor`: every logits processor interface this vLLM has,
#: so that the loader of either runner accepts it.
PROCESSOR_BASES: tuple[type, ...] = tuple(
    b for b in (vllm_symbol("v1", "LogitsProcessor"), vllm_symbol("v2", "LogitsProcessor")) if b is not None
) or (object,)


class TwiceKeyedProcessor(*PROCESSOR_BASES):  # type: ignore[misc]
    """Keyed Gumbel sampling in vLLM, for either model runner (module level: vLLM loads it by name).

    A subclass of every processor interface the installed vLLM has, so both runners'
    loaders accept it; constructing it returns the processor of the runner that
    constructs it (:func:`~twice_envs.agents.sampling.vllm.engine_runner`:
    ``vllm_config.use_v2_model_runner``, else the constructor's arguments).
    """

    def __new__(cls, vllm_config: Any, *runner_args: Any, **runner_kwargs: Any) -> Any:
        impl = runner_processor_class(engine_runner(vllm_config, runner_args, runner_kwargs))
        # not an instance of cls, so Python does not call __init__ on it again
        return impl(vllm_config, *runner_args, **runner_kwargs)

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        parse_keyed_args(sampling_params.extra_args)


def make_vllm_processor_class(interface: Optional[str] = None) -> type:
    """The keyed processor class to pass to ``LLM(..., logits_processors=[cls])`` (needs vLLM).

    ``interface``: ``None`` (default) gives :class:`TwiceKeyedProcessor`, which serves
    either model runner; ``"v1"`` or ``"v2"`` the processor of that runner only. The
    newline table comes from the model's tokenizer, at the first keyed request.
    """
    require("vllm", "vllm", "the vLLM backend")
    if interface is None:
        return TwiceKeyedProcessor
    if interface not in ("v1", "v2"):
        raise ValueError(f"interface must be 'v1', 'v2' or None, got {interface!r}")
    try:
        return runner_processor_class(interface)
    except RuntimeError as e:
        raise ImportError(str(e)) from None


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
