"""Trajectory records: JSON lines round trip, atomic writes, clear errors on bad files."""

from __future__ import annotations

import json
import os
import random
import re

import pytest

import twice_envs
from tests import toy_envs  # noqa: F401
from twice_envs import Trajectory, TrajectoryFormatError
from twice_envs.errors import BrokenChain
from twice_envs.replay import noise_kind
from twice_envs.trajectory import (
    atomic_write_text,
    load_trajectories,
    reset_digest,
    save_trajectories,
    step_digest,
)


def episode(seed=0):
    env = twice_envs.make("CoinChain-v0")
    env.reset(seed=seed)
    for a in ["look", "right", "🙂"]:
        env.step(a)
    return env.trajectory


def rechained(data: dict) -> list[str]:
    """The digest chain ``data``'s fields give (what a forger would write after an edit)."""
    digests = [reset_digest(data["env_id"], data["env_version"], data["kwargs"], data["seed"], data["options"],
                            data["observations"][0])]
    for a, o, r in zip(data["actions"], data["observations"][1:], data["rewards"]):
        digests.append(step_digest(digests[-1], a, o, r))
    return digests


def test_round_trip(tmp_path):
    recs = [episode(0), episode(1)]
    path = tmp_path / "eps.jsonl"
    save_trajectories(path, recs)
    back = load_trajectories(path)
    assert [r.to_json() for r in back] == [r.to_json() for r in recs]
    assert twice_envs.replay(back[1]).trajectory.digests == recs[1].digests


@pytest.mark.parametrize(
    "line, match",
    [
        ("{not json", "not valid JSON"),
        ('{"format": "something-else/1"}', "not a twice_envs trajectory"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path, line, match):
    path = tmp_path / "bad.jsonl"
    good = json.dumps(episode().to_json())
    path.write_text(good + "\n" + line + "\n")
    with pytest.raises(TrajectoryFormatError, match=rf"bad\.jsonl:2: {match}"):
        load_trajectories(path)


def test_missing_field_and_inconsistent_lengths(tmp_path):
    rec = episode().to_json()
    del rec["digests"]
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    with pytest.raises(TrajectoryFormatError, match="missing field 'digests'"):
        load_trajectories(path)
    rec = episode().to_json()
    rec["rewards"].append(1.0)
    path.write_text(json.dumps(rec) + "\n")
    with pytest.raises(TrajectoryFormatError, match="inconsistent lengths"):
        load_trajectories(path)


def test_missing_file():
    with pytest.raises(TrajectoryFormatError, match="no such file"):
        load_trajectories("/nonexistent/x.jsonl")


def test_atomic_write_leaves_old_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "f.txt"
    atomic_write_text(path, "old")

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write_text(path, "new")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]  # no temp file left behind


def test_unregistered_env_in_record():
    rec = episode().to_json()
    rec["env_id"] = "Unknown-v9"
    rec["digests"] = rechained(rec)  # a record of an env this process does not register
    with pytest.raises(TrajectoryFormatError, match="not registered"):
        twice_envs.replay(rec)


ODD_STRINGS = [
    "\udcff",  # a lone surrogate: what decoding a Latin-1 byte with surrogateescape gives
    "caf\udce9 au lait",
    "\ud83d\ude00",  # two surrogate code points, not the emoji
    "😀",
    "\ud800",
    "\x00\x1b[31m\u202e\ufeff",
]


def test_any_str_round_trips_exactly(tmp_path):
    env = twice_envs.make("CoinChain-v0")
    env.reset(seed=0)
    for a in ODD_STRINGS:
        env.step(a)
    rec = env.trajectory
    path = tmp_path / "odd.jsonl"
    save_trajectories(path, [rec])
    (back,) = load_trajectories(path)
    assert back.actions == ODD_STRINGS
    assert back.to_json() == rec.to_json()
    back.check_chain()
    assert twice_envs.replay(back).trajectory.digests == rec.digests


def test_digests_tell_surrogate_code_points_from_the_character():
    from twice_envs.trajectory import step_digest

    assert step_digest("d", "\ud83d\ude00", "", 0.0) != step_digest("d", "😀", "", 0.0)
    # Text without surrogate code points keeps the digest it always had (ASCII canonical JSON).
    import hashlib

    expected = hashlib.sha256(b'["d","caf\\u00e9 \\ud83d\\ude00","","0.0"]').hexdigest()
    assert step_digest("d", "café 😀", "", 0.0) == expected


def test_record_episodes_saves_lone_surrogates(tmp_path):
    from twice_envs.wrappers import RecordEpisodes

    path = tmp_path / "rec.jsonl"
    env = RecordEpisodes(twice_envs.make("CoinChain-v0", max_turns=2), path)
    for seed in (0, 1):
        env.reset(seed=seed)
        env.step("\udcff")
        env.step("look")  # the episode ends here and is written
    back = load_trajectories(path)
    assert [r.seed for r in back] == [0, 1] and back[0].actions == ["\udcff", "look"]


@pytest.mark.parametrize(
    "content, match",
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", r"bin\.jsonl:(1|2): (binary data|not UTF-8)"),
        (b'{"format": "caf\xe9"}\n', r"bin\.jsonl:1: not UTF-8 text \(byte 0xe9 at column 16\)"),
        (b"[" * 100_000 + b"]" * 100_000 + b"\n", r"bin\.jsonl:1: JSON nested too deeply"),
    ],
)
def test_unreadable_files_name_file_and_line(tmp_path, content, match):
    path = tmp_path / "bin.jsonl"
    path.write_bytes(content)
    with pytest.raises(TrajectoryFormatError, match=match):
        load_trajectories(path)


