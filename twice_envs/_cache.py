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
