"""Trajectory records: JSON lines round trip, atomic writes, clear errors on bad files."""

from __future__ import annotations

import json
import os

import pytest

import twice_envs
from tests import toy_envs  # noqa: F401
from twice_envs import TrajectoryFormatError
from twice_envs.trajectory import (
    atomic_write_text,
    load_trajectories,
    save_trajectories,
)


def episode(seed=0):
    env = twice_envs.make("CoinChain-v0")
    env.reset(seed=seed)
    for a in ["look", "right", "🙂"]:
        env.step(a)
    return env.trajectory


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
