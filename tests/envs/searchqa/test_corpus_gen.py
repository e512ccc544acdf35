"""Generated SearchQA data is a cache: its files are checked against their manifest on every use, and a
damaged folder is named and generated again, byte for byte."""

from __future__ import annotations

import json
import re

import pytest

import twice_envs
from tests.cache_damage import cases, damage, named
from twice_envs import _cache
from twice_envs.envs.searchqa import resources
from twice_envs.envs.searchqa.corpus_gen import (
    GENERATED_FORMAT,
    GENERATOR_VERSION,
    GeneratorConfig,
    write_generated,
    write_wiki18,
)
from twice_envs.errors import DataFormatError

SMALL = {"seed": 5, "num_entities": 80, "num_train": 30, "num_dev": 20, "num_test": 10}
FILES = ("corpus.jsonl", "train.jsonl", "dev.jsonl", "test.jsonl")


def _contents(paths):
    return {name: path.read_bytes() for name, path in paths.items()}


@pytest.mark.parametrize("kind, name", cases(FILES, _cache.MANIFEST))
def test_each_damaged_file_is_named_and_generated_again(tmp_path, kind, name):
    folder = tmp_path / "g"
    first = _contents(write_generated(GeneratorConfig(**SMALL), folder))
    damage(kind, folder, name)
    with pytest.raises(DataFormatError) as err:
        _cache.read_manifest(folder, GENERATED_FORMAT, FILES)
    assert err.value.path == named(kind, folder, name)
    with pytest.warns(RuntimeWarning, match=f"generated SearchQA data unusable, rebuilding it: "
                                            f"{re.escape(named(kind, folder, name))}"):
        again = write_generated(GeneratorConfig(**SMALL), folder)
    assert _contents(again) == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g"]


def test_a_dev_file_cut_short_gives_every_dev_question_again(tmp_path, monkeypatch):
    monkeypatch.setenv("TWICE_CACHE", str(tmp_path / "cache"))
    resources.clear()
    env = twice_envs.make("SearchQA-v0", generator=SMALL, split="dev")
    assert len(env.resources.questions["dev"]) == SMALL["num_dev"]
    digest = GeneratorConfig(**SMALL).digest()
    folder = _cache.cache_dir("searchqa", "generated") / f"g{GENERATOR_VERSION}-{digest[:16]}"
    dev = folder / "dev.jsonl"
    dev.write_text("".join(dev.read_text().splitlines(keepends=True)[:10]))
    resources.clear()
    with pytest.warns(RuntimeWarning, match="dev.jsonl: .* bytes where manifest.json says"):
        env = twice_envs.make("SearchQA-v0", generator=SMALL, split="dev")
    assert len(env.resources.questions["dev"]) == SMALL["num_dev"]
    resources.clear()


def test_a_folder_generated_with_other_settings_is_generated_again(tmp_path):
    folder = tmp_path / "g"
    first = _contents(write_generated(GeneratorConfig(**SMALL), folder))
    manifest = json.loads((folder / _cache.MANIFEST).read_text())
    manifest["meta"]["settings"]["config"]["seed"] = 6
    (folder / _cache.MANIFEST).write_text(json.dumps(manifest))
    with pytest.warns(RuntimeWarning, match="generated with"):
        assert _contents(write_generated(GeneratorConfig(**SMALL), folder)) == first


@pytest.mark.parametrize("kind, name", [("truncated", "corpus.jsonl"), ("edited byte", "dev.jsonl"),
                                        ("manifest deeply nested", _cache.MANIFEST)])
def test_a_damaged_wiki18_corpus_is_generated_again(tmp_path, kind, name):
    folder = tmp_path / "w"
    first = _contents(write_wiki18(folder, passages=300, seed=5, questions=20))
    damage(kind, folder, name)
    with pytest.warns(RuntimeWarning, match=f"wiki-18 corpus unusable, rebuilding it: {re.escape(str(folder / name))}"):
        assert _contents(write_wiki18(folder, passages=300, seed=5, questions=20)) == first
