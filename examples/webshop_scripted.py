"""WebShop in a few lines: a scripted shopper against a random one, then a fork.

    python examples/webshop_scripted.py [EPISODES]
"""

import sys

import twice_envs
from twice_envs.envs.webshop.scripted import RandomAgent, ScriptedAgent, evaluate

episodes = int(sys.argv[1]) if len(sys.argv) > 1 else 50
env = twice_envs.make("WebShop-v0", split="test")
for name, agent in (("scripted", ScriptedAgent()), ("random", RandomAgent(seed=0))):
    stats = evaluate(env, agent, seeds=range(episodes))
    print(f"{name:8s} mean reward {stats['mean_reward']:.3f}  success {stats['success_rate']:.2f}  ({episodes} episodes)")

# One episode step by step, then a fork that tries another product.
obs, info = env.reset(seed=7)
print(obs)
obs, *_ = env.step(f"search[{info['instruction']}]")
print(obs[:300], "...")
branch = env.fork(1)  # the results page, independent of env
obs, reward, done, _, info = branch.step("Thought: start over.\nAction: click[back to search]")
print("fork is back on:", info["page"], "| original still on:", env.last_info["page"])
