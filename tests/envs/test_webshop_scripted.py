"""The scripted shopper scores well above the random one on the default catalogue."""

from __future__ import annotations

import numpy as np

import twice_envs
from twice_envs.envs.webshop.scripted import (
    RandomAgent,
    ScriptedAgent,
    evaluate,
    scripted_turns,
)


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
    assert any(e[:1] == "B" and e.isupper() for e in seen)  # a product id, as shown: B0V1096J0Q
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


def test_reassigned_ids_swap_product_ids_one_to_one_and_keep_the_play_right():
    import re

    from twice_envs.agents.models.transcripts import (
        AUGMENTERS,
        scripted_agent,
        scripted_episodes,
    )
    from twice_envs.envs.mistakes import Mistake
    from twice_envs.envs.webshop.scripted import reassigned_ids

    assert scripted_agent("WebShop-v0", AUGMENTERS) is reassigned_ids
    env = twice_envs.make("WebShop-v0")
    env.reset(seed=0)
    catalogue = {env.unwrapped.res.catalogue[i].asin for i in range(len(env.unwrapped.res.catalogue))}
    episodes = scripted_episodes("WebShop-v0", 6, seed=1, skill_range=(0.5, 0.8), max_turns=6)
    copies = reassigned_ids(env, episodes, 2, np.random.default_rng(3))
    assert len(copies) == 12
    ids = re.compile(r"\b[A-Za-z0-9]{10}\b")
    changed = 0
    for k, (first, turns) in enumerate(copies):
        orig_first, orig_turns = episodes[k // 2]
        mapping = {}
        for old, new in zip([orig_first] + [t for p in orig_turns for t in p], [first] + [t for p in turns for t in p]):
            # only catalogue ids change, one to one, the same way in every text, case kept
            assert ids.sub("#", old) == ids.sub("#", new)
            for a, b in zip(ids.findall(old), ids.findall(new)):
                if a.upper() in catalogue:
                    assert b.upper() in catalogue and a.isupper() == b.isupper()
                    assert mapping.setdefault(a.upper(), b.upper()) == b.upper()
                else:
                    assert a == b
        assert len(set(mapping.values())) == len(mapping)
        changed += any(a != b for a, b in mapping.items())
        # every click names an element of the page before it; marks stay
        pages = [first] + [o for _a, o in turns]
        for (action, _o), page in zip(turns, pages):
            if action.startswith("click["):
                assert action[6:-1] in page.split(" [SEP] ")
        assert [isinstance(a, Mistake) for a, _o in turns] == [isinstance(a, Mistake) for a, _o in orig_turns]
    assert changed >= len(copies) - 1
