"""What the ``twice bench`` commands share: progress lines on stderr and the JSON result file."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Callable

from twice_envs import progress
from twice_envs.trajectory import atomic_write_text


def stderr_log(bench: str) -> Callable[[str], None]:
    """A logger printing ``[bench NAME  SECONDSs] message`` to stderr, seconds counted from now.

    It follows the progress rule (:func:`twice_envs.progress.enabled`): lines show on a terminal
    only, never under ``--no-progress`` or ``TWICE_PROGRESS=0``; the results go to stdout and files."""
    t0 = time.time()

    def log(message: str) -> None:
        if progress.enabled():
            print(f"[bench {bench} {time.time() - t0:5.0f}s] {message}", file=sys.stderr, flush=True)

    return log


def write_json(out_dir: str | Path, name: str, result: dict) -> Path:
    """Write ``result`` to ``out_dir/name`` atomically (the folder is created) and print where."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / name, json.dumps(result, indent=1))
    print(f"written: {out / name}")
    return out / name
