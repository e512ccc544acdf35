"""Generate with vLLM and the keyed processor; prints the token ids as JSON (run as a script: vLLM spawns workers)."""

import json
import sys


def main() -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from twice_envs.agents.sampling.vllm import keyed_extra_args
    from twice_envs.agents.sampling.vllm_engine import make_vllm_processor_class
    from twice_envs.keys import NoiseKey

    spec = json.loads(sys.argv[1])
    cls = make_vllm_processor_class()
    print("VLLM_PROCESSOR " + cls.__name__, flush=True)
    llm = LLM(model=spec["model"], dtype="float32", max_model_len=2048, enforce_eager=True,
              logits_processors=[cls], enable_prefix_caching=False, seed=0)
    params = [SamplingParams(max_tokens=spec["max_tokens"], temperature=1.0, top_p=1.0, top_k=0, ignore_eos=True,
                             extra_args=keyed_extra_args(NoiseKey(*r["key"]), temperature=spec["temperature"],
                                                         top_p=spec["top_p"], key_mode=r["mode"]))
              for r in spec["requests"]]
    outs = llm.generate([TokensPrompt(prompt_token_ids=r["prompt"]) for r in spec["requests"]], params)
    print("VLLM_TOKENS " + json.dumps([list(o.outputs[0].token_ids) for o in outs]), flush=True)


if __name__ == "__main__":
    main()
