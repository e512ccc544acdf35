"""The replayable-tool API: Tool, Journal (memory and SQLite WAL), replay mode, several processes."""

import multiprocessing as mp
import os

import pytest

from twice_envs.tools import FunctionTool, Journal, JournalMiss, Tool, shared_journal, tool_key


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
