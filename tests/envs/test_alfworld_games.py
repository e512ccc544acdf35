"""Bundled ALFWorld games: each is solved by its walkthrough in the real engine and by the expert;
the engine's parse caches change nothing; the generator is deterministic."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("alfworld")
pytest.importorskip("fast_downward")

import twice_envs  # noqa: E402
from twice_envs.envs.alfworld.engine import POOL, PlannerTimeout  # noqa: E402
from twice_envs.envs.alfworld.expert import ALFWorldExpert, ExpertError, solve  # noqa: E402
from twice_envs.envs.alfworld.games import (  # noqa: E402
    BUNDLED_DIR,
    SPLITS,
    TASK_TYPES,
    list_games,
    load_game,
)

ENTRIES = [e for split in SPLITS for e in list_games(None, split, TASK_TYPES)]


def test_bundled_set_covers_every_task_type_and_split():
    assert len(ENTRIES) == len({e.path for e in ENTRIES}) >= 36
    for split in SPLITS:
        assert {e.task_type for e in list_games(None, split, TASK_TYPES)} == set(TASK_TYPES)
    layouts = {json.loads(Path(e.path).read_text())["layout"] for e in ENTRIES}
    assert len(layouts) >= 4
    # only authored content is stored: no engine domain or grammar in the package
    for e in ENTRIES:
        stored = json.loads(Path(e.path).read_text())
        assert "pddl_domain" not in stored and "grammar" not in stored
        assert "(:domain alfred)" in stored["pddl_problem"]


@pytest.mark.slow
def test_every_bundled_walkthrough_wins_in_the_engine():
    for entry in ENTRIES:
        game = load_game(entry)
        engine = POOL.acquire(game)
        try:
            obs = engine.reset()
            assert f"Your task is to: {game.goal}." in obs
            assert not engine.won
            for i, command in enumerate(game.walkthrough):
                assert command in engine.admissible, (entry.name, command)
                engine.step(command)
                assert engine.won == (i == len(game.walkthrough) - 1), (entry.name, i)
        finally:
            POOL.release(engine)


@pytest.mark.slow
def test_every_bundled_game_is_solved_by_the_expert():
    expert = ALFWorldExpert(timeout_s=30)
    for split in SPLITS:
        env = twice_envs.make("ALFWorld-v0", split=split)
        for i, name in enumerate(env.games):
            assert solve(env, seed=0, options={"index": i}, expert=expert), (split, name)
            assert env.turn <= len(env.game.walkthrough) + 2
    expert.close()


def test_expert_recovers_after_a_detour_and_refuses_when_done():
    env = twice_envs.make("ALFWorld-v0")
    env.reset(seed=0, options={"index": 2})
    expert = ALFWorldExpert()
    first = expert.act(env)
    assert first == env.game.walkthrough[0] or first.startswith("go to ")
    others = [a for a in env.last_info["admissible_actions"] if a.startswith("go to ") and a != first]
    env.step(others[0])  # leave the plan
    env.step("dance")  # an invalid command changes nothing
    while not env.done:
        env.step(expert.act(env))
    assert env.last_info["won"] and expert.plans_made >= 2
    with pytest.raises(ExpertError, match="already holds"):
        expert.act(env)


def test_planner_timeout_is_bounded_and_abandons_the_engine(monkeypatch):
    import time

    env = twice_envs.make("ALFWorld-v0")
    env.reset(seed=0)
    expert = ALFWorldExpert(timeout_s=0.2)
    expert.act(env)  # load the expert's engine
    engine = expert._engine
    expert._plan = []
    monkeypatch.setattr(type(engine._env._pddl_state), "replan", lambda self, infos: time.sleep(3) or [])
    start = time.monotonic()
    with pytest.raises(PlannerTimeout, match="within 0.2 s"):
        expert.act(env)
    assert time.monotonic() - start < 2.0
    assert engine.poisoned and expert._engine is None
    POOL.release(engine)
    assert engine not in POOL._idle


_PLAIN_SCRIPT = """
import json, sys
from twice_envs.envs.alfworld import engine
engine.plain_engine()
from twice_envs.envs.alfworld.games import list_games, load_game, TASK_TYPES
out = []
for name, commands in json.loads(sys.stdin.read()):
    entry = next(e for e in list_games(None, "train", TASK_TYPES) if e.name == name)
    eng = engine.Engine(); eng.load(load_game(entry))
    rows = [(eng.reset(), eng.admissible, eng.won)]
    for c in commands:
        rows.append((eng.step(c), eng.admissible, eng.won))
    out.append(rows)
