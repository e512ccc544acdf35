"""Reading what ``twice view`` shows: record files, run folders and audit folders, normalised.

:func:`load` takes a path and returns an :class:`Explorer`: a list of episode summaries (the
page's list), one detail per episode (what a click opens: turns, tokens and keys, credit,
coins and twins), learning curves, credit-vs-``A*`` scatters, and the problems met on the way.
A damaged line or file is named (``file:line: what is wrong``) and the rest is read.

Accepted paths:

* a record file (JSON lines): episodes as ``twice rollout`` writes them (a trajectory record
  with the agent's record under ``"episode"``), twins among them (``twin_of`` names their
  factual episode's index in its batch, and the turn), or plain trajectory records
  (``twice play``'s ``:save``, ``RecordEpisodes``);
* a ``twice train`` run folder (``config.json``, ``metrics.jsonl``, ``episodes.jsonl``);
* an audit folder: ``twice audit`` on an LLM env (``audit.json``, ``audit_episodes.jsonl``,
  ``audit_decisions.csv``) or on a lab env (``lab_audit.json``, ``lab_episodes.jsonl``,
  ``lab_decisions.csv``), and ``twice bench learn``'s ``learn.json`` (learning curves);
* a folder holding any of these (``twice demo``'s output, a folder of rollout files), searched
  two levels deep.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from twice_envs.agents.records import AUDIT_EPISODES, LAB_EPISODES, ORACLE, RUN_EPISODES
from twice_envs.agents.types import EpisodeRecord
from twice_envs.agents.view.episodes import (
    TASK_TEXT,
    _detail,
    _Entry,
    _num,
    _short,
    _text,
    _twin,
    read_records,
    task_of,
)
from twice_envs.errors import TrajectoryFormatError
from twice_envs.trajectory import read_json_lines

__all__ = ["TASK_TEXT", "Explorer", "load", "load_audit", "load_file", "load_learn", "load_run", "read_records", "task_of"]

#: The files that mark an audit folder and a learning-curve file.
AUDIT_MARKER = "audit.json"
LAB_MARKER = "lab_audit.json"
LEARN_MARKER = "learn.json"
#: Folders not searched for inputs.
SKIP_DIRS = {"checkpoint", "__pycache__", ".git"}
#: Why an episode may have no twins, by where it came from.
WHY_NO_TWINS = {
    "records": "no twins in this file: `twice rollout` samples factual episodes only; twins are run by "
               "`twice train` with a twin-credit method and by `twice audit`",
    "trajectory": "a bare trajectory record (no agent record): it holds no tokens, credit or twins",
    "audit": "no decision of this episode was audited (an audit twins the first episode of each group)",
    "lab": "no decision of this episode was twinned in the audit",
}


@dataclass
class Explorer:
    """Everything the page shows (plain JSON data).

    Attributes:
        title: the page's title.
        path: what was read.
        sources: one ``{"name", "kind", "path"}`` per run, audit or file read.
        rows: one summary per listed episode: ``[id, source, task, question, return, turns, method,
            twins, mixed group, batch, group]``.
        details: one detail per row, in the same order: its turns (tokens with their keys, credit,
            coins), its twins and, where it has none, why.
        curves: learning-curve charts: ``{"title", "x", "y", "series": [{"name", "x", "y", "lo", "hi"}]}``.
        scatters: per audit, ``{"source", "title", "methods": {name: [[A*, credit, row, turn], ...]}, "note"}``.
        problems: ``"file:line: what is wrong"`` for everything that could not be read.
    """

    title: str
    path: str
    sources: list = field(default_factory=list)
    rows: list = field(default_factory=list)
    details: list = field(default_factory=list)
    curves: list = field(default_factory=list)
    scatters: list = field(default_factory=list)
    problems: list = field(default_factory=list)


class _Builder:
    """Collects rows and details from several sources."""

    def __init__(self, explorer: Explorer):
        self.x = explorer

    def source(self, name: str, kind: str, path: Path) -> dict:
        s = {"name": name, "kind": kind, "path": str(path)}
        self.x.sources.append(s)
        return s

    def add_entries(self, entries: list[_Entry], source: dict, method: str, why_key: str) -> dict:
        """Join twins to their factual episodes and add every episode; returns ``{(batch, index): row}``."""
        factual: dict = {}
        order: dict = {}
        twins: dict = {}
        orphans = []
        for e in entries:
            if e.ep.twin_of is None:
                b = _hashable(e.batch)
                i = e.index if e.index is not None else order.get(b, 0)
                order[b] = max(order.get(b, 0), i + 1)
                factual[(b, i)] = e
            else:
                twins.setdefault((_hashable(e.batch), int(e.ep.twin_of[0])), []).append(e)
        for key, tws in twins.items():
            if key not in factual:
                orphans += tws
        rows = {}
        groups: dict = {}
        for key, e in factual.items():
            groups.setdefault((key[0], e.ep.group), set()).add(round(float(e.ep.utility), 9))
        for key, e in factual.items():
            tws = sorted(twins.get(key, []), key=lambda w: (int(w.ep.twin_of[1]), w.ep.pair, w.ep.branch))
            why = None
            if not tws:
                why = self._why(e, why_key)
            detail = _detail(e, source, method, [_twin(w.ep, e.ep, w.where) for w in tws], why)
            mixed = len(groups[(key[0], e.ep.group)]) > 1
            rows[key] = self.add(detail, len(tws), mixed, e.ep)
        for w in orphans:
            detail = _detail(w, source, method, [], None)
            detail["why"] = (f"this is a twin (branch turn {w.ep.twin_of[1]}) whose factual episode (index "
                             f"{w.ep.twin_of[0]} of batch {w.batch}) is not in the file; it is shown alone")
            detail["orphan"] = True
            self.add(detail, 0, False, w.ep)
        return rows

    def _why(self, e: _Entry, why_key: str) -> str:
        if e.bare:
            return WHY_NO_TWINS["trajectory"]
        coins = [c for c in (e.ep.coins or []) if isinstance(c, dict) and c]
        if coins and not any(c.get("B") for c in coins):
            qs = ", ".join(f"{c['q']:.2f}" for c in coins if _num(c.get("q")) is not None)
            return f"no decision of this episode was branched: every branch coin B was 0 (q per turn: {qs})"
        if coins:
            return "a decision was branched (B = 1) but its twins are not in the file"
        if why_key == "run":
            return "this run's credit step ran no twins for this episode (its method uses none, or none was branched)"
        return WHY_NO_TWINS.get(why_key, "no twins were recorded for this episode")

    def add(self, detail: dict, n_twins: int, mixed: bool, ep: EpisodeRecord) -> int:
        n = len(self.x.details)
        detail["id"] = n
        self.x.details.append(detail)
        # [id, source, task, question, return, turns, method, twins, mixed, batch, group]
        self.x.rows.append([n, detail["source"], detail["task"], detail["question"][:160], detail["U"],
                            len(detail["turns"]), detail["method"], n_twins, bool(mixed), detail["batch"], ep.group])
        return n


def _hashable(x: Any) -> Any:
    return x if isinstance(x, (int, str, float, type(None))) else json.dumps(x, sort_keys=True)


# --------------------------------------------------------------------------- kinds of input


def _read_json(path: Path, problems: list) -> Optional[dict]:
    try:
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError) as exc:
        problems.append(f"{path}: cannot read ({_short(exc)})")
        return None
    if not isinstance(data, dict):
        problems.append(f"{path}: expected a JSON object")
        return None
    return data


def _json_rows(path: Path, problems: list) -> list[dict]:
    """The objects of a JSON lines file (metrics), naming each damaged line."""
    rows = []
    try:
        for where, data in read_json_lines(path):
            if isinstance(data, TrajectoryFormatError):
                problems.append(str(data))
            elif not isinstance(data, dict):
                problems.append(f"{where}: expected a JSON object")
            else:
                rows.append(data)
    except TrajectoryFormatError as exc:
        problems.append(str(exc))
    return rows


def _mean_ci(values: list) -> tuple[float, float, float]:
    """Mean and 95% normal interval of the mean (the interval collapses for one value)."""
    n = len(values)
    m = sum(values) / n
    if n < 2:
        return m, m, m
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    h = 1.96 * sd / math.sqrt(n)
    return m, m - h, m + h


def load_run(b: _Builder, folder: Path, name: str) -> None:
    """A ``twice train`` run folder: its episodes and learning curves."""
    x = b.x
    config = _read_json(folder / "config.json", x.problems) or {}
    method = _text(config.get("method")) or "?"
    source = b.source(name, "run", folder)
    entries = read_records(folder / RUN_EPISODES, x.problems) if (folder / RUN_EPISODES).exists() else []
    if not (folder / RUN_EPISODES).exists():
        x.problems.append(f"{folder}: no {RUN_EPISODES} (a run written before runs recorded their episodes): "
                          "learning curves only")
    b.add_entries(entries, source, method, "run")
    metrics = _json_rows(folder / "metrics.jsonl", x.problems) if (folder / "metrics.jsonl").exists() else []
    by_batch: dict = {}
    for e in entries:
        if e.ep.twin_of is None and isinstance(e.batch, int):
            by_batch.setdefault(e.batch, []).append(float(e.ep.utility))
    train = [r for r in metrics if _num(r.get("reward")) is not None and isinstance(r.get("update"), int)]
    series = []
    if train:
        xs, ys, lo, hi = [], [], [], []
        for r in train:
            u = r["update"]
            xs.append(u)
            if by_batch.get(u):
                m, a, c = _mean_ci(by_batch[u])
                ys.append(m)
                lo.append(a)
                hi.append(c)
            else:
                ys.append(_num(r["reward"]))
                lo.append(None)
                hi.append(None)
        series.append({"name": f"{name} ({method})", "x": xs, "y": ys, "lo": lo, "hi": hi})
    evals = [r for r in metrics if isinstance(r.get("eval"), dict) and isinstance(r.get("update"), int)]
    eval_series = []
    if evals:
        measure = _text(evals[0]["eval"].get("measure")) or "em"
        xs, ys, lo, hi = [], [], [], []
        for r in evals:
            ev = r["eval"]
            v = _num(ev.get(measure))
            if v is None:
                continue
            ci = ev.get(f"{measure}_ci")
            xs.append(r["update"])
            ys.append(v)
            ok = isinstance(ci, list) and len(ci) == 2
            lo.append(_num(ci[0]) if ok else None)
            hi.append(_num(ci[1]) if ok else None)
        eval_series.append({"name": f"{name} ({method})", "x": xs, "y": ys, "lo": lo, "hi": hi, "measure": measure})
    _merge_curve(x, "Training reward per update (mean over the update's episodes, 95% interval)", "update",
                 "reward", series)
    if eval_series:
        _merge_curve(x, f"Held-out {eval_series[0]['measure']} (greedy, 95% Wilson interval)", "update",
                     eval_series[0]["measure"], eval_series)


def _merge_curve(x: Explorer, title: str, xlab: str, ylab: str, series: list) -> None:
    if not series:
        return
    for c in x.curves:
        if c["title"] == title:
            c["series"] += series
            return
    x.curves.append({"title": title, "x": xlab, "y": ylab, "series": series})


def load_learn(b: _Builder, path: Path, name: str) -> None:
    """``twice bench learn``'s ``learn.json``: exact ``V(s0)`` per update with bootstrap bands."""
    doc = _read_json(path, b.x.problems)
    if not doc or not isinstance(doc.get("methods"), dict):
        if doc is not None:
            b.x.problems.append(f"{path}: no 'methods' (not a learn.json)")
        return
    b.source(f"{name}/{path.name}" if name else path.name, "learn", path)
    series = []
    for m, r in doc["methods"].items():
        if not isinstance(r, dict) or not isinstance(r.get("curve"), list):
            b.x.problems.append(f"{path}: method {m!r} has no curve")
            continue
        n = len(r["curve"])
        lo, hi = r.get("lo") or [None] * n, r.get("hi") or [None] * n
        series.append({"name": str(m), "x": list(range(n)), "y": [_num(v) for v in r["curve"]],
                       "lo": [_num(v) for v in lo], "hi": [_num(v) for v in hi]})
    env = (doc.get("config") or {}).get("env", "lab") if isinstance(doc.get("config"), dict) else "lab"
    _merge_curve(b.x, f"{name}: exact V(s0) per update on {env} (mean over seeds, 95% bootstrap band)", "update",
                 "V(s0)", series)


