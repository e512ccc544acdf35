"""Every writer of episode records counts them, so every reader names a file cut at a line boundary."""

from __future__ import annotations

import warnings

import pytest

import twice_envs
from tests import toy_envs  # noqa: F401  (registers CoinChain-v0)
from tests.agents.view._pairs import lone_episode, resync_pair
from twice_envs.agents import records
from twice_envs.agents.view.load import load
from twice_envs.errors import RecordCountError, UncountedRecordsWarning
from twice_envs.trajectory import iter_records, load_trajectories
from twice_envs.wrappers import RecordEpisodes


def played(seed: int) -> dict:
    env = twice_envs.make("CoinChain-v0", max_turns=2)
    env.reset(seed=seed)
    env.step("look")
    env.step("look")
    return env.trajectory.to_json()


def save_trajectories(path) -> None:
    twice_envs.save_trajectories(path, [played(s) for s in range(3)])


def record_episodes(path) -> None:
    env = RecordEpisodes(twice_envs.make("CoinChain-v0", max_turns=1), path)
    for seed in range(3):
        env.reset(seed=seed)
        env.step("look")


def audit_file(path) -> None:
    factual, twin = resync_pair()
    records.write_lines(path, records.decision_lines([factual, lone_episode()], [twin], [(0, 0)], {"grpo": [0.5]},
                                                     [0.25]))


def run_file(path) -> None:
    factual, twin = resync_pair()
    records.write_lines(path, [])  # as a fresh run starts
    records.append_lines(path, records.batch_lines([factual], [twin], batch=1, slim=True))
    records.append_lines(path, records.batch_lines([lone_episode()], batch=2, slim=True))


#: Each writer of record files, and the readers of what it writes (``twice rollout``'s: tests/agents/cli).
WRITERS = {
    "save_trajectories": (save_trajectories, ("load_trajectories", "iter_records", "view")),
    "RecordEpisodes": (record_episodes, ("load_trajectories", "iter_records", "view")),
    "audit": (audit_file, ("view",)),
    "run": (run_file, ("view",)),
}


def reader_error(reader: str, path) -> str:
    """What ``reader`` says of ``path``: the count error's message, or "" if it read the file without one."""
    if reader == "view":
        found = [p for p in load(path).problems if "header counts" in p]
        return found[0] if found else ""
    if reader == "iter_records":
        last = list(iter_records(path))[-1][1]
        return str(last) if isinstance(last, RecordCountError) else ""
    try:
        load_trajectories(path)
    except RecordCountError as exc:
        return str(exc)
    return ""


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_every_reader_names_a_file_cut_at_a_line_boundary(tmp_path, writer):
    write, readers = WRITERS[writer]
    path = tmp_path / "episodes.jsonl"
    write(path)
    lines = path.read_bytes().splitlines(keepends=True)
    n = len(lines) - 1
    assert lines[0].startswith(b'{"format": "twice_envs.records/1", "records": %d}' % n) and n >= 3
    with warnings.catch_warnings():
        warnings.simplefilter("error", UncountedRecordsWarning)
        for reader in readers:
            assert reader_error(reader, path) == "", reader  # the whole file reads cleanly
        path.write_bytes(b"".join(lines[:-1]))
        for reader in readers:
            assert reader_error(reader, path) == f"{path}: cut short: its header counts {n} records, {n - 1} found " \
                                                 "(1 missing)", reader


def test_a_resumed_run_recounts_its_file_and_an_older_one_is_read_with_a_note(tmp_path):
    path = tmp_path / "episodes.jsonl"
    run_file(path)
    records.keep_batches(path, 1)
    x = load(path)
    assert x.problems == [] and len(x.rows) == 1
    old = tmp_path / "old.jsonl"
    old.write_text("".join(line.decode() for line in path.read_bytes().splitlines(keepends=True)[1:]))
    x = load(old)
    assert len(x.rows) == 1
    assert x.problems == [f"{old}: no header counting its records (a file written before record files were counted, "
                          "or by hand): read as it is, but a cut at a line boundary cannot be detected in it"]