def test_a_folder_is_a_clear_error(tmp_path):
    with pytest.raises(TrajectoryFormatError, match="is a folder"):
        load_trajectories(tmp_path)


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("actions", ["look", 3, "right"], r"actions\[1\] must be a string, got a number"),
        ("observations", None, "field 'observations' must be array, got null"),
        ("rewards", ["1", 0.0, 0.0], r"rewards\[0\] must be a finite number"),
        ("rewards", [True, 0.0, 0.0], r"rewards\[0\] must be a finite number"),
        ("digests", [{}, "a", "b", "c"], r"digests\[0\] must be a string, got an object"),
        ("terminated", "yes", "field 'terminated' must be true or false, got a string"),
        ("seed", 1.5, "field 'seed' must be integer, got a number"),
        ("meta", [1], "field 'meta' must be object, got an array"),
    ],
)
def test_wrong_field_types_name_file_and_line(tmp_path, field, value, match):
    rec = episode().to_json()
    rec[field] = value
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(episode().to_json()) + "\n" + json.dumps(rec) + "\n")
    with pytest.raises(TrajectoryFormatError, match=rf"t\.jsonl:2: {match}"):
        load_trajectories(path)


def test_atomic_write_gives_new_files_the_umask_mode_and_keeps_an_old_files(tmp_path):
    old = os.umask(0o027)
    try:
        atomic_write_text(tmp_path / "new.txt", "x")
        assert (tmp_path / "new.txt").stat().st_mode & 0o777 == 0o640  # not mkstemp's private 0o600
        kept = tmp_path / "kept.txt"
        kept.write_text("old")
        kept.chmod(0o604)
        atomic_write_text(kept, "new")
        assert kept.stat().st_mode & 0o777 == 0o604 and kept.read_text() == "new"
    finally:
        os.umask(old)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the umask from /proc")
def test_the_umask_is_read_without_being_set(monkeypatch):
    from twice_envs import trajectory

    for mask in (0o027, 0o002):
        old = os.umask(mask)
        try:
            with monkeypatch.context() as m:
                # setting the umask, even for a moment, would race other threads' new files
                m.setattr(trajectory.os, "umask", lambda *_: pytest.fail("the umask was set"))
                assert trajectory.created_mode() == 0o666 & ~mask
                assert trajectory.created_mode(directory=True) == 0o777 & ~mask
        finally:
            os.umask(old)


def finished(seed=3) -> Trajectory:
    """A CoinChain episode that found its coin after 4 actions (terminated)."""
    env = twice_envs.make("CoinChain-v0")
    env.reset(seed=seed, options={"goal": 3})
    for a in ["look", "right", "right", "right"]:
        env.step(a)
    assert env.trajectory.terminated and env.trajectory.num_turns == 4
    return env.trajectory


@pytest.mark.parametrize(
    "field, edit",
    [
        ("observations[0]", lambda d: d["observations"].__setitem__(0, "Walk to the coin.\nYou are at 3.")),
        ("env_id", lambda d: d.update(env_id="CoinChainReplayOnly-v0")),
        ("env_version", lambda d: d.update(env_version="2")),
        ("kwargs", lambda d: d.update(kwargs={"length": 6})),
        ("seed", lambda d: d.update(seed=d["seed"] + 1)),
        ("options", lambda d: d.update(options={"goal": 4})),
    ],
)
def test_an_edited_reset_field_breaks_the_chain_before_any_env_runs(field, edit):
    data = finished().to_json()
    edit(data)
    record = Trajectory.from_json(data)
    with pytest.raises(BrokenChain, match=rf"broken at turn 0: digests\[0\] is .*{re.escape(field)}") as err:
        record.check_chain()
    assert err.value.turn == 0 and err.value.expected == data["digests"][0]
    assert "the record was edited after it was written" in str(err.value)
    with pytest.raises(BrokenChain):
        twice_envs.replay(data)
    assert isinstance(twice_envs.first_divergence(data), BrokenChain)


