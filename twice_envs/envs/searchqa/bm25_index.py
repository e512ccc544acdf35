"""The files of a BM25 index: a streaming writer, and a checked, memory-mapped reader.

An index is one folder of ``.npy`` files plus ``meta.json``:

* ``data.npy`` (float32) and ``indices.npy`` (int32), ``nnz`` long: the postings,
  term-major; a posting is a passage position and its precomputed BM25 weight
  ``idf(t) * tf / (k1 * (1 - b + b * dl / avgdl) + tf)``. Inside a term's list the
  passages are in ascending order.
* ``indptr.npy`` (int64, ``V + 1``): where each term's list starts in ``data``/``indices``.
* ``term_max.npy`` (float32, ``V``): the largest weight of each list.
* ``block_max.npy`` (float32) and ``block_ptr.npy`` (int64, ``V + 1``): the largest
  weight of each block of ``BLOCK`` consecutive postings of a list (a list of ``df``
  postings has ``ceil(df / BLOCK)`` blocks, the last one shorter).
* ``doc_len.npy`` (int32, ``N``): passage lengths in tokens.
* ``vocab_bytes.npy`` (uint8), ``vocab_offsets.npy`` (int64, ``V + 1``) and
  ``vocab_table.npy`` (int32 or int64, a power of two long): the terms as UTF-8 in
  term-id order, and an open-addressing hash table (linear probing, ``-1`` = empty)
  from a term's bytes to its id, so a lookup costs a few array reads and no process
  holds the vocabulary as Python objects (the table and its lookups: :mod:`.bm25_vocab`).
* ``meta.json`` (written last): the format version, the sizes, the parameters, and for
  every file its dtype, shape, size in bytes and CRC-32 checksums.

Every array is opened as a read-only memory map (what ``np.load(mmap_mode="r")``
gives, after the checks below): processes that open the same index share its pages
through the page cache.

Writing. :class:`IndexWriter` takes the passages a chunk at a time. Each chunk's
postings are sorted by term and appended to run files on disk; :meth:`IndexWriter.finish`
then merges the runs one range of terms at a time (the weights need the global
document frequencies and mean length, known only at the end). Memory holds one chunk,
one range of ``MERGE_POSTINGS`` postings (or the longest single list if that is
longer), the vocabulary (a dict of the distinct terms, about 150 bytes each, and
per-term counters); never the corpus, its postings or the whole index.
The caller builds into a temporary folder and renames it into place.

Reading. :class:`IndexFiles` checks ``meta.json`` (format version), then each file: its
size, its ``.npy`` header, dtype and shape, its checksum (the whole file for indexes up
to ``FULL_VERIFY_BYTES``, else ``SAMPLE_WINDOWS`` evenly spaced windows of every file
and the whole of the small ones), and the structure of the pointer arrays. Anything
wrong raises :class:`~twice_envs.errors.DataFormatError` naming the file, so a
truncated, corrupt or foreign file, or one written by another format version, is
never read as an index.
"""

from __future__ import annotations

import json
import zlib
from array import array
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from twice_envs._cache import read_json
from twice_envs.envs.searchqa.bm25_vocab import Vocabulary, _build_table, _encode
from twice_envs.errors import DataFormatError

#: Bump when any file's layout or meaning changes (part of the cache key; checked on open).
INDEX_FORMAT = "searchqa.bm25/2"
#: Postings per block of the block maxima.
BLOCK = 128
#: Postings merged per term range when an index is finished.
MERGE_POSTINGS = 1 << 21
#: Indexes up to this many bytes are checksummed whole on open; larger ones by windows.
FULL_VERIFY_BYTES = 1 << 29
#: Windows (each ``SAMPLE_WINDOW`` bytes) checksummed per file of a large index.
SAMPLE_WINDOWS = 64
SAMPLE_WINDOW = 1 << 16

#: The index files and their dtypes (the term table's is int32, or int64 past 2**31 slots).
FILES = {
    "data.npy": "float32",
    "indices.npy": "int32",
    "indptr.npy": "int64",
    "term_max.npy": "float32",
    "block_max.npy": "float32",
    "block_ptr.npy": "int64",
    "doc_len.npy": "int32",
    "vocab_bytes.npy": "uint8",
    "vocab_offsets.npy": "int64",
    "vocab_table.npy": None,
}

_MAX_DOCS = (1 << 31) - 1


