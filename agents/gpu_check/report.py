"""Running one section of the check within its time budget, and writing the report.

A section is a :class:`Section`: an id, a title, the function that fills its record and its
time budgets. Its record (:func:`new_record`) holds a status (:data:`STATUSES`), the criterion it
judged by, its results (JSON data), the lines of the text report and the error it raised.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import signal
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable

#: Statuses; ``FAIL`` and ``ERROR`` make the exit status 1.
STATUSES = ("PASS", "FAIL", "INFO", "SKIP", "ERROR")


@dataclasses.dataclass(frozen=True)
class Section:
    """One section of the check.

    Attributes:
        id: ``setup``, ``a``, ``b``, ...
        title: a format string with the fields ``dev`` (CUDA or CPU), ``device``, ``batches``,
            ``recipe`` and ``steps``.
        run: ``run(ctx, record, deadline)`` fills ``record``; ``deadline`` is a
            ``time.monotonic()`` value by which it should cut its work short.
        gpu_budget_s: seconds it may take at the GPU sizes ...
        cpu_budget_s: ... and at the CPU mode's tiny sizes.
    """

    id: str
    title: str
    run: Callable[[Any, dict, float], None]
    gpu_budget_s: float
    cpu_budget_s: float


class SectionTimeout(Exception):
    """A section ran past its time budget."""


def new_record(sid: str, title: str) -> dict:
    """An empty section record."""
    return {"id": sid, "title": title, "status": "INFO", "criterion": "", "budget_s": 0, "seconds": 0.0,
            "results": {}, "lines": [], "error": None}


@contextlib.contextmanager
def _alarm(seconds: float, enabled: bool):
    """Raise :class:`SectionTimeout` in the main thread after ``seconds`` (when ``enabled``)."""
    if not enabled or seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):
        raise SectionTimeout(f"over its time budget ({seconds:.0f} s)")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_section(sid: str, title: str, fn: Callable[[dict, float], None], budget: float, *,
                hard: bool = True, grace: float = 5.0) -> dict:
    """Run ``fn(record, deadline)``; an exception or a run past ``budget`` seconds marks it ERROR/FAIL.

    ``fn`` fills the record (status, criterion, results, lines) and may check ``deadline``
    (a ``time.monotonic()`` value) to cut its work short; with ``hard``, an alarm stops it
    ``grace`` seconds after the deadline.
    """
    sec = new_record(sid, title)
    sec["budget_s"] = round(budget, 1)
    t0 = time.monotonic()
    try:
        with _alarm(budget + grace, hard):
            fn(sec, t0 + budget)
    except SectionTimeout as exc:
        sec["status"] = "FAIL"
        sec["error"] = str(exc)
        sec["lines"].append(f"stopped: {exc}")
    except Exception as exc:  # noqa: BLE001 - a failing section must not stop the others
        sec["status"] = "ERROR"
        sec["error"] = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-4000:]
        sec["lines"].append(f"error: {type(exc).__name__}: {exc}")
    sec["seconds"] = round(time.monotonic() - t0, 1)
    return sec


def skip(sec: dict, why: str) -> None:
    """Mark a section record skipped, saying why."""
    sec["status"] = "SKIP"
    sec["lines"].append(f"skipped: {why}")
    sec["results"]["skipped"] = why


def worst(statuses: Iterable[str]) -> str:
    """The status of a section from its checks' statuses: ERROR, else FAIL, else PASS, else INFO, else SKIP."""
    s = set(statuses)
    for status in ("ERROR", "FAIL"):
        if status in s:
            return status
    if "PASS" in s:
        return "PASS"
    return "INFO" if "INFO" in s else "SKIP"


def render_text(report: dict) -> str:
    """The text report: one block per section, then a one-line summary."""
    out = [f"GPU checks of the keyed sampler and the build ({report['tool']})",
           f"mode: {report['mode']}; started {report['started']}; {report['seconds']} s so far"]
    for sec in report["sections"]:
        head = sec["title"] if sec["id"] == "setup" else f"({sec['id']}) {sec['title']}"
        out.append("")
        out.append(f"== {head}: {sec['status']} ({sec['seconds']} s of {sec['budget_s']} s) ==")
        if sec.get("criterion"):
            out.append(f"  criterion: {sec['criterion']}")
        out += ["  " + line for line in sec["lines"]]
    out.append("")
    out.append("summary: " + ", ".join(f"{s['id']} {s['status']}" for s in report["sections"])
               + f"; {'ok' if report['ok'] else 'FAILED'}")
    return "\n".join(out) + "\n"


def write_report(report: dict, out: Path) -> None:
    """Write ``gpu_check.json`` and ``gpu_check.txt`` into ``out`` (``report["ok"]`` set first)."""
    out.mkdir(parents=True, exist_ok=True)
    report["ok"] = not any(s["status"] in ("FAIL", "ERROR") for s in report["sections"])
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "gpu_check.txt").write_text(render_text(report))