def load_audit(b: _Builder, folder: Path, name: str, lab: bool) -> None:
    """An audit folder: its episodes (audited decisions with credits and ``A*``, and their twins) and
    the credit-vs-``A*`` scatter of every row."""
    x = b.x
    kind = "lab" if lab else "audit"
    doc = _read_json(folder / (LAB_MARKER if lab else AUDIT_MARKER), x.problems) or {}
    env = (doc.get("config") or {}).get("env", "") if isinstance(doc.get("config"), dict) else ""
    source = b.source(name, kind, folder)
    records = folder / (LAB_EPISODES if lab else AUDIT_EPISODES)
    title = f"{name}: credit against A* on {env}" if env else f"{name}: credit against A*"
    if records.exists():
        entries = read_records(records, x.problems)
        rows = b.add_entries(entries, source, "audit", kind)
        methods: dict = {}
        for row in rows.values():
            d = x.details[row]
            for k, t in enumerate(d["turns"]):
                c = t.get("credit") or {}
                a = c.get(ORACLE)
                if a is None:
                    continue
                for m, v in c.items():
                    if m != ORACLE and v is not None:
                        methods.setdefault(m, []).append([a, v, row, k])
        x.scatters.append({"source": name, "title": title, "methods": methods, "note": ""})
        return
    csv_path = folder / ("lab_decisions.csv" if lab else "audit_decisions.csv")
    methods = _csv_points(csv_path, x.problems)
    x.problems.append(f"{folder}: no {records.name} (an audit written before audits recorded their episodes): "
                      "the scatter's points do not open episodes")
    x.scatters.append({"source": name, "title": title, "methods": methods,
                       "note": f"points from {csv_path.name}; no episode records, so a click opens nothing"})


