"""A passage store on disk: contents and ids as byte blobs with offset arrays, memory-mapped.

Built once from a wiki-18 style JSONL file by streaming it; opening it reads nothing
but the offsets, so a 21M-passage corpus costs page cache, not Python objects. The
store's ``version`` is the sha256 of the source file's bytes: indexes, embeddings
and tool journals are keyed by it.
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

STORE_FORMAT = "searchqa.corpus/1"


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
        if len(offsets) == 1:
            raise DataFormatError(source, None, "the corpus has no passages")
        np.save(tmp / "offsets.npy", np.asarray(offsets, dtype=np.int64))
        np.save(tmp / "id_offsets.npy", np.asarray(id_offsets, dtype=np.int64))
        manifest = {"format": STORE_FORMAT, "sha256": sha.hexdigest(), "source": str(source.resolve()), "passages": len(offsets) - 1}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        publish_dir(tmp, directory, "manifest.json")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def open_corpus(source: str | Path) -> CorpusStore:
    """The store for ``source``, built on first use under the cache (rebuilt when the file changes)."""
    source = Path(source)
    if not source.is_file():
        raise DataFormatError(source, None, "corpus file not found")
    directory = cache_dir("searchqa", "corpus") / _fingerprint(source)
    if not (directory / "manifest.json").exists():
        build_store(source, directory)
    return CorpusStore(directory)
