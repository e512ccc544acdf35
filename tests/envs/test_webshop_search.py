"""The BM25 search: Lucene's formula with k1=0.9, b=0.4, the analyzer, top 50, ties."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from twice_envs.envs.webshop.search import TOP_K, Analyzer, SearchIndex

DOCS = [
    "red running shoes for women",
    "blue running shoes",
    "the shoes' laces and the shoe box",
    "women's red dress with pockets",
    "coffee beans, dark roast, 6.76 oz bag",
    "red red red shoes",
]


def lucene_bm25(docs_terms, query_terms, k1=0.9, b=0.4):
    n = len(docs_terms)
    avg = sum(len(d) for d in docs_terms) / n
    df = Counter(t for d in docs_terms for t in set(d))
    out = []
    for d in docs_terms:
        tf = Counter(d)
        s = 0.0
        for q in query_terms:  # a repeated query term counts again
            if tf[q]:
                idf = math.log(1 + (n - df[q] + 0.5) / (df[q] + 0.5))
                s += idf * tf[q] / (tf[q] + k1 * (1 - b + b * len(d) / avg))
        out.append(s)
    return out


def test_analyzer():
    a = Analyzer()
    assert a("The Running Shoes are for Women's feet") == ["run", "shoe", "women", "feet"]
    assert a("6.76 fl oz, 1,000 count; l'eau") == ["6.76", "fl", "oz", "1,000", "count", "l'eau"]
    assert a("a an and of the with") == []


def test_scores_match_the_lucene_formula():
    a = Analyzer()
    index = SearchIndex.build(DOCS)
    terms = [a(d) for d in DOCS]
    for q in ["red running shoes", "women dress", "red red shoes", "coffee 6.76", "unknownword shoes"]:
        want = lucene_bm25(terms, a(q))
        got = index.scores(q)
        assert got.tolist() == pytest.approx(want, rel=1e-5), q


def test_ranking_ties_and_no_match():
    index = SearchIndex.build(DOCS)
    hits = index.search("shoes")
    scores = index.scores("shoes")
    assert all(scores[hits[i]] >= scores[hits[i + 1]] for i in range(len(hits) - 1))
    assert 3 not in hits and 4 not in hits  # no shared term: not returned
    assert index.search("zzz") == () and index.search("the of") == ()
    # identical documents tie: catalogue order
    same = SearchIndex.build(["green tea"] * 60 + ["black tea"])
    assert same.search("green tea") == tuple(range(TOP_K))
    assert same.search("tea")[:3] == (0, 1, 2)


def test_save_and_load(tmp_path):
    index = SearchIndex.build(DOCS)
    index.save(tmp_path / "idx")
    loaded = SearchIndex.load(tmp_path / "idx")
    for q in ["red shoes", "coffee", "dress"]:
        assert loaded.search(q) == index.search(q)
        assert loaded.scores(q).tolist() == index.scores(q).tolist()
