"""Evaluate a chat model on a twice env with verifiers' own rollout loop (``load_environment``).

    pip install 'twice-envs[verifiers]'
    OPENAI_API_KEY=... python examples/hubs/verifiers_eval.py --base-url http://127.0.0.1:8000/v1 --model my-model

Any OpenAI-compatible endpoint serves (a local vLLM server, for one). Each task is an episode start
(a seed); each rollout plays the episode with the model's replies as actions and records its return
and digest.
"""

from __future__ import annotations

import argparse
import asyncio

from verifiers.v1.clients import ModelContext
from verifiers.v1.configs.client import EvalClientConfig

from twice_envs.integrations.verifiers_env import load_environment


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", required=True, help="an OpenAI-compatible endpoint (…/v1)")
    p.add_argument("--model", default="model")
    p.add_argument("--api-key-var", default="OPENAI_API_KEY", help="the environment variable holding the key")
    p.add_argument("--env", default="SearchToy-v0")
    p.add_argument("--tasks", type=int, default=2, help="episode starts (seeds 0..tasks-1)")
    p.add_argument("--rollouts", type=int, default=2, help="rollouts per task")
    a = p.parse_args(argv)
    env = load_environment(a.env, num_tasks=a.tasks)
    ctx = ModelContext(client=EvalClientConfig(base_url=a.base_url, api_key_var=a.api_key_var), model=a.model)

    async def evaluate():
        async with env.serving():
            return [await env.run_slot(slot, ctx) for task in env.taskset for slot in env.slots(task, a.rollouts)]

    rows = []
    for episode in asyncio.run(evaluate()):
        for trace in episode.traces:
            row = {"seed": trace.info["seed"], "turns": trace.info["turns"],
                   "return": trace.rewards["episode_return"].score, "digest": trace.info["digest"]}
            print(row)
            rows.append(row)
    return rows


if __name__ == "__main__":
    main()
