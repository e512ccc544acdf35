"""The pruned BM25 path returns exactly the exhaustive top k: the same passages, in the same order, with bit-equal scores."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from twice_envs.envs.searchqa import bm25, bm25_maxscore
from twice_envs.envs.searchqa.bm25 import BM25Index, BM25Params, build_index

WORDS = ["harbour", "lantern", "copper", "bell", "river", "founded", "born", "town", "guild", "atlas", "meridian",
         "orchard", "weaver", "compass", "glass", "winter", "salt", "marble", "tide", "archive"]


def _same(a, b) -> bool:
    return np.array_equal(a[0], b[0]) and a[0].dtype == b[0].dtype and np.array_equal(a[1], b[1]) and a[1].dtype == b[1].dtype


def _tie_heavy_corpus(n: int, seed: int) -> list[str]:
    """Passages of few lengths and a small vocabulary, with exact duplicates: long lists and long runs of equal scores."""
    rng = np.random.default_rng(seed)
    texts = []
    for i in range(n):
        if i % 7 == 0 and texts:
            texts.append(texts[int(rng.integers(0, len(texts)))])  # an exact duplicate
            continue
        length = int(rng.choice([4, 6, 6, 8]))
        words = [WORDS[int(w)] for w in rng.zipf(1.6, size=length) % len(WORDS)]
        if rng.random() < 0.05:
            words.append(f"rare{int(rng.integers(0, 40))}")
        texts.append(" ".join(words))
    return texts


@pytest.fixture(scope="module")
def tie_index(tmp_path_factory):
    d = tmp_path_factory.mktemp("bm25_ties") / "idx"
    build_index(_tie_heavy_corpus(6000, 1), d, BM25Params(), chunk_size=1000)
    return BM25Index(d)


def _random_queries(ix: BM25Index, n: int, seed: int) -> list[tuple[list[int], int]]:
    rng = np.random.default_rng(seed)
    V = len(ix.vocab)
    out = []
    for _ in range(n):
        m = int(rng.integers(1, 9))
        q = [int(rng.integers(0, V)) for _ in range(m)]
        if rng.random() < 0.3:
            q += q[: int(rng.integers(1, len(q) + 1))]  # repeated terms count twice
        out.append((q, int(rng.choice([1, 2, 3, 5, 10, 50, 400]))))
    return out


@pytest.mark.parametrize("mode", ["default", "always_prune", "never_give_up", "give_up_at_once", "tiny_batches"])
def test_pruned_equals_exhaustive_on_ties_and_repeats(tie_index, monkeypatch, mode):
    if mode == "always_prune":  # no small-query shortcut: every query goes through MaxScore
        monkeypatch.setattr(bm25, "UNION_POSTINGS", 0)
    if mode == "never_give_up":
        monkeypatch.setattr(bm25, "UNION_POSTINGS", 0)
        monkeypatch.setattr(bm25._MaxScore, "_spend", lambda self, work: None)
    if mode == "give_up_at_once":
        monkeypatch.setattr(bm25, "UNION_POSTINGS", 0)
        monkeypatch.setattr(bm25_maxscore, "BATCH_UNITS", 10**12)
    if mode == "tiny_batches":  # many buckets and chunks, seeds of one block
        monkeypatch.setattr(bm25, "UNION_POSTINGS", 0)
        monkeypatch.setattr(bm25._MaxScore, "_spend", lambda self, work: None)
        monkeypatch.setattr(bm25_maxscore, "REFINE", 2)
        monkeypatch.setattr(bm25_maxscore, "SEED_BLOCKS_MAX", 1)
        monkeypatch.setattr(bm25_maxscore, "SEED_BLOCKS", 1)
    ix = tie_index
    for q, k in _random_queries(ix, 300, {"default": 0, "always_prune": 1, "never_give_up": 2, "give_up_at_once": 3,
                                          "tiny_batches": 4}[mode]):
        assert _same(ix.search_ids(q, k, "pruned"), ix.search_ids(q, k, "exhaustive")), (q, k)


def test_ties_go_to_the_lower_position(tie_index):
    ix = tie_index
    for word in ("harbour", "lantern", "tide"):
        q = ix.term_ids(word)
        for k in (1, 3, 17):
            ids, scores = ix.search(word, k)
            assert (ids, scores) == ix.search(word, k, method="exhaustive")
            assert len(ids) == k
            for (i0, s0), (i1, s1) in zip(zip(ids, scores), zip(ids[1:], scores[1:])):
                assert s0 > s1 or (s0 == s1 and i0 < i1)
        full = ix.scores(q)
        best = np.flatnonzero(full == full.max())
        assert ix.search(word, len(best))[0] == best.tolist()  # one long run of equal scores, in position order


def test_search_api(tie_index):
    ix = tie_index
    queries = ["harbour lantern", "", "zzzz unknown", "tide tide tide archive", "rare3 copper"]
    assert ix.search_batch(queries, 5) == [ix.search(q, 5) for q in queries] == ix.search_batch(queries, 5, "exhaustive")
    assert ix.search("", 3) == ([], []) and ix.search("zzzz", 3) == ([], [])
    assert ix.search("harbour", 0) == ([], [])
    with pytest.raises(ValueError):
        ix.search("harbour", 3, method="fast")
    # the scores are BM25: a term repeated in the query counts twice
    one, two = ix.scores(ix.term_ids("harbour")), ix.scores(ix.term_ids("harbour harbour"))
    assert np.array_equal(two, one * 2)


def _words(n: int) -> list[str]:
    """n distinct lower-case words that the tokenizer keeps as they are (no stopword, stable under stemming)."""
    letters = "bcdfghjklmnpqrstvwxz"
    out = []
    for i in range(n):
        w, x = "", i
        for _ in range(5):
            w += letters[x % 20]
            x //= 20
        out.append("q" + w + "x")
    return out


@pytest.mark.timeout(300)
def test_huge_queries_are_answered_in_linear_time(tmp_path):
    words = _words(100_000)
    texts = [" ".join(words[i : i + 5]) + " harbour" for i in range(0, len(words), 5)]  # 20k passages, 100k terms
    build_index(texts, tmp_path / "idx", chunk_size=4000)
    ix = BM25Index(tmp_path / "idx")
    assert len(ix.vocab) == 100_001
    assert all(len(t) == 1 for t in map(ix.tokenizer, words[:50]))

    # 100k distinct terms, every one in the index
    q = " ".join(words)
    t = time.perf_counter()
    ids, scores = ix.search(q, 3)
    elapsed = time.perf_counter() - t
    assert (ids, scores) == ix.search(q, 3, method="exhaustive")
    assert len(ids) == 3 and elapsed < 60

    # 1 MiB of text, and its quarter: linear, not quadratic
    rng = np.random.default_rng(0)
    pool = words[:20_000] + ["harbour", "unknownword", "the", "and"] * 50
    big = " ".join(pool[i] for i in rng.integers(0, len(pool), size=200_000))[: 1 << 20]
    small = big[: len(big) // 4]
    assert len(big) == 1 << 20
    times = {}
    for name, text in (("small", small), ("big", big), ("small", small), ("big", big)):
        t = time.perf_counter()
        res = ix.search(text, 3)
        times[name] = min(times.get(name, 1e9), time.perf_counter() - t)
        assert res == ix.search(text, 3, method="exhaustive")
    assert times["big"] < 60
    assert times["big"] < 12 * times["small"] + 1.0, times  # 4x the text: about 4x the time, far from 16x


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_identical_top_k_on_1000_queries_at_100k_passages(tmp_path_factory, monkeypatch):
    """Generated encyclopedia, ~100k passages; the env's queries (questions and their hop queries)."""
    from twice_envs.envs.searchqa.corpus_gen import config_for_passages, write_generated

    root = tmp_path_factory.mktemp("bm25_100k")
    paths = write_generated(config_for_passages(100_000, num_train=400, num_dev=50, num_test=50), root / "gen")
    with open(paths["corpus"], encoding="utf-8") as fh:
        build_index((json.loads(line)["contents"] for line in fh), root / "idx")
    ix = BM25Index(root / "idx")
    assert 95_000 < ix.num_docs < 105_000
    queries = []
    for line in paths["train"].read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        queries.append(row["question"])
        queries += [h["query"] for h in row["metadata"]["hops"]]
    queries = queries[:1000]
    assert len(queries) == 1000
    runs = []
    run = bm25._MaxScore.run
    monkeypatch.setattr(bm25._MaxScore, "run", lambda self: runs.append(1) or run(self))
    for k in (3, 10):
        for q in queries:
            ids = ix.term_ids(q)
            a, b = ix.search_ids(ids, k, "pruned"), ix.search_ids(ids, k, "exhaustive")
            assert _same(a, b), (q, k)
    assert len(runs) > 1000  # most queries went through MaxScore (the rest have few postings)