# ----------------------------------------------------------------------------- checksums
def _bytes_of(arr: np.ndarray) -> memoryview:
    return memoryview(np.ascontiguousarray(arr).reshape(-1).view(np.uint8))


def crc_full(arr: np.ndarray) -> int:
    """CRC-32 of an array's data bytes."""
    return zlib.crc32(_bytes_of(arr)) & 0xFFFFFFFF


def crc_sample(arr: np.ndarray) -> int:
    """CRC-32 of ``SAMPLE_WINDOWS`` evenly spaced windows of an array's bytes (all of them if it is small)."""
    buf = _bytes_of(arr)
    n = len(buf)
    if n <= SAMPLE_WINDOWS * SAMPLE_WINDOW:
        return zlib.crc32(buf) & 0xFFFFFFFF
    crc = 0
    for i in range(SAMPLE_WINDOWS):
        a = (n - SAMPLE_WINDOW) * i // (SAMPLE_WINDOWS - 1)
        crc = zlib.crc32(buf[a : a + SAMPLE_WINDOW], crc)
    return crc & 0xFFFFFFFF


# ----------------------------------------------------------------------------- writing
def _write_npy(path: Path, arr: np.ndarray) -> None:
    with open(path, "wb") as fh:
        np.lib.format.write_array(fh, np.ascontiguousarray(arr), allow_pickle=False)


