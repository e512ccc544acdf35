"""The episode records that run and audit folders hold, one JSON line per episode.

A line is an episode as ``twice rollout`` writes it: the env's trajectory record (so
``twice replay`` re-runs it) with the agent's record (:class:`~twice_envs.agents.types.EpisodeRecord`)
under ``"episode"``. Lines written for a batch also carry

* ``"batch"``: the batch the episode belongs to (a training run: its update; an audit: 0);
* ``"index"``: a factual episode's position in its batch, which a twin's ``twin_of[0]`` names.

Twins follow the factual episodes of their batch. A record without a trajectory (the credit lab's
episodes, which live in lab envs) is the agent's record alone. Run folders drop the token ids of
prompts and observations (:data:`SLIM_FIELDS`): the trajectory holds their text, and a run's file
stays a fraction of the size.

Every file is a record file (:mod:`twice_envs.files`): its first line is a header counting the
lines that follow, so a file cut short is reported, naming the counts. A run's file is appended to
after each update and its count rewritten in place.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from twice_envs.agents.types import EpisodeRecord
from twice_envs.files import ENCODING, ERRORS, append_record_lines, is_header, write_record_lines

#: The episode file of a ``twice train`` run folder (beside ``config.json`` and ``metrics.jsonl``).
RUN_EPISODES = "episodes.jsonl"
#: The episode file of an LLM credit audit's folder (beside ``audit.json``).
AUDIT_EPISODES = "audit_episodes.jsonl"
#: The episode file of a credit lab audit's folder (beside ``lab_audit.json``).
LAB_EPISODES = "lab_episodes.jsonl"
#: Agent-record fields a run folder leaves out (the context's token ids; the text is in the trajectory).
SLIM_FIELDS = ("prompt_ids", "obs_token_ids")
#: The key of an audited decision's true advantage in :attr:`EpisodeRecord.credit`.
ORACLE = "A*"


def finite_json(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def record_line(ep: EpisodeRecord, *, batch: Optional[int] = None, index: Optional[int] = None,
                slim: bool = False) -> dict:
    """One line: the trajectory record (if any) with the agent's record under ``"episode"``."""
    agent = ep.to_json()
    trajectory = agent.pop("trajectory", None)
    if slim:
        agent.pop("prompt_ids", None)
        for t in agent["turns"] + agent["history"]:
            t.pop("obs_token_ids", None)
    line = dict(trajectory) if trajectory is not None else {}
    line["episode"] = agent
    if batch is not None:
        line["batch"] = int(batch)
    if index is not None:
        line["index"] = int(index)
    return line


def dumps(line: dict) -> str:
    """A line as JSON text (any ``str`` kept; a non-finite credit becomes null)."""
    try:
        return json.dumps(line, ensure_ascii=False, allow_nan=False)
    except ValueError:
        return json.dumps(finite_json(line), ensure_ascii=False, allow_nan=False)


def batch_lines(factual: Sequence[EpisodeRecord], twins: Iterable[EpisodeRecord] = (), *, batch: int = 0,
                slim: bool = False) -> list[str]:
    """The lines of one batch: its factual episodes (with their index), then its twins."""
    out = [dumps(record_line(ep, batch=batch, index=i, slim=slim)) for i, ep in enumerate(factual)]
    out += [dumps(record_line(tw, batch=batch, slim=slim)) for tw in twins]
    return out


def append_lines(path: str | os.PathLike, lines: Sequence[str]) -> None:
    """Append lines to a record file (created if missing) and count them in its header."""
    if lines:
        append_record_lines(path, lines)


def keep_batches(path: str | os.PathLike, last: int) -> None:
    """Keep only the lines of batches ``<= last`` (a resumed run drops what it will redo), recounted.

    A line that cannot be read is kept as it is (the explorer names it); the header is written anew."""
    path = Path(path)
    if not path.exists():
        return
    kept = []
    with open(path, encoding=ENCODING, errors=ERRORS) as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except (ValueError, RecursionError):
                kept.append(line.rstrip("\n"))
                continue
            if not kept and is_header(value):
                continue
            batch = value.get("batch", 0) if isinstance(value, dict) else None
            if not isinstance(batch, int) or batch <= last:
                kept.append(line.rstrip("\n"))
    write_record_lines(path, kept)


def decision_lines(factual: Sequence[EpisodeRecord], twins: Sequence[EpisodeRecord],
                   decisions: Sequence[tuple[int, int]], credit: dict, oracle: Sequence[float]) -> list[str]:
    """An audit's lines: its factual episodes, each with the audited credit of every row and ``A*`` at
    each audited turn (None elsewhere), then the twins that were run for its decisions."""
    for name, values in list(credit.items()) + [(ORACLE, oracle)]:
        for (i, t), v in zip(decisions, values):
            ep = factual[int(i)]
            row = ep.credit.setdefault(name, [None] * len(ep.turns))
            if len(row) != len(ep.turns):
                row = ep.credit[name] = [None] * len(ep.turns)
            row[int(t)] = float(v)
    return batch_lines(factual, twins)


def write_lines(path: str | os.PathLike, lines: Sequence[str]) -> Path:
    """Write a record file atomically (a header counting ``lines``, then the lines); returns its path."""
    return write_record_lines(path, lines)