def _csv_points(path: Path, problems: list) -> dict:
    methods: dict = {}
    try:
        with open(path, newline="", encoding="utf-8", errors="replace") as fh:
            reader = csv.reader(fh)
            head = next(reader, None)
            if not head or "oracle" not in head:
                problems.append(f"{path}: no header with an 'oracle' column")
                return {}
            o = head.index("oracle")
            names = [(j, h) for j, h in enumerate(head) if j > o and h != "oracle_se"]
            for lineno, row in enumerate(reader, 2):
                try:
                    a = float(row[o])
                    for j, h in names:
                        methods.setdefault(h, []).append([a, float(row[j]), None, None])
                except (ValueError, IndexError):
                    problems.append(f"{path}:{lineno}: not a decision row")
    except OSError as exc:
        problems.append(f"{path}: cannot read ({_short(exc)})")
    return methods


def load_file(b: _Builder, path: Path, name: str) -> None:
    """A record file (episodes, twins, bare trajectories)."""
    source = b.source(name, "records", path)
    entries = read_records(path, b.x.problems)
    method = "rollout"
    for e in entries:
        if e.ep.credit:
            method = next(iter(e.ep.credit))
            break
    b.add_entries(entries, source, method, "records")


def _kind(folder: Path) -> Optional[str]:
    if (folder / LAB_MARKER).exists():
        return "lab"
    if (folder / AUDIT_MARKER).exists():
        return "audit"
    if (folder / "config.json").exists() and any((folder / m).exists() for m in ("metrics.jsonl", RUN_EPISODES)):
        return "run"
    return None


