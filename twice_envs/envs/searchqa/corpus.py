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
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Iterator

import numpy as np

from twice_envs._cache import build_dir, cache_dir, publish_dir
from twice_envs.errors import DataFormatError
from twice_envs.envs.searchqa.loaders import iter_corpus_jsonl

#: Version 2: built only from files whose passage ids are unique (a store from an
#: earlier version is rebuilt, and so checked, on first use).
STORE_FORMAT = "searchqa.corpus/2"


class CorpusStore:
    """Read access to a built store (see :func:`open_corpus`)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        meta = json.loads((self.directory / "manifest.json").read_text())
        self.version: str = meta["sha256"]
        self.source: str = meta["source"]
        self._offsets = np.load(self.directory / "offsets.npy", mmap_mode="r")
        self._id_offsets = np.load(self.directory / "id_offsets.npy", mmap_mode="r")
        self._text = np.memmap(self.directory / "contents.bin", dtype=np.uint8, mode="r") if self._offsets[-1] > 0 else np.zeros(0, np.uint8)
        self._ids = np.memmap(self.directory / "ids.bin", dtype=np.uint8, mode="r") if self._id_offsets[-1] > 0 else np.zeros(0, np.uint8)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def contents(self, i: int) -> str:
        """The ``'"Title"\\ntext'`` contents of passage ``i`` (0-based position)."""
        a, b = int(self._offsets[i]), int(self._offsets[i + 1])
        return self._text[a:b].tobytes().decode("utf-8")

    def passage_id(self, i: int) -> str:
        a, b = int(self._id_offsets[i]), int(self._id_offsets[i + 1])
        return self._ids[a:b].tobytes().decode("utf-8")

    def iter_contents(self, start: int = 0, stop: int | None = None) -> Iterator[str]:
        stop = len(self) if stop is None else stop
        for i in range(start, stop):
            yield self.contents(i)


def _fingerprint(path: Path) -> str:
    st = path.stat()
    return hashlib.sha256(json.dumps([STORE_FORMAT, str(path.resolve()), st.st_size, st.st_mtime_ns]).encode()).hexdigest()[:32]


def build_store(source: str | Path, directory: str | Path) -> Path:
    """Stream ``source`` (wiki-18 JSONL) into a store at ``directory`` (atomic: built aside, then renamed)."""
    source, directory = Path(source), Path(directory)
    tmp = build_dir(directory)
    try:
        sha = hashlib.sha256()
        offsets, id_offsets = [0], [0]
        id_hashes = bytearray()
        with open(source, "rb") as raw, open(tmp / "contents.bin", "wb") as text, open(tmp / "ids.bin", "wb") as ids:
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
        if len(offsets) == 1:
            raise DataFormatError(source, None, "the corpus has no passages")
        _refuse_duplicate_ids(source, id_hashes, tmp / "ids.bin", id_offsets)
        np.save(tmp / "offsets.npy", np.asarray(offsets, dtype=np.int64))
        np.save(tmp / "id_offsets.npy", np.asarray(id_offsets, dtype=np.int64))
        manifest = {"format": STORE_FORMAT, "sha256": sha.hexdigest(), "source": str(source.resolve()), "passages": len(offsets) - 1}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        publish_dir(tmp, directory, "manifest.json")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


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
    """The store for ``source``, built on first use under the cache (rebuilt when the file changes)."""
    source = Path(source)
    if not source.is_file():
        raise DataFormatError(source, None, "corpus file not found")
    directory = cache_dir("searchqa", "corpus") / _fingerprint(source)
    if not (directory / "manifest.json").exists():
        build_store(source, directory)
    return CorpusStore(directory)
