"""Retrievers over a corpus store, and the search tool the env calls through its journal.

* :class:`BM25Retriever`: the cached BM25 index (:mod:`.bm25`) of the corpus.
* :class:`DenseRetriever`: a sentence encoder loaded from a local path (:mod:`.dense_encoder`:
  mean pooling, L2 normalisation, e5-style ``query: ``/``passage: `` prefixes) and a faiss
  inner-product index over the passage embeddings (:mod:`.dense_index`), built once per
  (corpus, model, index settings) and cached (:mod:`.dense_files`), or a prebuilt
  ``.index`` file.

Both retrievers are deterministic and break score ties by passage position. A
retriever's ``version`` names the corpus version and every setting that changes its
results, so a journal written for another corpus or index is never read back.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterable, Optional, Sequence

import numpy as np

from twice_envs._cache import cache_dir, cached, folder_digest
from twice_envs._deps import require
from twice_envs.envs.searchqa.bm25 import BM25Index, BM25Params, open_index
from twice_envs.envs.searchqa.corpus import CorpusStore
from twice_envs.envs.searchqa.dense_encoder import default_model_path, get_encoder
from twice_envs.envs.searchqa.dense_files import (
    open_index_dir,
    open_vectors,
    read_index_file,
    write_index_dir,
    write_vectors,
)
from twice_envs.envs.searchqa.dense_index import (
    BuildProgress,
    DenseParams,
    FlatVectors,
    build_faiss_index,
    configure_search,
    index_spec,
    kind_of,
    place_index,
    rank_rows,
    search_settings,
)
from twice_envs.tools import Tool

#: Part of the dense retriever's version (what its results depend on).
DENSE_FORMAT = "searchqa.dense/1"
#: Layout of the cached vectors and index folders (part of their cache keys).
STORE_FORMAT = "searchqa.dense-store/2"
#: Passages encoded per chunk while building the vectors.
_ENCODE_CHUNK = 4096


class Retriever:
    """Top-k passage positions and scores for a query."""

    kind: str = ""
    version: str = ""

    def search(self, query: str, k: int) -> tuple[list[int], list[float]]:
        raise NotImplementedError

    def search_batch(self, queries: Sequence[str], k: int) -> list[tuple[list[int], list[float]]]:
        return [self.search(q, k) for q in queries]


class BM25Retriever(Retriever):
    """BM25 over a corpus store; the index is built on first use and cached by corpus version."""

    kind = "bm25"

    def __init__(self, corpus: CorpusStore, params: BM25Params = BM25Params()) -> None:
        self.corpus = corpus
        self.index: BM25Index = open_index(corpus.version, None, params, texts_fn=corpus.iter_contents)
        if self.index.num_docs != len(corpus):
            raise ValueError(f"the BM25 index at {self.index.directory} has {self.index.num_docs} passages, "
                             f"the corpus {len(corpus)}")
        self.version = f"bm25:{corpus.version[:32]}:{params.digest()[:16]}"

    def search(self, query: str, k: int) -> tuple[list[int], list[float]]:
        return self.index.search(query, k)


#: The fields the flat retriever's results depend on (its version is computed from them alone).
_RESULT_FIELDS = ("query_prefix", "passage_prefix", "max_length", "index_path")
#: The fields the embeddings depend on (besides the model and the corpus).
_EMBED_FIELDS = ("passage_prefix", "max_length")


# ----------------------------------------------------------------------------- the dense retriever
def embedding_key(params: DenseParams, model_digest: str, corpus_version: str) -> str:
    """Cache key of a corpus's embeddings: format, model, the settings they depend on, corpus."""
    settings = {k: getattr(params, k) for k in _EMBED_FIELDS}
    payload = json.dumps([STORE_FORMAT, model_digest, settings, corpus_version], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def index_key(emb_key: str, spec: dict) -> str:
    """Cache key of an index built over the embeddings ``emb_key`` with build settings ``spec``."""
    return hashlib.sha256(json.dumps([STORE_FORMAT, emb_key, spec], sort_keys=True).encode()).hexdigest()


class DenseRetriever(Retriever):
    """faiss inner-product search over encoder embeddings of the corpus.

    Attributes:
        index_kind: the kind searched (for a prebuilt file, the file's kind).
        index: the searched index (:class:`FlatVectors`, a CPU faiss index, or a GPU one).
        vectors_dir: the cached embeddings folder (``None`` with ``index_path``).
        index_dir: the cached index folder (``None`` for flat and ``index_path``).
    """

    kind = "dense"

    def __init__(self, corpus: CorpusStore, params: DenseParams = DenseParams()) -> None:
        faiss = self.faiss = require("faiss", "dense", "dense retrieval")
        self.corpus, self.params = corpus, params
        model_path = Path(params.model_path or default_model_path())
        self.encoder = get_encoder(str(model_path), params.max_length, params.device, params.threads)
        model_digest = folder_digest(model_path)
        settings = {k: getattr(params, k) for k in _RESULT_FIELDS}
        digest = hashlib.sha256(json.dumps([DENSE_FORMAT, model_digest, settings], sort_keys=True).encode()).hexdigest()
        self.vectors_dir: Optional[Path] = None
        self.index_dir: Optional[Path] = None
        n, dim = len(corpus), self.encoder.dim
        if params.index_path:
            index = read_index_file(faiss, Path(params.index_path))
            kind = kind_of(faiss, index)
            if params.index_kind not in ("flat", kind):
                raise ValueError(f"index_kind={params.index_kind!r} but {params.index_path} holds a {kind!r} index")
            with open(params.index_path, "rb") as fh:  # size and first MiB: tells files apart, cheap at any size
                h = hashlib.sha256(str(Path(params.index_path).stat().st_size).encode() + fh.read(1 << 20)).hexdigest()
            digest = hashlib.sha256((digest + h).encode()).hexdigest()
            found = {}
        else:
            kind = params.index_kind
            emb_key = embedding_key(params, model_digest, corpus.version)
            root = cache_dir("searchqa", "dense")
            self.vectors_dir = root / f"{corpus.version[:24]}-{emb_key[:16]}.vectors"

            def build_vectors(tmp: Path) -> None:
                texts = (params.passage_prefix + c for c in corpus.iter_contents())
                chunks = (self.encoder.encode(batch, params.batch_size) for batch in _batches(texts, _ENCODE_CHUNK))
                meta = {"corpus_version": corpus.version, "model": model_digest,
                        "settings": {k: getattr(params, k) for k in _EMBED_FIELDS}}
                with BuildProgress("dense retrieval: encoding passages", n) as progress:
                    write_vectors(tmp, chunks, n, dim, meta, progress=progress)

            vectors = cached(self.vectors_dir, lambda d: open_vectors(d, n, dim), build_vectors, "dense vectors")
            found = index_spec(params, n, dim)
            if kind == "flat":
                index = FlatVectors(faiss, vectors)
            else:
                self.index_dir = root / f"{corpus.version[:24]}-{emb_key[:16]}.{kind}-{index_key(emb_key, found)[:16]}"

                def build(tmp: Path) -> None:
                    with BuildProgress(f"dense retrieval: building the {kind} index", n) as progress:
                        index = build_faiss_index(faiss, vectors, found, progress)
                    meta = {"corpus_version": corpus.version, "vectors": self.vectors_dir.name}
                    write_index_dir(faiss, index, tmp, found, meta)

                index = cached(self.index_dir, lambda d: open_index_dir(faiss, d, found, n), build,
                               f"dense {kind} index")
                del vectors  # the index file holds the rows the index searches
        if index.ntotal != n:
            raise ValueError(f"the dense index has {index.ntotal} vectors but the corpus has {n} passages")
        search = search_settings(params, kind)
        if search:
            configure_search(faiss, index, search)
        if kind != "flat":
            extra = json.dumps([found, search], sort_keys=True)
            digest = hashlib.sha256((digest + extra).encode()).hexdigest()
        self.index_kind = kind
        self.index = place_index(faiss, index, params.use_gpu, kind)
        self.version = f"dense:{corpus.version[:32]}:{digest[:16]}"

    def search(self, query: str, k: int) -> tuple[list[int], list[float]]:
        return self.search_batch([query], k)[0]

    def search_batch(self, queries: Sequence[str], k: int) -> list[tuple[list[int], list[float]]]:
        if not queries:
            return []
        q = self.encoder.encode([self.params.query_prefix + x for x in queries])
        return self.search_vectors(q, k)

    def search_vectors(self, q: np.ndarray, k: int) -> list[tuple[list[int], list[float]]]:
        """Top ``k`` per row of already-encoded queries (ties by position)."""
        extra = min(self.index.ntotal, k + 8)  # a margin so equal scores can be re-ordered by position
        scores, ids = self.index.search(np.ascontiguousarray(q, dtype=np.float32), extra)
        return rank_rows(scores, ids, k)


def _batches(items: Iterable, size: int) -> Iterable[list]:
    batch: list = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


class SearchTool(Tool):
    """The env's search as a replayable tool: ``call(query, k) -> {"ids", "scores"}``.

    Its version is the retriever's (corpus version + index settings), so journal
    entries never cross corpora or indexes.
    """

    def __init__(self, retriever: Retriever) -> None:
        self.retriever = retriever
        self.name = f"searchqa.{retriever.kind}"
        self.version = retriever.version

    def call(self, query: str, k: int) -> dict:
        ids, scores = self.retriever.search(query, int(k))
        return {"ids": [int(i) for i in ids], "scores": [float(s) for s in scores]}
