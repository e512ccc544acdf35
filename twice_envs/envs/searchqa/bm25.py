"""BM25 (the Lucene variant bm25s implements): a streaming index builder and two exact query paths.

The index (:mod:`.bm25_index`) stores, term-major, each posting's precomputed weight
``idf(t) * tf / (k1 * (1 - b + b * dl / avgdl) + tf)`` with per-term and per-block
maxima, as memory-mapped ``.npy`` files. A passage's score is the sum of the weights of
the query's terms it contains (a term repeated in the query counts that many times),
added left to right in float64 in the query's *summation order*: terms by decreasing
largest weight, ties by term id (:meth:`BM25Index.query_terms`). Results are the top
``k`` passages with a positive score, ties broken by passage position.

Two query paths give bit-identical results (positions and float64 scores):

* ``method="exhaustive"``: every posting of every query term is added into one score
  per passage (in summation order), and the top ``k`` is selected. Its cost grows with
  the corpus; it is the reference.
* ``method="pruned"`` (default): MaxScore, with block maxima. Terms are taken in
  summation order, most valuable first. The pool holds the best ``k`` (score,
  position) pairs found so far; once full, its last pair ``(theta, kpos)`` bounds
  what is worth reading, and a passage can still enter only with a score above
  ``theta`` or equal to it at a position before ``kpos``:

  - a term whose bound (its largest weight followed by the later terms' largest
    weights) cannot compete ends the search: no passage not yet seen can enter;
  - inside a term's list, a block of ``BLOCK`` postings whose maximum, followed by the
    later terms' maxima, cannot compete is skipped (a block starting after ``kpos``
    needs a bound above ``theta``), and so is every posting whose own weight cannot;
  - the first long list is sampled (its best blocks scored) to get a first ``theta``;
  - many candidates from one list are scored best bound first, in growing batches,
    each raising ``theta`` before the next is filtered;
  - a candidate gets the other terms' weights by binary search in their lists, in
    summation order, and is dropped as soon as its known weights, followed by the
    maxima of the terms still unknown, cannot compete.

  Bounds are the same left-to-right sum as the score, with some weights replaced by
  larger ones; rounded addition is monotone, so a bound is never below the score it
  bounds, exactly, with no rounding margin, and ties with ``theta`` are decided
  exactly. The path counts its work and, when it has spent about what the
  unpruned sum costs (``LOOKUP_UNITS``, ``BATCH_UNITS``), finishes with that sum; so
  do queries with few postings (``UNION_POSTINGS``) or more than ``MAX_PRUNED_TERMS``
  distinct terms. No path costs more than about ``n log n`` in the query's length and
  postings (plus the number of passages for the one-score-per-passage sum): a 1 MiB
  query, or one of 100k distinct terms, takes about a second.

The pruned path (:class:`_MaxScore`, its pool and its tuning constants) lives in
:mod:`.bm25_maxscore`.

MaxScore rather than block-max WAND: WAND keeps its terms sorted by current passage
and moves one cursor at a time, a loop per posting that numpy cannot vectorise (a
pure-Python cursor loop measured about 400 ns per posting, ten times the whole
exhaustive numpy sum per posting, so it would have to skip over 90% of the postings
just to break even). MaxScore's work splits into whole-array steps (select blocks,
filter a list, look up a batch of candidates), each one numpy call.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from twice_envs._cache import build_dir, cache_dir, cached, publish_dir
from twice_envs.envs.searchqa.bm25_index import INDEX_FORMAT, IndexFiles, IndexWriter

# The pruned path; its tuning constants are re-exported for reading only (_MaxScore reads them in bm25_maxscore).
from twice_envs.envs.searchqa.bm25_maxscore import (  # noqa: F401
    BATCH_UNITS,
    LOOKUP_UNITS,
    REFINE,
    SEED_BLOCKS,
    SEED_BLOCKS_MAX,
    SEED_SHARE,
    _find,
    _kth_largest,
    _MaxScore,
    _TooMany,
)
from twice_envs.errors import DataFormatError

BM25_FORMAT = INDEX_FORMAT
_WORD_RE = re.compile(r"\w+")

#: Query paths of :meth:`BM25Index.search`.
METHODS = ("pruned", "exhaustive")
#: Queries with more distinct terms than this are scored without pruning (still exact).
MAX_PRUNED_TERMS = 16
#: Queries with at most this many postings in all are scored without pruning.
UNION_POSTINGS = 4096
#: Unpruned queries are summed over the union of their postings when these are at most
#: ``1/UNION_SHARE`` of the passages, else into one score per passage.
UNION_SHARE = 8


@dataclass(frozen=True)
class BM25Params:
    """BM25 settings.

    Attributes:
        k1: term-frequency saturation (0.9 is the Lucene/Pyserini default).
        b: length normalisation (0.4 is the Lucene/Pyserini default).
        stem: Porter-style English stemming (PyStemmer).
        stopwords: drop English stopwords.
    """

    k1: float = 0.9
    b: float = 0.4
    stem: bool = True
    stopwords: bool = True

    def digest(self) -> str:
        return hashlib.sha256(json.dumps([BM25_FORMAT, asdict(self)], sort_keys=True).encode()).hexdigest()


class Tokenizer:
    """Lower-case word tokens, English stopwords removed, stemmed."""

    def __init__(self, stem: bool = True, stopwords: bool = True, cache_items: int = 2_000_000) -> None:
        from twice_envs._deps import require

        self._stem = None
        if stem:
            self._stem = require("Stemmer", "search", "BM25 stemming").Stemmer("english").stemWord
        if stopwords:
            self._stop = frozenset(require("bm25s.stopwords", "search", "BM25 stopwords").STOPWORDS_EN)
        else:
            self._stop = frozenset()
        self._cache: dict[str, str] = {}
        self._cache_items = cache_items

    def __call__(self, text: str) -> list[str]:
        cache, out = self._cache, []
        for w in _WORD_RE.findall(text.lower()):
            s = cache.get(w)
            if s is None:
                s = "" if w in self._stop else (self._stem(w) if self._stem else w)
                if len(cache) >= self._cache_items:
                    cache.clear()
                cache[w] = s
            if s:
                out.append(s)
        return out


def _chunks(texts: Iterable[str], size: int) -> Iterator[list[str]]:
    buf: list[str] = []
    for t in texts:
        buf.append(t)
        if len(buf) == size:
            yield buf
            buf = []
    if buf:
        yield buf


def build_index(texts: Iterable[str], directory: str | Path, params: BM25Params = BM25Params(), *, chunk_size: int = 50_000,
                meta: dict | None = None, progress=None) -> Path:
    """Stream ``texts`` into a BM25 index at ``directory`` (built aside, then renamed into place).

    Memory holds one chunk of ``chunk_size`` passages, one merge range and the
    vocabulary (see :mod:`.bm25_index`). ``progress(passages_done)`` is called after each chunk.
    """
    directory = Path(directory)
    tmp = build_dir(directory)
    try:
        write_index(texts, tmp, params, chunk_size=chunk_size, meta=meta, progress=progress)
        publish_dir(tmp, directory, "meta.json")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def write_index(texts: Iterable[str], directory: Path, params: BM25Params = BM25Params(), *, chunk_size: int = 50_000,
                meta: dict | None = None, progress=None) -> None:
    """Write the files of the BM25 index of ``texts`` into the existing, empty folder ``directory``
    (``meta.json`` last; see :func:`build_index`)."""
    writer = IndexWriter(directory, params.k1, params.b)
    try:
        tok = Tokenizer(params.stem, params.stopwords)
        for chunk in _chunks(texts, chunk_size):
            writer.add([tok(t) for t in chunk])
            if progress is not None:
                progress(writer.num_docs)
        writer.finish({"params": asdict(params), **(meta or {})})
    finally:
        writer.close()


def _no_hits() -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)


def topk(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions and scores of the ``k`` best positive scores; ties go to the lower position."""
    if k <= 0:
        return _no_hits()
    nz = np.flatnonzero(scores > 0)
    if len(nz) > k:
        vals = scores[nz]
        kth = _kth_largest(vals, k)
        above = nz[vals > kth]
        ties = nz[vals == kth][: k - len(above)]
        nz = np.concatenate([above, ties])
    order = np.lexsort((nz, -scores[nz]))
    sel = nz[order]
    return sel, scores[sel]