class IndexWriter:
    """Streams passages (as token lists) into the files of an index in ``directory`` (see the module docstring).

    Term ids are given in order of first occurrence, so the index does not depend on
    the chunking.
    """

    def __init__(self, directory: str | Path, k1: float, b: float) -> None:
        self.directory = Path(directory)
        self.k1, self.b = float(k1), float(b)
        self.vocab: dict[str, int] = {}
        self._df = np.zeros(1 << 16, dtype=np.int64)
        self.num_docs = 0
        self._tokens = 0
        self._runs = {name: open(self.directory / f"run_{name}.bin", "wb") for name in ("docs", "tf", "terms", "tptr", "doc_len")}
        self._chunks: list[tuple[int, int, int]] = []  # (first posting, first term, terms) of each chunk's run
        self._postings = 0
        self._terms = 0
        self._closed = False

    def add(self, token_lists: Sequence[Sequence[str]]) -> None:
        """Add the next passages, each as its list of tokens."""
        vocab = self.vocab
        flat = array("q")  # 8 bytes a token, no int objects
        lens = np.empty(len(token_lists), dtype=np.int64)
        for j, toks in enumerate(token_lists):
            ids = [vocab.setdefault(t, len(vocab)) for t in toks]
            lens[j] = len(ids)
            flat.extend(ids)
        if self.num_docs + len(token_lists) > _MAX_DOCS:
            raise ValueError(f"an index holds at most {_MAX_DOCS} passages")
        terms = np.frombuffer(flat, dtype=np.int64) if len(flat) else np.zeros(0, np.int64)
        local = np.repeat(np.arange(len(token_lists), dtype=np.int64), lens)
        keys, tf = np.unique((terms << 32) | local, return_counts=True)  # sorted by term, then passage
        t = keys >> 32
        docs = ((keys & 0xFFFFFFFF) + self.num_docs).astype(np.int32)
        cut = np.flatnonzero(t[1:] != t[:-1]) + 1
        first = np.concatenate([[0], cut]).astype(np.int64) if len(t) else np.zeros(0, np.int64)
        uterms = t[first].astype(np.int32)
        tptr = np.concatenate([first, [len(t)]]).astype(np.int64)
        V = len(vocab)
        if V > len(self._df):
            self._df = np.concatenate([self._df, np.zeros(max(V, 2 * len(self._df)) - len(self._df), dtype=np.int64)])
        self._df[uterms] += np.diff(tptr)
        r = self._runs
        docs.tofile(r["docs"])
        tf.astype(np.int32).tofile(r["tf"])
        uterms.tofile(r["terms"])
        tptr.tofile(r["tptr"])
        lens.astype(np.int32).tofile(r["doc_len"])
        self._chunks.append((self._postings, self._terms, len(uterms)))  # its tptr starts at first term + chunk number
        self._postings += len(t)
        self._terms += len(uterms)
        self.num_docs += len(token_lists)
        self._tokens += int(lens.sum())

    def close(self) -> None:
        """Close the run files (``finish`` does; call it when a build is abandoned)."""
        if not self._closed:
            for fh in self._runs.values():
                fh.close()
            self._closed = True

    def _run(self, name: str, dtype) -> np.ndarray:
        path = self.directory / f"run_{name}.bin"
        if path.stat().st_size == 0:
            return np.zeros(0, dtype)
        return np.asarray(np.memmap(path, dtype=dtype, mode="r"))

    def finish(self, meta: dict) -> dict:
        """Merge the runs into the index files and write ``meta.json`` (with ``meta`` added); returns the metadata."""
        self.close()
        d = self.directory
        N, V = self.num_docs, len(self.vocab)
        if N == 0:
            raise ValueError("cannot index an empty corpus")
        df = self._df[:V]
        avgdl = self._tokens / N or 1.0
        idf = np.log1p((N - df + 0.5) / (df + 0.5))
        indptr = np.zeros(V + 1, dtype=np.int64)
        np.cumsum(df, out=indptr[1:])
        nnz = int(indptr[-1])
        nblocks = (df + BLOCK - 1) // BLOCK
        block_ptr = np.zeros(V + 1, dtype=np.int64)
        np.cumsum(nblocks, out=block_ptr[1:])

        r_docs, r_tf = self._run("docs", np.int32), self._run("tf", np.int32)
        r_terms, r_tptr = self._run("terms", np.int32), self._run("tptr", np.int64)
        doc_len = self._run("doc_len", np.int32)
        _write_npy(d / "doc_len.npy", doc_len)
        _write_npy(d / "indptr.npy", indptr)
        _write_npy(d / "block_ptr.npy", block_ptr)

        def out(name: str, dtype, n: int):
            if n == 0:
                _write_npy(d / name, np.zeros(0, dtype))
                return None
            return np.lib.format.open_memmap(d / name, mode="w+", dtype=dtype, shape=(n,))

        data, indices = out("data.npy", np.float32, nnz), out("indices.npy", np.int32, nnz)
        block_max, term_max = out("block_max.npy", np.float32, int(block_ptr[-1])), out("term_max.npy", np.float32, V)
        k1, b = self.k1, self.b
        a = 0
        while a < V:
            # the next range of terms [a, z): about MERGE_POSTINGS postings, at least one term
            z = int(np.searchsorted(indptr, indptr[a] + MERGE_POSTINGS, side="right")) - 1
            z = min(max(z, a + 1), V)
            lo, hi = int(indptr[a]), int(indptr[z])
            wd = np.empty(hi - lo, dtype=np.float32)
            wi = np.empty(hi - lo, dtype=np.int32)
            cursor = indptr[a:z] - lo
            for c, (p0, t0, nt) in enumerate(self._chunks):  # passage order: every list stays sorted
                ct = r_terms[t0 : t0 + nt]
                i0, i1 = (int(x) for x in np.searchsorted(ct, [a, z]))
                if i0 == i1:
                    continue
                ptr = r_tptr[t0 + c + i0 : t0 + c + i1 + 1]
                cnt = np.diff(ptr)
                s0, s1 = int(ptr[0]), int(ptr[-1])
                docs = r_docs[p0 + s0 : p0 + s1]
                tf = r_tf[p0 + s0 : p0 + s1].astype(np.float64)
                rel = ct[i0:i1].astype(np.int64) - a
                t = np.repeat(rel + a, cnt)
                rank = np.arange(s1 - s0, dtype=np.int64) - np.repeat(ptr[:-1] - s0, cnt)
                pos = np.repeat(cursor[rel], cnt) + rank
                dl = doc_len[docs].astype(np.float64)
                wd[pos] = idf[t] * tf / (k1 * (1.0 - b + b * dl / avgdl) + tf)
                wi[pos] = docs
                cursor[rel] += cnt
            data[lo:hi] = wd
            indices[lo:hi] = wi
            starts = indptr[a:z] - lo
            nb = nblocks[a:z]
            bstarts = np.repeat(starts, nb) + BLOCK * (np.arange(int(nb.sum()), dtype=np.int64) - np.repeat(np.cumsum(nb) - nb, nb))
            block_max[block_ptr[a] : block_ptr[z]] = np.maximum.reduceat(wd, bstarts)
            term_max[a:z] = np.maximum.reduceat(wd, starts)
            a = z
        for arr in (data, indices, block_max, term_max):
            if arr is not None:
                arr.flush()
        del data, indices, block_max, term_max, r_docs, r_tf, r_terms, r_tptr, doc_len
        for name in ("docs", "tf", "terms", "tptr", "doc_len"):
            (d / f"run_{name}.bin").unlink()
        max_probe = self._write_vocab()
        info = {"format": INDEX_FORMAT, "num_docs": N, "avgdl": avgdl, "vocab": V, "nnz": nnz, "block": BLOCK,
                "max_probe": max_probe, "tokens": self._tokens, **meta}
        info["files"] = {name: describe_file(d / name) for name in FILES}
        (d / "meta.json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
        return info

    def _write_vocab(self) -> int:
        """Write the vocabulary files (in slices of terms, so no list of all encoded terms is held)."""
        d = self.directory
        V = len(self.vocab)
        offsets = np.zeros(V + 1, dtype=np.int64)
        hashes = np.zeros(V, dtype=np.uint32)
        step = 1 << 18
        words = iter(self.vocab)  # insertion order is id order
        with open(d / "vocab_bytes.raw", "wb") as raw:
            for a in range(0, V, step):
                enc = [_encode(next(words)) for _ in range(min(step, V - a))]
                lens = np.fromiter((len(e) for e in enc), dtype=np.int64, count=len(enc))
                offsets[a + 1 : a + 1 + len(enc)] = offsets[a] + np.cumsum(lens)
                hashes[a : a + len(enc)] = np.fromiter((zlib.crc32(e) for e in enc), dtype=np.uint32, count=len(enc))
                raw.write(b"".join(enc))
        path = d / "vocab_bytes.raw"
        blob = np.fromfile(path, dtype=np.uint8) if path.stat().st_size == 0 else np.memmap(path, dtype=np.uint8, mode="r")
        _write_npy(d / "vocab_bytes.npy", blob)
        del blob
        path.unlink()
        _write_npy(d / "vocab_offsets.npy", offsets)
        table, longest = _build_table(hashes)
        _write_npy(d / "vocab_table.npy", table)
        return longest


def describe_file(path: Path) -> dict:
    """What ``meta.json`` records of an index file (read back from disk)."""
    arr = load_npy(path)
    return {"dtype": str(arr.dtype), "shape": list(arr.shape), "bytes": path.stat().st_size,
            "crc32": crc_full(arr), "sample_crc32": crc_sample(arr)}


# ----------------------------------------------------------------------------- reading
def load_npy(path: Path, expect: Optional[dict] = None) -> np.ndarray:
    """A read-only memory map of the ``.npy`` file ``path`` (a plain array when it is empty).

    With ``expect`` (a :func:`describe_file` record) the file's size, dtype and shape must
    match it. Raises :class:`DataFormatError` naming the file for anything unreadable.
    """
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise DataFormatError(path, None, f"index file missing or unreadable ({exc.strerror}); the index must be rebuilt") from None
    if expect is not None and size != expect.get("bytes"):
        raise DataFormatError(path, None, f"{size} bytes where the index recorded {expect.get('bytes')}: truncated, corrupt "
                                          "or from another index; the index must be rebuilt")
    try:
        with open(path, "rb") as fh:
            version = np.lib.format.read_magic(fh)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
            else:
                raise ValueError(f"unsupported .npy version {version}")
            offset = fh.tell()
    except (ValueError, OSError, EOFError, SyntaxError) as exc:
        raise DataFormatError(path, None, f"not a .npy array file ({exc}); the index must be rebuilt") from None
    if fortran or dtype.hasobject or len(shape) != 1:
        raise DataFormatError(path, None, f"unexpected array layout (shape {shape}, dtype {dtype}); the index must be rebuilt")
    nbytes = int(shape[0]) * dtype.itemsize
    if size != offset + nbytes:
        raise DataFormatError(path, None, f"{size} bytes, but its header announces {offset + nbytes}: truncated or corrupt; "
                                          "the index must be rebuilt")
    if expect is not None and (str(dtype) != expect.get("dtype") or list(shape) != expect.get("shape")):
        raise DataFormatError(path, None, f"holds {dtype} {list(shape)} where the index recorded {expect.get('dtype')} "
                                          f"{expect.get('shape')}: from another index; the index must be rebuilt")
    if nbytes == 0:
        return np.zeros(shape, dtype)
    return np.asarray(np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape))


