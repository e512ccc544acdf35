"""Where twice_envs keeps built indexes, generated data and models."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """``$TWICE_CACHE`` (default ``~/.cache/twice_envs``) joined with ``parts``, created."""
    root = Path(os.environ.get("TWICE_CACHE") or Path.home() / ".cache" / "twice_envs")
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def publish_dir(tmp: Path, directory: Path, marker: str) -> None:
    """Move the fully built folder ``tmp`` to ``directory`` in one rename.

    If another process published ``directory`` first (its ``marker`` file exists), keep
    theirs and drop ``tmp``: both were built from the same inputs.
    """
    import shutil

    try:
        os.replace(tmp, directory)
    except OSError:
        if not (directory / marker).exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
