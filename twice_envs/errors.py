"""Exceptions raised by twice_envs. Each message says what went wrong and how to fix it."""

from __future__ import annotations


class TwiceError(Exception):
    """Base class of every error raised on purpose by twice_envs."""


class ReplayDivergence(TwiceError):
    """A fork or replay did not reproduce the recorded episode.

    Attributes:
        turn: the first turn whose digest differs (0 = the reset observation).
        expected: the recorded digest at that turn.
        got: the digest the replay produced.
        detail: what differs, in words.
        field: ``None`` when the digests differ; else the field of the record, besides
            the digests, that the replay did not reproduce (``terminated``,
            ``truncated``, ``noise.episode_seed``, ``actions``): the digests agree then
            (``expected == got``).
    """

    def __init__(self, turn: int, expected: str, got: str, detail: str = "", *, field: str | None = None) -> None:
        self.turn, self.expected, self.got, self.detail, self.field = turn, expected, got, detail, field
        if field is not None:
            super().__init__(
                f"replay diverged at turn {turn}: the digests agree, but {detail}. The record was edited, "
                "or the env's data or version changed since it was recorded."
            )
            return
        msg = (
            f"replay diverged at turn {turn}: recorded digest {expected[:12]}..., replay gave {got[:12]}..."
        )
        if detail:
            msg += f" ({detail})"
        msg += ". The env is not deterministic for this record, or its data or version changed since it was recorded."
        super().__init__(msg)

    def __reduce__(self):  # survives pickling (e.g. from a worker process)
        return (_replay_divergence, (self.turn, self.expected, self.got, self.detail, self.field))


def _replay_divergence(turn: int, expected: str, got: str, detail: str, field: str | None) -> ReplayDivergence:
    return ReplayDivergence(turn, expected, got, detail, field=field)


class BrokenChain(ReplayDivergence):
    """A record's own digest chain does not follow from its fields: it was edited after it was written.

    Found from the record alone, before any env runs (``Trajectory.check_chain``). ``turn`` is
    the first digest its fields do not give; ``expected`` is the record's digest there and
    ``got`` the one its fields give. Turn 0 is the reset: ``env_id``, ``env_version``,
    ``kwargs``, ``seed``, ``options`` and ``observations[0]``.
    """

    def __init__(self, turn: int, expected: str, got: str, detail: str = "") -> None:
        self.turn, self.expected, self.got, self.detail, self.field = turn, expected, got, detail, None
        TwiceError.__init__(
            self,
            f"the record's digest chain is broken at turn {turn}: digests[{turn}] is {expected[:12]}..., while "
            f"the record's {detail} give {got[:12]}...; the record was edited after it was written",
        )

    def __reduce__(self):
        return (type(self), (self.turn, self.expected, self.got, self.detail))


class UncountedRecordsWarning(UserWarning):
    """A record file without the header that counts its records (written before record files
    carried one, or by hand): it is read, but a cut at a line boundary cannot be detected in it."""


class MissingExtra(TwiceError, ImportError):
    """An optional dependency is not installed; the message names the extra."""

    def __init__(self, module: str, extra: str, what: str = "") -> None:
        self.module, self.extra = module, extra
        need = f" (needed for {what})" if what else ""
        super().__init__(
            f"the optional dependency '{module}' is not installed{need}. "
            f"Install it with: pip install 'twice-envs[{extra}]'"
        )


class TrajectoryFormatError(TwiceError, ValueError):
    """A trajectory file or record is corrupt, foreign or from another env version."""


class RecordCountError(TrajectoryFormatError):
    """A record file holds another number of lines than its header counts: it was cut short (or
    an append did not finish). Attributes: ``path``, ``expected`` (the header's count), ``found``."""

    def __init__(self, path: object, expected: int, found: int) -> None:
        self.path, self.expected, self.found = str(path), expected, found
        if found < expected:
            why = f"cut short: its header counts {expected} records, {found} found ({expected - found} missing)"
        else:
            why = (f"holds {found} records, more than the {expected} its header counts "
                   "(an append that did not finish, or lines added by hand)")
        super().__init__(f"{path}: {why}")

    def __reduce__(self):
        return (type(self), (self.path, self.expected, self.found))


class EnvClosedError(TwiceError, RuntimeError):
    """An env was used after ``close()``: ``step``, ``fork`` and ``reset`` are refused.

    ``close()`` released what the env held (engines, journals); make a new env with
    ``twice_envs.make(...)`` (or rebuild one from a record with ``twice_envs.replay``).
    """

    def __init__(self, env: str, call: str) -> None:
        self.env, self.call = env, call
        super().__init__(
            f"{call}() after close(): this {env} env was closed and cannot be used again; "
            f"make a new one with twice_envs.make(...) (or twice_envs.replay(record) to rebuild an episode)"
        )

    def __reduce__(self):
        return (type(self), (self.env, self.call))


class DataFormatError(TwiceError, ValueError):
    """A data file (corpus, questions, catalogue, games) is malformed; names file and line."""

    def __init__(self, path: object, line: int | None, problem: str) -> None:
        self.path, self.line, self.problem = str(path), line, problem
        where = f"{path}:{line}" if line is not None else f"{path}"
        super().__init__(f"{where}: {problem}")


class JournalError(TwiceError):
    """A tool journal file cannot be used: corrupt, not a twice_envs journal, or unreadable.

    The message names the file.
    """

    def __init__(self, path: object, problem: str) -> None:
        self.path, self.problem = str(path), problem
        super().__init__(f"tool journal {path}: {problem}")
