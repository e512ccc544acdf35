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

Storage: ``bm25s`` computes each (term, product) score once when the index is built; the
index keeps them as three flat arrays (scores, product ids, term starts: a sparse
column-per-term matrix) and the vocabulary as the terms' UTF-8 bytes sorted, with their
offsets and ids. Saved, they are ``.npy`` files in a verified cache folder
(:class:`~.catalogue.FlatFiles`), loaded memory-mapped read-only and shared by every
process on the machine; a query reads only its terms' columns.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Iterable, Optional

import numpy as np

from twice_envs._deps import require
from twice_envs.envs.webshop.catalogue import FlatFiles, FlatWriter
from twice_envs.errors import DataFormatError

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
#: Bump when the saved index files change.
INDEX_FORMAT = "webshop-index/2"
#: The arrays of a saved index (each ``<prefix><name>.npy``).
INDEX_ARRAYS = ("data", "docs", "ptr", "vocab_bytes", "vocab_offsets", "vocab_ids")

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
        memo = self._memo
        out = []
        for tok in _TOKEN.findall(text.lower()):
            t = memo[tok] if tok in memo else self.term(tok)
            if t is not None:
                out.append(t)
        return out


def _index_problem(a: dict, terms, num_docs) -> Optional[str]:
    """What is inconsistent in a loaded index's arrays (None: nothing)."""
    if not isinstance(terms, int) or not isinstance(num_docs, int) or terms < 0 or num_docs < 0:
        return "the index metadata lacks 'terms' or 'num_docs'"
    ptr, offsets, ids = a["ptr"], a["vocab_offsets"], a["vocab_ids"]
    if a["data"].dtype != np.float32 or a["docs"].dtype != np.int32 or a["vocab_bytes"].dtype != np.uint8:
        return "postings or vocabulary of the wrong type"
    if ptr.dtype != np.int64 or offsets.dtype != np.int64 or ids.dtype != np.int64:
        return "offsets of the wrong type"
    if not (len(ids) == terms and len(offsets) == terms + 1 and len(ptr) == terms + 1):
        return "array lengths disagree with the number of terms"
    if len(a["data"]) != len(a["docs"]) or ptr[0] != 0 or ptr[-1] != len(a["data"]):
        return "term starts disagree with the postings"
    if offsets[0] != 0 or offsets[-1] != len(a["vocab_bytes"]):
        return "vocabulary offsets disagree with its bytes"
    if terms and not 0 <= int(ids.min()) <= int(ids.max()) < terms:
        return "a term id is out of range"
    return None


