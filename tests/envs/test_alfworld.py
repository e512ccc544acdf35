"""ALFWorld-v0: observations, admissible commands, options, rewards and bad input."""

from __future__ import annotations

import json
import sys

import pytest

import twice_envs
from twice_envs.errors import DataFormatError, MissingExtra, TwiceError

pytest.importorskip("alfworld")
pytest.importorskip("fast_downward")

from twice_envs.envs.alfworld.env import parse_action  # noqa: E402
from twice_envs.envs.alfworld.games import TASK_TYPES, list_games  # noqa: E402


@pytest.fixture(scope="module")
def env():
    e = twice_envs.make("ALFWorld-v0")
    yield e
    e.close()


def test_first_observation_is_alfworlds_with_the_task(env):
    obs, info = env.reset(seed=0)
    assert obs.startswith("-= Welcome to TextWorld, ALFRED! =-")
    assert "You are in the middle of a room. Looking quickly around you, you see" in obs
    assert obs.rstrip().endswith(f"Your task is to: {info['goal']}.")
    assert info["admissible_actions"] == sorted(info["admissible_actions"])
    assert {"look", "inventory"} <= set(info["admissible_actions"])
    assert any(a.startswith("go to ") for a in info["admissible_actions"])
    assert info["won"] is False and info["task_type"] in TASK_TYPES


def test_games_are_sorted_and_chosen_deterministically(env):
    assert env.games == sorted(env.games) and len(env.games) >= 12
    picks = [env.reset(seed=s)[1]["game"] for s in range(8)]
    again = [env.reset(seed=s)[1]["game"] for s in range(8)]
    assert picks == again and len(set(picks)) > 1
    name = env.games[3]
    assert env.reset(seed=99, options={"index": 3})[1]["game"] == name
    assert env.reset(seed=5, options={"game": name})[1]["game"] == name
    with pytest.raises(ValueError, match="index"):
        env.reset(seed=0, options={"index": len(env.games)})
    with pytest.raises(ValueError, match="Did you mean"):
        env.reset(seed=0, options={"game": name[:-1] + "x"})
    with pytest.raises(ValueError, match="unknown ALFWorld reset options"):
        env.reset(seed=0, options={"split": "train"})


def test_walkthrough_wins_with_reward_and_raw_turns(env):
    obs, info = env.reset(seed=0, options={"index": 0})
    walkthrough = list(env.game.walkthrough)
    for i, command in enumerate(walkthrough):
        turn = f"<think>next: {command}</think>\n<action> {command.upper()} </action>" if i % 2 else command + "."
        obs, reward, terminated, truncated, info = env.step(turn)
        assert not info["invalid"], (turn, obs)
        last = i == len(walkthrough) - 1
        assert terminated is last and info["won"] is last
        assert reward == (1.0 if last else 0.0)
    assert env.done


def test_reward_scale_and_max_turns():
    e = twice_envs.make("ALFWorld-v0", reward_scale=10, max_turns=3)
    e.reset(seed=0, options={"index": 0})
    walkthrough = list(e.game.walkthrough)
    for command in walkthrough[:2]:
        e.step(command)
    _, _, terminated, truncated, _ = e.step("look")
    assert truncated and not terminated  # three turns, goal not reached
    e2 = twice_envs.make("ALFWorld-v0", reward_scale=10)
    e2.reset(seed=0, options={"index": 0})
    rewards = [e2.step(c)[1] for c in walkthrough]
    assert rewards[-1] == 10.0 and sum(rewards) == 10.0
    with pytest.raises(ValueError, match="reward_scale"):
        twice_envs.make("ALFWorld-v0", reward_scale=0)


def test_invalid_commands_change_nothing_and_are_flagged(env):
    obs0, info0 = env.reset(seed=1)
    for bad in ["dance", "", "<action>fly to the moon</action>", "go to the moon 9", "x" * 50000, "\x00"]:
        obs, reward, terminated, truncated, info = env.step(bad)
        assert obs == "Nothing happens." and reward == 0.0 and not terminated
        assert info["invalid"] is True
        assert info["admissible_actions"] == info0["admissible_actions"]
    obs, _, _, _, info = env.step("look")
    assert info["invalid"] is False and obs.startswith("You are in the middle of a room")


def test_parse_action():
    assert parse_action("<action>go to fridge 1</action>") == "go to fridge 1"
    assert parse_action("I think <ACTION>Open  Fridge 1.</ACTION> then more <action>x</action>") == "open fridge 1"
    assert parse_action("<action>take apple 1 from countertop 1") == "take apple 1 from countertop 1"
    assert parse_action("  look \n") == "look"
    assert len(parse_action("a" * 10**6)) <= 300


