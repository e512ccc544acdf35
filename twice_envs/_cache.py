"""Where twice_envs keeps built indexes, generated data and models, and how builds publish them.

A build writes into a temporary folder beside its target (:func:`build_dir`) and renames
it into place (:func:`publish_dir`), so readers never see half a build. A build killed
before the rename leaves its temporary folder behind; the next build of the same target
removes the ones whose process is gone (see :func:`sweep_stale_builds`).
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Optional

from twice_envs.trajectory import created_mode

#: A temporary build folder of a live process is never removed; one whose process is gone
#: is removed once it has been untouched this long (it may belong to a process on another
#: machine sharing the cache, whose pid this machine cannot see, after ``FOREIGN_STALE_S``).
STALE_S = 10 * 60.0
FOREIGN_STALE_S = 24 * 3600.0


def cache_dir(*parts: str) -> Path:
    """``$TWICE_CACHE`` (default ``~/.cache/twice_envs``) joined with ``parts``, created."""
    root = Path(os.environ.get("TWICE_CACHE") or Path.home() / ".cache" / "twice_envs")
    path = root.joinpath(*parts)
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
    return Path(tempfile.mkdtemp(prefix=f".{directory.name}.{_host()}-{os.getpid()}.", suffix=".build", dir=directory.parent))


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