class FlatVocabulary:
    """term -> id over flat arrays: the terms' UTF-8 bytes in sorted order (``blob``,
    ``offsets``) and their ids; a lookup is a binary search (about 20 probes for a million
    terms), so the vocabulary can stay memory-mapped and shared instead of a dict per process."""

    def __init__(self, blob: np.ndarray, offsets: np.ndarray, ids: np.ndarray) -> None:
        self.blob, self.offsets, self.ids = blob, offsets, ids
        self._n = len(ids)

    @staticmethod
    def arrays(vocab: dict[str, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(blob, offsets, ids)`` of a dict vocabulary."""
        items = sorted((t.encode("utf-8"), i) for t, i in vocab.items())
        blob = np.frombuffer(b"".join(t for t, _ in items), dtype=np.uint8)
        offsets = np.zeros(len(items) + 1, dtype=np.int64)
        if items:
            np.cumsum([len(t) for t, _ in items], out=offsets[1:])
        ids = np.asarray([i for _, i in items], dtype=np.int64)
        return blob, offsets, ids

    def __len__(self) -> int:
        return self._n

    def _term(self, k: int) -> bytes:
        return self.blob[int(self.offsets[k]) : int(self.offsets[k + 1])].tobytes()

    def get(self, term: str, default: Optional[int] = None) -> Optional[int]:
        key = term.encode("utf-8")
        lo, hi = 0, self._n
        while lo < hi:
            mid = (lo + hi) // 2
            if self._term(mid) < key:
                lo = mid + 1
            else:
                hi = mid
        if lo < self._n and self._term(lo) == key:
            return int(self.ids[lo])
        return default

    def __contains__(self, term: str) -> bool:
        return self.get(term) is not None

    def __getitem__(self, term: str) -> int:
        i = self.get(term)
        if i is None:
            raise KeyError(term)
        return i

    def items(self) -> Iterable[tuple[str, int]]:
        for k in range(self._n):
            yield self._term(k).decode("utf-8"), int(self.ids[k])


class SearchIndex:
    """A BM25 index over the catalogue (see the module docstring).

    Attributes:
        data: per posting, the term's BM25 score in the product (float32).
        docs: per posting, the product (int32); a term's postings are ``ptr[t]:ptr[t + 1]``.
        ptr: term starts (int64, one more than the terms).
        vocab: term -> id (a dict, or a :class:`FlatVocabulary` when loaded).
        num_docs: products indexed.
    """

    _MEMO_MAX = 1 << 16

    def __init__(self, data: np.ndarray, docs: np.ndarray, ptr: np.ndarray, vocab, num_docs: int) -> None:
        self.data, self.docs, self.ptr = data, docs, ptr
        self.vocab = vocab
        self.num_docs = int(num_docs)
        self.analyzer = Analyzer()
        self._ids: dict[str, Optional[int]] = {}

    # ------------------------------------------------------------------ build, save, load
    @classmethod
    def build(cls, texts: Iterable[str], analyzer: Optional[Analyzer] = None) -> "SearchIndex":
        """Index ``texts`` (one per product, in catalogue order)."""
        builder = IndexBuilder(analyzer)
        for t in texts:
            builder.add(t)
        return builder.finish()

    def write_files(self, writer: FlatWriter, prefix: str = "") -> dict:
        """Write the index arrays as ``<prefix><name>.npy``; return the metadata to keep beside them."""
        if isinstance(self.vocab, FlatVocabulary):
            blob, offsets, ids = self.vocab.blob, self.vocab.offsets, self.vocab.ids
        else:
            blob, offsets, ids = FlatVocabulary.arrays(self.vocab)
        arrays = {
            "data": np.asarray(self.data, dtype=np.float32),
            "docs": np.asarray(self.docs, dtype=np.int32),
            "ptr": np.asarray(self.ptr, dtype=np.int64),
            "vocab_bytes": blob,
            "vocab_offsets": offsets,
            "vocab_ids": ids,
        }
        for name in INDEX_ARRAYS:
            writer.array(f"{prefix}{name}.npy", arrays[name])
        return {"analyzer": ANALYZER_VERSION, "num_docs": self.num_docs, "terms": len(ids), "k1": K1, "b": B}

    @classmethod
    def from_files(cls, files: FlatFiles, meta: dict, prefix: str = "") -> "SearchIndex":
        """The index written by :meth:`write_files` (arrays memory-mapped read-only)."""
        where = files.manifest_path
        if meta.get("analyzer") != ANALYZER_VERSION or meta.get("k1") != K1 or meta.get("b") != B:
            raise DataFormatError(
                where, None, f"the index was built by analyzer {meta.get('analyzer')!r} (k1={meta.get('k1')}, "
                f"b={meta.get('b')}); this version uses {ANALYZER_VERSION!r} (k1={K1}, b={B})"
            )
        a = {name: files.array(f"{prefix}{name}.npy") for name in INDEX_ARRAYS}
        terms, num_docs = meta.get("terms"), meta.get("num_docs")
        problem = _index_problem(a, terms, num_docs)
        if problem:
            raise DataFormatError(where, None, f"inconsistent search index: {problem}")
        vocab = FlatVocabulary(a["vocab_bytes"], a["vocab_offsets"], a["vocab_ids"])
        return cls(a["data"], a["docs"], a["ptr"], vocab, num_docs)

    def save(self, directory: str | os.PathLike) -> None:
        """Save as a verified cache folder: built beside it, then renamed into place.

        If another process saved the same folder first, its copy is kept (folders only
        appear by rename, so it is complete).
        """
        from twice_envs._cache import build_dir, publish_dir
        from twice_envs.envs.webshop.catalogue import MANIFEST

        directory = Path(directory)
        tmp = build_dir(directory)
        try:
            writer = FlatWriter(tmp)
            meta = self.write_files(writer)
            writer.finish(INDEX_FORMAT, meta)
            publish_dir(tmp, directory, MANIFEST)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "SearchIndex":
        """An index saved by :meth:`save` (checked; :class:`DataFormatError` names a bad file)."""
        files = FlatFiles.open(directory, INDEX_FORMAT, [f"{n}.npy" for n in INDEX_ARRAYS])
        return cls.from_files(files, files.meta)

    # ------------------------------------------------------------------ query
    def _term_id(self, term: str) -> Optional[int]:
        try:
            return self._ids[term]
        except KeyError:
            pass
        i = self.vocab.get(term)
        if len(self._ids) >= self._MEMO_MAX:
            self._ids.clear()
        self._ids[term] = i
        return i

    def query_ids(self, query: str) -> list[int]:
        out = []
        for t in self.analyzer(query):
            i = self._term_id(t)
            if i is not None:
                out.append(i)
        return out

    def _scores_of(self, ids: list[int]) -> np.ndarray:
        # the query's terms in order, each adding its postings (a term repeated adds again), in
        # float32, as bm25s scores
        scores = np.zeros(self.num_docs, dtype=np.float32)
        ptr, docs, data = self.ptr, self.docs, self.data
        for t in ids:
            a, b = int(ptr[t]), int(ptr[t + 1])
            if b > a:
                np.add.at(scores, docs[a:b], data[a:b])
        return scores

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every product for ``query`` (float32)."""
        return self._scores_of(self.query_ids(query))

    def search(self, query: str, k: int = TOP_K) -> tuple[int, ...]:
        """Catalogue positions of the top ``k`` products; ties in catalogue order.

        Products that share no term with the query are never returned (as Lucene).
        """
        ids = self.query_ids(query)
        if not ids:
            return ()
        return top_k(self._scores_of(ids), k)


#: :func:`top_k` picks its first threshold from every ``_STRIDE``-th score.
_STRIDE = 64


def top_k(scores: np.ndarray, k: int) -> tuple[int, ...]:
    """Positions of the ``k`` best positive scores, best first, equal scores in position order.

    On a large array a threshold is read off a strided sample first (the 16th best of every
    64th score), so only the scores at least that good are selected among; when fewer than
    ``k`` pass it, all positive scores are. Either way the result is exact: everything at
    least as good as the ``k``-th best score is a candidate.
    """
    n = len(scores)
    if k <= 0:
        return ()
    hits = None
    if n >= 64 * _STRIDE:
        sample = scores[::_STRIDE]
        r = 16 + k // _STRIDE
        t = np.partition(sample, len(sample) - r)[len(sample) - r]
        if t > 0:
            cand = np.flatnonzero(scores >= t)
            if len(cand) >= k:
                hits = cand
    if hits is None:
        hits = np.flatnonzero(scores > 0)
    if len(hits) > k:
        # the k-th best score, then everything at least that good, ordered stably
        got = scores[hits]
        kth = np.partition(got, len(hits) - k)[len(hits) - k]
        hits = hits[got >= kth]
    order = np.lexsort((hits, -scores[hits]))
    return tuple(int(i) for i in hits[order[:k]])


class IndexBuilder:
    """Incremental index construction: ``add`` texts in catalogue order, then ``finish``.

    Term ids are given in first-seen order; a token's id is memoised, so each token of a
    text costs one dict lookup.
    """

    _MEMO_MAX = 2_000_000

    def __init__(self, analyzer: Optional[Analyzer] = None) -> None:
        self.analyzer = analyzer or Analyzer()
        self.vocab: dict[str, int] = {}
        self.docs: list[list[int]] = []
        self._token_ids: dict[str, Optional[int]] = {}

    def _id_of(self, token: str) -> Optional[int]:
        t = self.analyzer.term(token)
        i = None
        if t is not None:
            i = self.vocab.get(t)
            if i is None:
                i = self.vocab[t] = len(self.vocab)
        if len(self._token_ids) < self._MEMO_MAX:
            self._token_ids[token] = i
        return i

    def add(self, text: str) -> None:
        memo = self._token_ids
        ids = []
        for tok in _TOKEN.findall(text.lower()):
            i = memo[tok] if tok in memo else self._id_of(tok)
            if i is not None:
                ids.append(i)
        self.docs.append(ids)

    def finish(self) -> SearchIndex:
        bm25s = require("bm25s", "webshop", "WebShop search")
        retriever = bm25s.BM25(k1=K1, b=B, method="lucene")
        vocab = dict(self.vocab)
        vocab.setdefault("", len(vocab))  # bm25s' empty token: keeps empty documents valid
        n = len(self.docs)
        retriever.index((self.docs, vocab), show_progress=False, create_empty_token=False)
        self.docs = []
        sc = retriever.scores
        index = SearchIndex(
            np.ascontiguousarray(sc["data"], dtype=np.float32),
            np.ascontiguousarray(sc["indices"], dtype=np.int32),
            np.ascontiguousarray(sc["indptr"], dtype=np.int64),
            vocab,
            n,
        )
        return index
