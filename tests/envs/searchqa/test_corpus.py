"""The passage store: every file checked against its manifest when opened, every passage against its
recorded hash when read; a damaged store is named and built again with the same passages."""

from __future__ import annotations

import json
import re

import pytest

import twice_envs
from tests.cache_damage import cases, damage, edit_byte, named
from twice_envs import _cache
from twice_envs.envs.searchqa import resources
from twice_envs.envs.searchqa.corpus import FILES, CorpusStore, _fingerprint, open_corpus
from twice_envs.errors import DataFormatError

WORDS = "amber copper harbour lantern meridian orchard salt winter glass ledger compass garden".split()


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TWICE_CACHE", str(tmp_path / "cache"))
    resources.clear()
    yield
    resources.clear()


def _corpus(tmp_path, n=40):
    rows = [{"id": f"p{i}", "contents": f'"Place {i}"\nThe {WORDS[i % 12]} {WORDS[i * 5 % 12]} of place {i}, née Ü.'}
            for i in range(n)]
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def _passages(store):
    return store.version, [(store.passage_id(i), store.contents(i)) for i in range(len(store))]


def _folder(source):
    return _cache.cache_dir("searchqa", "corpus") / _fingerprint(source)


@pytest.mark.parametrize("kind, name", cases(FILES, _cache.MANIFEST))
def test_each_damaged_file_is_named_and_the_store_rebuilt(tmp_path, kind, name):
    source = _corpus(tmp_path)
    first = _passages(open_corpus(source))
    folder = _folder(source)
    damage(kind, folder, name)
    with pytest.raises(DataFormatError) as err:
        CorpusStore(folder)
    assert err.value.path == named(kind, folder, name)
    bad = re.escape(named(kind, folder, name))
    with pytest.warns(RuntimeWarning, match=f"passage store unusable, rebuilding it: {bad}"):
        again = open_corpus(source)
    assert _passages(again) == first
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]  # no damaged copy or build folder left


@pytest.mark.parametrize("name", ["contents.bin", "ids.bin", "offsets.npy", "id_offsets.npy", "hashes.npy"])
def test_a_change_the_sampled_digest_misses_is_caught_when_the_passage_is_read(tmp_path, monkeypatch, name):
    # a large store: its files are digested by samples (here the first and last 16 bytes)
    monkeypatch.setattr(_cache, "DIGEST_WHOLE", 64)
    monkeypatch.setattr(_cache, "DIGEST_BLOCKS", 2)
    monkeypatch.setattr(_cache, "DIGEST_BLOCK", 16)
    source = _corpus(tmp_path)
    first = _passages(open_corpus(source))
    edit_byte(_folder(source), name)
    store = CorpusStore(_folder(source))  # size and samples agree
    with pytest.raises(DataFormatError, match=r"passage \d+ does not match the hash recorded") as err:
        _passages(store)
    assert err.value.path == str(_folder(source) / "contents.bin") and store.damaged
    assert not _folder(source).exists()  # discarded: the next open builds it again
    assert _passages(open_corpus(source)) == first


def test_a_damaged_passage_fails_the_search_and_the_next_make_serves_it_intact(tmp_path, monkeypatch):
    monkeypatch.setattr(_cache, "DIGEST_WHOLE", 64)
    monkeypatch.setattr(_cache, "DIGEST_BLOCKS", 2)
    monkeypatch.setattr(_cache, "DIGEST_BLOCK", 16)
    source = _corpus(tmp_path)
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"id": "q1", "question": "where is the amber harbour?", "golden_answers": ["x"]}))
    kw = {"corpus": str(source), "questions": str(questions), "max_searches": 3}
    env = twice_envs.make("SearchQA-v0", **kw)
    env.reset(seed=0)
    want = env.step("<search> amber copper harbour </search>")[0]
    assert "Place" in want
    store = env.resources.corpus
    text = (store.directory / "contents.bin").read_bytes()
    at = text.index(b"amber")  # the first passage the search shows, changed in place
    (store.directory / "contents.bin").write_bytes(text[:at] + b"AMBER" + text[at + 5:])
    env2 = twice_envs.make("SearchQA-v0", **kw)
    env2.reset(seed=0)
    with pytest.raises(DataFormatError, match="contents.bin: passage"):
        env2.step("<search> amber copper harbour </search>")
    env3 = twice_envs.make("SearchQA-v0", **kw)  # a make after it builds the store again
    assert env3.resources.corpus is not store
    env3.reset(seed=0)
    assert env3.step("<search> amber copper harbour </search>")[0] == want


def test_a_store_of_another_file_is_rebuilt_and_a_gone_source_is_named(tmp_path):
    source = _corpus(tmp_path)
    first = _passages(open_corpus(source))
    folder = _folder(source)
    manifest = json.loads((folder / _cache.MANIFEST).read_text())
    manifest["meta"]["source"] = "/elsewhere/corpus.jsonl"
    (folder / _cache.MANIFEST).write_text(json.dumps(manifest))
    with pytest.warns(RuntimeWarning, match="a store of /elsewhere/corpus.jsonl"):
        assert _passages(open_corpus(source)) == first
    source.unlink()
    with pytest.raises(DataFormatError, match="corpus.jsonl: corpus file not found"):
        open_corpus(source)
