"""Generate with vLLM and the keyed processor; prints the token ids as JSON (run as a script: vLLM spawns workers).

``spec`` (JSON, the first argument): ``model``, ``runner`` (``"v1"`` or ``"v2"``: which model runner
the engine must use), ``max_num_seqs`` (a small value makes requests join as others leave),
``temperature``, ``top_p`` and ``requests``: each ``{"prompt": ids, "max_tokens": n, "key": [seed, turn,
branch] or null (unkeyed, greedy), "mode": key mode, "prompt_len": the turn's original prompt length or
null}``.

Model Runner V2 needs Triton. On a machine without a GPU, vLLM's CPU build expects the ``triton-cpu``
backend, which is built from source and not installable here; the engine then runs MRV2 with Triton's
interpreter (``TRITON_INTERPRET=1``, every Triton kernel executed in Python on CPU tensors) in place of
a compiled backend, and a stand-in ``cpu`` entry in Triton's backend table, which is what vLLM checks
to enable Triton on CPU. Everything else (the runner, its loader, the sampler) is vLLM's own code.

Prints ``VLLM_RUNNER v1|v2`` (what the engine's config says), ``VLLM_PROCESSORS [class names]`` (the
processor objects alive in the engine) and ``VLLM_TOKENS``.
"""

import gc
import json
import os
import sys


def use_triton_interpreter() -> None:
    """Let vLLM's CPU build run Model Runner V2 with Triton's interpreter (see the module docstring)."""
    os.environ["TRITON_INTERPRET"] = "1"
    from triton.backends import Backend, backends
    from triton.backends.compiler import BaseBackend
    from triton.backends.driver import DriverBase

    class InterpreterDriver(DriverBase):
        @classmethod
        def is_active(cls) -> bool:
            return True

        def get_current_target(self):
            raise RuntimeError("Triton's interpreter compiles nothing")

        def get_active_torch_device(self):
            import torch

            return torch.device("cpu")

        def get_benchmarker(self):
            raise RuntimeError("Triton's interpreter has no benchmarker")

        def map_python_to_cpp_type(self, ty):
            raise RuntimeError("Triton's interpreter compiles nothing")

    backends.setdefault("cpu", Backend(BaseBackend, InterpreterDriver))


def main() -> None:
    spec = json.loads(sys.argv[1])
    # in-process engine: the processor objects can be inspected afterwards
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if spec["runner"] == "v2" else "0"
    if spec["runner"] == "v2":
        import torch

        if not torch.cuda.is_available():
            use_triton_interpreter()

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from twice_envs.agents.sampling import vllm as v1
    from twice_envs.agents.sampling import vllm_v2 as v2
    from twice_envs.agents.sampling.vllm import keyed_extra_args, processor_path
    from twice_envs.keys import NoiseKey

    llm = LLM(model=spec["model"], dtype="float32", max_model_len=1024, enforce_eager=True,
              logits_processors=[processor_path()], enable_prefix_caching=False, seed=0,
              max_num_seqs=spec.get("max_num_seqs", 256))
    print("VLLM_RUNNER " + ("v2" if llm.llm_engine.vllm_config.use_v2_model_runner else "v1"), flush=True)
    params = []
    for r in spec["requests"]:
        if r["key"] is None:
            params.append(SamplingParams(max_tokens=r["max_tokens"], temperature=0.0, ignore_eos=True))
            continue
        extra = keyed_extra_args(NoiseKey(*r["key"]), temperature=spec["temperature"], top_p=spec["top_p"],
                                 key_mode=r["mode"], prompt_len=r.get("prompt_len"))
        params.append(SamplingParams(max_tokens=r["max_tokens"], temperature=1.0, top_p=1.0, top_k=0,
                                     ignore_eos=True, extra_args=extra))
    outs = llm.generate([TokensPrompt(prompt_token_ids=r["prompt"]) for r in spec["requests"]], params)
    kinds = (v1.TwiceKeyedLogitsProcessor, v2.TwiceKeyedV2LogitsProcessor)
    gc.unfreeze()  # vLLM freezes the objects made at engine start, which hides them from get_objects
    alive = sorted(type(o).__name__ for o in gc.get_objects() if isinstance(o, kinds))
    print("VLLM_PROCESSORS " + json.dumps(alive), flush=True)
    print("VLLM_TOKENS " + json.dumps([list(o.outputs[0].token_ids) for o in outs]), flush=True)


if __name__ == "__main__":
    main()
