"""Where twice_envs keeps built indexes, generated data and models, how builds publish them,
and how a cache is checked before use and healed when damaged.

A build writes into a temporary folder beside its target (:func:`build_dir`) and renames
it into place (:func:`publish_dir`), so readers never see half a build. A build killed
before the rename leaves its temporary folder behind; the next build of the same target
removes the ones whose process is gone (see :func:`sweep_stale_builds`).

The manifest layer. A cache folder's ``manifest.json`` (:func:`write_manifest`, written
last, so a folder without one was never finished) records the cache's format, its
metadata and, for each file, its size and a digest (:func:`file_digest`: the sha256 of
the whole file up to ``DIGEST_WHOLE`` bytes; beyond, of its size and ``DIGEST_BLOCKS``
sampled blocks, so a change confined to unsampled bytes of a large file is not seen by
this check). :func:`read_manifest` checks all of it before a file is used and raises
:class:`~twice_envs.errors.DataFormatError` naming the manifest or the first bad file.
:func:`folder_digest` fingerprints a folder that a cache is built from (a model), for cache keys.

Healing. :func:`cached` opens a cache folder, building it first when it is missing, and
again when the opener refuses it with a :class:`~twice_envs.errors.DataFormatError`:
whatever is at the folder's place (a damaged folder, a file, a link) is moved aside and
deleted (:func:`discard`), with a ``RuntimeWarning`` naming the bad file, and a fresh
build is renamed into place. A cache is never left failing every use.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import stat
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, TypeVar

from twice_envs.errors import DataFormatError
from twice_envs.trajectory import atomic_write_text, created_mode

T = TypeVar("T")

#: A temporary build folder of a live process is never removed; one whose process is gone
#: is removed once it has been untouched this long (it may belong to a process on another
#: machine sharing the cache, whose pid this machine cannot see, after ``FOREIGN_STALE_S``).
STALE_S = 10 * 60.0
FOREIGN_STALE_S = 24 * 3600.0
#: The manifest file of a cache folder, and the layout version of what it holds.
MANIFEST = "manifest.json"
MANIFEST_LAYOUT = "twice_envs.manifest/1"
#: Files up to this size are digested whole; larger ones by their size and sampled blocks.
DIGEST_WHOLE = 16 << 20
DIGEST_BLOCKS, DIGEST_BLOCK = 64, 64 << 10


def cache_dir(*parts: str) -> Path:
    """``$TWICE_CACHE`` (default ``~/.cache/twice_envs``) joined with ``parts``, created.

    A file found where one of the ``parts`` folders belongs is discarded (with a
    ``RuntimeWarning``); a cache root that is not a folder raises ``NotADirectoryError``
    naming it (it is the user's path, never removed).
    """
    root = Path(os.environ.get("TWICE_CACHE") or Path.home() / ".cache" / "twice_envs")
    if os.path.lexists(root) and not root.is_dir():
        raise NotADirectoryError(f"the cache root {root} ($TWICE_CACHE, default ~/.cache/twice_envs) is not a folder")
    path = root
    for part in parts:
        path = path / part
        if os.path.lexists(path) and not path.is_dir():
            warnings.warn(f"cache: {path} is not a folder; replacing it with one", RuntimeWarning, stacklevel=2)
            discard(path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _host() -> str:
    return "".join(c if c.isalnum() else "-" for c in socket.gethostname())[:40] or "host"


def build_dir(directory: Path) -> Path:
    """A fresh temporary folder beside ``directory`` to build it in (first sweeping stale ones).

    Its name ``.<name>.<host>-<pid>.<random>.build`` records who builds it.
    """
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale_builds(directory)
    prefix = f".{directory.name}.{_host()}-{os.getpid()}."
    return Path(tempfile.mkdtemp(prefix=prefix, suffix=".build", dir=directory.parent))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a live process of another user
        return True
    return True


def _last_touched(path: Path) -> float:
    """Newest mtime of the folder and its direct entries (a running build keeps adding files)."""
    newest = path.stat().st_mtime
    with os.scandir(path) as it:
        for entry in it:
            try:
                newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
            except OSError:
                pass
    return newest


def sweep_stale_builds(directory: Path, now: Optional[float] = None) -> list[Path]:
    """Remove the temporary build folders of ``directory`` left by killed builds; returns them.

    A folder is removed when its owner is gone (its pid is not alive on this host, or
    it is on another host) and it has not been touched for ``STALE_S`` (``FOREIGN_STALE_S``
    for another host). Folders of live builds are never touched.
    """
    directory = Path(directory)
    now = time.time() if now is None else now
    prefix, host = f".{directory.name}.", _host()
    removed = []
    try:
        candidates = [p for p in directory.parent.iterdir() if p.name.startswith(prefix) and p.name.endswith(".build")]
    except OSError:
        return removed
    for path in candidates:
        owner = path.name[len(prefix) :].split(".", 1)[0]
        owner_host, _, pid_text = owner.rpartition("-")
        if not pid_text.isdigit() or not path.is_dir():
            continue
        if owner_host == host:
            if _pid_alive(int(pid_text)):
                continue
            limit = STALE_S
        else:
            limit = FOREIGN_STALE_S
        try:
            if now - _last_touched(path) < limit:
                continue
        except OSError:
            continue  # removed meanwhile by another sweeper
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def publish_dir(tmp: Path, directory: Path, marker: str) -> None:
    """Move the fully built folder ``tmp`` to ``directory`` in one rename.

    If another process published ``directory`` first (its ``marker`` file exists), keep
    theirs and drop ``tmp``: both were built from the same inputs.
    """
    os.chmod(tmp, created_mode(directory=True))  # ``mkdtemp`` creates it private
    try:
        os.replace(tmp, directory)
    except OSError:
        if not (directory / marker).exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------------------- the manifest layer
def file_digest(path: Path) -> str:
    """sha256 of the file if it is at most ``DIGEST_WHOLE`` bytes, else of its size, first and last
    ``DIGEST_BLOCK`` bytes and evenly spaced blocks between (``DIGEST_BLOCKS`` in all).

    Cheap on a file of many GB; a truncated, overwritten or foreign file almost surely changes it.
    """
    path = Path(path)
    size = path.stat().st_size
    h = hashlib.sha256(f"{size}:".encode())
    with open(path, "rb") as fh:
        if size <= DIGEST_WHOLE:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        else:
            span = size - DIGEST_BLOCK
            for i in range(DIGEST_BLOCKS):
                fh.seek(span * i // (DIGEST_BLOCKS - 1))
                h.update(fh.read(DIGEST_BLOCK))
    return h.hexdigest()


def folder_digest(directory: Path) -> str:
    """sha256 of a folder's regular files (not its subfolders), in name order: each file's name, size
    and first MiB.

    A cheap fingerprint of a folder read whole elsewhere (a model's weights and tokenizer), part of
    the keys of the caches built from it: a file added, removed, renamed, resized or changed in its
    first MiB changes it; a change beyond the first MiB that keeps the size does not. Its value is
    stable across versions (cache folders are named after it).
    """
    directory = Path(directory)
    h = hashlib.sha256()
    for name in sorted(os.listdir(directory)):
        f = directory / name
        if f.is_file():
            h.update(name.encode())
            h.update(str(f.stat().st_size).encode())
            with open(f, "rb") as fh:
                h.update(fh.read(1 << 20))
    return h.hexdigest()


def read_json(path: Path, missing: str = "missing") -> Any:
    """The JSON value in ``path``.

    Raises:
        DataFormatError: naming ``path`` for anything that stops it being read or parsed:
            missing (the message is ``missing``), a folder, not UTF-8, not JSON, nested
            too deeply (``RecursionError``), ...
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataFormatError(path, None, missing) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DataFormatError(path, None, f"unreadable ({type(exc).__name__}: {exc})") from None
    try:
        return json.loads(text)
    except Exception as exc:  # ValueError, RecursionError for deep nesting, MemoryError: all mean "not ours"
        raise DataFormatError(path, None, f"not valid JSON ({type(exc).__name__}: {str(exc)[:200]})") from None


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(directory: Path, fmt: str, files: Iterable[str], meta: Optional[dict] = None) -> dict:
    """Record the ``files`` of ``directory`` (their sizes and :func:`file_digest`), the cache format
    ``fmt`` and ``meta`` in ``directory/manifest.json``; returns what was written.

    Call it last: the files are synced first and the manifest is written atomically, so a
    folder with a manifest is complete.
    """
    directory = Path(directory)
    entries = {}
    for name in files:
        path = directory / name
        _fsync(path)
        entries[name] = {"bytes": path.stat().st_size, "digest": file_digest(path)}
    manifest = {"layout": MANIFEST_LAYOUT, "format": fmt, "files": entries, "meta": dict(meta or {})}
    atomic_write_text(directory / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def read_manifest(directory: Path, fmt: str, files: Optional[Iterable[str]]) -> dict:
    """The ``meta`` of a folder written by :func:`write_manifest`, after checking everything it records.

    The folder must be a folder; its manifest readable JSON of this layout and of format
    ``fmt``, listing exactly ``files`` (``None``: the files it lists, at least one); and
    each file a regular file of the recorded size and digest.

    Raises:
        DataFormatError: naming the manifest or the first bad file.
    """
    directory = Path(directory)
    mpath = directory / MANIFEST
    if not directory.is_dir():
        raise DataFormatError(directory, None, "not a folder (a cache folder was expected here)")
    m = read_json(mpath, "missing: the cache folder was never finished")
    if not isinstance(m, dict) or m.get("layout") != MANIFEST_LAYOUT:
        raise DataFormatError(mpath, None, f"not a {MANIFEST_LAYOUT} cache manifest (another version wrote it, or "
                                           "it was edited)")
    if m.get("format") != fmt:
        raise DataFormatError(mpath, None, f"cache format {m.get('format')!r}; this version reads {fmt!r}")
    table, meta = m.get("files"), m.get("meta")
    if not isinstance(table, dict) or not isinstance(meta, dict):
        raise DataFormatError(mpath, None, "lacks its 'files' or 'meta' table")
    expected = sorted(table) if files is None else sorted(files)
    if sorted(table) != expected or not expected:
        raise DataFormatError(mpath, None, f"lists the files {sorted(table)}, expected {expected}")
    for name in expected:
        if name.startswith("/") or ".." in Path(name).parts:
            raise DataFormatError(mpath, None, f"lists {name!r}, not a file inside the cache folder")
        check_file(directory / name, table[name])
    return meta


def check_file(path: Path, entry: Any) -> None:
    """Check that ``path`` is a regular file with the size and digest of its manifest ``entry``.

    Raises:
        DataFormatError: naming ``path``.
    """
    path = Path(path)
    if not isinstance(entry, dict):
        raise DataFormatError(path, None, f"its {MANIFEST} entry is not a table")
    try:
        st = os.stat(path)
    except OSError as exc:
        raise DataFormatError(path, None, f"missing or unreadable ({exc.strerror}; listed in {MANIFEST})") from None
    if not stat.S_ISREG(st.st_mode):
        raise DataFormatError(path, None, "not a regular file (a folder or another kind of entry where the cache "
                                          "keeps a file)")
    if st.st_size != entry.get("bytes"):
        raise DataFormatError(path, None, f"{st.st_size} bytes where {MANIFEST} says {entry.get('bytes')}: "
                                          "truncated or overwritten")
    try:
        digest = file_digest(path)
    except OSError as exc:
        raise DataFormatError(path, None, f"unreadable ({exc.strerror})") from None
    if digest != entry.get("digest"):
        raise DataFormatError(path, None, f"its bytes do not match the digest in {MANIFEST}: the file is corrupt")


# ----------------------------------------------------------------------------- healing
def identity(path: Path) -> Optional[tuple[int, int]]:
    """What tells one file or folder at ``path`` from another put there later (device, inode); None if absent."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def discard(path: Path, only: Optional[tuple[int, int]] = None) -> None:
    """Move whatever is at ``path`` (a folder, a file, a link) aside in one rename, so readers see it
    whole or gone, then delete it.

    With ``only`` (an :func:`identity`), nothing is done if ``path`` now holds something else
    (another process has already put a fresh build there).
    """
    path = Path(path)
    if only is not None and identity(path) != only:
        return
    trash = build_dir(path)  # a build folder's name: a sweep finds it if this process dies now
    try:
        os.replace(path, trash / "old")
    except FileNotFoundError:  # another process discarded it first
        pass
    shutil.rmtree(trash, ignore_errors=True)


def _empty_folder(path: Path) -> bool:
    try:
        with os.scandir(path) as it:
            return next(it, None) is None
    except OSError:
        return False


def cached(directory: Path, open_fn: Callable[[Path], T], build_fn: Callable[[Path], None], what: str,
           marker: str = MANIFEST) -> T:
    """``open_fn(directory)``, building the cache folder first when it is missing or damaged.

    ``build_fn(tmp)`` fills a temporary folder beside ``directory`` (ending with the
    ``marker`` file, usually the manifest), which is then renamed into place. When
    ``open_fn`` refuses what is there with :class:`DataFormatError` (a damaged or foreign
    file, a missing or unparseable manifest, a file where the folder belongs), it is
    discarded with a ``RuntimeWarning`` naming the bad file, and built again (an empty
    folder is built quietly). If another process replaced the folder meanwhile, its copy
    is opened instead.

    Raises:
        DataFormatError: when a fresh build still fails ``open_fn``.
    """
    directory = Path(directory)
    built = False
    for _ in range(3):
        seen = identity(directory)
        if seen is not None:
            try:
                return open_fn(directory)
            except DataFormatError as exc:
                if built:
                    raise
                if identity(directory) != seen:
                    continue  # another process put a fresh copy there: open that
                if not _empty_folder(directory):
                    warnings.warn(f"cached {what} unusable, rebuilding it: {exc}", RuntimeWarning, stacklevel=2)
                discard(directory, only=seen)
        tmp = build_dir(directory)
        try:
            build_fn(tmp)
            publish_dir(tmp, directory, marker)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        built = True
    return open_fn(directory)
