"""Trajectory records: what an episode did, with a digest chain that proves it.

A :class:`Trajectory` is plain, JSON-serialisable data: env id, env version and
kwargs, the reset seed and options, the noise schedule, and per turn the action,
observation and reward. ``digests[0]`` covers the reset; for ``t >= 1``::

    digests[t] = sha256(digests[t-1], action_t, obs_t, reward_t)

so two records with equal last digests went through identical turns. The
``terminated``/``truncated`` flags and the noise block are not digested (a twin shares
the factual episode's digests but not its noise); :func:`twice_envs.replay` checks them
directly against the replayed episode, and :meth:`Trajectory.from_json` checks the form of
every field (:func:`check_noise` for the noise block), naming the field. Files hold one
record per line (JSON lines) and are written atomically.

Encoding: files are UTF-8. A record may hold any Python ``str``, including lone
surrogates such as ``'\\udcff'`` (what decoding bad bytes with ``surrogateescape``
gives); those code points are written in their 3-byte form (Python's
``surrogatepass``), so every record reads back exactly. Only lines holding such code
points are not strict UTF-8. The digests hash ASCII canonical JSON; a value holding
surrogate code points is hashed as its ``surrogatepass`` UTF-8 bytes instead, so
distinct strings never share a digest (``'\\ud83d\\ude00'`` and ``'😀'`` differ).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, Iterable, Iterator

from twice_envs.errors import TrajectoryFormatError

FORMAT = "twice_envs.trajectory/1"
#: How record files are encoded and decoded (see the module docstring).
ENCODING, ERRORS = "utf-8", "surrogatepass"
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
                raise TrajectoryFormatError(f"{where}: field {name!r} must be true or false, got {json_kind(data[name])}")
        check_noise(data["noise"], where)
        if not isinstance(data.get("meta") or {}, dict):
            raise TrajectoryFormatError(f"{where}: field 'meta' must be object, got {json_kind(data['meta'])}")
        n = len(data["actions"])
        if len(data["observations"]) != n + 1 or len(data["rewards"]) != n or len(data["digests"]) != n + 1:
            raise TrajectoryFormatError(
                f"{where}: inconsistent lengths: {n} actions need {n + 1} observations, "
                f"{n} rewards and {n + 1} digests"
            )
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
        """Recompute the step digests from the record; raise if the record was edited."""
        from twice_envs.errors import ReplayDivergence

        for t in range(1, len(self.digests)):
            d = step_digest(self.digests[t - 1], self.actions[t - 1], self.observations[t], self.rewards[t - 1])
            if d != self.digests[t]:
                raise ReplayDivergence(t, self.digests[t], d, "the record's own digest chain is broken")


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
                f"{where}: field 'noise.branches' keys must be turns (decimal integers >= 0, e.g. \"3\"), got {turn!r:.40}"
            )
        if isinstance(branch, bool) or not isinstance(branch, int) or branch < 1:
            raise TrajectoryFormatError(
                f"{where}: field 'noise.branches[\"{turn}\"]' must be a branch (an integer >= 1; "
                f"0 is the factual noise and is not listed), got {json_kind(branch)} {branch!r:.40}"
            )


def json_kind(value: Any) -> str:
    """How a value reads in JSON terms (``a string``, ``an object``, ...), for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return {str: "a string", dict: "an object", list: "an array", tuple: "an array"}.get(type(value), type(value).__name__)


def created_mode(directory: bool = False) -> int:
    """The permission bits ``open`` or ``mkdir`` would give a new file (or folder) under the
    process's umask: what a temporary file or folder (created private, 0o600 / 0o700) is given
    before it is renamed into place."""
    return (0o777 if directory else 0o666) & ~_umask()


