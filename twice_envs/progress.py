"""Progress for long work: how much is done out of the total, and the time left.

Every command that runs longer than a few seconds reports through :class:`Progress`, so
they all look and behave alike:

* one line on stderr, rewritten in place, e.g.
  ``lab audit: 240/600 episodes (40%), 12 s elapsed, about 18 s left``;
* shown only when stderr is a terminal (a log file or a pipe gets nothing), and never
  after :func:`set_enabled(False) <set_enabled>` (what every command's ``--no-progress``
  flag calls, see :func:`add_argument`) or with ``TWICE_PROGRESS=0`` in the environment;
* finished with a newline on :meth:`Progress.close` (or leaving its ``with`` block), so the
  command's own output starts on a clean line.

Example::

    with Progress("lab audit", total=len(tasks), unit="tasks") as bar:
        for task in tasks:
            run(task)
            bar.update()
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import IO, Iterable, Iterator, Optional, TypeVar

T = TypeVar("T")

_forced: Optional[bool] = None


def set_enabled(flag: Optional[bool]) -> None:
    """Force progress on (``True``) or off (``False``) for this process; ``None`` restores the
    default (shown on a terminal unless ``TWICE_PROGRESS=0``)."""
    global _forced
    _forced = flag


def enabled(stream: Optional[IO[str]] = None) -> bool:
    """Whether progress is shown on ``stream`` (default stderr) under the rules above."""
    if _forced is not None:
        return _forced
    if os.environ.get("TWICE_PROGRESS", "").strip() == "0":
        return False
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def add_argument(parser: argparse.ArgumentParser) -> None:
    """Add the shared ``--no-progress`` flag; :func:`apply` then honours it."""
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress line on stderr (it shows only on a terminal anyway)")


def apply(args: argparse.Namespace) -> bool:
    """Honour ``args.no_progress``; returns whether progress is shown."""
    if getattr(args, "no_progress", False):
        set_enabled(False)
    return enabled()


def _clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class Progress:
    """``done/total`` with elapsed and remaining time, redrawn at most every ``every_s`` seconds.

    Args:
        what: the work's name, first on the line.
        total: how many units the work has (``None`` or 0: no percentage and no time left).
        unit: what a unit is ("episodes", "updates", ...).
        stream: where to draw (default stderr).
        show: force showing (``True``) or hiding (``False``); default :func:`enabled`.
        every_s: the least time between two redraws (the last one always draws).

    The time left is the elapsed time per unit so far times the units left: an estimate that
    assumes the remaining units cost what the finished ones did.
    """

    def __init__(self, what: str, total: Optional[int], *, unit: str = "episodes", stream: Optional[IO[str]] = None,
                 show: Optional[bool] = None, every_s: float = 0.5):
        if total is not None and total < 0:
            raise ValueError(f"Progress total must be >= 0, got {total}")
        self.what, self.total, self.unit = what, total, unit
        self.stream = sys.stderr if stream is None else stream
        self.show = enabled(self.stream) if show is None else show
        self.every_s = every_s
        self.done = 0
        self.t0 = time.perf_counter()
        self._drawn_at = -float("inf")
        self._width = 0
        self._closed = False

    def line(self) -> str:
        """The progress line as it would be drawn now."""
        elapsed = time.perf_counter() - self.t0
        if not self.total:
            return f"{self.what}: {self.done} {self.unit}, {_clock(elapsed)} elapsed"
        share = min(1.0, self.done / self.total)
        text = f"{self.what}: {self.done}/{self.total} {self.unit} ({share:.0%}), {_clock(elapsed)} elapsed"
        if 0 < self.done < self.total:
            text += f", about {_clock(elapsed / self.done * (self.total - self.done))} left"
        return text

    def update(self, n: int = 1) -> None:
        """Count ``n`` more units done, and redraw if due."""
        self.done += n
        now = time.perf_counter()
        if self.show and (now - self._drawn_at >= self.every_s or (self.total and self.done >= self.total)):
            self._draw()
            self._drawn_at = now

    def _draw(self) -> None:
        text = self.line()
        pad = " " * max(0, self._width - len(text))
        self._width = len(text)
        self.stream.write("\r" + text + pad)
        self.stream.flush()

    def close(self) -> None:
        """Draw the final line and end it with a newline (once; nothing when hidden)."""
        if self._closed:
            return
        self._closed = True
        if self.show:
            self._draw()
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def track(items: Iterable[T], what: str, *, total: Optional[int] = None, unit: str = "episodes",
          show: Optional[bool] = None) -> Iterator[T]:
    """Yield ``items``, counting each one done after the loop body runs (``total`` defaults to ``len(items)``)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with Progress(what, total, unit=unit, show=show) as bar:
        for item in items:
            yield item
            bar.update()
