"""The dense retriever's cache folders: the passage vectors and the faiss index files.

Under ``cache_dir("searchqa", "dense")``:

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
its manifest before every use (the manifest layer of :mod:`twice_envs._cache`: the file's
size, and a digest of the whole file up to 16 MiB; beyond, of its size and 64 sampled
blocks, so a change confined to unsampled bytes of a large file goes unnoticed). A file
that fails these checks or that faiss cannot parse, a missing or unparseable manifest, or
a file where a folder belongs raises :class:`~twice_envs.errors.DataFormatError` naming
it, and the cache discards the folder with a warning and builds it again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable, Optional

import numpy as np

from twice_envs._cache import read_manifest, write_manifest
from twice_envs.envs.searchqa.dense_index import kind_of
from twice_envs.errors import DataFormatError

#: What the manifests of these folders name (version 3: the shared manifest layer of :mod:`twice_envs._cache`).
FOLDER_FORMAT = "searchqa.dense-store/3"
#: The file of a vectors folder, and of an index folder.
VECTORS_FILE = "vectors.npy"
INDEX_FILE = "index.faiss"


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

