"""BM25 (the Lucene variant bm25s implements) with a streaming index builder.

The index is a term-major sparse matrix in bm25s's layout (``data``/``indices``/
``indptr`` of a CSC matrix docs x vocabulary, each entry the precomputed
``idf(t) * tf / (k1 * (1 - b + b * dl / avgdl) + tf)``). Building streams the corpus
in chunks, so memory holds one chunk plus the vocabulary, and the arrays are written
straight into ``.npy`` files; queries add the posting lists of their terms and take
the top k with ties broken by passage position.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from twice_envs._cache import build_dir, publish_dir

BM25_FORMAT = "searchqa.bm25/1"
_WORD_RE = re.compile(r"\w+")


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


def build_index(texts: Iterable[str], directory: str | Path, params: BM25Params = BM25Params(), *, chunk_size: int = 50_000, meta: dict | None = None) -> Path:
    """Stream ``texts`` into a BM25 index at ``directory`` (built aside, then renamed into place)."""
    directory = Path(directory)
    tmp = build_dir(directory)
    try:
        tok = Tokenizer(params.stem, params.stopwords)
        vocab: dict[str, int] = {}
        df = np.zeros(1 << 16, dtype=np.int64)
        doc_len_parts: list[np.ndarray] = []
        chunk_files: list[Path] = []
        n_docs = 0
        for ci, chunk in enumerate(_chunks(texts, chunk_size)):
            flat: list[int] = []
            lens = np.empty(len(chunk), dtype=np.int64)
            for j, text in enumerate(chunk):
                ids = [vocab.setdefault(t, len(vocab)) for t in tok(text)]
                lens[j] = len(ids)
                flat.extend(ids)
            terms = np.asarray(flat, dtype=np.int64)
            local = np.repeat(np.arange(len(chunk), dtype=np.int64), lens)
            keys, tf = np.unique((local << 32) | terms, return_counts=True)  # sorted by doc, then term
            t = (keys & 0xFFFFFFFF).astype(np.int32)
            d = ((keys >> 32) + n_docs).astype(np.int32)
            if len(vocab) > len(df):
                df = np.concatenate([df, np.zeros(max(len(vocab), 2 * len(df)) - len(df), dtype=np.int64)])
            df[: len(vocab)] += np.bincount(t, minlength=len(vocab))
            path = tmp / f"chunk{ci}.npz"
            np.savez(path, d=d, t=t, tf=tf.astype(np.int32))
            chunk_files.append(path)
            doc_len_parts.append(lens)
            n_docs += len(chunk)
        if n_docs == 0:
            raise ValueError("cannot index an empty corpus")
        V = len(vocab)
        df = df[:V]
        doc_len = np.concatenate(doc_len_parts).astype(np.float64)
        avgdl = float(doc_len.mean()) or 1.0
        idf = np.log1p((n_docs - df + 0.5) / (df + 0.5))
        indptr = np.zeros(V + 1, dtype=np.int64)
        np.cumsum(df, out=indptr[1:])
        nnz = int(indptr[-1])
        data = np.lib.format.open_memmap(tmp / "data.npy", mode="w+", dtype=np.float32, shape=(nnz,))
        indices = np.lib.format.open_memmap(tmp / "indices.npy", mode="w+", dtype=np.int32, shape=(nnz,))
        cursor = indptr[:-1].copy()
        k1, b = params.k1, params.b
        for path in chunk_files:
            with np.load(path) as z:
                d, t, tf = z["d"], z["t"], z["tf"].astype(np.float64)
            score = idf[t] * tf / (k1 * (1.0 - b + b * doc_len[d] / avgdl) + tf)
            order = np.argsort(t, kind="stable")  # keeps passage order inside each posting list
            ts = t[order]
            rank = np.arange(len(ts)) - np.searchsorted(ts, ts, side="left")
            pos = cursor[ts] + rank
            data[pos] = score[order]
            indices[pos] = d[order]
            cursor += np.bincount(t, minlength=V)
            path.unlink()
        data.flush()
        indices.flush()
        del data, indices
        np.save(tmp / "indptr.npy", indptr)
        vocab_list = [""] * V
        for w, i in vocab.items():
            vocab_list[i] = w
        (tmp / "vocab.json").write_text(json.dumps(vocab_list, ensure_ascii=True))
        info = {"format": BM25_FORMAT, "params": asdict(params), "num_docs": n_docs, "avgdl": avgdl, "vocab": V, "nnz": nnz, **(meta or {})}
        (tmp / "meta.json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
        publish_dir(tmp, directory, "meta.json")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def topk(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions and scores of the ``k`` best positive scores; ties go to the lower position."""
    nz = np.flatnonzero(scores > 0)
    if len(nz) > k:
        vals = scores[nz]
        kth = np.partition(vals, len(vals) - k)[len(vals) - k]
        above = nz[vals > kth]
        ties = nz[vals == kth][: k - len(above)]
        nz = np.concatenate([above, ties])
    order = np.lexsort((nz, -scores[nz]))
    sel = nz[order]
    return sel, scores[sel]


