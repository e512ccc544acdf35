"""Trajectory records: what an episode did, with a digest chain that proves it.

A :class:`Trajectory` is plain, JSON-serialisable data: env id, env version and
kwargs, the reset seed and options, the noise schedule, and per turn the action,
observation and reward. The digest chain::

    digests[0] = sha256(format, env_id, env_version, kwargs, seed, options, observations[0])
    digests[t] = sha256(digests[t-1], action_t, obs_t, reward_t)        (t >= 1)

so two records with equal last digests went through identical turns.
:meth:`Trajectory.check_chain` recomputes every digest, the reset's included, from the
record's own fields, so an edited field (the task text in ``observations[0]`` too) is
found without running the env. The ``terminated``/``truncated`` flags and the noise block
are not digested (a twin shares the factual episode's digests but not its noise):
:func:`twice_envs.replay` checks them directly against the replayed episode, and
:meth:`Trajectory.from_json` checks the form of every field (:func:`check_noise` for the
noise block; a branch turn must lie inside the episode), naming the field. Files hold a
header counting their records, then one record per line (JSON lines), and are written
atomically (:mod:`twice_envs.files`).

Encoding: files are UTF-8. A record may hold any Python ``str``, including lone
surrogates such as ``'\\udcff'`` (what decoding bad bytes with ``surrogateescape``
gives); those code points are written in their 3-byte form (Python's
``surrogatepass``), so every record reads back exactly. Only lines holding such code
points are not strict UTF-8. The digests hash ASCII canonical JSON; a value holding
surrogate code points is hashed as its ``surrogatepass`` UTF-8 bytes instead, so
distinct strings never share a digest (``'\\ud83d\\ude00'`` and ``'😀'`` differ).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Iterator

from twice_envs.errors import BrokenChain, TrajectoryFormatError

# Re-exported: writers and readers across the package import these from here.
from twice_envs.files import (  # noqa: F401
    ENCODING,
    ERRORS,
    atomic_file,
    atomic_write_text,
    created_mode,
    iter_json_lines,
    read_json_lines,
    read_record_lines,
    write_record_lines,
)

FORMAT = "twice_envs.trajectory/1"
#: An escaped UTF-16 surrogate in ASCII JSON: a non-BMP character or a surrogate code point.
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


def canonical_json(value: Any) -> str:
    """Canonical JSON (sorted keys, no spaces, ASCII) used for digests and kwargs."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _reward_text(reward: float) -> str:
    r = float(reward)
    if not math.isfinite(r):
        raise ValueError(f"reward must be finite, got {reward!r}")
    return repr(r)


def digest_bytes(value: Any) -> bytes:
    """The bytes a digest hashes: ASCII canonical JSON, unless ``value`` holds surrogate code points.

    ASCII JSON writes ``'😀'`` and the two code points ``'\\ud83d\\ude00'`` alike, so
    values with surrogate code points (never valid text) are hashed as non-ASCII JSON
    in ``surrogatepass`` UTF-8: injective, and disjoint from every ASCII payload, so the
    digests of all other values stay as they were.
    """
    payload = canonical_json(value)
    if _ESCAPED_SURROGATE.search(payload):
        wide = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        try:
            wide.encode(ENCODING)
        except UnicodeEncodeError:
            return wide.encode(ENCODING, ERRORS)
    return payload.encode()


def reset_digest(env_id: str, version: str, kwargs: dict, seed: int, options: dict, obs: str) -> str:
    """Digest of the reset: what the env is, how it was reset, and what it showed first."""
    return hashlib.sha256(digest_bytes([FORMAT, env_id, str(version), kwargs, int(seed), options, obs])).hexdigest()


def step_digest(previous: str, action: str, obs: str, reward: float) -> str:
    """``H(digest_{t-1}, action_t, obs_t, reward_t)``."""
    return hashlib.sha256(digest_bytes([previous, action, obs, _reward_text(reward)])).hexdigest()