def test_task_type_variants_and_selection():
    for env_id, task in [("ALFWorld-Heat-v0", "pick_heat_then_place_in_recep"), ("ALFWorld-Look-v0", "look_at_obj_in_light")]:
        e = twice_envs.make(env_id)
        assert {e.reset(seed=s)[1]["task_type"] for s in range(4)} == {task}
    e = twice_envs.make("ALFWorld-v0", task_types=[2, "pick_two_obj_and_place"], split="valid_unseen")
    assert {n.split("-")[0] for n in e.games} == {"look_at_obj_in_light", "pick_two_obj_and_place"}
    with pytest.raises(ValueError, match="Did you mean 'pick_and_place_simple'"):
        twice_envs.make("ALFWorld-v0", task_types=["pick_and_place_simpel"])
    with pytest.raises(ValueError, match="ids are 1-6"):
        twice_envs.make("ALFWorld-v0", task_types=[7])
    with pytest.raises(ValueError, match="split"):
        twice_envs.make("ALFWorld-v0", split="test")


def _real_layout(root, games: dict) -> None:
    """Write games in the layout alfworld-download produces."""
    for rel, content in games.items():
        d = root / "json_2.1.1" / "train" / rel
        d.mkdir(parents=True)
        (d / "game.tw-pddl").write_text(content)
        (d / "traj_data.json").write_text(json.dumps({"task_type": rel.split("-")[0], "pddl_params": {}}))


def test_real_data_layout_is_discovered_sorted_and_played(tmp_path, monkeypatch):
    monkeypatch.setenv("TWICE_CACHE", str(tmp_path / "cache"))
    bundled = twice_envs.make("ALFWorld-v0", task_types=["pick_and_place_simple"])
    bundled.reset(seed=0, options={"index": 0})
    game = bundled.game.as_json()
    _real_layout(
        tmp_path,
        {
            "pick_and_place_simple-Mug-None-Shelf-2/trial_B": json.dumps(game),
            "pick_and_place_simple-Mug-None-Shelf-2/trial_A": json.dumps(game),
            "pick_and_place_simple-Mug-None-Shelf-2/trial_C": json.dumps({**game, "solvable": False}),
            "pick_heat_then_place_in_recep-Egg-None-Fridge-1/trial_Z": json.dumps(game),
            "pick_and_place_simple-Apple-Sliced-Fridge-1/trial_S": json.dumps(game),
        },
    )
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    e = twice_envs.make("ALFWorld-v0", data_dir="$ALFWORLD_DATA", task_types=[1])
    assert e.games == ["pick_and_place_simple-Mug-None-Shelf-2/trial_A", "pick_and_place_simple-Mug-None-Shelf-2/trial_B"]
    obs, info = e.reset(seed=0, options={"index": 1})
    assert info["goal"] == bundled.game.goal and info["task_type"] == "pick_and_place_simple"
    for command in bundled.game.walkthrough:
        _, reward, terminated, _, _ = e.step(command)
    assert terminated and reward == 1.0
    assert len(list_games(str(tmp_path), "train", TASK_TYPES)) == 3  # heat game included
    assert len(list((tmp_path / "cache" / "alfworld" / "index").glob("*.json"))) == 1  # the index is cached on disk


def test_bad_data_gives_one_clear_error_each(tmp_path, monkeypatch):
    monkeypatch.setenv("TWICE_CACHE", str(tmp_path / "cache"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataFormatError, match="no ALFWorld games.*alfworld-download"):
        twice_envs.make("ALFWorld-v0", data_dir=str(tmp_path / "empty"))
    with pytest.raises(TwiceError, match="is not a folder"):
        twice_envs.make("ALFWorld-v0", data_dir=str(tmp_path / "nope"))
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    with pytest.raises(TwiceError, match="ALFWORLD_DATA.*alfworld-download"):
        twice_envs.make("ALFWorld-v0", data_dir="$ALFWORLD_DATA")
    bad = tmp_path / "bad"
    _real_layout(bad, {"pick_and_place_simple-X-None-Y-1/trial_1": '{"pddl_domain": "(define",\n  oops'})
    with pytest.raises(DataFormatError, match=r"game.tw-pddl:2: not valid JSON"):
        twice_envs.make("ALFWorld-v0", data_dir=str(bad))
    other = tmp_path / "other"
    _real_layout(other, {"pick_and_place_simple-X-None-Y-1/trial_1": json.dumps({"grammar": "g"})})
    e = twice_envs.make("ALFWorld-v0", data_dir=str(other))
    with pytest.raises(DataFormatError, match="missing or empty 'pddl_domain'"):
        e.reset(seed=0)
    with pytest.raises(DataFormatError, match="no games of task type"):
        twice_envs.make("ALFWorld-v0", data_dir=str(other), task_types=["pick_two_obj_and_place"])


def test_missing_extra_names_the_pip_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "alfworld", None)
    with pytest.raises(MissingExtra, match=r"pip install 'twice-envs\[alfworld\]'"):
        twice_envs.make("ALFWorld-v0")


