"""BM25 index files: memory-mapped read-only, streamed builds, and every damaged file refused by name (and rebuilt
by the cache). The fuzz test damages each file (and meta.json, and the folder) in each way of ``tests.cache_damage``."""

from __future__ import annotations

import json
import re
import shutil
import tracemalloc
import warnings

import numpy as np
import pytest

from tests.cache_damage import cases, damage, named
from twice_envs.envs.searchqa import bm25_index
from twice_envs.envs.searchqa.bm25 import BM25Index, BM25Params, build_index, index_dir, open_index
from twice_envs.envs.searchqa.bm25_index import FILES, INDEX_FORMAT
from twice_envs.errors import DataFormatError

TEXTS = [
    '"Aldermoor"\nAldermoor is a river port founded by the weaver Ilsa Varn in 1702.',
    '"Ilsa Varn"\nIlsa Varn was a weaver and the founder of Aldermoor. She was born in Quell.',
    '"Quell"\nQuell is a mountain village known for its copper bells.',
    '"Copper bell"\nA copper bell is a bell cast from copper; Quell is famous for them.',
    '"Same"\nidentical text about lanterns',
    '"Same"\nidentical text about lanterns',
    '"Ünïcode Town"\nA town whose name has accents: Ünïcode Town, home of 日本 traders.',
    '"Empty"\nthe of and',
]
QUERIES = ["founder of Aldermoor", "copper bells quell", "lanterns", "Ünïcode 日本", "weaver born Quell village", "zzz"]


def _texts(n: int) -> list[str]:
    return [TEXTS[i % len(TEXTS)] + f" item{i % 97} batch{i // 50}" for i in range(n)]


@pytest.fixture()
def built(tmp_path):
    d = tmp_path / "idx"
    build_index(_texts(400), d, chunk_size=64)
    return d


def test_arrays_are_read_only_memory_maps_and_results_hold(built, tmp_path):
    ix = BM25Index(built)
    for name, arr in ix.files.arrays.items():
        if len(arr):
            assert not arr.flags.writeable, name
            assert isinstance(arr.base, np.memmap), name
    assert ix.meta["format"] == INDEX_FORMAT and ix.num_docs == 400
    assert sorted(p.name for p in built.iterdir()) == sorted([*FILES, "meta.json"])  # no run files left
    assert sorted(p.name for p in built.parent.iterdir()) == ["idx"]  # no temporary folder left
    for q in QUERIES:
        assert ix.search(q, 5) == ix.search(q, 5, method="exhaustive")
    assert ix.search("lanterns", 3)[0] == [4, 5, 12]


def test_chunking_does_not_change_a_byte(tmp_path):
    texts = _texts(300)
    build_index(texts, tmp_path / "a", chunk_size=1000)
    build_index(iter(texts), tmp_path / "b", chunk_size=7)
    for name in FILES:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_vocabulary_lookups(built):
    ix = BM25Index(built)
    v = ix.vocab
    for tid in range(len(v)):
        assert v.get(v.term(tid)) == tid
    assert v.get("日本") is not None and v.get("ünïcode") is not None
    assert v.get("nosuchterm") is None and "nosuchterm" not in v and v.get("") is None
    assert v.get("\ud800lone") is None  # a lone surrogate is a term like any other (and not in this index)


def test_build_is_streamed_with_bounded_memory(tmp_path, monkeypatch):
    """A lazy stream of passages: memory holds a chunk and a merge range, not the postings of the corpus."""
    monkeypatch.setattr(bm25_index, "MERGE_POSTINGS", 4096)
    words = [f"w{i}" for i in range(300)]

    def stream(n):
        rng = np.random.default_rng(0)
        for _ in range(n):
            yield " ".join(words[j] for j in rng.integers(0, len(words), size=30))

    build_index(stream(500), tmp_path / "warm", chunk_size=500)  # imports and caches outside the measurement
    tracemalloc.start()
    build_index(stream(40_000), tmp_path / "big", chunk_size=1000)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    ix = BM25Index(tmp_path / "big")
    postings = int(ix.meta["nnz"])
    assert postings > 900_000
    assert peak < 4 * postings  # the postings alone take 8 B each (and the token lists of the corpus far more)
    assert ix.search("w1 w2", 3) == ix.search("w1 w2", 3, method="exhaustive")