class IndexFiles:
    """The checked, memory-mapped arrays of an index folder (see the module docstring).

    Args:
        directory: the index folder.
        verify: ``"full"`` checksums every byte; ``"sample"`` checksums windows of each
            file (and small files whole); ``"auto"``: full up to ``FULL_VERIFY_BYTES``.

    Attributes:
        meta: the contents of ``meta.json``.
        arrays: file name -> read-only array.
        vocab: the term table.
    """

    def __init__(self, directory: str | Path, verify: str = "auto") -> None:
        if verify not in ("auto", "full", "sample"):
            raise ValueError(f"verify must be 'auto', 'full' or 'sample', got {verify!r}")
        self.directory = Path(directory)
        self.meta = read_meta(self.directory)
        files = self.meta["files"]
        total = sum(int(f.get("bytes", 0)) for f in files.values())
        full = verify == "full" or (verify == "auto" and total <= FULL_VERIFY_BYTES)
        self.arrays: dict[str, np.ndarray] = {}
        for name in FILES:
            path = self.directory / name
            arr = load_npy(path, files[name])
            if full or len(arr) * arr.itemsize <= SAMPLE_WINDOWS * SAMPLE_WINDOW:
                ok = crc_full(arr) == files[name].get("crc32")
            else:
                ok = crc_sample(arr) == files[name].get("sample_crc32")
            if not ok:
                raise DataFormatError(path, None, "checksum mismatch: the file is corrupt or from another index; "
                                                  "the index must be rebuilt")
            self.arrays[name] = arr
        self._check_structure()
        a = self.arrays
        self.vocab = Vocabulary(a["vocab_bytes.npy"], a["vocab_offsets.npy"], a["vocab_table.npy"], int(self.meta["max_probe"]))

    def _check_structure(self) -> None:
        """Cheap consistency checks (O(V + N)) that keep every later array access in bounds."""
        m, a, d = self.meta, self.arrays, self.directory
        N, V, nnz = int(m["num_docs"]), int(m["vocab"]), int(m["nnz"])

        def need(cond: bool, name: str, problem: str) -> None:
            if not cond:
                raise DataFormatError(d / name, None, f"{problem}; the index must be rebuilt")

        for name, n in (("data.npy", nnz), ("indices.npy", nnz), ("indptr.npy", V + 1), ("term_max.npy", V),
                        ("block_ptr.npy", V + 1), ("doc_len.npy", N), ("vocab_offsets.npy", V + 1)):
            need(len(a[name]) == n, name, f"{len(a[name])} entries where the index has {n}")
        indptr, block_ptr, offsets = a["indptr.npy"], a["block_ptr.npy"], a["vocab_offsets.npy"]
        df = np.diff(indptr)
        need(indptr[0] == 0 and indptr[-1] == nnz and bool((df >= 1).all()), "indptr.npy", "posting pointers out of order")
        need(np.array_equal(block_ptr[1:] - block_ptr[:-1], (df + BLOCK - 1) // BLOCK) and block_ptr[0] == 0
             and len(a["block_max.npy"]) == block_ptr[-1], "block_ptr.npy", "block pointers do not match the posting lists")
        need(offsets[0] == 0 and offsets[-1] == len(a["vocab_bytes.npy"]) and bool((np.diff(offsets) >= 0).all()),
             "vocab_offsets.npy", "term offsets out of order")
        table = a["vocab_table.npy"]
        need(len(table) >= 2 and len(table) & (len(table) - 1) == 0 and len(table) >= 2 * V
             and int(table.min()) >= -1 and int(table.max()) < V, "vocab_table.npy", "not a term table of this vocabulary")


def read_meta(directory: Path) -> dict:
    """``meta.json`` of an index folder, checked for this format version."""
    path = Path(directory) / "meta.json"
    if not Path(directory).is_dir():
        raise DataFormatError(directory, None, "not a folder (an index folder belongs here); the index must be rebuilt")
    meta = read_json(path, "missing: the folder holds no finished index; the index must be rebuilt")
    fmt = meta.get("format") if isinstance(meta, dict) else None
    if fmt != INDEX_FORMAT:
        raise DataFormatError(path, None, f"index format {fmt!r}, this version reads {INDEX_FORMAT!r}; the index must be rebuilt")
    files = meta.get("files")
    try:
        ok = isinstance(files, dict) and set(files) == set(FILES) and all(isinstance(v, dict) for v in files.values())
        ok = ok and all(int(meta[k]) >= 0 for k in ("num_docs", "vocab", "nnz", "max_probe")) and meta.get("block") == BLOCK
    except (KeyError, TypeError, ValueError):
        ok = False
    if not ok:
        raise DataFormatError(path, None, "incomplete index description; the index must be rebuilt")
    return meta
