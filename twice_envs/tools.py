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

The memory layer is capped in bytes (``memory_bytes``, default
:data:`DEFAULT_MEMORY_BYTES`, 32 MiB). It keeps each result compactly, keyed by the
32-byte digest of the call, with its JSON text encoded as UTF-8 bytes; each counts the
lengths of both plus :data:`ENTRY_OVERHEAD` bytes, close to what the process really
allocates for it, and the least recently used results are dropped past the cap. A
dropped result is read back from the file, or computed again by a memory-only
journal; so keep a nondeterministic tool behind a writable file journal, whose file
keeps every result. The process-wide journals of :func:`shared_journal` have the default cap:
``shared_journal(path, memory_bytes=...)`` sets it for every env that uses that journal.

``readonly=True`` opens the file read-only (an SQLite ``mode=ro`` URI, so
it also works on a read-only file system) and never writes it or creates it: results of
calls it computes stay in memory. (Where the folder is writable, SQLite may create its
empty ``-wal``/``-shm`` working files beside a WAL database, as any reader does.)

Opening is safe when many processes open one fresh file at once (switching it to WAL
is retried while another process holds the lock). A file that is corrupt, or a SQLite
database that is not a twice_envs journal, raises :class:`JournalError` naming it and
is never modified.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
import random
import sqlite3
import threading
import time
import urllib.parse
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from twice_envs.errors import JournalError, TwiceError
from twice_envs.trajectory import canonical_json

