"""replay() of records from elsewhere: file and folder kwargs need consent, journals stay untouched."""

from __future__ import annotations

import hashlib
import os
import re
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


# ---------------------------------------------------------------- every field of a record is checked
REAL_IDS = ("SearchQA-v0", "WebShop-v0", "ALFWorld-v0")
FIRST_ACTIONS = {"SearchQA-v0": [SEARCH, "<search> river port </search>"], "WebShop-v0": ["search[red shirt]"]}


def unfinished(env_id: str) -> dict:
    """A two-action record of ``env_id`` whose episode is still running, as JSON data."""
    if env_id == "ALFWorld-v0":
        pytest.importorskip("alfworld")
    env = twice_envs.make(env_id)
    env.reset(seed=5)
    for action in FIRST_ACTIONS.get(env_id, []) + ["look", "look"]:
        if env.turn == 2:
            break
        env.step(action)
    assert env.turn == 2 and not env.done
    data = env.trajectory.to_json()
    assert twice_envs.first_divergence(data) is None
    return data


@pytest.mark.parametrize("flag", ["terminated", "truncated"])
@pytest.mark.parametrize("env_id", REAL_IDS)
def test_a_flipped_end_flag_does_not_replay_exactly(env_id, flag):
    data = unfinished(env_id)
    data[flag] = True
    divergence = twice_envs.first_divergence(data)
    assert isinstance(divergence, twice_envs.ReplayDivergence) and divergence.turn == 2
    assert f"{flag}=True" in str(divergence) and "the replay ended" in str(divergence)
    with pytest.raises(twice_envs.ReplayDivergence, match=f"the record says {flag}=True"):
        twice_envs.replay(data)


def test_a_finished_episode_flagged_as_running_does_not_replay_exactly(tmp_path):
    record = searched(tmp_path, tmp_path / "j.sqlite")
    assert record.terminated
    data = record.to_json()
    data["terminated"] = False
    with pytest.raises(twice_envs.ReplayDivergence, match="terminated=False.*the replay ended terminated=True"):
        twice_envs.replay(data, trusted=True)
    # a prefix replay does not judge the flags (they describe the end of the record) ...
    assert twice_envs.replay(data, turn=1, trusted=True).turn == 1
    # ... but the whole record must end as recorded
    assert twice_envs.first_divergence(record, trusted=True) is None


def test_actions_after_the_end_of_the_episode_are_a_divergence(tmp_path):
    record = searched(tmp_path, tmp_path / "j.sqlite")
    data = record.to_json()
    data["actions"].append(SEARCH)
    data["observations"].append("more evidence")
    data["rewards"].append(0.0)
    data["digests"].append(step_digest(data["digests"][-1], SEARCH, "more evidence", 0.0))
    with pytest.raises(twice_envs.ReplayDivergence, match="the episode ended after 2 actions, but the record holds 3"):
        twice_envs.replay(data, trusted=True)


@pytest.mark.parametrize("env_id", REAL_IDS)
def test_an_edited_noise_seed_does_not_replay_exactly(env_id):
    data = unfinished(env_id)
    data["noise"]["episode_seed"] += 1
    divergence = twice_envs.first_divergence(data)
    assert isinstance(divergence, twice_envs.ReplayDivergence) and divergence.turn == 0
    assert "noise.episode_seed" in str(divergence)
    # a noise seed given at reset is what the record must hold
    env = twice_envs.make(env_id)
    env.reset(seed=5, options={"noise_seed": 77})
    assert env.trajectory.noise["episode_seed"] == 77 and twice_envs.first_divergence(env.trajectory) is None
    data = env.trajectory.to_json()
    data["noise"]["episode_seed"] = 78
    with pytest.raises(twice_envs.ReplayDivergence, match=r"noise.episode_seed is 78.*options\['noise_seed'\] = 77"):
        twice_envs.replay(data)