def test_a_failed_build_leaves_nothing(tmp_path):
    def broken():
        yield from TEXTS
        raise RuntimeError("source died")

    with pytest.raises(RuntimeError):
        build_index(broken(), tmp_path / "idx", chunk_size=3)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError):
        build_index([], tmp_path / "idx")
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- damaged files
def _flip(path, where=0.5):
    blob = bytearray(path.read_bytes())
    i = min(len(blob) - 1, max(128, int(len(blob) * where)))  # past the .npy header: the data
    blob[i] ^= 0x5A
    path.write_bytes(bytes(blob))


def _expect(directory, name, *needles, verify="auto"):
    with pytest.raises(DataFormatError) as err:
        BM25Index(directory, verify=verify)
    assert err.value.path == str(directory / name), (err.value.path, name)
    for n in needles:
        assert n in str(err.value), str(err.value)
    return err.value


@pytest.mark.parametrize("name", list(FILES))
def test_truncated_file_is_refused_by_name(built, name):
    path = built / name
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.truncate(size - max(1, min(8, size - 130)))
    _expect(built, name, "truncated")


@pytest.mark.parametrize("name", ["data.npy", "indices.npy", "indptr.npy", "block_max.npy", "doc_len.npy", "vocab_bytes.npy",
                                  "vocab_table.npy", "term_max.npy"])
def test_corrupt_file_is_refused_by_name(built, name):
    _flip(built / name)
    _expect(built, name, "checksum")


def test_corrupt_large_file_is_caught_by_sampled_checks(tmp_path, monkeypatch):
    monkeypatch.setattr(bm25_index, "SAMPLE_WINDOWS", 8)  # small windows: this index counts as large
    monkeypatch.setattr(bm25_index, "SAMPLE_WINDOW", 512)
    build_index(_texts(6000), tmp_path / "idx")
    data = tmp_path / "idx" / "data.npy"
    assert data.stat().st_size > bm25_index.SAMPLE_WINDOWS * bm25_index.SAMPLE_WINDOW  # sampling applies
    _flip(data, where=1.0)  # the last bytes: always in the last window
    _expect(tmp_path / "idx", "data.npy", "checksum", verify="sample")
    _expect(tmp_path / "idx", "data.npy", "checksum", verify="full")


def test_other_format_version_is_refused(built):
    meta = json.loads((built / "meta.json").read_text())
    meta["format"] = "searchqa.bm25/1"
    (built / "meta.json").write_text(json.dumps(meta))
    _expect(built, "meta.json", "searchqa.bm25/1", INDEX_FORMAT)


def test_first_version_layout_is_refused(tmp_path):
    d = tmp_path / "old"
    d.mkdir()
    np.save(d / "data.npy", np.ones(3, np.float32))
    np.save(d / "indices.npy", np.arange(3, dtype=np.int32))
    np.save(d / "indptr.npy", np.array([0, 3]))
    (d / "vocab.json").write_text('["x"]')
    (d / "meta.json").write_text(json.dumps({"format": "searchqa.bm25/1", "params": {}, "num_docs": 3, "nnz": 3, "vocab": 1}))
    _expect(d, "meta.json", "format")


def test_foreign_and_missing_files_are_refused(built, tmp_path):
    other = tmp_path / "other"
    build_index(list(reversed(_texts(400))), other, chunk_size=64)  # the same passages in another order
    size = (built / "data.npy").stat().st_size
    # the same layout from another index of as many passages and terms: same size, other bytes
    assert (other / "indptr.npy").stat().st_size == (built / "indptr.npy").stat().st_size
    shutil.copy(other / "indptr.npy", built / "indptr.npy")
    _expect(built, "indptr.npy", "checksum")
    shutil.copy(other / "data.npy", built / "data.npy")  # checked before indptr: named first
    _expect(built, "data.npy")
    # not an array file at all, at the recorded size
    (built / "data.npy").write_bytes(b"PK\x03\x04" + b"\x00" * (size - 4))
    _expect(built, "data.npy", "not a .npy")
    (built / "data.npy").unlink()
    _expect(built, "data.npy", "missing")
    (built / "meta.json").write_text("{ not json")
    _expect(built, "meta.json", "not valid JSON")
    (built / "meta.json").unlink()
    _expect(built, "meta.json", "missing")


def test_inconsistent_pointers_are_refused_even_with_matching_checksums(built):
    """A file rewritten with its checksums updated (so only the structure checks can catch it)."""
    meta = json.loads((built / "meta.json").read_text())
    indptr = np.load(built / "indptr.npy")
    indptr[1], indptr[2] = indptr[2], indptr[1]
    np.save(built / "indptr.npy", indptr)
    meta["files"]["indptr.npy"] = bm25_index.describe_file(built / "indptr.npy")
    (built / "meta.json").write_text(json.dumps(meta))
    _expect(built, "indptr.npy", "out of order")


