"""replay() of records from elsewhere: file and folder kwargs need consent, journals stay untouched."""

from __future__ import annotations

import hashlib
import os
import sqlite3

import pytest

import twice_envs
from twice_envs import Trajectory, TwiceError
from twice_envs.replay import path_kwargs
from twice_envs.trajectory import reset_digest, step_digest

pytest.importorskip("bm25s")

SEARCH = "<search> capital of Velora </search>"


def forged(record: Trajectory, **kwargs) -> dict:
    """``record`` with some kwargs changed and its digest chain recomputed, as an attacker would."""
    data = record.to_json()
    data["kwargs"] = {**data["kwargs"], **kwargs}
    digests = [reset_digest(data["env_id"], data["env_version"], data["kwargs"], data["seed"], data["options"], data["observations"][0])]
    for a, o, r in zip(data["actions"], data["observations"][1:], data["rewards"]):
        digests.append(step_digest(digests[-1], a, o, r))
    data["digests"] = digests
    return data


def searched(tmp_path, journal) -> Trajectory:
    env = twice_envs.make("SearchQA-v0", journal=str(journal))
    env.reset(seed=3)
    env.step(SEARCH)
    env.step("<answer> nowhere </answer>")
    return Trajectory.from_json(env.trajectory.to_json())


def sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_a_record_naming_a_journal_is_refused_without_consent_and_touches_nothing(tmp_path):
    record = searched(tmp_path, tmp_path / "mine" / "journal.sqlite")
    target = tmp_path / "elsewhere" / "deep" / "j.sqlite"
    with pytest.raises(TwiceError, match=r"journal=.*elsewhere.*trusted=True.*--trust-kwargs.*overrides=\{'journal': \.\.\.\}"):
        twice_envs.replay(forged(record, journal=str(target)))
    assert not (tmp_path / "elsewhere").exists()


def test_a_trusted_replay_opens_the_journal_read_only(tmp_path):
    # an unrelated SQLite database where the record points
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE people (name TEXT)")
        db.execute("INSERT INTO people VALUES ('ada')")
    before = sha(other)
    # the record's own journal, replayed with consent: read, never written
    journal = tmp_path / "mine" / "journal.sqlite"
    record = searched(tmp_path, journal)
    mine_before = sha(journal)
    env = twice_envs.replay(record, trusted=True)
    assert env.trajectory.digests == record.digests
    assert sha(journal) == mine_before
    # a journal file that does not exist is not created by a trusted replay either
    missing = tmp_path / "absent" / "j.sqlite"
    env = twice_envs.replay(forged(record, journal=str(missing)), trusted=True)
    env.reset(seed=3)
    env.step("<search> a query never searched before </search>")
    assert not (tmp_path / "absent").exists()
    assert sha(other) == before and not os.path.exists(f"{other}-wal")


def test_overrides_name_the_paths_and_the_replay_still_verifies_the_record(tmp_path):
    record = searched(tmp_path, tmp_path / "mine" / "journal.sqlite")
    theirs = forged(record, journal=str(tmp_path / "theirs.sqlite"))
    env = twice_envs.replay(theirs, overrides={"journal": None})
    assert env.make_kwargs["journal"] is None and env.trajectory.observations == record.observations
    # overrides that change what the env shows are caught by the digest chain
    with pytest.raises(twice_envs.ReplayDivergence, match="turn 1"):
        twice_envs.replay(theirs, overrides={"journal": None, "max_searches": 0})


def test_path_kwargs_are_recognised_by_name_and_by_the_env_class():
    assert path_kwargs("SearchQA-v0", {"journal": "j.db", "corpus": "c.jsonl", "questions": {"train": "q"}, "topk": 3}) == [
        "corpus", "journal", "questions",
    ]
    assert path_kwargs("SearchQA-v0", {"journal": None, "split": "dev"}) == []
    assert path_kwargs("WebShop-v0", {"products_path": "p.json", "cache_root": "/tmp/x", "split": "test"}) == [
        "cache_root", "products_path",
    ]
    assert path_kwargs("ALFWorld-v0", {"data_dir": "/data", "split": "train"}) == ["data_dir"]


def test_cli_replay_needs_trust_kwargs_for_such_records(tmp_path, capsys):
    from twice_envs.play import replay_main

    record = searched(tmp_path, tmp_path / "mine" / "journal.sqlite")
    path = tmp_path / "episodes.jsonl"
    twice_envs.save_trajectories(path, [record])
    # The refusal is that record's result (the rest of a file would still be replayed).
    assert replay_main([str(path)]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "--trust-kwargs" in out and "0/1 episodes replay exactly" in out
    assert replay_main([str(path), "--trust-kwargs"]) == 0
    assert "replays exactly" in capsys.readouterr().out
