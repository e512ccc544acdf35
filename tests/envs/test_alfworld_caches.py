"""ALFWorld's caches: a collection of generated games is checked against its manifest on every use, the game
index of a data folder against the sha256 it records, and the expert's task file against what it must hold; a
damaged one is named and built again."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("alfworld")

from tests.cache_damage import FILE_DAMAGES, cases, damage, named  # noqa: E402
from twice_envs import _cache  # noqa: E402
from twice_envs.envs.alfworld import games, generator  # noqa: E402
from twice_envs.envs.alfworld.expert import HandcodedExpert  # noqa: E402

SPLIT_FILES = ["valid_unseen/pick_and_place_simple-a-0.json", "valid_unseen/look_at_obj_in_light-b-0.json"]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TWICE_CACHE", str(tmp_path / "cache"))


def _stand_in_generate(log):
    """``generator.generate`` without the engine: two fixed game files (the cache logic is what is tested)."""

    def generate(out_dir, counts, *, keep_existing=False, rooms=0):
        log.append(out_dir)
        written = []
        for rel in SPLIT_FILES:
            path = out_dir / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"name": rel, "counts": counts, "walkthrough": ["look"] * 40}))
            written.append(path)
        return written

    return generate


def _files(folder):
    return {rel: (folder / rel).read_bytes() for rel in SPLIT_FILES}


@pytest.mark.parametrize("kind, name", cases(SPLIT_FILES, _cache.MANIFEST))
def test_a_damaged_collection_of_generated_games_is_named_and_generated_again(monkeypatch, kind, name):
    builds = []
    monkeypatch.setattr(generator, "generate", _stand_in_generate(builds))
    folder = generator.generated_collection("valid_unseen", 1)
    first = _files(folder)
    assert generator.generated_collection("valid_unseen", 1) == folder and len(builds) == 1  # checked, not rebuilt
    damage(kind, folder, name)
    bad = re.escape(named(kind, folder, name))
    with pytest.warns(RuntimeWarning, match=f"generated ALFWorld games unusable, rebuilding it: {bad}"):
        assert generator.generated_collection("valid_unseen", 1) == folder
    assert _files(folder) == first and len(builds) == 2
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]


def _game_folder(tmp_path):
    root = tmp_path / "data" / "valid_seen"
    for i, (task, solvable) in enumerate([("pick_and_place_simple", True), ("look_at_obj_in_light", False)]):
        game = root / f"{task}-Thing-None-Place-{i}" / "trial_0"
        game.mkdir(parents=True)
        (game / games.GAME_FILE).write_text(json.dumps({"solvable": solvable}))
    found = sorted((os.path.relpath(d, root), os.stat(d / games.GAME_FILE)) for d in root.glob("*/trial_0"))
    return root, found


@pytest.mark.parametrize("kind", [*FILE_DAMAGES, "deeply nested", "unparseable"])
def test_a_damaged_game_index_is_named_and_computed_again(tmp_path, kind):
    root, found = _game_folder(tmp_path)
    want = games._cached_index(root, found)
    assert want == {found[0][0]: ("look_at_obj_in_light", False), found[1][0]: ("pick_and_place_simple", True)}
    (index_file,) = _cache.cache_dir("alfworld", "index").iterdir()
    if kind == "deeply nested":
        index_file.write_text("[" * 100_000 + "]" * 100_000)
    elif kind == "unparseable":
        index_file.write_text('{"stamp": ')
    elif kind == "edited byte":  # still JSON: a task type changed
        index_file.write_text(index_file.read_text().replace("pick_and_place_simple", "pick_clean_then_place"))
    else:
        FILE_DAMAGES[kind](index_file.parent, index_file.name)
    if kind == "deleted":
        assert games._cached_index(root, found) == want
    else:
        with pytest.warns(RuntimeWarning, match=f"game index unusable, computing it again: {re.escape(str(index_file))}"):
            assert games._cached_index(root, found) == want
    assert games._cached_index(root, found) == want and index_file.is_file()


@pytest.mark.parametrize("kind", [*FILE_DAMAGES, "deeply nested"])
def test_the_experts_task_file_is_written_again_when_it_differs(kind):
    game = SimpleNamespace(path=None, name="g", key="k" * 30, task_type="pick_and_place_simple",
                           pddl_params={"object_target": "Apple", "parent_target": "Fridge"})
    game_file = HandcodedExpert._traj_file(None, game)
    target = os.path.join(os.path.dirname(game_file), "traj_data.json")
    want = open(target, "rb").read()
    if kind == "deeply nested":
        with open(target, "w") as fh:
            fh.write("[" * 100_000 + "]" * 100_000)
    else:
        FILE_DAMAGES[kind](Path(target).parent, "traj_data.json")
    assert HandcodedExpert._traj_file(None, game) == game_file
    assert open(target, "rb").read() == want
