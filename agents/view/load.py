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
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from twice_envs.agents.types import EpisodeRecord, TurnRecord
from twice_envs.agents.records import AUDIT_EPISODES, LAB_EPISODES, ORACLE, RUN_EPISODES
from twice_envs.errors import TrajectoryFormatError, UncountedRecordsWarning
from twice_envs.files import read_record_lines
from twice_envs.keys import NoiseKey
from twice_envs.trajectory import FORMAT, Trajectory, read_json_lines

#: The files that mark an audit folder and a learning-curve file.
AUDIT_MARKER = "audit.json"
LAB_MARKER = "lab_audit.json"
LEARN_MARKER = "learn.json"
#: Folders not searched for inputs.
SKIP_DIRS = {"checkpoint", "__pycache__", ".git"}
#: Info entries that describe a task in words, first found wins.
TASK_TEXT = ("question", "instruction", "goal", "task")
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


def _num(x: Any) -> Optional[float]:
    """A finite float, or None."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _text(x: Any) -> str:
    return x if isinstance(x, str) else ("" if x is None else str(x))


# --------------------------------------------------------------------------- one record file


@dataclass
class _Entry:
    """A record read from a file, before twins are joined to their factual episode."""

    where: str
    ep: EpisodeRecord
    batch: Any
    index: Optional[int]
    observations: list
    bare: bool = False


def _read_record(where: str, data: Any) -> _Entry:
    """A line as an entry, or a :class:`TrajectoryFormatError` naming what is wrong."""
    if not isinstance(data, dict):
        raise TrajectoryFormatError(f"{where}: expected a JSON object (an episode record), got {type(data).__name__}")
    batch = data.get("batch", 0)
    index = data.get("index")
    index = index if isinstance(index, int) and not isinstance(index, bool) else None
    if "episode" in data:
        agent = data["episode"]
        if not isinstance(agent, dict):
            raise TrajectoryFormatError(f"{where}: field 'episode' must be an object (the agent's record)")
        try:
            ep = EpisodeRecord.from_json(agent)
            _check_episode(ep)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise TrajectoryFormatError(f"{where}: not an episode record ({_short(exc)})") from None
        obs = data.get("observations") if data.get("format") == FORMAT else None
        return _Entry(where, ep, batch, index, obs if isinstance(obs, list) else [])
    if data.get("format") == FORMAT:
        traj = Trajectory.from_json(data, where=where)
        ep = EpisodeRecord(traj.env_id, traj.seed, dict(traj.options))
        for a, o, r in zip(traj.actions, traj.observations[1:], traj.rewards):
            ep.turns.append(_bare_turn(a, o, r))
        ep.utility = traj.total_reward
        ep.terminated, ep.truncated = traj.terminated, traj.truncated
        return _Entry(where, ep, batch, index, list(traj.observations), bare=True)
    raise TrajectoryFormatError(f"{where}: neither an episode record (no 'episode' field) nor a trajectory record "
                                f"(format {data.get('format')!r})")


def _bare_turn(action: str, obs: str, reward: float) -> TurnRecord:
    return TurnRecord([], [], action, NoiseKey(0, 0, 0), obs=obs, reward=reward)


def _short(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) < 200 else text[:200] + "..."


def _check_episode(ep: EpisodeRecord) -> None:
    """Raise ``ValueError`` where a record's fields have types the page cannot show."""
    if not isinstance(ep.turns, list):
        raise ValueError("'turns' must be a list")
    for k, t in enumerate(ep.turns):
        if not isinstance(t.text, str) or not isinstance(t.obs, str):
            raise ValueError(f"turn {k}: 'text' and 'obs' must be strings")
        if not isinstance(t.token_ids, list) or not all(isinstance(v, int) for v in t.token_ids):
            raise ValueError(f"turn {k}: 'token_ids' must be a list of integers")
        if not isinstance(t.token_texts, list) or not all(isinstance(v, str) for v in t.token_texts):
            raise ValueError(f"turn {k}: 'token_texts' must be a list of strings")
        keys_ok = all(isinstance(key, list) and len(key) == 4 and all(isinstance(v, int) for v in key)
                      for key in t.token_keys) if isinstance(t.token_keys, list) else False
        if not keys_ok:
            raise ValueError(f"turn {k}: 'token_keys' must be a list of [turn, branch, line, pos]")
        if len(tuple(t.noise_key)) < 3:
            raise ValueError(f"turn {k}: 'noise_key' must be [episode_seed, turn, branch, ...]")
    if ep.twin_of is not None and (len(ep.twin_of) != 2 or not all(isinstance(v, int) for v in ep.twin_of)):
        raise ValueError("'twin_of' must be [episode index, turn]")
    if _num(ep.utility) is None:
        raise ValueError("'utility' must be a finite number")
    for name, typ in (("info", dict), ("options", dict), ("credit", dict), ("coins", list)):
        if not isinstance(getattr(ep, name), typ):
            raise ValueError(f"'{name}' must be {'an object' if typ is dict else 'a list'}")