def test_a_branch_past_the_end_of_a_finished_episode_is_refused():
    data = finished().to_json()
    data["noise"]["branches"] = {"3": 1}  # turn 3 is the last action's noise: inside
    assert twice_envs.first_divergence(data) is None
    for turn in ("4", "99"):
        data["noise"]["branches"] = {turn: 1}
        problem = rf"field 'noise.branches\[\"{turn}\"\]' names turn {turn}, past the episode's end \(it ended " \
                  r"after 4 actions, so its branch turns are 0..3\)"
        with pytest.raises(TrajectoryFormatError, match=problem):
            Trajectory.from_json(data)
        with pytest.raises(TrajectoryFormatError, match=problem):
            twice_envs.first_divergence(data)
    # a running episode may hold a later branch (a fork taken before a twin's turn), up to max_turns
    running = finished().prefix(2).to_json()
    running["noise"]["branches"] = {"3": 2}
    assert twice_envs.first_divergence(running) is None
    running["noise"]["branches"] = {"12": 2}  # CoinChain's max_turns is 12: turns 0..11
    divergence = twice_envs.first_divergence(running)
    assert divergence.field == "noise.branches" and "names turn 12, past the end of any episode" in str(divergence)


#: Per record field, edits of it: (name, edit). Each must give an error naming the field, or be
#: reported as what it is (a branch added: a twin), or be a field no replay checks (meta).
FIELD_EDITS = {
    "format": [("other", lambda d, r: d.update(format="twice_envs.trajectory/2")),
               ("gone", lambda d, r: d.pop("format"))],
    "env_id": [("other", lambda d, r: d.update(env_id="CoinChainReplayOnly-v0")),
               ("unknown", lambda d, r: d.update(env_id="Nope-v0")), ("number", lambda d, r: d.update(env_id=7))],
    "env_version": [("other", lambda d, r: d.update(env_version="0")),
                    ("null", lambda d, r: d.update(env_version=None))],
    "kwargs": [("added", lambda d, r: d["kwargs"].update(length=7)), ("array", lambda d, r: d.update(kwargs=[]))],
    "seed": [("other", lambda d, r: d.update(seed=d["seed"] + r.randrange(1, 1000))),
             ("text", lambda d, r: d.update(seed=str(d["seed"])))],
    "options": [("other", lambda d, r: d["options"].update(goal=r.choice([1, 2, 4, 5]))),
                ("null", lambda d, r: d.update(options=None))],
    "noise.episode_seed": [("other", lambda d, r: d["noise"].update(episode_seed=r.randrange(2**64))),
                           ("negative", lambda d, r: d["noise"].update(episode_seed=-1))],
    "noise.branches": [("past the end", lambda d, r: d["noise"].update(branches={"12": 1})),  # max_turns is 12
                       ("zero branch", lambda d, r: d["noise"].update(branches={"0": 0}))],
    "actions": [("one", lambda d, r: _flip(d["actions"], r)), ("dropped", lambda d, r: d["actions"].pop()),
                ("number", lambda d, r: d["actions"].__setitem__(0, 1))],
    "observations": [("one", lambda d, r: _flip(d["observations"], r)),
                     ("first", lambda d, r: _flip(d["observations"], r, 0))],
    "rewards": [("one", lambda d, r: d["rewards"].__setitem__(r.randrange(len(d["rewards"])), 0.5)),
                ("nan", lambda d, r: d["rewards"].__setitem__(0, float("nan")))],
    "digests": [("one", lambda d, r: _flip(d["digests"], r)), ("first", lambda d, r: _flip(d["digests"], r, 0))],
    "terminated": [("flipped", lambda d, r: d.update(terminated=not d["terminated"])),
                   ("text", lambda d, r: d.update(terminated="yes"))],
    "truncated": [("flipped", lambda d, r: d.update(truncated=not d["truncated"]))],
}


def _flip(values: list, rng, i=None) -> None:
    """Change one character of one string of ``values`` (of ``values[i]``)."""
    i = rng.randrange(len(values)) if i is None else i
    text = values[i]
    k = rng.randrange(len(text))
    values[i] = text[:k] + ("X" if text[k] != "X" else "Y") + text[k + 1:]


@pytest.mark.parametrize("seed", range(3))
def test_every_record_field_edited_gives_a_named_error_and_an_unedited_record_replays_identically(seed):
    rng = random.Random(seed)
    base = finished(3 + seed).to_json() if seed != 1 else finished(3).prefix(2).to_json()  # finished and running
    rebuilt = twice_envs.replay(json.loads(json.dumps(base)))
    assert rebuilt.trajectory.to_json() == base and twice_envs.first_divergence(base) is None
    for field, edits in FIELD_EDITS.items():
        for name, edit in edits:
            data = json.loads(json.dumps(base))
            edit(data, rng)
            what = f"{field} edited ({name}, seed {seed})"
            try:
                error = twice_envs.first_divergence(data)
            except TrajectoryFormatError as exc:
                error = exc
            # the message names the field (a chain error names the fields its broken digest covers)
            assert error is not None, f"{what}: the record replays exactly"
            assert field in str(error), f"{what}: {error}"
    # a branch added inside the episode makes a twin's record, and says so; meta is the caller's, unchecked
    data = json.loads(json.dumps(base))
    data["noise"]["branches"] = {"0": 1}
    data["noise"]["episode_seed"] ^= 1
    assert twice_envs.first_divergence(data) is None and noise_kind(Trajectory.from_json(data)) == "independent twin"
    data = json.loads(json.dumps(base))
    data["meta"] = {"note": "anything"}
    assert twice_envs.first_divergence(data) is None
