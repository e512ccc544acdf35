"""The replayable-tool API: Tool, Journal (memory and SQLite WAL), replay mode, several processes."""

import multiprocessing as mp
import os

import pytest

from twice_envs.tools import (
    FunctionTool,
    Journal,
    JournalMiss,
    Tool,
    shared_journal,
    tool_key,
)


class Counting(Tool):
    name, version = "square", "1"

    def __init__(self):
        self.calls = 0

    def call(self, x):
        self.calls += 1
        return {"y": x * x}


def test_memory_journal_computes_once():
    tool = Counting()
    j = Journal()
    wrapped = j.wrap(tool)
    assert wrapped(x=3) == {"y": 9}
    assert wrapped(x=3) == {"y": 9}
    assert tool.calls == 1 and j.hits == 1 and j.misses == 1
    assert wrapped(x=4) == {"y": 16}
    assert tool.calls == 2


def test_key_is_canonical_in_argument_order_and_separates_versions():
    assert tool_key("t", "1", {"a": 1, "b": 2}) == tool_key("t", "1", {"b": 2, "a": 1})
    assert tool_key("t", "1", {"a": 1}) != tool_key("t", "2", {"a": 1})
    assert tool_key("t", "1", {"a": 1}) != tool_key("u", "1", {"a": 1})


def test_sqlite_journal_persists_and_replays_with_the_tool_gone(tmp_path):
    path = tmp_path / "j.sqlite"
    j = Journal(path)
    tool = Counting()
    j.call(tool, {"x": 5})
    j.close()
    # a new journal on the same file, replay-only: no tool call is possible
    broken = FunctionTool("square", "1", lambda x: (_ for _ in ()).throw(RuntimeError("network is off")))
    r = Journal(path, mode="replay")
    assert r.call(broken, {"x": 5}) == {"y": 25}
    with pytest.raises(JournalMiss):
        r.call(broken, {"x": 6})
    # another version of the tool never reads the old entry
    v2 = FunctionTool("square", "2", lambda x: {"y": -1})
    assert Journal(path).call(v2, {"x": 5}) == {"y": -1}


def test_first_recorded_result_wins_for_a_nondeterministic_tool(tmp_path):
    path = tmp_path / "j.sqlite"
    a, b = Journal(path), Journal(path)
    assert a.call(FunctionTool("clock", "1", lambda: 1), {}) == 1
    assert b.call(FunctionTool("clock", "1", lambda: 2), {}) == 1  # b reads a's entry
    assert len(a) == 1


def test_off_mode_always_calls():
    tool = Counting()
    j = Journal(mode="off")
    j.call(tool, {"x": 1})
    j.call(tool, {"x": 1})
    assert tool.calls == 2


def test_memory_layer_is_bounded():
    j = Journal(memory_items=3)
    for i in range(10):
        j.call(Counting(), {"x": i})
    assert len(j) == 3


def test_memory_layer_is_capped_in_bytes():
    """Filling a journal past its byte cap drops the least recently used results: the accounted
    size stays under the cap, the newest results stay, the oldest go."""
    cap = 1 << 20
    j = Journal(memory_bytes=cap)
    tool = FunctionTool("blob", "1", lambda i: "x" * 10_000 + str(i))
    for i in range(300):  # about 3 MB of results
        assert j.call(tool, {"i": i}).endswith(str(i))
        assert j.memory_bytes_used <= cap
    assert 50 < len(j) < 300
    hits, misses = j.hits, j.misses
    j.call(tool, {"i": 299})
    assert j.hits == hits + 1
    j.call(tool, {"i": 0})
    assert j.misses == misses + 1
    # a result larger than the whole cap is returned but not kept in memory
    big = FunctionTool("big", "1", lambda: "y" * (2 * cap))
    assert len(j.call(big, {})) == 2 * cap and j.memory_bytes_used <= cap


