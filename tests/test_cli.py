"""The `twice` CLI, driven as a person would: piped keystrokes, saved files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.test_trajectory import rechained
from twice_envs.files import write_record_lines

ROOT = Path(__file__).resolve().parents[1]


def saved(path: Path) -> dict:
    """The one record of a saved file (its first line is the header counting the records)."""
    head, line = path.read_text().splitlines()
    assert json.loads(head) == {"format": "twice_envs.records/1", "records": 1}
    return json.loads(line)


def twice(*args, stdin="", cwd=ROOT):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "twice_envs.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


def test_help_and_unknown_command():
    out = twice("--help")
    assert out.returncode == 0 and "play" in out.stdout and "replay" in out.stdout
    out = twice("pley")
    assert out.returncode == 2 and "Did you mean 'play'" in out.stderr


def test_envs_lists_ids():
    out = twice("envs")
    assert out.returncode == 0
    for env_id in ("SearchQA-v0", "WebShop-v0", "ALFWorld-v0"):
        line = next(l for l in out.stdout.splitlines() if l.startswith(env_id + " "))
        assert len(line.split(None, 1)) == 2  # id and a description


def test_play_fork_undo_save_then_replay(tmp_path):
    save = tmp_path / "ep.jsonl"
    keys = "\n".join(
        [
            "look",
            "right",
            "dance",  # invalid: an observation, not a crash
            ":undo",
            ":fork 1",
            "right",
            ":actions",
            f":save {save}",
            ":fork 9",
            ":quit",
        ]
    )
    out = twice("play", "tests.toy_envs:CoinChain-v0", "--seed", "4", "--option", "goal=5", stdin=keys + "\n")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "(invalid action)" in text
    assert "--- turn 2 ---" in text  # after :undo of the invalid third action
    assert "cannot fork: fork(9) is outside this episode" in text
    assert "saved 2 turns" in text
    rec = saved(save)
    assert rec["actions"] == ["look", "right"] and rec["options"] == {"goal": 5}

    out = twice("replay", str(save), "--import", "tests.toy_envs", "--show")
    assert out.returncode == 0, out.stderr
    assert "replays exactly" in out.stdout and "> right" in out.stdout


def test_replay_reports_first_divergence(tmp_path):
    save = tmp_path / "ep.jsonl"
    out = twice("play", "tests.toy_envs:CoinChain-v0", "--seed", "1", stdin=f"look\nlook\nlook\n:save {save}\n")
    assert out.returncode == 0, out.stderr
    rec = saved(save)
    rec["observations"][2] = "You are somewhere else."
    write_record_lines(save, [json.dumps(rec)])
    out = twice("replay", str(save), "--import", "tests.toy_envs")
    assert out.returncode == 1
    assert "DIVERGED at turn 2" in out.stdout and "recorded: 'You are somewhere else.'" in out.stdout


def test_replay_of_corrupt_file_is_one_clear_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format": "twice_envs.trajectory/1", "env_id": "CoinChain-v0"\n')
    out = twice("replay", str(bad))
    assert out.returncode == 1
    assert "bad.jsonl:1: not valid JSON" in out.stdout
    assert "Traceback" not in out.stderr


def test_check_command():
    out = twice("check", "tests.toy_envs:CoinChain-v0", "--episodes", "1")
    assert out.returncode == 0, out.stderr
    assert "checks passed" in out.stdout


def test_bench_unknown_name():
    out = twice("bench", "nosie")
    assert out.returncode == 2 and "Did you mean 'noise'" in out.stderr


def test_replay_goes_on_past_bad_records(tmp_path):
    save = tmp_path / "ep.jsonl"
    out = twice("play", "tests.toy_envs:CoinChain-v0", "--seed", "1", stdin=f"look\nright\n:save {save}\n")
    assert out.returncode == 0, out.stderr
    good = json.dumps(saved(save))
    unknown = json.loads(good)
    unknown["env_id"] = "NoSuchEnv-v0"
    unknown["digests"] = rechained(unknown)  # a record of an env this process does not register
    wrong_type = json.loads(good)
    wrong_type["rewards"][0] = "one"
    lines = [good, "{not json", json.dumps(unknown), json.dumps(wrong_type), good]
    write_record_lines(save, lines)  # line 1 is the header, so episode i is on line i + 1
    out = twice("replay", str(save), "--import", "tests.toy_envs")
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    text = out.stdout
    assert text.count(": replays exactly") == 2  # episodes 1 and 5
    assert "episode 2: UNREADABLE" in text and "ep.jsonl:3: not valid JSON" in text
    assert "episode 3 (NoSuchEnv-v0, seed 1): FAILED" in text
    assert "episode 4: UNREADABLE" in text and "ep.jsonl:5: rewards[0] must be a finite number" in text
    assert "episode 5 (CoinChain-v0, seed 1): 2 turns" in text
    assert "2/5 episodes replay exactly" in text


def test_play_save_to_unwritable_path_keeps_the_session(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file, so no folder can be made under it")
    save = tmp_path / "ep.jsonl"
    keys = f"look\n:save {blocker}/sub/ep.jsonl\nright\n:save {save}\n"
    out = twice("play", "tests.toy_envs:CoinChain-v0", "--seed", "1", stdin=keys)
    assert out.returncode == 0, out.stderr
    assert f"cannot save to {blocker}/sub/ep.jsonl" in out.stdout
    assert "saved 2 turns" in out.stdout  # the session went on after the failed save
    assert saved(save)["actions"] == ["look", "right"]


def test_play_saves_a_latin1_byte_exactly(tmp_path):
    save = tmp_path / "ep.jsonl"
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONIOENCODING"] = "utf-8"  # strict UTF-8 stdin, as on most terminals
    keys = b"caf\xe9\n:save " + str(save).encode() + b"\n"
    out = subprocess.run(
        [sys.executable, "-m", "twice_envs.cli", "play", "tests.toy_envs:CoinChain-v0"],
        input=keys, capture_output=True, cwd=ROOT, env=env, timeout=300,
    )
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    assert b"saved 1 turns" in out.stdout
    import twice_envs

    (rec,) = twice_envs.load_trajectories(save)
    assert rec.actions == ["caf\udce9"]
    rec.check_chain()


def test_replay_names_an_edited_task_a_cut_file_and_an_older_one(tmp_path):
    save = tmp_path / "ep.jsonl"
    out = twice("play", "tests.toy_envs:CoinChain-v0", "--seed", "1", stdin=f"look\n:save {save}\n")
    assert out.returncode == 0, out.stderr
    rec = saved(save)
    edited = dict(rec, observations=["Walk to the coin. It is at 5.", *rec["observations"][1:]])
    write_record_lines(save, [json.dumps(rec), json.dumps(edited)])
    out = twice("replay", str(save), "--import", "tests.toy_envs")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "episode 2 (CoinChain-v0, seed 1): DIVERGED at turn 0: the record's digest chain is broken" in out.stdout
    assert "1/2 episodes replay exactly" in out.stdout
    # cut at a line boundary: the header's count names what is missing
    head, first, _ = save.read_text().splitlines(keepends=True)
    save.write_text(head + first)
    out = twice("replay", str(save), "--import", "tests.toy_envs")
    assert out.returncode == 1
    assert f"FILE DAMAGED: {save}: cut short: its header counts 2 records, 1 found (1 missing)" in out.stdout
    # a file from before record files were counted still replays, with a note
    save.write_text(first)
    out = twice("replay", str(save), "--import", "tests.toy_envs")
    assert out.returncode == 0, out.stdout
    assert f"note: {save}: no header counting its records" in out.stdout and "1/1 episodes replay exactly" in out.stdout


def test_replay_says_which_records_are_twins(tmp_path):
    import twice_envs
    from tests import toy_envs  # noqa: F401
    from twice_envs.wrappers import twin

    env = twice_envs.make("CoinChain-v0")
    env.reset(seed=1)
    env.step("look")
    coupled = twin(env.fork(0), "right", env.noise_schedule, branch=2)
    independent = twin(env.fork(0), "right", 12345)
    save = tmp_path / "twins.jsonl"
    twice_envs.save_trajectories(save, [env.trajectory, coupled.trajectory, independent.trajectory])
    out = twice("replay", str(save), "--import", "tests.toy_envs")
    assert out.returncode == 0, out.stdout
    factual, coupled_line, independent_line = out.stdout.splitlines()[:3]
    assert factual.endswith("replays exactly")
    assert coupled_line.endswith(f"replays exactly (a coupled twin: branches {{'0': 2}}, noise seed "
                                 f"{env.noise_schedule.episode_seed})")
    assert independent_line.endswith("replays exactly (an independent twin: branches {'0': 1}, noise seed 12345, "
                                     "not its reset's: a fresh seed no replay can check)")
