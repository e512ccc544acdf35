"""One episode as ``twice view`` shows it: record files read into entries, each normalised to the page's JSON.

:func:`read_records` reads a record file (episode records as ``twice rollout`` writes them, or
plain trajectory records) into entries, naming each damaged line; :func:`task_of` says which
task an episode played; the detail of an episode (its turns with tokens, keys, credit and
coins, and its twins) is plain JSON data the page reads.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from twice_envs.agents.types import EpisodeRecord, TurnRecord
from twice_envs.errors import TrajectoryFormatError, UncountedRecordsWarning
from twice_envs.files import read_record_lines
from twice_envs.keys import NoiseKey
from twice_envs.trajectory import FORMAT, Trajectory

#: Info entries that describe a task in words, first found wins.
TASK_TEXT = ("question", "instruction", "goal", "task")


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
