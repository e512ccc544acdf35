"""Replayable tools: a name, a version and a pure call, wrapped by a persistent journal.

A tool is a function of its (JSON) arguments and of fixed resources (a corpus, an
index, a catalogue). Its ``version`` must change whenever those resources or the code
change, because the journal keys every result by ``(name, version, canonical args)``::

    from twice_envs.tools import Journal, Tool

    class Calculator(Tool):
        name, version = "calculator", "1"
        def call(self, expression: str) -> str:
            ...

    journal = Journal("tools.sqlite")        # or Journal() for memory only
    calc = journal.wrap(Calculator())
    calc(expression="2+3")                   # computed once, then read back

The journal has a memory layer (shared by every env in the process, so forks and
twins never recompute) over an optional SQLite file in WAL mode that several
processes may read and write at once; the first result recorded for a key wins, so a
nondeterministic tool (a live web search) becomes replayable. ``mode="replay"``
never calls the tool: a missing key raises :class:`JournalMiss` (use it with the
network off).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
import sqlite3
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from twice_envs.errors import TwiceError
from twice_envs.trajectory import canonical_json

MODES = ("record", "replay", "off")


class JournalMiss(TwiceError, KeyError):
    """A replay-only journal has no result for this call."""


class Tool:
    """Base class of a replayable tool.

    Subclasses set ``name`` and ``version`` and implement ``call(**args)``, which must
    return JSON data and depend only on its arguments and the tool's fixed resources.
    """

    name: str = ""
    version: str = ""

    def call(self, **args: Any) -> Any:
        raise NotImplementedError

    def __call__(self, **args: Any) -> Any:
        return self.call(**args)


class FunctionTool(Tool):
    """A plain function as a tool: ``FunctionTool("calc", "1", fn)``."""

    def __init__(self, name: str, version: str, fn: Callable[..., Any]) -> None:
        self.name, self.version, self._fn = name, version, fn

    def call(self, **args: Any) -> Any:
        return self._fn(**args)


def tool_key(name: str, version: str, args: dict) -> str:
    """The journal key of a call: sha256 of the canonical JSON of ``(name, version, args)``."""
    return hashlib.sha256(canonical_json([name, version, args]).encode()).hexdigest()


class Journal:
    """Results of tool calls keyed by ``(name, version, canonical args)``.

    Args:
        path: SQLite file (created; WAL mode); ``None`` keeps results in memory only.
        mode: ``"record"`` calls the tool on a miss and stores the result;
            ``"replay"`` never calls it (a miss raises :class:`JournalMiss`);
            ``"off"`` always calls and stores nothing.
        memory_items: results kept in the memory layer (least recently used dropped).
        readonly: never create or write the file (results of misses stay in memory);
            a missing file reads as empty. Replays open journals this way.
    """

    def __init__(
        self,
        path: Optional[str | os.PathLike] = None,
        *,
        mode: str = "record",
        memory_items: int = 200_000,
        readonly: bool = False,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.path = None if path is None else Path(path)
        self.mode = mode
        self.memory_items = int(memory_items)
        self.readonly = bool(readonly)
        self._mem: "OrderedDict[str, str]" = OrderedDict()
        self._lock = threading.RLock()
        self._conn: Optional[sqlite3.Connection] = None
        self._conn_pid = -1
        self.hits = 0
        self.misses = 0

    # ------------------------------------------------------------------ storage
    def _db(self) -> Optional[sqlite3.Connection]:
        if self.path is None:
            return None
        if self._conn is None or self._conn_pid != os.getpid():
            # A connection must not cross a fork(): open one per process.
            if self.readonly:
                if not self.path.is_file():
                    return None
                conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)
                self._conn, self._conn_pid = conn, os.getpid()
                return conn
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(str(self.path), timeout=60.0, check_same_thread=False, isolation_level=None)
            conn.execute("PRAGMA busy_timeout=60000")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS calls (key TEXT PRIMARY KEY, name TEXT NOT NULL, version TEXT NOT NULL,"
                " args TEXT NOT NULL, result TEXT NOT NULL, created REAL NOT NULL)"
            )
            self._conn, self._conn_pid = conn, os.getpid()
        return self._conn

    def _remember(self, key: str, text: str) -> None:
        self._mem[key] = text
        self._mem.move_to_end(key)
        while len(self._mem) > self.memory_items:
            self._mem.popitem(last=False)

    def lookup(self, name: str, version: str, args: dict) -> tuple[bool, Any]:
        """``(True, result)`` if the call is journaled, else ``(False, None)``."""
        key = tool_key(name, version, args)
        with self._lock:
            text = self._mem.get(key)
            if text is None:
                db = self._db()
                if db is not None:
                    row = db.execute("SELECT result, name, version FROM calls WHERE key=?", (key,)).fetchone()
                    # The key covers name and version; the check guards against a foreign file.
                    if row is not None and row[1] == name and row[2] == version:
                        text = row[0]
                        self._remember(key, text)
            else:
                self._mem.move_to_end(key)
        if text is None:
            return False, None
        return True, json.loads(text)

    def record(self, name: str, version: str, args: dict, result: Any) -> Any:
        """Store a result (the first one stored for a key wins); returns the stored result."""
        key = tool_key(name, version, args)
        text = canonical_json(result)
        with self._lock:
            db = None if self.readonly else self._db()
            if db is not None:
                db.execute(
                    "INSERT OR IGNORE INTO calls (key, name, version, args, result, created) VALUES (?,?,?,?,?,?)",
                    (key, name, version, canonical_json(args), text, time.time()),
                )
                row = db.execute("SELECT result FROM calls WHERE key=?", (key,)).fetchone()
                text = row[0] if row is not None else text
            self._remember(key, text)
        return json.loads(text)

    def call(self, tool: Tool, args: dict) -> Any:
        """The result of ``tool(**args)``: from the journal when present, else computed."""
        if self.mode == "off":
            return tool.call(**args)
        hit, value = self.lookup(tool.name, tool.version, args)
        if hit:
            self.hits += 1
            return value
        if self.mode == "replay":
            raise JournalMiss(
                f"the journal {self.path or '(memory)'} has no result for {tool.name} v{tool.version} {canonical_json(args)[:200]}"
            )
        self.misses += 1
        return self.record(tool.name, tool.version, args, tool.call(**args))

    def wrap(self, tool: Tool) -> "JournaledTool":
        """``tool`` behind this journal (call it like the tool)."""
        return JournaledTool(tool, self)

    def clear_memory(self) -> None:
        """Drop the memory layer (the SQLite file is kept)."""
        with self._lock:
            self._mem.clear()

    def __len__(self) -> int:
        db = self._db()
        if db is None:
            return len(self._mem)
        return int(db.execute("SELECT COUNT(*) FROM calls").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._conn_pid == os.getpid():
                self._conn.close()
            self._conn = None


class JournaledTool(Tool):
    """A tool whose calls go through a :class:`Journal`."""

    def __init__(self, tool: Tool, journal: Journal) -> None:
        self.tool, self.journal = tool, journal
        self.name, self.version = tool.name, tool.version

    def call(self, **args: Any) -> Any:
        return self.journal.call(self.tool, args)


_SHARED: dict[tuple[str, bool], Journal] = {}
_SHARED_LOCK = threading.Lock()
_READ_ONLY = contextvars.ContextVar("twice_envs_read_only_journals", default=False)


@contextlib.contextmanager
def read_only_journals() -> Iterator[None]:
    """Within this block, :func:`shared_journal` hands out read-only journals (replays use it)."""
    token = _READ_ONLY.set(True)
    try:
        yield
    finally:
        _READ_ONLY.reset(token)


def shared_journal(path: Optional[str | os.PathLike] = None, *, readonly: Optional[bool] = None) -> Journal:
    """The process-wide journal for ``path`` (``None``: the memory-only one).

    ``readonly`` defaults to whether the caller runs inside :func:`read_only_journals`.
    """
    readonly = _READ_ONLY.get() if readonly is None else bool(readonly)
    key = ("" if path is None else str(Path(path).resolve()), readonly and path is not None)
    with _SHARED_LOCK:
        j = _SHARED.get(key)
        if j is None:
            j = _SHARED[key] = Journal(None if path is None else path, readonly=key[1])
        return j
