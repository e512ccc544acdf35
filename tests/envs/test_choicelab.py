"""ChoiceLab-v0: the env contract, its dynamics, and its refusals."""

import pytest

import twice_envs
from twice_envs.envs.choicelab.env import (
    ATTRIBUTES,
    INVALID,
    MAX_WORLD,
    ChoiceLabConfig,
    outcome,
    parse_choice,
    world,
)

TINY = {"tasks": 3, "horizon": 4, "options": 3, "attributes": 5, "per_option": 2, "seed": 1}


@pytest.mark.parametrize("kwargs", [{}, TINY])
def test_check_env(kwargs):
    env = twice_envs.make("ChoiceLab-v0", **kwargs)
    report = twice_envs.check_env(env, extra_actions=["choose 1", "choose 99999999", "#5", "choose", "7 8",
                                                      "choose ²"])
    assert not report.skipped and "fork independence" in report.passed, report


def test_dynamics_by_hand():
    c = ChoiceLabConfig(**TINY)
    w = world(c)
    env = twice_envs.make("ChoiceLab-v0", **TINY)
    obs, info = env.reset(seed=0, options={"task": 2})
    # the offers: every item's number and attribute words, in the admissible actions too
    first = [c.item(2, 0, o) for o in range(3)]
    assert info["admissible_actions"] == [f"choose {i}" for i in first] and info["task"] == 2
    words = " ".join(ATTRIBUTES[a] for a in w.attrs[2, 0, 1])
    assert f"#{first[1]} {words}" in obs and "choice 1 of 4" in obs
    right = w.right[2]
    wrong0 = (right[0] + 1) % 3
    obs, r, term, trunc, info = env.step(f"choose {c.item(2, 0, wrong0)}")
    # the observation repeats the chosen item (never whether it was right) and shows the next offers
    assert obs.startswith(f"You chose #{c.item(2, 0, wrong0)}.\nTask 2, choice 2 of 4: ") and r == 0 and not term
    assert info["choices"] == [wrong0]
    env.step(f"  CHOOSE #{c.item(2, 1, right[1])} ")  # case, spaces and '#' read
    obs, r, term, trunc, info = env.step(f"choose {c.item(2, 0, right[0])}")  # an item of an earlier choice
    assert info["invalid"] and "Choice wasted" in obs and not term
    obs, r, term, trunc, info = env.step(str(c.item(2, 3, right[3])))  # a bare number reads too
    assert term and not trunc and r == pytest.approx(2 / 4)
    assert obs == f"You chose #{c.item(2, 3, right[3])}.\nDone: 2 of 4 choices right."
    assert env.unwrapped.choices == [wrong0, right[1], INVALID, right[3]]
    assert outcome(c, 2, env.unwrapped.choices) == r


def test_the_right_item_weighs_most_and_items_name_their_choice():
    c = ChoiceLabConfig(**TINY)
    w = world(c)
    weight = w.features @ w.preference
    assert (weight.argmax(axis=-1) == w.right).all()
    assert (w.features.sum(axis=-1) == c.per_option).all()  # distinct attribute words per item
    for item in (0, 7, c.item(2, 3, 2)):
        assert c.item(*c.locate(item)) == item
    assert [parse_choice(c, t) for t in ("choose 5", "#5", "5", "choose five", "choose 5 6", "choose 36", "")] \
        == [5, 5, 5, INVALID, INVALID, INVALID, INVALID]  # 36 items: 0..35


def test_tasks_come_from_the_seed_or_the_option_and_forks_replay():
    env = twice_envs.make("ChoiceLab-v0", **TINY)
    tasks = {env.reset(seed=s)[1]["task"] for s in range(20)}
    assert tasks == {0, 1, 2}
    assert env.reset(seed=5)[1]["task"] == twice_envs.make("ChoiceLab-v0", **TINY).reset(seed=5)[1]["task"]
    env.reset(seed=0, options={"task": 1, "noise_seed": 9})
    for a in ("choose 12", "choose 16", "oops"):
        env.step(a)
    fork = env.fork(2)
    assert fork.unwrapped.task == 1 and fork.unwrapped.choices == env.unwrapped.choices[:2]
    fork.step("choose 20")
    assert env.unwrapped.choices[2] == INVALID  # the original is untouched
    replayed = twice_envs.replay(env.trajectory)
    assert replayed.trajectory.digests == env.trajectory.digests


def test_bad_settings_and_options_are_refused_by_name():
    with pytest.raises(ValueError, match="world too large.*cap"):
        ChoiceLabConfig(tasks=100_000, horizon=64, options=16, attributes=32)
    assert ChoiceLabConfig(tasks=MAX_WORLD // (16 * 8 * 32)).world_size <= MAX_WORLD  # the largest default world
    with pytest.raises(ValueError, match="per_option <= attributes"):
        ChoiceLabConfig(attributes=3, per_option=4)
    with pytest.raises(ValueError, match="options >= 2"):
        ChoiceLabConfig(options=1)
    with pytest.raises(ValueError, match="horizon must be an int"):
        ChoiceLabConfig(horizon=2.5)
    env = twice_envs.make("ChoiceLab-v0", **TINY)
    with pytest.raises(ValueError, match="'task' must be an int in 0..2"):
        env.reset(seed=0, options={"task": 3})
    with pytest.raises(ValueError, match=r"unknown ChoiceLab reset options \[.game.\]; accepted: task"):
        env.reset(seed=0, options={"game": 3})
