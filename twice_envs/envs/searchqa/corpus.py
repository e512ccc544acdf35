"""A passage store on disk: contents and ids as byte blobs with offset arrays, memory-mapped.

Built once from a wiki-18 style JSONL file by streaming it; opening it reads nothing
but the offsets, so a 21M-passage corpus costs page cache, not Python objects. The
store's ``version`` is the sha256 of the source file's bytes: indexes, embeddings
and tool journals are keyed by it.

Passage ids must be unique (an integer id and the same id written as a string are one
id; a row without an id is numbered by its position). A file with a duplicate id is
refused with a :class:`~twice_envs.errors.DataFormatError` naming the file, the line of
the repeat and the line of the first use. The check keeps 8 bytes per passage (a hash
of its id), never the ids themselves.

Files of a store: ``contents.bin`` and ``ids.bin`` (the passages' UTF-8 bytes, end to
end), ``offsets.npy`` and ``id_offsets.npy`` (int64, passages + 1: where each starts),
``hashes.npy`` (uint64, one per passage: an 8-byte blake2b of its id and contents) and
``manifest.json`` (:mod:`twice_envs._cache`: each file's size and digest, whole up to
16 MiB and sampled beyond). Opening checks the manifest and the offsets' ends; reading a
passage checks its bytes against its recorded hash, so a changed byte anywhere, even in
an unsampled part of a large file, is caught when the passage holding it is read.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Iterator

import numpy as np

from twice_envs._cache import (
    MANIFEST,
    build_dir,
    cache_dir,
    cached,
    discard,
    identity,
    publish_dir,
    read_manifest,
    write_manifest,
)
from twice_envs.errors import DataFormatError
from twice_envs.envs.searchqa.loaders import iter_corpus_jsonl

#: Version 2: built only from files whose passage ids are unique. Version 3: every file
#: in the manifest, and a hash per passage (a store from an earlier version is rebuilt).
STORE_FORMAT = "searchqa.corpus/3"
FILES = ("contents.bin", "ids.bin", "offsets.npy", "id_offsets.npy", "hashes.npy")


def passage_hash(pid: bytes, contents: bytes) -> bytes:
    """The 8-byte blake2b of a passage's id and contents that its store records (``hashes.npy``, little-endian)."""
    h = hashlib.blake2b(len(pid).to_bytes(8, "little"), digest_size=8)
    h.update(pid)
    h.update(contents)
    return h.digest()


