"""The shop's search engine: BM25 over each product's text, as the original's Lucene index.

* Text: title, description, first bullet point and option values, lower-cased
  (:meth:`Product.search_text`).
* Analyzer (Lucene's English analyzer, approximated): word tokens as Unicode word
  segmentation gives them for shop text (``6.76``, ``l'eau``, ``1,000`` stay whole), the
  possessive ``'s`` removed, Lucene's English stop words removed, Porter stemming
  (PyStemmer's ``porter``).
* Scoring: ``bm25s`` with Lucene's BM25 (``k1 = 0.9``, ``b = 0.4``, the defaults of the
  original's pyserini searcher); a query term repeated ``n`` times counts ``n`` times, as
  pyserini's bag-of-words query does.
* Top 50; equal scores are ordered by catalogue position (Lucene's docid order).

Known differences from Lucene: document lengths are exact (Lucene rounds them to one
byte), and the tokenizer is a regular expression, not the full UAX #29 rules.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Iterable, Optional

import numpy as np

from twice_envs._deps import require

#: Results the search returns (the original's ``SEARCH_RETURN_N``).
TOP_K = 50
K1 = 0.9
B = 0.4
#: Lucene's default English stop words (``EnglishAnalyzer.ENGLISH_STOP_WORDS_SET``).
STOP_WORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these they "
    "this to was will with".split()
)
#: Bump when tokenisation or scoring changes (part of the index cache key).
ANALYZER_VERSION = "lucene-en-porter/1"

# Letters/digits joined by an inner apostrophe or period (l'eau, u.s, 6.76), or digits
# joined by commas (1,000), stay one token, as Unicode word segmentation keeps them.
_TOKEN = re.compile(r"\w+(?:(?:['’.]|(?<=\d),(?=\d))\w+)*")


class Analyzer:
    """Text -> index terms (lower case, no stop words, Porter stems); memoises stems."""

    def __init__(self) -> None:
        stemmer_mod = require("Stemmer", "webshop", "WebShop search (Porter stemming)")
        self._stem = stemmer_mod.Stemmer("porter").stemWord
        self._memo: dict[str, Optional[str]] = {}

    def term(self, token: str) -> Optional[str]:
        """The index term of one lower-case token (None for a stop word)."""
        try:
            return self._memo[token]
        except KeyError:
            pass
        word = token[:-2] if token.endswith(("'s", "’s")) else token
        t = None if (not word or word in STOP_WORDS) else self._stem(word)
        if len(self._memo) < 2_000_000:
            self._memo[token] = t
        return t

    def __call__(self, text: str) -> list[str]:
        out = []
        for tok in _TOKEN.findall(text.lower()):
            t = self.term(tok)
            if t is not None:
                out.append(t)
        return out


class SearchIndex:
    """A BM25 index over the catalogue (see the module docstring)."""

    def __init__(self, retriever, vocab: dict[str, int], num_docs: int) -> None:
        self.retriever = retriever
        self.vocab = vocab
        self.num_docs = num_docs
        self.analyzer = Analyzer()

    # ------------------------------------------------------------------ build, save, load
    @classmethod
    def build(cls, texts: Iterable[str], analyzer: Optional[Analyzer] = None) -> "SearchIndex":
        """Index ``texts`` (one per product, in catalogue order)."""
        builder = IndexBuilder(analyzer)
        for t in texts:
            builder.add(t)
        return builder.finish()

    def save(self, directory: str | os.PathLike) -> None:
        """Save atomically: written to a temp dir, then renamed into place."""
        directory = Path(directory)
        tmp = directory.with_name(f".{directory.name}.{os.getpid()}.tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        self.retriever.save(str(tmp))
        with open(tmp / "twice_vocab.json", "w", encoding="utf-8") as fh:
            json.dump({"analyzer": ANALYZER_VERSION, "num_docs": self.num_docs, "vocab": self.vocab}, fh)
        if directory.exists():
            # another process saved first; indexes only appear by rename, so its copy is
            # complete, and it is identical (same data, same analyzer)
            shutil.rmtree(tmp, ignore_errors=True)
            return
        try:
            os.replace(tmp, directory)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "SearchIndex":
        bm25s = require("bm25s", "webshop", "WebShop search")
        directory = Path(directory)
        with open(directory / "twice_vocab.json", encoding="utf-8") as fh:
            meta = json.load(fh)
        if meta.get("analyzer") != ANALYZER_VERSION:
            raise ValueError(f"index at {directory} was built by another analyzer version")
        retriever = bm25s.BM25.load(str(directory), mmap=True, load_vocab=False)
        return cls(retriever, meta["vocab"], int(meta["num_docs"]))

    # ------------------------------------------------------------------ query
    def query_ids(self, query: str) -> list[int]:
        vocab = self.vocab
        return [vocab[t] for t in self.analyzer(query) if t in vocab]

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every product for ``query`` (float32)."""
        ids = self.query_ids(query)
        if not ids:
            return np.zeros(self.num_docs, dtype=np.float32)
        return self.retriever.get_scores_from_ids(ids)

    def search(self, query: str, k: int = TOP_K) -> tuple[int, ...]:
        """Catalogue positions of the top ``k`` products; ties in catalogue order.

        Products that share no term with the query are never returned (as Lucene).
        """
        ids = self.query_ids(query)
        if not ids:
            return ()
        scores = self.retriever.get_scores_from_ids(ids)
        hits = np.flatnonzero(scores > 0)
        if len(hits) > k:
            # the k-th best score, then everything at least that good, ordered stably
            kth = np.partition(scores[hits], len(hits) - k)[len(hits) - k]
            hits = hits[scores[hits] >= kth]
        order = np.lexsort((hits, -scores[hits]))
        return tuple(int(i) for i in hits[order[:k]])


class IndexBuilder:
    """Incremental index construction: ``add`` texts in catalogue order, then ``finish``."""

    def __init__(self, analyzer: Optional[Analyzer] = None) -> None:
        self.analyzer = analyzer or Analyzer()
        self.vocab: dict[str, int] = {}
        self.docs: list[list[int]] = []

    def add(self, text: str) -> None:
        vocab = self.vocab
        ids = []
        for t in self.analyzer(text):
            i = vocab.get(t)
            if i is None:
                i = vocab[t] = len(vocab)
            ids.append(i)
        self.docs.append(ids)

    def finish(self) -> SearchIndex:
        bm25s = require("bm25s", "webshop", "WebShop search")
        retriever = bm25s.BM25(k1=K1, b=B, method="lucene")
        vocab = dict(self.vocab)
        vocab.setdefault("", len(vocab))  # bm25s' empty token: keeps empty documents valid
        retriever.index((self.docs, vocab), show_progress=False, create_empty_token=False)
        index = SearchIndex(retriever, vocab, len(self.docs))
        self.docs = []
        return index
