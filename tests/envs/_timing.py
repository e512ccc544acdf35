"""Timing helper for the parser tests: how a parser's time grows with its input."""

from __future__ import annotations

import time
from typing import Callable


def growth(parse: Callable[[str], object], shape: str, small: int = 2048, factor: int = 8, repeats: int = 5) -> float:
    """CPU time of ``parse`` on ``factor * small`` characters of ``shape`` repeated, over its time on ``small``.

    About ``factor`` for a linear parser, about ``factor ** 2`` for a quadratic one
    (best of ``repeats``, thread CPU time, so a loaded machine does not skew it).
    """

    def best(n: int) -> float:
        text = (shape * (n // len(shape) + 1))[:n]
        times = []
        for _ in range(repeats):
            start = time.thread_time()
            parse(text)
            times.append(time.thread_time() - start)
        return max(min(times), 1e-7)

    return best(small * factor) / best(small)
