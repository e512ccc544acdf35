"""The scripted shopper scores well above the random one on the default catalogue."""

from __future__ import annotations

import twice_envs
from twice_envs.envs.webshop.scripted import RandomAgent, ScriptedAgent, evaluate


def test_scripted_beats_random():
    env = twice_envs.make("WebShop-v0", split="test")
    scripted = evaluate(env, ScriptedAgent(), seeds=range(60))
    rand = evaluate(env, RandomAgent(seed=0), seeds=range(60))
    # measured: scripted ~0.96 mean / ~0.8 success, random ~0.28 / ~0.05
    assert scripted["mean_reward"] > 0.85 and scripted["success_rate"] > 0.6
    assert rand["mean_reward"] < 0.45
    assert scripted["mean_reward"] > rand["mean_reward"] + 0.4


def test_scripted_agent_buys_the_named_options():
    env = twice_envs.make("WebShop-v0")
    agent = ScriptedAgent()
    obs, info = env.reset(seed=0, options={"goal": 0})
    goal = env.goal
    done = False
    while not done:
        obs, r, term, trunc, info = env.step(agent.act(obs, info))
        done = term or trunc
    if info["reward_details"]["purchased"] == goal.asin:
        assert sorted(map(tuple, info["reward_details"]["options"])) == sorted(goal.goal_options)