@dataclass
class Trajectory:
    """The record of one episode (see the module docstring).

    Attributes:
        env_id: registered id the env was made from.
        env_version: the env implementation's version; a replay refuses another.
        kwargs: keyword arguments given to ``make`` (JSON data only).
        seed: the reset seed (always concrete, drawn if the user passed none).
        options: the reset options.
        noise: the noise schedule, as :meth:`NoiseSchedule.to_json` gives it:
            ``{"episode_seed": uint64, "branches": {"<turn>": branch >= 1}}``.
        actions: the action text of each turn, as the env received it.
        observations: ``observations[0]`` is the reset observation, then one per turn.
        rewards: one per turn.
        digests: the digest chain, one more entry than ``actions``.
        terminated, truncated: how the episode ended so far (a replay of the whole
            record must end the same way).
        meta: free-form JSON data (e.g. the agent's token ids); not digested.
    """

    env_id: str
    env_version: str
    kwargs: dict
    seed: int
    options: dict
    noise: dict
    actions: list[str] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)
    terminated: bool = False
    truncated: bool = False
    meta: dict = field(default_factory=dict)

    @property
    def num_turns(self) -> int:
        return len(self.actions)

    @property
    def digest(self) -> str:
        """The last digest: a fingerprint of the whole episode so far."""
        return self.digests[-1]

    @property
    def total_reward(self) -> float:
        return float(sum(self.rewards))

    def prefix(self, turn: int) -> "Trajectory":
        """A copy holding only the first ``turn`` actions."""
        return Trajectory(
            self.env_id,
            self.env_version,
            dict(self.kwargs),
            self.seed,
            dict(self.options),
            dict(self.noise),
            self.actions[:turn],
            self.observations[: turn + 1],
            self.rewards[:turn],
            self.digests[: turn + 1],
            False,
            False,
            {},
        )

    def to_json(self) -> dict:
        d = asdict(self)
        d["format"] = FORMAT
        return d

    @classmethod
    def from_json(cls, data: Any, where: str = "record") -> "Trajectory":
        """Validate and load a record; errors say what is wrong and where."""
        if not isinstance(data, dict):
            raise TrajectoryFormatError(f"{where}: expected a JSON object, got {type(data).__name__}")
        fmt = data.get("format")
        if fmt != FORMAT:
            raise TrajectoryFormatError(
                f"{where}: not a twice_envs trajectory (format {fmt!r}, expected {FORMAT!r})"
            )
        required = {
            "env_id": str,
            "env_version": str,
            "kwargs": dict,
            "seed": int,
            "options": dict,
            "noise": dict,
            "actions": list,
            "observations": list,
            "rewards": list,
            "digests": list,
        }
        for name, typ in required.items():
            if name not in data:
                raise TrajectoryFormatError(f"{where}: missing field {name!r}")
            if not isinstance(data[name], typ) or (typ is int and isinstance(data[name], bool)):
                raise TrajectoryFormatError(
                    f"{where}: field {name!r} must be {_JSON_NAMES[typ]}, got {json_kind(data[name])}"
                )
        for name in ("actions", "observations", "digests"):
            for i, x in enumerate(data[name]):
                if not isinstance(x, str):
                    raise TrajectoryFormatError(f"{where}: {name}[{i}] must be a string, got {json_kind(x)}")
        for i, r in enumerate(data["rewards"]):
            if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r):
                raise TrajectoryFormatError(f"{where}: rewards[{i}] must be a finite number, got {r!r:.40}")
        for name in ("terminated", "truncated"):
            if not isinstance(data.get(name, False), bool):
                raise TrajectoryFormatError(
                    f"{where}: field {name!r} must be true or false, got {json_kind(data[name])}"
                )
        check_noise(data["noise"], where)
        if not isinstance(data.get("meta") or {}, dict):
            raise TrajectoryFormatError(f"{where}: field 'meta' must be object, got {json_kind(data['meta'])}")
        n = len(data["actions"])
        if len(data["observations"]) != n + 1 or len(data["rewards"]) != n or len(data["digests"]) != n + 1:
            raise TrajectoryFormatError(
                f"{where}: inconsistent lengths: {n} actions need {n + 1} observations, "
                f"{n} rewards and {n + 1} digests"
            )
        if data.get("terminated") or data.get("truncated"):
            check_branch_turns(data["noise"], n, where)
        return cls(
            data["env_id"],
            data["env_version"],
            data["kwargs"],
            data["seed"],
            data["options"],
            data["noise"],
            list(data["actions"]),
            list(data["observations"]),
            [float(r) for r in data["rewards"]],
            list(data["digests"]),
            data.get("terminated", False),
            data.get("truncated", False),
            dict(data.get("meta") or {}),
        )

    def check_chain(self) -> None:
        """Recompute every digest from the record's own fields; raise :class:`BrokenChain` if one was edited.

        ``digests[0]`` from ``env_id``, ``env_version``, ``kwargs``, ``seed``, ``options`` and
        ``observations[0]``; each later digest from the one before and its turn's action,
        observation and reward. The error names the first turn whose digest the fields do not give.
        """
        try:
            d = reset_digest(self.env_id, self.env_version, self.kwargs, self.seed, self.options, self.observations[0])
        except (TypeError, ValueError) as exc:  # kwargs or options that are not JSON data
            raise TrajectoryFormatError(f"record: its reset cannot be digested ({exc})") from None
        if d != self.digests[0]:
            raise BrokenChain(0, self.digests[0], d, "env_id, env_version, kwargs, seed, options and observations[0]")
        for t in range(1, len(self.digests)):
            d = step_digest(self.digests[t - 1], self.actions[t - 1], self.observations[t], self.rewards[t - 1])
            if d != self.digests[t]:
                raise BrokenChain(t, self.digests[t], d, f"digests[{t - 1}], actions[{t - 1}], observations[{t}] and "
                                                         f"rewards[{t - 1}]")