@pytest.mark.parametrize(
    "edit, problem",
    [
        (lambda n: n.pop("episode_seed"), "missing field 'noise.episode_seed'"),
        (lambda n: n.update(episode_seed="12"), "'noise.episode_seed' must be an integer in 0..2**64-1, got a string"),
        (lambda n: n.update(episode_seed=1.5), "'noise.episode_seed' must be an integer in 0..2**64-1, got a number"),
        (lambda n: n.update(episode_seed=True), "'noise.episode_seed' must be an integer in 0..2**64-1, got a boolean"),
        (lambda n: n.update(episode_seed=-1), "'noise.episode_seed' must be an integer in 0..2**64-1, got -1"),
        (lambda n: n.update(episode_seed=2**64), "'noise.episode_seed' must be an integer in 0..2**64-1"),
        (lambda n: n.update(branches=[1]), "'noise.branches' must be an object"),
        (lambda n: n.update(branches={"x": 1}), "'noise.branches' keys must be turns"),
        (lambda n: n.update(branches={"2": 0}), "'noise.branches[\"2\"]' must be a branch"),
        (lambda n: n.update(seed=3), "unknown field 'noise.seed'"),
    ],
)
def test_a_malformed_noise_block_is_refused_naming_the_field(edit, problem):
    from twice_envs.errors import TrajectoryFormatError

    problem = re.escape(problem)
    data = unfinished("SearchQA-v0")
    edit(data["noise"])
    with pytest.raises(TrajectoryFormatError, match=problem):
        Trajectory.from_json(data)
    with pytest.raises(TrajectoryFormatError, match=problem):
        twice_envs.replay(data)
    with pytest.raises(TrajectoryFormatError, match=problem):
        twice_envs.first_divergence(data)
    # a record built in code is checked by replay as well
    record = Trajectory.from_json(unfinished("SearchQA-v0"))
    edit(record.noise)
    with pytest.raises(TrajectoryFormatError, match=problem):
        twice_envs.replay(record)


def test_twin_records_still_replay_exactly():
    from twice_envs.wrappers import twin

    env = twice_envs.make("SearchQA-v0")
    env.reset(seed=5)
    env.step(SEARCH)
    env.step("<search> river port </search>")
    coupled = twin(env.fork(1), "<search> copper bells </search>", env.noise_schedule, branch=2)
    independent = twin(env.fork(1), "<search> copper bells </search>", 12345)
    for tw in (coupled, independent):
        assert tw.trajectory.noise["branches"] == {"1": tw.trajectory.noise["branches"]["1"]}
        assert twice_envs.first_divergence(tw.trajectory) is None
        rebuilt = twice_envs.replay(tw.trajectory)
        assert rebuilt.trajectory.to_json() == tw.trajectory.to_json()
    # a fork taken before the twin's branch turn keeps the twin's schedule and replays too
    early = coupled.fork(0)
    assert early.trajectory.noise == coupled.trajectory.noise and twice_envs.first_divergence(early.trajectory) is None


def test_a_rewritten_question_does_not_replay_exactly(tmp_path):
    """The task a reader sees is ``observations[0]``: its digest covers it, so an edit is found, with or
    without the digests recomputed."""
    record = searched(tmp_path, tmp_path / "j.sqlite")
    data = record.to_json()
    assert "Velora" not in data["observations"][0]
    data["observations"][0] = data["observations"][0].replace("Question:", "Question: what is the capital of Velora?")
    assert data["observations"][0] != record.observations[0]
    with pytest.raises(twice_envs.ReplayDivergence, match=r"chain is broken at turn 0: .*observations\[0\]"):
        Trajectory.from_json(data).check_chain()
    with pytest.raises(twice_envs.ReplayDivergence, match=r"chain is broken at turn 0"):
        twice_envs.replay(data, trusted=True)
    assert twice_envs.first_divergence(data, trusted=True).turn == 0
    # a forger who recomputes the whole chain is caught by the replayed env's own first observation
    rechained = forged(Trajectory.from_json(data))
    divergence = twice_envs.first_divergence(rechained, trusted=True)
    assert divergence.turn == 0 and "reset observation differs" in str(divergence)


def test_a_factual_record_given_a_branch_and_another_seed_shows_as_an_independent_twin():
    from twice_envs.replay import noise_kind

    env = twice_envs.make("SearchQA-v0")
    env.reset(seed=5)
    env.step(SEARCH)
    record = Trajectory.from_json(env.trajectory.to_json())
    assert noise_kind(record) == "factual"
    data = record.to_json()
    data["noise"]["episode_seed"] += 1
    assert twice_envs.first_divergence(data).field == "noise.episode_seed"
    data["noise"]["branches"] = {"0": 1}  # a fake branch: the record now claims to be a twin ...
    assert twice_envs.first_divergence(data) is None
    assert noise_kind(Trajectory.from_json(data)) == "independent twin"  # ... and is reported as one
    data["noise"]["branches"] = {"5000": 1}  # a branch no episode of the env reaches is refused
    assert twice_envs.first_divergence(data).field == "noise.branches"
    data["noise"] = {**record.noise, "branches": {"0": 1}}
    assert noise_kind(Trajectory.from_json(data)) == "coupled twin"