def _load_folder(b: _Builder, folder: Path, name: str, depth: int) -> int:
    """Load ``folder`` by its kind, or search it; returns the number of sources found."""
    kind = _kind(folder)
    found = 0
    if kind == "run":
        load_run(b, folder, name)
        found += 1
    elif kind in ("audit", "lab"):
        load_audit(b, folder, name, kind == "lab")
        found += 1
    if (folder / LEARN_MARKER).exists():
        load_learn(b, folder / LEARN_MARKER, name)
        found += 1
    if kind is not None:
        return found
    try:
        children = sorted(folder.iterdir())
    except OSError as exc:
        b.x.problems.append(f"{folder}: cannot list ({_short(exc)})")
        return found
    for p in children:
        if p.name.startswith(".") or p.name in SKIP_DIRS:
            continue
        label = f"{name}/{p.name}" if name else p.name
        if p.is_dir() and depth > 0:
            found += _load_folder(b, p, label, depth - 1)
        elif p.is_file() and p.suffix == ".jsonl" and p.name != "metrics.jsonl":
            load_file(b, p, label)
            found += 1
    return found


def load(path: str | Path, title: Optional[str] = None) -> Explorer:
    """Read ``path`` (see the module docstring); problems are collected, never raised, except for a
    path that does not exist or holds nothing the explorer can show."""
    path = Path(path)
    x = Explorer(title or f"twice view: {path.name or path}", str(path))
    b = _Builder(x)
    if path.is_file():
        if path.name == LEARN_MARKER:
            load_learn(b, path, path.stem)
        elif path.name in (AUDIT_MARKER, LAB_MARKER):
            load_audit(b, path.parent, path.parent.name, path.name == LAB_MARKER)
        else:
            load_file(b, path, path.name)
        return x
    if not path.is_dir():
        raise TrajectoryFormatError(f"{path}: no such file or folder")
    if not _load_folder(b, path, "" if _kind(path) is None else path.name, 2):
        raise TrajectoryFormatError(f"{path}: nothing to show (no record file, run folder or audit folder in it, "
                                    "two levels deep)")
    for s in x.sources:
        if not s["name"]:
            s["name"] = path.name
    for d in x.details:
        if not d["source"]:
            d["source"] = path.name
    for r in x.rows:
        if not r[1]:
            r[1] = path.name
    return x