_JSON_NAMES = {str: "string", int: "integer", dict: "object", list: "array"}
_UINT64_MAX = (1 << 64) - 1
#: The fields of a record's noise block (what ``NoiseSchedule.to_json`` writes).
NOISE_FIELDS = ("episode_seed", "branches")


def check_noise(noise: Any, where: str = "record") -> None:
    """Check a record's noise block; a :class:`TrajectoryFormatError` names the bad field.

    The block is ``{"episode_seed": uint64, "branches": {"<turn>": branch, ...}}``:
    ``branches`` (optional, empty for a factual episode) maps turns, written as
    decimal strings, to branches ``>= 1``.
    """
    if not isinstance(noise, dict):
        raise TrajectoryFormatError(f"{where}: field 'noise' must be object, got {json_kind(noise)}")
    unknown = sorted(map(str, set(noise) - set(NOISE_FIELDS)))
    if unknown:
        raise TrajectoryFormatError(
            f"{where}: unknown field 'noise.{unknown[0]}' (a noise block holds {' and '.join(NOISE_FIELDS)})"
        )
    if "episode_seed" not in noise:
        raise TrajectoryFormatError(f"{where}: missing field 'noise.episode_seed' (the episode's noise seed)")
    seed = noise["episode_seed"]
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TrajectoryFormatError(
            f"{where}: field 'noise.episode_seed' must be an integer in 0..2**64-1, got {json_kind(seed)} {seed!r:.40}"
        )
    if not 0 <= seed <= _UINT64_MAX:
        raise TrajectoryFormatError(f"{where}: field 'noise.episode_seed' must be an integer in 0..2**64-1, got {seed}")
    branches = noise.get("branches", {})
    if not isinstance(branches, dict):
        raise TrajectoryFormatError(
            f"{where}: field 'noise.branches' must be an object mapping turns to branches, got {json_kind(branches)}"
        )
    for turn, branch in branches.items():
        if not (isinstance(turn, str) and turn.isdigit() and turn.isascii() and str(int(turn)) == turn):
            raise TrajectoryFormatError(
                f"{where}: field 'noise.branches' keys must be turns (decimal integers >= 0, e.g. \"3\"), "
                f"got {turn!r:.40}"
            )
        if isinstance(branch, bool) or not isinstance(branch, int) or branch < 1:
            raise TrajectoryFormatError(
                f"{where}: field 'noise.branches[\"{turn}\"]' must be a branch (an integer >= 1; "
                f"0 is the factual noise and is not listed), got {json_kind(branch)} {branch!r:.40}"
            )


def check_branch_turns(noise: dict, end: int, where: str = "record") -> None:
    """Every branch turn of ``noise`` lies inside an episode that ended after ``end`` actions.

    Turn ``t`` is the noise of action ``t + 1``, so a finished episode's branch turns are
    ``0..end-1``; a branch past them is refused (:class:`TrajectoryFormatError` naming it).
    """
    for turn in noise.get("branches", {}):
        if int(turn) >= end:
            raise TrajectoryFormatError(
                f"{where}: field 'noise.branches[\"{turn}\"]' names turn {turn}, past the episode's end "
                f"(it ended after {end} actions, so {f'its branch turns are 0..{end - 1}' if end else 'it has none'})"
            )


def json_kind(value: Any) -> str:
    """How a value reads in JSON terms (``a string``, ``an object``, ...), for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    names = {str: "a string", dict: "an object", list: "an array", tuple: "an array"}
    return names.get(type(value), type(value).__name__)


def save_trajectories(path: str | os.PathLike, records: Iterable[Trajectory | dict]) -> None:
    """Write records as a record file, atomically: a header counting them, then one JSON line each
    (any ``str`` round-trips; see the module docstring and :mod:`twice_envs.files`)."""
    lines = []
    for r in records:
        data = r.to_json() if isinstance(r, Trajectory) else r
        lines.append(json.dumps(data, ensure_ascii=False, allow_nan=False))
    write_record_lines(path, lines)


def iter_records(path: str | os.PathLike) -> Iterator[tuple[str, "Trajectory | TrajectoryFormatError"]]:
    """``("file:line", record or TrajectoryFormatError)`` per line: a bad line does not stop the rest.

    A file cut short (fewer records than its header counts) ends with ``(file, RecordCountError)``.
    """
    for where, data in read_record_lines(path):
        if isinstance(data, TrajectoryFormatError):
            yield where, data
            continue
        try:
            yield where, Trajectory.from_json(data, where=where)
        except TrajectoryFormatError as exc:
            yield where, exc


def iter_trajectories(path: str | os.PathLike) -> Iterator[Trajectory]:
    """Read records from a record file; errors name the file and line, or the file and both counts
    (:class:`~twice_envs.errors.RecordCountError`) when it was cut short."""
    for where, data in read_record_lines(path):
        if isinstance(data, TrajectoryFormatError):
            raise data
        yield Trajectory.from_json(data, where=where)


def load_trajectories(path: str | os.PathLike) -> list[Trajectory]:
    """All records of a record file."""
    return list(iter_trajectories(path))
