"""The scripted shopper scores well above the random one on the default catalogue."""

from __future__ import annotations

import numpy as np

import twice_envs
from twice_envs.envs.webshop.scripted import RandomAgent, ScriptedAgent, evaluate, scripted_turns


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


def test_clicks_are_written_as_the_page_shows_them():
    """Product ids and buttons keep the page's case (a model can copy them), and the env accepts them."""
    env = twice_envs.make("WebShop-v0")
    rng = np.random.default_rng(0)
    seen = []
    for seed in range(4):
        env.reset(seed=seed)
        done = False
        while not done:
            page = env.trajectory.observations[-1]
            action = scripted_turns(env, rng, skill=0.7)
            _obs, _r, term, trunc, info = env.step(action)
            assert not info.get("invalid"), (action, info.get("error"))
            if action.startswith("click["):
                element = action[6:-1]
                seen.append(element)
                assert element in page.split(" [SEP] "), (element, page)
            done = term or trunc
    assert any(e[:1] == "B" and e.isupper() for e in seen)  # a product id, as shown: B00000J0CW
    assert "Buy Now" in seen


def test_random_clicks_are_marked_as_mistakes_and_expert_actions_are_not():
    from twice_envs.envs.mistakes import Mistake

    env = twice_envs.make("WebShop-v0")
    env.reset(seed=1)
    rng = np.random.default_rng(0)
    first = scripted_turns(env, rng, skill=0.0)  # a search: never replaced by a mistake
    assert first.startswith("search[") and not isinstance(first, Mistake)
    env.step(first)
    assert isinstance(scripted_turns(env, rng, skill=0.0), Mistake)
    assert not isinstance(scripted_turns(env, rng, skill=1.0), Mistake)