def _umask() -> int:
    """The process's umask, read without changing it where the system reports it (Linux's
    ``/proc/self/status``); elsewhere set and restored at once, which another thread creating a
    file at that moment could see."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w", **open_kwargs: Any) -> Iterator[IO]:
    """A file to write whose contents replace ``path`` when the block ends without an error.

    It is written under a temporary name in the same folder, synced and renamed into place, so
    readers see the old file or the new one, never half; on an error the temporary file is
    removed and ``path`` is left as it was. ``mode`` is ``"w"`` or ``"wb"``; ``open_kwargs`` go
    to ``open`` (text files default to UTF-8).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if "b" not in mode:
        open_kwargs.setdefault("encoding", "utf-8")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **open_kwargs) as fh:
            # the file keeps the permissions of the one it replaces, else gets those of a new file
            os.chmod(fh.fileno(), path.stat().st_mode & 0o7777 if path.exists() else created_mode())
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_text(path: str | os.PathLike, text: str, errors: str = "strict") -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new one, never half.

    ``errors`` is the UTF-8 error handler (record files use ``"surrogatepass"``).
    """
    with atomic_file(path, "w", errors=errors) as fh:
        fh.write(text)


def save_trajectories(path: str | os.PathLike, records: Iterable[Trajectory | dict]) -> None:
    """Write records as JSON lines, atomically (any ``str`` round-trips; see the module docstring)."""
    lines = []
    for r in records:
        data = r.to_json() if isinstance(r, Trajectory) else r
        lines.append(json.dumps(data, ensure_ascii=False, allow_nan=False))
    atomic_write_text(path, "".join(line + "\n" for line in lines), errors=ERRORS)


def read_json_lines(path: str | os.PathLike) -> Iterator[tuple[str, Any]]:
    """``("file:line", value or TrajectoryFormatError)`` per non-blank line; goes on past bad lines.

    Lines are read one at a time. A file that cannot be read at all (missing, a folder,
    no permission) raises :class:`TrajectoryFormatError`.
    """
    path = Path(path)
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        raise TrajectoryFormatError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TrajectoryFormatError(f"{path}: is a folder, not a trajectory file") from None
    except OSError as exc:
        raise TrajectoryFormatError(f"{path}: cannot read ({exc.strerror or exc})") from None
    with fh:
        lineno = 0
        while True:
            try:
                raw = fh.readline()
            except IsADirectoryError:
                raise TrajectoryFormatError(f"{path}: is a folder, not a trajectory file") from None
            except OSError as exc:
                raise TrajectoryFormatError(f"{path}:{lineno + 1}: cannot read ({exc.strerror or exc})") from None
            if not raw:
                return
            lineno += 1
            if raw.strip():
                where = f"{path}:{lineno}"
                yield where, _decode_line(raw, where)


def _decode_line(raw: bytes, where: str) -> Any:
    if b"\x00" in raw:
        return TrajectoryFormatError(f"{where}: binary data (NUL bytes), not a JSON lines trajectory file")
    try:
        text = raw.decode(ENCODING, ERRORS)
    except UnicodeDecodeError as exc:
        return TrajectoryFormatError(
            f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); "
            "trajectory files are UTF-8 JSON lines"
        )
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        return TrajectoryFormatError(f"{where}: not valid JSON ({exc.msg}, column {exc.colno})")
    except RecursionError:
        return TrajectoryFormatError(f"{where}: JSON nested too deeply to be a trajectory")


def iter_json_lines(path: str | os.PathLike) -> Iterator[tuple[str, Any]]:
    """``("file:line", value)`` for each non-blank line of a JSON lines file; errors name the line."""
    for where, data in read_json_lines(path):
        if isinstance(data, TrajectoryFormatError):
            raise data
        yield where, data


def iter_records(path: str | os.PathLike) -> Iterator[tuple[str, "Trajectory | TrajectoryFormatError"]]:
    """``("file:line", record or TrajectoryFormatError)`` per line: a bad line does not stop the rest."""
    for where, data in read_json_lines(path):
        if isinstance(data, TrajectoryFormatError):
            yield where, data
            continue
        try:
            yield where, Trajectory.from_json(data, where=where)
        except TrajectoryFormatError as exc:
            yield where, exc


def iter_trajectories(path: str | os.PathLike) -> Iterator[Trajectory]:
    """Read records from a JSON lines file; errors name the file and line."""
    for where, data in iter_json_lines(path):
        yield Trajectory.from_json(data, where=where)


def load_trajectories(path: str | os.PathLike) -> list[Trajectory]:
    """All records of a JSON lines file."""
    return list(iter_trajectories(path))