class BM25Index:
    """A built index, memory-mapped read-only (see :mod:`.bm25_index` for the files and their checks).

    Args:
        directory: the index folder.
        verify: how much of the files to checksum when opening (``"auto"``, ``"full"``, ``"sample"``).

    Raises:
        DataFormatError: naming the file, when any file is missing, truncated, corrupt,
            foreign or of another format version.
    """

    def __init__(self, directory: str | Path, verify: str = "auto") -> None:
        self.directory = Path(directory)
        self.files = IndexFiles(self.directory, verify)
        self.meta = self.files.meta
        a = self.files.arrays
        try:
            self.params = BM25Params(**self.meta["params"])
        except (KeyError, TypeError) as exc:
            raise DataFormatError(self.directory / "meta.json", None,
                                  f"no valid BM25 parameters ({exc}); the index must be rebuilt") from None
        self.data, self.indices, self.indptr = a["data.npy"], a["indices.npy"], a["indptr.npy"]
        self.term_max, self.block_max, self.block_ptr = a["term_max.npy"], a["block_max.npy"], a["block_ptr.npy"]
        self.doc_len = a["doc_len.npy"]
        self.vocab = self.files.vocab
        self.num_docs = int(self.meta["num_docs"])
        self.tokenizer = Tokenizer(self.params.stem, self.params.stopwords)

    @property
    def nbytes(self) -> int:
        """Bytes of all the index's arrays (postings, pointers, maxima, lengths, vocabulary)."""
        return int(sum(a.nbytes for a in self.files.arrays.values()))

    def disk_bytes(self) -> int:
        """Bytes of the index folder on disk."""
        return sum(p.stat().st_size for p in self.directory.iterdir() if p.is_file())

    def term_ids(self, query: str) -> list[int]:
        get = self.vocab.get
        return [i for i in map(get, self.tokenizer(query)) if i is not None]

    def query_terms(self, term_ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A query's distinct terms in summation order, with their query counts and weight bounds.

        The order is by decreasing bound (the term's largest weight times its count), ties
        by term id; both query paths add a passage's weights in this order.
        """
        terms, counts = np.unique(np.asarray(term_ids, dtype=np.int64), return_counts=True)
        ub = self.term_max[terms].astype(np.float64) * counts
        order = np.argsort(-ub, kind="stable")
        return terms[order], counts[order], ub[order]

    # ------------------------------------------------------------------ exhaustive
    def scores(self, term_ids: Sequence[int]) -> np.ndarray:
        """BM25 score of every passage (float64; weights added in :meth:`query_terms` order)."""
        if not len(term_ids):
            return np.zeros(self.num_docs)
        terms, counts, _ = self.query_terms(term_ids)
        idx, w = self._postings(terms, counts)
        out = np.bincount(idx, weights=w, minlength=self.num_docs)  # adds in posting order
        if len(out) != self.num_docs:
            self._corrupt()
        return out

    def _postings(self, terms: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """All postings of ``terms``, list after list in the given order, weights times the query counts."""
        ip = self.indptr
        lo, hi = ip[terms].tolist(), ip[terms + 1].tolist()
        idx = np.concatenate([self.indices[a:b] for a, b in zip(lo, hi)])
        w = np.concatenate([self.data[a:b] for a, b in zip(lo, hi)]).astype(np.float64)
        if counts.max() > 1:  # a term repeated in the query counts that many times
            w *= np.repeat(counts, np.subtract(hi, lo))
        return idx, w

    def _corrupt(self):
        raise DataFormatError(self.directory / "indices.npy", None,
                              "a posting names a passage beyond the corpus: corrupt; the index must be rebuilt")

    def _union_topk(self, terms: np.ndarray, counts: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The exhaustive sums over the passages that have a query term only (no corpus-sized array)."""
        idx, w = self._postings(terms, counts)
        order = np.argsort(idx, kind="stable")  # merges the sorted lists; keeps each passage's weights in order
        idx = idx[order]
        first = np.empty(len(idx), dtype=bool)
        first[0] = True
        np.not_equal(idx[1:], idx[:-1], out=first[1:])
        sc = np.bincount(np.cumsum(first) - 1, weights=w[order])  # adds in that order, as `scores`
        pos, s = topk(sc, k)
        return idx[first][pos].astype(np.int64), s

    # ------------------------------------------------------------------ search
    def search(self, query: str, k: int, method: str = "pruned") -> tuple[list[int], list[float]]:
        """Top ``k`` passages for ``query`` (only passages sharing a term with it).

        ``method`` ``"pruned"`` (default) and ``"exhaustive"`` give identical results.
        """
        pos, sc = self.search_ids(self.term_ids(query), k, method)
        return pos.tolist(), sc.tolist()

    def search_ids(self, term_ids: Sequence[int], k: int, method: str = "pruned") -> tuple[np.ndarray, np.ndarray]:
        """Top ``k`` for a query given as term ids: (positions int64, scores float64)."""
        if method == "exhaustive":
            return topk(self.scores(term_ids), k)
        if method != "pruned":
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if k <= 0 or not len(term_ids):
            return _no_hits()
        terms, counts, ub = self.query_terms(term_ids)
        ip = self.indptr
        total = int((ip[terms + 1] - ip[terms]).sum())
        if total <= UNION_POSTINGS or len(terms) > MAX_PRUNED_TERMS:
            pos, sc = self._unpruned(terms, counts, k, total)
        else:
            try:
                pos, sc = _MaxScore(self, terms, counts, ub, k, total).run()
            except _TooMany:  # pruning would look up about as many passages as there are postings
                pos, sc = self._unpruned(terms, counts, k, total)
        if len(pos) and int(pos.max()) >= self.num_docs:
            self._corrupt()
        return pos, sc

    def _unpruned(self, terms: np.ndarray, counts: np.ndarray, k: int, total: int) -> tuple[np.ndarray, np.ndarray]:
        if total * UNION_SHARE <= self.num_docs:
            return self._union_topk(terms, counts, k)
        return topk(self.scores(terms.repeat(counts)), k)

    def search_batch(self, queries: Sequence[str], k: int, method: str = "pruned") -> list[tuple[list[int], list[float]]]:
        """Top ``k`` for many queries (the same results as :meth:`search`, one by one).

        Each query is answered on its own: pruning works per query, and scoring several
        exhaustive queries in one pass measured no faster (the cost is reading postings).
        """
        return [self.search(q, k, method) for q in queries]

    def _lookup(self, t: int, count: int, docs: np.ndarray) -> np.ndarray:
        """Weight of term ``t`` (times its query count) in each of the sorted passages ``docs`` (0 where absent).

        Binary search of the passages in the list, or of the list in the passages when
        the list is the shorter.
        """
        a, b = int(self.indptr[t]), int(self.indptr[t + 1])
        lst = self.indices[a:b]
        w = np.zeros(len(docs))
        if len(docs) <= b - a:
            loc = np.searchsorted(lst, docs)
            np.minimum(loc, b - a - 1, out=loc)
            hit = lst[loc] == docs
            w[hit] = self.data[a + loc[hit]]
        else:
            at, found = _find(docs, lst)
            w[at] = self.data[a + found]
        if count != 1:
            w *= count
        return w


def index_dir(corpus_version: str, params: BM25Params) -> Path:
    return cache_dir("searchqa", "bm25") / f"{corpus_version[:24]}-{params.digest()[:12]}"


def open_index(corpus_version: str, texts: Iterable[str] | None, params: BM25Params = BM25Params(), texts_fn=None) -> BM25Index:
    """The cached index for a corpus version, built from ``texts`` (or ``texts_fn()``) on first use.

    A cached index that fails its checks (a missing, truncated, corrupt or foreign file,
    an unparseable ``meta.json``, a file where the folder belongs, another format
    version, another corpus or other parameters) is discarded with a warning naming the
    file, and rebuilt (:func:`twice_envs._cache.cached`).
    """

    def open_checked(d: Path) -> BM25Index:
        index = BM25Index(d)
        if index.meta.get("corpus_version") != corpus_version or index.meta.get("params") != asdict(params):
            raise DataFormatError(d / "meta.json", None,
                                  "built for another corpus or other parameters; the index must be rebuilt")
        return index

    def build(tmp: Path) -> None:
        write_index(texts if texts is not None else texts_fn(), tmp, params, meta={"corpus_version": corpus_version},
                    progress=_Progress())

    return cached(index_dir(corpus_version, params), open_checked, build, "BM25 index", marker="meta.json")


class _Progress:
    """Prints a line to stderr every ``every`` passages indexed (a large corpus takes minutes to hours)."""

    def __init__(self, every: int = 1_000_000) -> None:
        self.every, self.next, self.t0 = every, every, time.perf_counter()

    def __call__(self, done: int) -> None:
        if done >= self.next:
            print(f"BM25 index: {done:,} passages indexed, {time.perf_counter() - self.t0:.0f} s", file=sys.stderr, flush=True)
            self.next = (done // self.every + 1) * self.every