def test_default_memory_layer_holds_a_bounded_amount_of_memory():
    """A journal made with the defaults keeps at most its default byte cap of results, counted
    by what the process really allocates (tracemalloc), however many results pass through."""
    import tracemalloc

    from twice_envs.tools import DEFAULT_MEMORY_BYTES

    tool = FunctionTool("blob", "1", lambda i: "z" * 20_000 + str(i))
    tracemalloc.start()
    try:
        j = Journal()
        for i in range(2 * DEFAULT_MEMORY_BYTES // 20_000):  # twice the cap
            j.call(tool, {"i": i})
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert j.memory_bytes_used <= DEFAULT_MEMORY_BYTES
    # the accounting (lengths + a fixed overhead per entry) tracks the real size within 10%
    assert held < 1.1 * DEFAULT_MEMORY_BYTES


def test_small_results_are_accounted_as_the_process_allocates_them():
    """The per-entry overhead is right for small results (a search's ids and scores), where it
    dominates: accounted within 10% of what tracemalloc sees, and under 260 bytes a result."""
    import tracemalloc

    tool = FunctionTool("search", "1", lambda query: {"ids": ["595823", "947556", "16166"],
                                                        "scores": [1.7755, 14.8469, len(query) + 0.5]})
    j = Journal()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(5000):
            j.call(tool, {"query": f"query number {i}"})
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(j) == 5000
    assert abs(j.memory_bytes_used - held) < 0.1 * held
    assert held / 5000 < 260
    assert j.call(tool, {"query": "query number 7"}) == {"ids": ["595823", "947556", "16166"], "scores": [1.7755, 14.8469, 14.5]}


def test_memory_limits_can_be_changed_and_shared_journals_take_them(tmp_path):
    j = Journal(memory_bytes=1 << 20)
    for i in range(50):
        j.call(Counting(), {"x": i})
    used = j.memory_bytes_used
    j.set_memory_limits(memory_bytes=used // 10)  # about 5 of the 50 results fit
    assert 3 <= len(j) <= 6 and j.memory_bytes_used <= used // 10
    j.set_memory_limits(memory_items=1)
    assert len(j) == 1
    nothing = Journal(memory_items=0)  # a journal that keeps no results in memory
    nothing.call(Counting(), {"x": 1})
    assert len(nothing) == 0 and nothing.memory_bytes_used == 0
    shared = shared_journal(tmp_path / "s.sqlite", memory_bytes=12345)
    assert shared.memory_bytes == 12345
    assert shared_journal(tmp_path / "s.sqlite") is shared and shared.memory_bytes == 12345
    with pytest.raises(ValueError):
        Journal(memory_bytes=-1)


def test_shared_journal_is_one_per_path(tmp_path):
    assert shared_journal(None) is shared_journal(None)
    assert shared_journal(tmp_path / "a.sqlite") is shared_journal(str(tmp_path / "a.sqlite"))


def _writer(path, worker, n, out):
    j = Journal(path)
    pid_tool = FunctionTool("pid", "1", lambda k: [worker, k])
    results = [j.call(pid_tool, {"k": k}) for k in range(n)]
    out.put((worker, results))


def test_several_processes_write_one_journal(tmp_path):
    path = str(tmp_path / "shared.sqlite")
    ctx = mp.get_context("fork" if hasattr(os, "fork") else "spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(path, w, 150, q)) for w in range(3)]
    for p in procs:
        p.start()
    got = dict(q.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    j = Journal(path, mode="replay")
    assert len(j) == 150
    stored = [j.call(FunctionTool("pid", "1", lambda k: None), {"k": k}) for k in range(150)]
    # every process saw exactly what the journal holds: one result per key, first writer wins
    for worker, results in got.items():
        assert results == stored


def _fresh_opener(folder, worker, barrier, out):
    errors = []
    for rnd in range(20):
        barrier.wait(timeout=60)  # all 8 open the same fresh file at the same instant
        try:
            j = Journal(os.path.join(folder, f"fresh{rnd}.sqlite"))
            for k in range(3):
                j.call(FunctionTool("t", "1", lambda w, k: [w, k]), {"w": worker, "k": k})
            j.close()
        except Exception as exc:  # noqa: BLE001 -- reported to the parent, which asserts none
            errors.append(f"round {rnd}: {type(exc).__name__}: {exc}")
    out.put(errors)


def test_many_processes_open_a_fresh_journal_at_once(tmp_path):
    """8 processes open one fresh file at once, 20 rounds: no error and no lost row."""
    ctx = mp.get_context("fork" if hasattr(os, "fork") else "spawn")
    barrier, q = ctx.Barrier(8), ctx.Queue()
    procs = [ctx.Process(target=_fresh_opener, args=(str(tmp_path), w, barrier, q)) for w in range(8)]
    for p in procs:
        p.start()
    errors = sum((q.get(timeout=300) for _ in procs), [])
    for p in procs:
        p.join(timeout=60)
    lost = sum(8 * 3 - len(Journal(tmp_path / f"fresh{rnd}.sqlite", readonly=True)) for rnd in range(20))
    assert errors == [] and lost == 0


def test_switching_a_fresh_journal_to_wal_is_retried_while_locked(tmp_path, monkeypatch):
    """SQLite answers "database is locked" to ``journal_mode=WAL`` without waiting when two
    processes switch one fresh file at once; opening retries instead of failing."""
    import sqlite3

    real_connect = sqlite3.connect
    failures = []

    class Contended:
        def __init__(self, conn):
            self._conn = conn

        def execute(self, sql, *args):
            if sql == "PRAGMA journal_mode=WAL" and len(failures) < 3:
                failures.append(sql)
                raise sqlite3.OperationalError("database is locked")
            return self._conn.execute(sql, *args)

        def close(self):
            self._conn.close()

    monkeypatch.setattr(sqlite3, "connect", lambda *a, **k: Contended(real_connect(*a, **k)))
    j = Journal(tmp_path / "j.sqlite")
    assert j.call(Counting(), {"x": 2}) == {"y": 4}
    assert len(failures) == 3 and len(j) == 1


def _make_journal(path):
    j = Journal(path)
    j.call(FunctionTool("square", "1", lambda x: {"y": x * x}), {"x": 3})
    j.close()


def test_readonly_journal_reads_and_never_writes(tmp_path):
    path = tmp_path / "j.sqlite"
    _make_journal(path)
    before = path.read_bytes()
    tool = Counting()
    r = Journal(path, readonly=True)
    assert r.call(tool, {"x": 3}) == {"y": 9} and tool.calls == 0
    assert r.call(tool, {"x": 4}) == {"y": 16} and tool.calls == 1  # computed, kept in memory
    assert len(r) == 1  # ... and not stored in the file
    r.close()
    assert path.read_bytes() == before
    # at most SQLite's empty working files appear beside it
    assert all(p.name in ("j.sqlite-wal", "j.sqlite-shm") and p.stat().st_size <= 32768
               for p in tmp_path.iterdir() if p != path)
    assert not (tmp_path / "j.sqlite-wal").exists() or (tmp_path / "j.sqlite-wal").stat().st_size == 0
    with pytest.raises(JournalMiss, match="j.sqlite"):
        Journal(path, readonly=True, mode="replay").call(tool, {"x": 5})
    # a missing file reads as empty and is not created
    missing = tmp_path / "sub" / "none.sqlite"
    assert Journal(missing, readonly=True).call(tool, {"x": 2}) == {"y": 4}
    assert not missing.parent.exists()


READONLY_FS_SCRIPT = """
import os, subprocess, sys
from twice_envs.tools import FunctionTool, Journal
d = sys.argv[1]
subprocess.run(["mount", "-t", "tmpfs", "none", d], check=True)
j = Journal(os.path.join(d, "j.sqlite"))
j.call(FunctionTool("square", "1", lambda x: {"y": x * x}), {"x": 3})
j.close()
subprocess.run(["mount", "-o", "remount,ro", d], check=True)
r = Journal(os.path.join(d, "j.sqlite"), readonly=True, mode="replay")
print(r.call(FunctionTool("square", "1", lambda x: None), {"x": 3}), sorted(os.listdir(d)))
"""


def test_readonly_journal_works_on_a_read_only_file_system(tmp_path):
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None:
        pytest.skip("needs unshare to mount a read-only file system")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("user namespaces are not available here")
    out = subprocess.run(["unshare", "-rm", sys.executable, "-c", READONLY_FS_SCRIPT, str(mnt)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "{'y': 9} ['j.sqlite']"


def test_corrupt_or_foreign_files_raise_journal_error(tmp_path):
    import sqlite3

    from twice_envs.errors import JournalError

    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database at all\n" * 100)
    for readonly in (False, True):
        with pytest.raises(JournalError, match="junk.sqlite.*corrupt or of another kind"):
            Journal(junk, readonly=readonly).call(Counting(), {"x": 1})
    foreign = tmp_path / "app.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE users (id INTEGER)")
    conn.commit()
    conn.close()
    before = foreign.read_bytes()
    for readonly in (False, True):
        with pytest.raises(JournalError, match="app.db: not a twice_envs tool journal.*users"):
            Journal(foreign, readonly=readonly).call(Counting(), {"x": 1})
    assert foreign.read_bytes() == before  # not converted to WAL, no table added
    # a journal whose stored result was damaged
    path = tmp_path / "j.sqlite"
    _make_journal(path)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE calls SET result = '{broken'")
    conn.commit()
    conn.close()
    with pytest.raises(JournalError, match="j.sqlite: the stored result .* not valid JSON"):
        Journal(path).call(Counting(), {"x": 3})
    with pytest.raises(JournalError, match="is a folder"):
        Journal(tmp_path).call(Counting(), {"x": 3})
