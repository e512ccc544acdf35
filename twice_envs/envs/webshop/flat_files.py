"""Flat cache files: ``.npy`` arrays and a records file in one folder, checked against a manifest.

The built catalogue, search index and goal tables are flat files in one folder: ``.npy``
arrays (opened with ``mmap_mode="r"``, so every process on one machine shares their pages)
and a records file, listed last in ``manifest.json`` with each file's size, CRC-32 and array
type. Each file is written under a temporary name and renamed (:class:`FlatWriter`). Opening
(:class:`FlatFiles`) checks the manifest's format version and every file's size, checksum,
dtype and shape before anything is read; a truncated, corrupt, foreign or other-version file
raises :class:`~twice_envs.errors.DataFormatError` naming it.
"""

from __future__ import annotations

import json
import os
import re
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Iterator

import numpy as np

from twice_envs._cache import read_json
from twice_envs.errors import DataFormatError


#: The file that lists a cache folder's files; written last.
MANIFEST = "manifest.json"
_MAGIC = "twice_envs flat cache"
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_CHUNK = 1 << 22


def _check_name(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(f"bad cache file name {name!r}")
    return name


class _CrcWriter:
    """A binary file wrapper that keeps the CRC-32 and size of what went through it."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh, self.crc, self.size = fh, 0, 0

    def write(self, data: bytes) -> int:
        self.crc = zlib.crc32(data, self.crc)
        self.size += len(data)
        return self.fh.write(data)


def file_crc32(path: str | os.PathLike) -> tuple[int, int]:
    """``(crc32, size)`` of a file, read in chunks (no memory map, so no resident pages)."""
    crc, size = 0, 0
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while True:
            n = fh.readinto(buf)
            if not n:
                break
            crc = zlib.crc32(view[:n], crc)
            size += n
    return crc, size


class FlatWriter:
    """Writes a folder of flat files, then (:meth:`finish`) its manifest.

    Every file goes to a temporary name in the folder and is renamed when complete; the
    manifest comes last, so a folder without one was never finished.
    """

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.files: dict[str, dict] = {}

    def _tmp(self, name: str) -> Path:
        return self.directory / f".{name}.{os.getpid()}.tmp"

    def array(self, name: str, arr: Any) -> None:
        """Save ``arr`` as ``name`` (``.npy``, C order, no pickled objects)."""
        _check_name(name)
        arr = np.ascontiguousarray(arr)
        if arr.dtype.hasobject:
            raise TypeError(f"cache array {name} holds Python objects")
        tmp = self._tmp(name)
        try:
            with open(tmp, "wb") as fh:
                w = _CrcWriter(fh)
                np.lib.format.write_array(w, arr, allow_pickle=False)  # type: ignore[arg-type]
            os.replace(tmp, self.directory / name)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self.files[name] = {"bytes": w.size, "crc32": w.crc, "dtype": arr.dtype.str, "shape": list(arr.shape)}

    @contextmanager
    def stream(self, name: str) -> Iterator[_CrcWriter]:
        """A binary stream written to ``name`` (renamed into place when the block ends)."""
        _check_name(name)
        tmp = self._tmp(name)
        try:
            with open(tmp, "wb") as fh:
                w = _CrcWriter(fh)
                yield w
            os.replace(tmp, self.directory / name)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self.files[name] = {"bytes": w.size, "crc32": w.crc}

    def finish(self, fmt: str, meta: dict) -> None:
        """Write the manifest (format, ``meta``, the files written)."""
        from twice_envs.trajectory import atomic_write_text

        manifest = {"magic": _MAGIC, "format": fmt, "meta": meta, "files": self.files}
        atomic_write_text(self.directory / MANIFEST, json.dumps(manifest, sort_keys=True))


class FlatFiles:
    """A verified folder of flat files (see :meth:`open`); arrays come memory-mapped read-only."""

    def __init__(self, directory: Path, fmt: str, meta: dict, files: dict) -> None:
        self.directory, self.format, self.meta, self.files = directory, fmt, meta, files
        self.manifest_path = directory / MANIFEST

    @classmethod
    def open(cls, directory: str | os.PathLike, fmt: str, required: Iterable[str] = ()) -> "FlatFiles":
        """Check the manifest and every file it lists, then return the folder.

        Raises :class:`DataFormatError` naming the file when the manifest is missing, not
        one of ours, of another format version, or lacks a ``required`` file, or when a
        file is missing, of another size (truncated), fails its checksum (corrupt or
        replaced) or is not the array the manifest describes.
        """
        directory = Path(directory)
        mpath = directory / MANIFEST
        if not directory.is_dir():
            raise DataFormatError(directory, None, "not a folder (a cache folder was expected here)")
        m = read_json(mpath, "missing: the cache folder was never finished")
        if not isinstance(m, dict) or m.get("magic") != _MAGIC:
            raise DataFormatError(mpath, None, "not a twice_envs cache manifest")
        if m.get("format") != fmt:
            raise DataFormatError(
                mpath, None, f"written in cache format {m.get('format')!r}; this version reads {fmt!r}"
            )
        files, meta = m.get("files"), m.get("meta")
        if not isinstance(files, dict) or not isinstance(meta, dict):
            raise DataFormatError(mpath, None, "the manifest lacks its 'files' or 'meta' table")
        for name in required:
            if name not in files:
                raise DataFormatError(mpath, None, f"the manifest lists no {name!r}")
        for name, entry in files.items():
            if not isinstance(name, str) or not _NAME.match(name) or not isinstance(entry, dict):
                raise DataFormatError(mpath, None, f"bad file entry {name!r}")
            cls._verify(directory / name, entry)
        return cls(directory, fmt, meta, files)

    @staticmethod
    def _verify(path: Path, entry: dict) -> None:
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise DataFormatError(path, None, f"missing (listed in {MANIFEST})") from None
        if size != entry.get("bytes"):
            raise DataFormatError(
                path, None, f"is {size} bytes, {MANIFEST} says {entry.get('bytes')} (truncated or replaced)"
            )
        try:
            crc, _ = file_crc32(path)
        except OSError as exc:
            raise DataFormatError(path, None, f"unreadable: {exc}") from None
        if crc != entry.get("crc32"):
            raise DataFormatError(path, None, "its content does not match its checksum (corrupt or replaced)")

    def path(self, name: str) -> Path:
        if name not in self.files:
            raise DataFormatError(self.manifest_path, None, f"the manifest lists no {name!r}")
        return self.directory / name

    def array(self, name: str) -> np.ndarray:
        """The array ``name``, memory-mapped read-only (checked against the manifest's dtype and shape)."""
        path = self.path(name)
        entry = self.files[name]
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise DataFormatError(path, None, f"not a valid .npy array ({exc})") from None
        if arr.dtype.str != entry.get("dtype") or list(arr.shape) != entry.get("shape") or not arr.flags.c_contiguous:
            raise DataFormatError(
                path, None,
                f"holds {arr.dtype.str} {list(arr.shape)}, {MANIFEST} says {entry.get('dtype')} {entry.get('shape')}",
            )
        return arr.view(np.ndarray)