print(json.dumps(out))
"""


@pytest.mark.slow
def test_cached_engine_equals_the_plain_engine():
    """The parse and translation caches give the same text and commands as the untouched engine."""
    picks = {}
    for e in list_games(None, "train", TASK_TYPES):
        picks.setdefault(e.task_type, e.name)
    script = []
    ours = []
    for name in picks.values():
        env = twice_envs.make("ALFWorld-v0")
        env.reset(seed=0, options={"game": name})
        walk = list(env.game.walkthrough)
        commands = ["look", "inventory", walk[0], "examine " + walk[0][6:], *walk[1:]]
        rows = [(env.trajectory.observations[0], env.last_info["admissible_actions"], False)]
        for c in commands:
            obs, _, _, _, info = env.step(c)
            rows.append((obs, info["admissible_actions"], info["won"]))
        script.append((name, commands))
        ours.append(rows)
    proc = subprocess.run([sys.executable, "-c", _PLAIN_SCRIPT], input=json.dumps(script), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    plain = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [[list(r) for r in rows] for rows in ours] == plain


def test_generator_is_deterministic_and_matches_the_bundled_file():
    from twice_envs.envs.alfworld.generator import make_game

    path = BUNDLED_DIR / "valid_unseen" / "pick_heat_then_place_in_recep-kitchen_b-valid_unseen-0.json"
    assert make_game("pick_heat_then_place_in_recep", "kitchen_b", "valid_unseen", 0) == json.loads(path.read_text())


@pytest.mark.slow
def test_alfworlds_handcoded_expert_solves_the_single_object_tasks_deterministically():
    from twice_envs.envs.alfworld.expert import HandcodedExpert

    env = twice_envs.make("ALFWorld-v0", task_types=[1, 2, 3, 4, 5])  # pick_two is beyond it in 50 turns
    runs = []
    for i, name in enumerate(env.games):
        assert solve(env, seed=0, options={"index": i}, expert=HandcodedExpert(seed=1)), name
        runs.append(list(env.trajectory.actions))
    # same seeds, same choices (its random tie-breaks are seeded)
    solve(env, seed=0, options={"index": 1}, expert=HandcodedExpert(seed=1))
    assert list(env.trajectory.actions) == runs[1]


def test_a_generated_training_set_is_played_through_data_dir(tmp_path):
    from twice_envs.envs.alfworld.generator import TASK_LAYOUTS, generate, main

    assert main(["--out", str(tmp_path), "--split", "train", "--count", "1"]) == 0
    files = sorted((tmp_path / "train").glob("*.json"))
    assert len(files) == sum(len(seen) for seen, _ in TASK_LAYOUTS.values())
    # train games use only the rooms of the train split, never the held-out valid_unseen rooms
    unseen = {u for _, us in TASK_LAYOUTS.values() for u in us}
    assert not any(f.stem.split("-")[1] in unseen for f in files)
    first = files[0].read_text()
    # keep_existing leaves a cached file alone; without it the file is rewritten
    files[0].write_text(first.replace('"walkthrough"', '"walkthrough" ', 1))
    generate(tmp_path, {"train": 1}, keep_existing=True)
    assert files[0].read_text() != first
    generate(tmp_path, {"train": 1})
    assert files[0].read_text() == first
    env = twice_envs.make("ALFWorld-v0", data_dir=str(tmp_path))
    assert env.unwrapped.games == [f.stem for f in files]
    game = json.loads(first)
    env.reset(seed=0, options={"index": 0})
    for command in game["walkthrough"]:
        _, reward, term, _, _ = env.step(command)
    assert term and reward == 1.0
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--count", "2"])  # --count needs --split


def test_drawn_rooms_are_deterministic_varied_and_never_a_held_out_room(monkeypatch):
    from twice_envs.envs.alfworld import generator as g

    rooms = g.drawn_rooms(12)
    assert g.drawn_layout("kitchen-room3") == g.drawn_layout("kitchen-room3")
    layouts = [g.drawn_layout(name) for name in rooms]
    assert len({l.receptacles for l in layouts}) > 40  # 48 rooms, counts drawn per room
    held_out = {frozenset(g.LAYOUTS[n].receptacles) for _, unseen in g.TASK_LAYOUTS.values() for n in unseen}
    assert not any(frozenset(l.receptacles) in held_out for l in layouts)
    # every room kind plays its tasks, with what each task needs
    assert all(tasks for tasks in rooms.values())
    assert any("look_at_obj_in_light" in rooms[n] for n in rooms if n.startswith("livingroom"))
    for name, tasks in rooms.items():
        present = {t for t, _ in g.drawn_layout(name).receptacles}
        if "pick_heat_then_place_in_recep" in tasks:
            assert "Microwave" in present
    kitchen = g.LAYOUTS["kitchen_a"]
    no_microwave = g.Layout("x", tuple(r for r in kitchen.receptacles if r[0] != "Microwave"), kitchen.objects)
    assert g.playable("pick_heat_then_place_in_recep", kitchen)
    assert not g.playable("pick_heat_then_place_in_recep", no_microwave)
    assert not g.playable("look_at_obj_in_light", kitchen)  # no lamp in a kitchen
    for bad in ("kitchen", "attic-room1", "kitchen-roomx", "kitchen_a"):
        with pytest.raises(ValueError, match="drawn room"):
            g.drawn_layout(bad)
    # a room kind that can only draw a held-out room is refused, not trained on
    living = dict(g.LAYOUTS["livingroom"].receptacles)
    monkeypatch.setitem(g.ROOM_KINDS, "livingroom", ({t: (c, c) for t, c in living.items()}, g.LAYOUTS["livingroom"].objects))
    with pytest.raises(RuntimeError, match="held-out"):
        g.drawn_layout("livingroom-room0")


def test_drawn_rooms_join_only_the_train_split_and_their_games_win(tmp_path):
    from twice_envs.envs.alfworld.generator import (
        TASK_LAYOUTS,
        drawn_rooms,
        generated_collection,
        main,
    )

    assert main(["--out", str(tmp_path), "--split", "train", "--count", "1", "--rooms", "1"]) == 0
    files = sorted((tmp_path / "train").glob("*.json"))
    fixed = sum(len(seen) for seen, _ in TASK_LAYOUTS.values())
    assert len(files) == fixed + sum(len(t) for t in drawn_rooms(1).values())
    drawn = [f for f in files if "-room" in f.stem]
    assert {f.stem.split("-")[1] for f in drawn} == {"kitchen", "bathroom", "bedroom", "livingroom"}
    env = twice_envs.make("ALFWorld-v0", data_dir=str(tmp_path))
    for f in drawn[::3]:
        game = json.loads(f.read_text())
        assert game["layout"] == "-".join(f.stem.split("-")[1:3])
        env.reset(seed=0, options={"index": env.unwrapped.games.index(f.stem)})
        for command in game["walkthrough"]:
            _, reward, term, _, _ = env.step(command)
        assert term and reward == 1.0, f.stem
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--split", "valid_unseen", "--rooms", "2"])
    with pytest.raises(ValueError, match="train split only"):
        generated_collection("valid_unseen", 1, rooms=2)