# ----------------------------------------------------------------------------- the cache rebuilds
@pytest.mark.parametrize("damage", ["truncate", "corrupt", "version", "missing_meta", "other_corpus"])
def test_the_cache_rebuilds_a_damaged_index(tmp_path, monkeypatch, damage):
    monkeypatch.setenv("TWICE_CACHE", str(tmp_path / "cache"))
    texts = _texts(200)
    first = open_index("v" * 64, texts)
    expected = {q: first.search(q, 4) for q in QUERIES}
    d = index_dir("v" * 64, BM25Params())
    assert first.directory == d
    if damage == "truncate":
        with open(d / "indices.npy", "r+b") as fh:
            fh.truncate(200)
    elif damage == "corrupt":
        _flip(d / "data.npy")
    elif damage == "version":
        meta = json.loads((d / "meta.json").read_text())
        meta["format"] = "searchqa.bm25/0"
        (d / "meta.json").write_text(json.dumps(meta))
    elif damage == "missing_meta":  # a folder left half there
        (d / "meta.json").unlink()
    elif damage == "other_corpus":
        meta = json.loads((d / "meta.json").read_text())
        meta["corpus_version"] = "w" * 64
        (d / "meta.json").write_text(json.dumps(meta))
    with pytest.warns(RuntimeWarning, match="rebuilding"):
        again = open_index("v" * 64, texts)
    assert {q: again.search(q, 4) for q in QUERIES} == expected
    BM25Index(d, verify="full")  # the rebuilt files pass every check
    assert sorted(p.name for p in d.parent.iterdir()) == [d.name]  # the damaged copy is gone
    # and a sound index is used as it is, silently
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        open_index("v" * 64, None, texts_fn=lambda: pytest.fail("must not rebuild"))


@pytest.mark.parametrize("kind, name", cases(FILES, "meta.json"))
def test_every_damage_of_every_file_is_named_then_healed(tmp_path, monkeypatch, kind, name):
    monkeypatch.setenv("TWICE_CACHE", str(tmp_path / "cache"))
    texts = _texts(120)
    first = open_index("v" * 64, texts)
    expected = {q: first.search(q, 4) for q in QUERIES}
    d = first.directory
    del first
    damage(kind, d, name)
    with pytest.raises(DataFormatError) as err:
        BM25Index(d)
    assert err.value.path == named(kind, d, name)
    with pytest.warns(RuntimeWarning, match=f"BM25 index unusable, rebuilding it: {re.escape(named(kind, d, name))}"):
        again = open_index("v" * 64, texts)
    assert {q: again.search(q, 4) for q in QUERIES} == expected
    assert sorted(p.name for p in d.parent.iterdir()) == [d.name]


def test_streamed_wiki18_format_corpus_indexes_as_a_stream(tmp_path):
    from twice_envs.envs.searchqa.corpus import open_corpus
    from twice_envs.envs.searchqa.corpus_gen import iter_wiki18_corpus, wiki18_hop_queries, write_wiki18
    from twice_envs.envs.searchqa.loaders import iter_corpus_jsonl

    paths = write_wiki18(tmp_path / "w", passages=3000, seed=5, questions=20)
    rows = list(iter_corpus_jsonl(paths["corpus"]))
    assert [r[1] for r in rows] == [str(i) for i in range(3000)]
    assert all(c.startswith('"') and '"\n' in c for _, _, c in rows)
    words = [len(c.split()) for _, _, c in rows]
    assert 60 < sum(words) / len(words) < 110
    again = write_wiki18(tmp_path / "w2", passages=3000, seed=5, questions=20)
    assert again["corpus"].read_bytes() == paths["corpus"].read_bytes()  # deterministic
    assert (next(iter_wiki18_corpus(3000, seed=5))[1]) == rows[0][2]
    q = [json.loads(line) for line in paths["dev"].read_text(encoding="utf-8").splitlines()]
    assert len(q) == 20 and all(r["golden_answers"][0].isdigit() for r in q)

    store = open_corpus(paths["corpus"])
    build_index(store.iter_contents(), tmp_path / "idx", chunk_size=500)
    ix = BM25Index(tmp_path / "idx")
    hits = 0
    for query, target in wiki18_hop_queries(3000, 100, seed=5):
        ids, _ = ix.search(query, 3)
        assert (ids, _) == ix.search(query, 3, method="exhaustive")
        hits += target in ids
    assert hits >= 90  # the entity's own passage is found