def read_records(path: Path, problems: list) -> list[_Entry]:
    """Every readable record of a record file; each damaged line is named in ``problems``, and so are
    a file cut short (its header's count against the lines found) and a file with no count."""
    out = []
    with warnings.catch_warnings(record=True) as notes:
        warnings.simplefilter("always", UncountedRecordsWarning)
        try:
            for where, data in read_record_lines(path):
                if isinstance(data, TrajectoryFormatError):
                    problems.append(str(data))
                    continue
                try:
                    out.append(_read_record(where, data))
                except TrajectoryFormatError as exc:
                    problems.append(str(exc))
        except TrajectoryFormatError as exc:
            problems.append(str(exc))
    for n in notes:
        if issubclass(n.category, UncountedRecordsWarning):
            problems.append(str(n.message))
        else:
            warnings.warn_explicit(n.message, n.category, n.filename, n.lineno)
    return out


# --------------------------------------------------------------------------- normalising


def _turn(t, credit: dict, coins: Optional[dict], k: int) -> dict:
    """A turn as the page shows it: the key base ``[episode seed as text (a uint64 is beyond JavaScript's
    exact integers), turn, branch]``, the tokens as parallel arrays and their keys flattened by four."""
    out = {"text": _text(t.text), "obs": _text(t.obs), "r": _num(t.reward), "inv": bool(t.invalid),
           "key": [str(int(t.noise_key[0]))] + [int(v) for v in tuple(t.noise_key)[1:3]]}
    if t.token_ids:
        out["ids"] = [int(v) for v in t.token_ids]
        if len(t.token_texts) == len(t.token_ids):
            out["tt"] = [_text(x) for x in t.token_texts]
        if len(t.token_keys) == len(t.token_ids):
            out["tk"] = [int(v) for key in t.token_keys for v in list(key)[:4]]
    c = {name: _num(vals[k]) for name, vals in credit.items() if isinstance(vals, list) and k < len(vals)}
    if c:
        out["credit"] = c
    if coins:
        out["coins"] = {"q": _num(coins.get("q")), "B": bool(coins.get("B")), "A_hat": _num(coins.get("A_hat"))}
    return out


def task_of(ep: EpisodeRecord, observations: list) -> tuple[str, str]:
    """``(task id, task text)``: the env's task id or reset options, and the question (or the
    first observation's last line)."""
    info = ep.info if isinstance(ep.info, dict) else {}
    opts = ep.options if isinstance(ep.options, dict) else {}
    if isinstance(info.get("task_id"), str):
        task = info["task_id"]
    elif "index" in opts:
        task = f"{opts.get('split', 'task')} #{opts['index']}"
    else:
        task = f"{ep.env_id} seed {ep.seed}"
    text = next((info[k] for k in TASK_TEXT if isinstance(info.get(k), str) and info[k].strip()), "")
    if not text and observations and isinstance(observations[0], str):
        lines = [x for x in observations[0].splitlines() if x.strip()]
        text = lines[-1] if lines else ""
    return task, text[:300]


def _twin(tw: EpisodeRecord, factual: Optional[EpisodeRecord], where: str) -> dict:
    t = int(tw.twin_of[1])
    u = _num(tw.pair_utility) if tw.pair_utility is not None else (_num(factual.utility) if factual else None)
    dropped = tw.evidence_coin is False
    u2 = u if tw.self_twin else (None if dropped else _num(tw.utility))
    out = {"t": t, "k": int(tw.branch), "coupled": bool(tw.coupled), "self": bool(tw.self_twin),
           "same_ev": bool(tw.same_evidence), "S": tw.evidence_coin, "pair": int(tw.pair), "U": u, "U2": u2,
           "D": None if u is None or u2 is None else u - u2, "where": where,
           "turns": [_turn(x, {}, None, 0) for x in tw.turns]}
    if tw.self_twin:
        out["note"] = ("self-twin: the alternative turn has the factual turn's tokens, so the twin is the factual "
                       "episode (D = 0)")
    elif dropped:
        out["note"] = "not continued: its evidence coin S = 0 (same evidence as the factual turn), so U' is unused"
    return out


def _detail(entry: _Entry, source: dict, method: str, twins: list, why: Optional[str]) -> dict:
    ep = entry.ep
    task, text = task_of(ep, entry.observations)
    credit = {k: v for k, v in (ep.credit or {}).items() if isinstance(v, list)}
    coins = ep.coins if isinstance(ep.coins, list) else []
    measures = ep.info.get("measures") if isinstance(ep.info, dict) else None
    return {
        "env": _text(ep.env_id), "task": task, "question": text, "source": source["name"], "where": entry.where,
        "batch": entry.batch if isinstance(entry.batch, (int, str)) else None, "group": ep.group,
        "U": _num(ep.utility), "method": method, "prompt": _text(entry.observations[0]) if entry.observations else "",
        "end": "terminated" if ep.terminated else ("truncated" if ep.truncated else "running"),
        "measures": {k: _num(v) for k, v in measures.items()} if isinstance(measures, dict) else {},
        "credit_names": list(credit),
        "turns": [_turn(t, credit, coins[k] if k < len(coins) and isinstance(coins[k], dict) else None, k)
                  for k, t in enumerate(ep.turns)],
        "twins": twins, "why": why,
    }


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
