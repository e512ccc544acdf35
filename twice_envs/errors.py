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
    """

    def __init__(self, turn: int, expected: str, got: str, detail: str = "") -> None:
        self.turn, self.expected, self.got = turn, expected, got
        msg = (
            f"replay diverged at turn {turn}: recorded digest {expected[:12]}..., replay gave {got[:12]}..."
        )
        if detail:
            msg += f" ({detail})"
        msg += ". The env is not deterministic for this record, or its data or version changed since it was recorded."
        super().__init__(msg)


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