MODES = ("record", "replay", "off")
#: The journal's one table and its columns.
_TABLE = "calls"
_COLUMNS = ("key", "name", "version", "args", "result", "created")
_CREATE = (
    "CREATE TABLE IF NOT EXISTS calls (key TEXT PRIMARY KEY, name TEXT NOT NULL, version TEXT NOT NULL,"
    " args TEXT NOT NULL, result TEXT NOT NULL, created REAL NOT NULL)"
)
#: Seconds to keep retrying while other processes hold the lock (opening or writing).
BUSY_SECONDS = 60.0
#: Default byte cap of a journal's memory layer. The layer only has to hold the working set
#: of forks, twins and replays (a training batch's searches: a few thousand results), since
#: the file, or the tool itself for a memory-only journal, serves the rest. 32 MiB holds
#: about 139,000 SearchQA results (about 240 bytes each) or 10,000 results of a tool that
#: returns passages (3 KB), and keeps 32 workers on one machine within 1 GiB.
DEFAULT_MEMORY_BYTES = 32 << 20
#: Bytes accounted per memory entry besides the lengths of its key (the 32-byte digest) and
#: its UTF-8 text: the two ``bytes`` headers and the ordered dict's slot and link (measured
#: with tracemalloc on Python 3.11: 141 bytes).
ENTRY_OVERHEAD = 144


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
        memory_bytes: byte cap of the memory layer (see the module docstring); the least
            recently used results are dropped past it, and 0 keeps none in memory.
        memory_items: an optional cap on the number of results in the memory layer, on top
            of ``memory_bytes`` (``None``: none; 0 keeps none in memory).
        readonly: read ``path`` without ever writing it (works on a read-only file
            system); a missing file reads as an empty journal and is not created, and
            results computed on a miss are kept in memory only.
    """

    def __init__(
        self,
        path: Optional[str | os.PathLike] = None,
        *,
        mode: str = "record",
        memory_bytes: int = DEFAULT_MEMORY_BYTES,
        memory_items: Optional[int] = None,
        readonly: bool = False,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.path = None if path is None else Path(path)
        self.mode = mode
        self.readonly = bool(readonly)
        self.memory_bytes = _limit(memory_bytes, "memory_bytes")
        self.memory_items = None if memory_items is None else _limit(memory_items, "memory_items")
        # key: the call's sha256 digest (32 bytes); value: its JSON text, UTF-8 encoded
        self._mem: "OrderedDict[bytes, bytes]" = OrderedDict()
        self._mem_bytes = 0
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
            conn = self._open_readonly() if self.readonly else self._open_writable()
            if conn is None:
                return None
            self._conn, self._conn_pid = conn, os.getpid()
        return self._conn

    def _open_writable(self) -> sqlite3.Connection:
        if self.path.is_dir():
            raise JournalError(self.path, "is a folder; give a file name such as tools.sqlite")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(str(self.path), timeout=BUSY_SECONDS, check_same_thread=False, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise JournalError(self.path, f"cannot open ({exc})") from None
        try:
            _retry_busy(self.path, lambda: self._set_up(conn))
        except BaseException:
            conn.close()
            raise
        return conn

    def _set_up(self, conn: sqlite3.Connection) -> None:
        # Check before writing anything, so a foreign database is never converted.
        conn.execute(f"PRAGMA busy_timeout={int(BUSY_SECONDS * 1000)}")
        self._check_schema(conn, missing_ok=True)
        # journal_mode=WAL takes an exclusive lock that the busy timeout does not cover on a
        # fresh file, so _retry_busy retries it; a file already in WAL needs no change.
        if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            if conn.execute("PRAGMA journal_mode=WAL").fetchone()[0] != "wal":
                raise sqlite3.OperationalError("database is locked (journal mode not switched)")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(_CREATE)

    def _open_readonly(self) -> Optional[sqlite3.Connection]:
        if not self.path.exists():
            return None  # an empty journal; nothing is created
        if self.path.is_dir():
            raise JournalError(self.path, "is a folder, not a journal file")
        base = "file:" + urllib.parse.quote(str(self.path.resolve())) + "?mode=ro"
        # On a read-only file system a WAL database without its -shm file only opens as
        # immutable, which is safe there: nobody can be writing it.
        for uri in (base, base + "&immutable=1"):
            conn = sqlite3.connect(uri, uri=True, timeout=BUSY_SECONDS, check_same_thread=False, isolation_level=None)
            try:
                _retry_busy(self.path, lambda: self._check_schema(conn, missing_ok=False))
                return conn
            except JournalError as exc:
                conn.close()
                if "unable to open" not in str(exc):
                    raise
                error = exc
        raise error

    def _check_schema(self, conn: sqlite3.Connection, missing_ok: bool) -> None:
        """Raise :class:`JournalError` unless the file is empty or a twice_envs journal."""
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        if _TABLE not in tables:
            if tables:
                shown = ", ".join(sorted(tables)[:5])
                raise JournalError(self.path, f"not a twice_envs tool journal (a SQLite database with tables {shown}); "
                                   "it was left unchanged: choose another file")
            if not missing_ok:
                raise JournalError(self.path, "not a twice_envs tool journal (no 'calls' table)")
            return
        columns = tuple(r[1] for r in conn.execute(f"PRAGMA table_info({_TABLE})"))
        if columns != _COLUMNS:
            raise JournalError(self.path, f"not a twice_envs tool journal (table 'calls' has columns {columns})")

    def _query(self, sql: str, params: tuple = ()) -> list:
        """Run ``sql`` on the file; SQLite errors become a :class:`JournalError` naming it."""
        db = self._db()
        return _retry_busy(self.path, lambda: db.execute(sql, params).fetchall())

    def _decode(self, text: str | bytes, key: str) -> Any:
        try:
            return json.loads(text)
        except (ValueError, RecursionError):
            raise JournalError(self.path, f"the stored result for key {key[:16]}... is not valid JSON (corrupt file)") from None

    def _remember(self, key: str, text: str) -> None:
        mkey, value = bytes.fromhex(key), text.encode()
        old = self._mem.pop(mkey, None)
        if old is not None:
            self._mem_bytes -= _entry_bytes(mkey, old)
        size = _entry_bytes(mkey, value)
        if size <= self.memory_bytes:
            self._mem[mkey] = value
            self._mem_bytes += size
        self._trim()

    def _trim(self) -> None:
        """Drop the least recently used results until the memory layer is within its caps."""
        mem = self._mem
        items = len(mem) if self.memory_items is None else self.memory_items
        while mem and (self._mem_bytes > self.memory_bytes or len(mem) > items):
            key, text = mem.popitem(last=False)
            self._mem_bytes -= _entry_bytes(key, text)

    def set_memory_limits(self, *, memory_bytes: Optional[int] = None, memory_items: Optional[int] = None) -> None:
        """Change the memory layer's byte cap and/or item cap (``None`` leaves one as it is);
        results past the new caps are dropped now."""
        with self._lock:
            if memory_bytes is not None:
                self.memory_bytes = _limit(memory_bytes, "memory_bytes")
            if memory_items is not None:
                self.memory_items = _limit(memory_items, "memory_items")
            self._trim()

    @property
    def memory_entries(self) -> int:
        """Results held in the memory layer."""
        return len(self._mem)

    @property
    def memory_bytes_used(self) -> int:
        """Accounted size of the memory layer in bytes (key and text lengths plus
        :data:`ENTRY_OVERHEAD` per result); never above :attr:`memory_bytes`."""
        return self._mem_bytes

    def lookup(self, name: str, version: str, args: dict) -> tuple[bool, Any]:
        """``(True, result)`` if the call is journaled, else ``(False, None)``."""
        key = tool_key(name, version, args)
        mkey = bytes.fromhex(key)
        with self._lock:
            text = self._mem.get(mkey)
            if text is None:
                if self._db() is not None:
                    rows = self._query("SELECT result, name, version FROM calls WHERE key=?", (key,))
                    # The key covers name and version; the check guards against a foreign file.
                    if rows and rows[0][1] == name and rows[0][2] == version:
                        text = rows[0][0]
                        if not isinstance(text, str):
                            raise JournalError(self.path, f"the stored result for key {key[:16]}... is not text (corrupt file)")
                        self._remember(key, text)
            else:
                self._mem.move_to_end(mkey)
        if text is None:
            return False, None
        return True, self._decode(text, key)

    def record(self, name: str, version: str, args: dict, result: Any) -> Any:
        """Store a result (the first one stored for a key wins); returns the stored result.

        A read-only journal keeps it in memory only.
        """
        key = tool_key(name, version, args)
        text = canonical_json(result)
        with self._lock:
            if not self.readonly and self._db() is not None:
                self._query(
                    "INSERT OR IGNORE INTO calls (key, name, version, args, result, created) VALUES (?,?,?,?,?,?)",
                    (key, name, version, canonical_json(args), text, time.time()),
                )
                rows = self._query("SELECT result FROM calls WHERE key=?", (key,))
                text = rows[0][0] if rows else text
            self._remember(key, text)
        return self._decode(text, key)

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
            self._mem_bytes = 0

    def __len__(self) -> int:
        if self._db() is None:
            return len(self._mem)
        return int(self._query("SELECT COUNT(*) FROM calls")[0][0])

    def close(self) -> None:
        """Close this process's connection to the file (the memory layer is kept). A later
        call opens the file again, so closing a journal that is still in use only costs a
        reconnection."""
        with self._lock:
            if self._conn is not None and self._conn_pid == os.getpid():
                self._conn.close()
            self._conn = None


def _limit(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return int(value)


def _entry_bytes(key: bytes, value: bytes) -> int:
    return len(key) + len(value) + ENTRY_OVERHEAD


def _retry_busy(path: Optional[Path], fn: Callable[[], Any]) -> Any:
    """``fn()``, retried while another process holds the file's lock; other SQLite errors
    become a :class:`JournalError` naming ``path``."""
    deadline = time.monotonic() + BUSY_SECONDS
    delay = 0.005
    while True:
        try:
            return fn()
        except sqlite3.OperationalError as exc:
            text = str(exc)
            busy = "locked" in text or "busy" in text
            if not busy or time.monotonic() > deadline:
                raise JournalError(path, f"{text} (after {BUSY_SECONDS:g} s)" if busy else text) from None
        except sqlite3.DatabaseError as exc:
            raise JournalError(path, f"not a usable SQLite journal ({exc}): the file is corrupt or of another kind") from None
        time.sleep(delay * (0.5 + random.random()))  # jitter, so waiting processes do not retry in step
        delay = min(delay * 2, 0.2)


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


def shared_journal(
    path: Optional[str | os.PathLike] = None, *, readonly: Optional[bool] = None, memory_bytes: Optional[int] = None
) -> Journal:
    """The process-wide journal for ``path`` (``None``: the memory-only one).

    ``readonly`` defaults to whether the caller runs inside :func:`read_only_journals`.
    ``memory_bytes`` sets the byte cap of its memory layer (default
    :data:`DEFAULT_MEMORY_BYTES`), also when the journal already exists: every env that
    uses it shares the one memory layer, e.g.
    ``shared_journal(None, memory_bytes=8 << 20)`` before or after
    ``make("SearchQA-v0")`` caps the memory-only journal its searches go through.
    """
    readonly = _READ_ONLY.get() if readonly is None else bool(readonly)
    key = ("" if path is None else str(Path(path).resolve()), readonly and path is not None)
    with _SHARED_LOCK:
        j = _SHARED.get(key)
        if j is None:
            j = _SHARED[key] = Journal(None if path is None else path, readonly=key[1])
    if memory_bytes is not None:
        j.set_memory_limits(memory_bytes=memory_bytes)
    return j


def shared_journals() -> list[Journal]:
    """The process-wide journals :func:`shared_journal` has made so far (to inspect their memory)."""
    with _SHARED_LOCK:
        return list(_SHARED.values())