def test_forks_reuse_pooled_engines(env):
    from twice_envs.envs.alfworld.engine import POOL

    env.reset(seed=2)
    for command in env.game.walkthrough[:3]:
        env.step(command)
    first = env.fork(2)
    del first  # its engine goes back to the pool
    created = POOL.created
    for t in (0, 1, 3):
        child = env.fork(t)
        assert child.trajectory.digests == env.trajectory.digests[: t + 1]
        del child
    assert POOL.created == created  # no new library copies, no re-parsing


@pytest.mark.parametrize(
    "field, garbage",
    [
        ("pddl_problem", "(define (problem garbage) oops ((("),
        ("pddl_domain", "garbage ))) ("),
        ("grammar", "{not a grammar"),
    ],
)
def test_garbage_pddl_is_a_data_error_naming_the_file(tmp_path, monkeypatch, field, garbage):
    monkeypatch.setenv("TWICE_CACHE", str(tmp_path / "cache"))
    bundled = twice_envs.make("ALFWorld-v0", task_types=["pick_and_place_simple"])
    bundled.reset(seed=0, options={"index": 0})
    rel = "pick_and_place_simple-X-None-Y-1/trial_1"
    _real_layout(tmp_path, {rel: json.dumps({**bundled.game.as_json(), field: garbage})})
    e = twice_envs.make("ALFWorld-v0", data_dir=str(tmp_path))
    with pytest.raises(DataFormatError, match=rf"{rel}/game.tw-pddl: the engine cannot load this game"):
        e.reset(seed=0)
    # the env is usable again with a good game
    e2 = twice_envs.make("ALFWorld-v0", task_types=["pick_and_place_simple"])
    assert e2.reset(seed=0, options={"index": 0})[0] == bundled.trajectory.observations[0]


def test_a_missing_split_folder_never_serves_another_split(tmp_path, monkeypatch):
    monkeypatch.setenv("TWICE_CACHE", str(tmp_path / "cache"))
    bundled = twice_envs.make("ALFWorld-v0", task_types=["pick_and_place_simple"])
    bundled.reset(seed=0, options={"index": 0})
    game = json.dumps(bundled.game.as_json())
    d = tmp_path / "json_2.1.1" / "valid_seen" / "pick_and_place_simple-X-None-Y-1" / "trial_1"
    d.mkdir(parents=True)
    (d / "game.tw-pddl").write_text(game)
    assert len(twice_envs.make("ALFWorld-v0", data_dir=str(tmp_path), split="valid_seen").games) == 1
    for split in ("train", "valid_unseen"):
        with pytest.raises(DataFormatError, match=rf"no '{split}' split folder here \(it holds valid_seen\)"):
            twice_envs.make("ALFWorld-v0", data_dir=str(tmp_path), split=split)
    split_dir = str(tmp_path / "json_2.1.1" / "valid_seen")
    assert len(twice_envs.make("ALFWorld-v0", data_dir=split_dir, split="valid_seen").games) == 1
    with pytest.raises(DataFormatError, match="this is the 'valid_seen' split folder, but split='train'"):
        twice_envs.make("ALFWorld-v0", data_dir=split_dir, split="train")


@pytest.mark.parametrize("shape", ["<action>", "<action", "<ACTION>a</action>"])
def test_parse_action_takes_linear_time(shape):
    from tests.envs._timing import growth
    from twice_envs.envs.alfworld.env import parse_action

    assert growth(parse_action, shape) < 20  # 8x the input: linear ~8, quadratic ~64


@pytest.mark.parametrize("data_dir", ["", "   ", "$TWICE_EMPTY_DATA"])
def test_an_empty_data_dir_is_refused_not_read_as_the_current_folder(tmp_path, monkeypatch, data_dir):
    monkeypatch.setenv("TWICE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TWICE_EMPTY_DATA", "")
    bundled = twice_envs.make("ALFWorld-v0", task_types=["pick_and_place_simple"])
    bundled.reset(seed=0, options={"index": 0})
    # the current folder holds games: an empty data_dir must not pick them up
    _real_layout(tmp_path, {"pick_and_place_simple-X-None-Y-1/trial_1": json.dumps(bundled.game.as_json())})
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"ALFWorld data_dir .* is empty.*data_dir=None for the bundled games"):
        twice_envs.make("ALFWorld-v0", data_dir=data_dir)
    with pytest.raises(ValueError, match=r"ALFWorld data_dir .* is empty"):
        list_games(data_dir, "train", TASK_TYPES)


@pytest.mark.parametrize("data_dir", [5, ["/data"]])
def test_a_data_dir_that_is_not_a_string_is_refused(data_dir):
    with pytest.raises(ValueError, match="ALFWorld data_dir must be a folder path as a string"):
        twice_envs.make("ALFWorld-v0", data_dir=data_dir)