class BM25Index:
    """A built index, loaded into memory (or memory-mapped when large)."""

    def __init__(self, directory: str | Path, mmap_over_bytes: int = 1 << 30) -> None:
        self.directory = Path(directory)
        self.meta = json.loads((self.directory / "meta.json").read_text())
        p = self.meta["params"]
        self.params = BM25Params(**p)
        size = (self.directory / "data.npy").stat().st_size
        mode = "r" if size > mmap_over_bytes else None
        self.data = np.load(self.directory / "data.npy", mmap_mode=mode)
        self.indices = np.load(self.directory / "indices.npy", mmap_mode=mode)
        self.indptr = np.load(self.directory / "indptr.npy")
        self.vocab = {w: i for i, w in enumerate(json.loads((self.directory / "vocab.json").read_text()))}
        self.num_docs = int(self.meta["num_docs"])
        self.tokenizer = Tokenizer(self.params.stem, self.params.stopwords)

    @property
    def nbytes(self) -> int:
        """Bytes of the score arrays (data, indices, indptr)."""
        return int(self.data.nbytes + self.indices.nbytes + self.indptr.nbytes)

    def term_ids(self, query: str) -> list[int]:
        v = self.vocab
        return [v[t] for t in self.tokenizer(query) if t in v]

    def scores(self, term_ids: Sequence[int]) -> np.ndarray:
        """BM25 score of every passage (float64; terms summed in term-id order, as the batch path does)."""
        if not term_ids:
            return np.zeros(self.num_docs)
        terms, counts = np.unique(np.asarray(term_ids, dtype=np.int64), return_counts=True)
        ip = self.indptr
        idx = np.concatenate([self.indices[ip[t] : ip[t + 1]] for t in terms])
        w = np.concatenate([self.data[ip[t] : ip[t + 1]] for t in terms]).astype(np.float64)
        if counts.max() > 1:  # a term repeated in the query counts that many times
            w *= np.repeat(counts, ip[terms + 1] - ip[terms])
        return np.bincount(idx, weights=w, minlength=self.num_docs)

    def search(self, query: str, k: int) -> tuple[list[int], list[float]]:
        """Top ``k`` passages for ``query`` (only passages sharing a term with it)."""
        pos, sc = topk(self.scores(self.term_ids(query)), k)
        return pos.tolist(), sc.tolist()

    def search_batch(self, queries: Sequence[str], k: int) -> list[tuple[list[int], list[float]]]:
        """Top ``k`` for many queries (the same results as :meth:`search`, one by one).

        Scoring several queries in one pass (a sparse product, or one offset
        ``bincount``) measured no faster here: the cost is reading posting lists.
        """
        return [self.search(q, k) for q in queries]


def index_dir(corpus_version: str, params: BM25Params) -> Path:
    from twice_envs._cache import cache_dir

    return cache_dir("searchqa", "bm25") / f"{corpus_version[:24]}-{params.digest()[:12]}"


def open_index(corpus_version: str, texts: Iterable[str] | None, params: BM25Params = BM25Params(), texts_fn=None) -> BM25Index:
    """The cached index for a corpus version, built from ``texts_fn()`` on first use."""
    d = index_dir(corpus_version, params)
    if not (d / "meta.json").exists():
        build_index(texts if texts is not None else texts_fn(), d, params, meta={"corpus_version": corpus_version})
    return BM25Index(d)