class CorpusStore:
    """Read access to a built store (see :func:`open_corpus`), checked as it is opened and read.

    Attributes:
        version: the sha256 of the source file's bytes.
        source: the source file's path.
        damaged: True once a passage failed its check (the store is then discarded, and
            the next :func:`open_corpus` builds it again).

    Raises:
        DataFormatError: naming the file, when the manifest is missing or unparseable, a
            file is missing, of another size or digest, or an array is not what the
            store records; and from :meth:`contents` / :meth:`passage_id`, when the
            passage read does not match its recorded hash.
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = d = Path(directory)
        self._identity = identity(d)
        meta = read_manifest(d, STORE_FORMAT, FILES)
        n, self.version, self.source = meta.get("passages"), meta.get("sha256"), meta.get("source")
        if type(n) is not int or n < 1 or not isinstance(self.version, str) or not isinstance(self.source, str):
            raise DataFormatError(d / MANIFEST, None, "no passage count, sha256 or source: not a store manifest")
        self.meta = meta
        self._offsets = _array(d / "offsets.npy", np.int64, n + 1)
        self._id_offsets = _array(d / "id_offsets.npy", np.int64, n + 1)
        self._hashes = _array(d / "hashes.npy", np.uint64, n)
        self._text, self._ids = _bytes(d / "contents.bin"), _bytes(d / "ids.bin")
        ends = (("offsets.npy", self._offsets, self._text), ("id_offsets.npy", self._id_offsets, self._ids))
        for name, offsets, blob in ends:
            if offsets[0] != 0 or offsets[-1] != len(blob):
                raise DataFormatError(d / name, None, f"the offsets run from {offsets[0]} to {offsets[-1]}, "
                                                      f"the file they point into has {len(blob)} bytes")
        self.damaged = False

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def _passage(self, i: int) -> tuple[bytes, bytes]:
        """The id and contents bytes of passage ``i``, checked against its recorded hash."""
        a, b = int(self._offsets[i]), int(self._offsets[i + 1])
        c, e = int(self._id_offsets[i]), int(self._id_offsets[i + 1])
        pid, text = self._ids[c:e].tobytes(), self._text[a:b].tobytes()
        if int.from_bytes(passage_hash(pid, text), "little") != int(self._hashes[i]):
            self.damaged = True
            discard(self.directory, only=self._identity)
            raise DataFormatError(self.directory / "contents.bin", None,
                                  f"passage {i} does not match the hash recorded when the store was built "
                                  "(contents.bin, ids.bin, their offsets or hashes.npy are damaged); the store "
                                  "is discarded and the next make builds it again")
        return pid, text

    def contents(self, i: int) -> str:
        """The ``'"Title"\\ntext'`` contents of passage ``i`` (0-based position)."""
        return self._passage(i)[1].decode("utf-8")

    def passage_id(self, i: int) -> str:
        return self._passage(i)[0].decode("utf-8")

    def iter_contents(self, start: int = 0, stop: int | None = None) -> Iterator[str]:
        stop = len(self) if stop is None else stop
        for i in range(start, stop):
            yield self.contents(i)


def _array(path: Path, dtype, n: int) -> np.ndarray:
    """The 1-d ``.npy`` array of ``n`` ``dtype`` values at ``path``, memory-mapped read-only."""
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as exc:  # a damaged header raises ValueError, SyntaxError, EOFError...
        raise DataFormatError(path, None, f"not a readable .npy array ({type(exc).__name__}: {exc})") from None
    if arr.dtype != dtype or arr.shape != (n,):
        raise DataFormatError(path, None, f"holds {arr.dtype} {arr.shape}, the store records {np.dtype(dtype)} ({n},)")
    return arr


def _bytes(path: Path) -> np.ndarray:
    """The bytes of ``path``, memory-mapped read-only (an empty array for an empty file)."""
    return np.memmap(path, dtype=np.uint8, mode="r") if path.stat().st_size else np.zeros(0, np.uint8)


def _fingerprint(path: Path) -> str:
    st = path.stat()
    key = json.dumps([STORE_FORMAT, str(path.resolve()), st.st_size, st.st_mtime_ns])
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def build_store(source: str | Path, directory: str | Path) -> Path:
    """Stream ``source`` (wiki-18 JSONL) into a store at ``directory`` (atomic: built aside, then renamed)."""
    source, directory = Path(source), Path(directory)
    tmp = build_dir(directory)
    try:
        write_store(source, tmp, directory.name)
        publish_dir(tmp, directory, MANIFEST)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def write_store(source: Path, directory: Path, key: str) -> None:
    """Write the store files of ``source`` into the existing folder ``directory``, the manifest last.

    ``key`` is recorded in the manifest: :func:`open_corpus` checks it against the folder's name.
    """
    sha = hashlib.sha256()
    offsets, id_offsets = [0], [0]
    id_hashes, hashes = bytearray(), bytearray()
    with open(source, "rb") as raw, open(directory / "contents.bin", "wb") as text, \
            open(directory / "ids.bin", "wb") as ids:
        for chunk in iter(lambda: raw.read(1 << 20), b""):
            sha.update(chunk)
        for _, pid, contents in iter_corpus_jsonl(source):
            b = contents.encode("utf-8")
            text.write(b)
            offsets.append(offsets[-1] + len(b))
            bi = pid.encode("utf-8")
            ids.write(bi)
            id_offsets.append(id_offsets[-1] + len(bi))
            id_hashes += hashlib.blake2b(bi, digest_size=8).digest()
            hashes += passage_hash(bi, b)
    if len(offsets) == 1:
        raise DataFormatError(source, None, "the corpus has no passages")
    _refuse_duplicate_ids(source, id_hashes, directory / "ids.bin", id_offsets)
    np.save(directory / "offsets.npy", np.asarray(offsets, dtype=np.int64))
    np.save(directory / "id_offsets.npy", np.asarray(id_offsets, dtype=np.int64))
    np.save(directory / "hashes.npy", np.frombuffer(hashes, dtype="<u8"))
    write_manifest(directory, STORE_FORMAT, FILES, {"sha256": sha.hexdigest(), "source": str(source.resolve()),
                                                    "passages": len(offsets) - 1, "key": key})


def _refuse_duplicate_ids(source: Path, id_hashes: bytearray, ids_path: Path, id_offsets: list[int]) -> None:
    """Raise a :class:`DataFormatError` at the first passage (in file order) whose id an earlier one has."""
    first_repeat = _first_repeat(np.frombuffer(id_hashes, dtype="<u8"), ids_path, id_offsets)
    if first_repeat is None:
        return
    repeat, first = first_repeat
    lines = {}
    for position, (line_no, pid, _) in enumerate(iter_corpus_jsonl(source)):
        if position in (first, repeat):
            lines[position] = (line_no, pid)
        if position >= repeat:
            break
    line_no, pid = lines[repeat]
    raise DataFormatError(
        source, line_no, f"duplicate passage id {pid!r} (first on line {lines[first][0]}); passage ids must be unique"
    )


def _first_repeat(keys: np.ndarray, ids_path: Path, id_offsets: list[int]) -> tuple[int, int] | None:
    """``(position of the repeat, position of the first use)`` of the earliest repeated id, or None.

    ``keys`` holds a hash of each passage's id; ids with equal hashes are compared as bytes.
    """
    order = np.argsort(keys, kind="stable")  # equal hashes stay in file order
    sorted_keys = keys[order]
    starts = np.flatnonzero(sorted_keys[1:] == sorted_keys[:-1])
    if len(starts) == 0:
        return None
    ids = np.memmap(ids_path, dtype=np.uint8, mode="r")

    def passage_id(i: int) -> bytes:
        return ids[id_offsets[i] : id_offsets[i + 1]].tobytes()

    first_repeat: tuple[int, int] | None = None  # (position of the repeat, position of the first use)
    for run_start in starts:
        if run_start > 0 and sorted_keys[run_start - 1] == sorted_keys[run_start]:
            continue  # inside a run already looked at
        run_end = run_start + 1
        while run_end + 1 < len(sorted_keys) and sorted_keys[run_end + 1] == sorted_keys[run_start]:
            run_end += 1
        seen: dict[bytes, int] = {}  # ids in this run of equal hashes (a hash collision keeps them apart)
        for k in range(run_start, run_end + 1):
            i = int(order[k])
            pid = passage_id(i)
            if pid in seen:
                if first_repeat is None or i < first_repeat[0]:
                    first_repeat = (i, seen[pid])
            else:
                seen[pid] = i
    return first_repeat


def open_corpus(source: str | Path) -> CorpusStore:
    """The store for ``source``, built on first use under the cache (rebuilt when the file changes).

    A damaged store (see :class:`CorpusStore`), or one built from another file, is
    discarded with a ``RuntimeWarning`` naming the bad file and built again from
    ``source``; a ``source`` that is gone raises :class:`DataFormatError` naming it.
    """
    source = Path(source)
    if not source.is_file():
        raise DataFormatError(source, None, "corpus file not found")
    directory = cache_dir("searchqa", "corpus") / _fingerprint(source)

    def open_store(d: Path) -> CorpusStore:
        store = CorpusStore(d)
        if store.meta.get("key") != d.name or store.source != str(source.resolve()):
            raise DataFormatError(d / MANIFEST, None, f"a store of {store.source}, not of {source.resolve()}")
        return store

    return cached(directory, open_store, lambda tmp: write_store(source, tmp, directory.name), "SearchQA passage store")
