"""Why a worker process died at start: a main script without the ``if __name__ == "__main__":`` guard.

A worker started with ``spawn`` or ``forkserver`` imports the main script again. If the script
starts its workers at the top level, the import starts them once more, inside the worker, and
Python refuses (the worker dies with a ``RuntimeError`` about its "bootstrapping phase"). The
parent only sees a pool that broke (``BrokenProcessPool``) or a pipe that closed (``EOFError``),
so :func:`check_layout <twice_envs.layout.check_layout>` and the async vector env ask
:func:`missing_main_guard` whether that is the reason, and say so.
"""

from __future__ import annotations

import ast
import multiprocessing
import sys
from typing import Optional

#: Start methods whose workers import the main script again.
REIMPORTING = ("spawn", "forkserver")


def _guarded(source: str) -> bool:
    """Whether ``source`` has a top-level ``if __name__ == "__main__":`` (either side of ``==``)."""
    for node in ast.parse(source).body:
        test = getattr(node, "test", None) if isinstance(node, ast.If) else None
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
            sides = [test.left, *test.comparators]
            names = [s.id for s in sides if isinstance(s, ast.Name)]
            values = [s.value for s in sides if isinstance(s, ast.Constant)]
            if names == ["__name__"] and values == ["__main__"]:
                return True
    return False


def missing_main_guard(start_method: Optional[str] = None) -> Optional[str]:
    """The explanation to add when a worker started with ``start_method`` (default: this
    process's) died at start and the main script lacks the guard; ``None`` when that cannot be
    the reason (``fork``, an interactive session, ``python -c``, a script with the guard).

    A script that cannot be read or parsed gets the explanation as a possibility.
    """
    method = start_method or multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_start_method()
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if method not in REIMPORTING or not path:
        return None
    guard = '`if __name__ == "__main__":`'
    why = (f"a worker started with {method!r} imports the main script again, so the import starts the workers "
           f"once more, which Python refuses. Put the code that starts the workers under the guard")
    try:
        with open(path, encoding="utf-8") as f:
            if _guarded(f.read()):
                return None
    except (OSError, ValueError, SyntaxError):
        return f"a worker died at start; if {path} has no {guard} guard, that is why: {why}"
    return f"a worker died at start: {path} has no {guard} guard, and {why}"
