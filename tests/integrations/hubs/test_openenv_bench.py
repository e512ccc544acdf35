"""``twice bench serve`` on 127.0.0.1, small: load, killed clients, a restart, errors, in one bounded run."""

import pytest

pytest.importorskip("openenv")

from twice_envs.integrations.openenv import bench  # noqa: E402


def test_a_small_run_reports_identical_digests_no_leaked_slots_restores_and_no_errors(capsys):
    rc = bench.main(["--env", "SearchToy-v0", "--sessions", "4", "--steps", "5", "--kill", "2",
                     "--idle-timeout", "0.5", "--no-progress"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("| env | sessions | steps |") and len(lines) == 3
    row = [cell.strip() for cell in lines[2].strip("|").split("|")]
    assert row[:3] == ["SearchToy-v0", "4", "20"]
    assert row[11:] == ["yes", "0", "2/2", "0"]  # same digests, leaked slots, restored, errors
    assert rc == 0


def test_bad_settings_are_named():
    with pytest.raises(bench.BenchError, match="--env 'Nope-v0' has no scripted episode"):
        bench.main(["--env", "Nope-v0"])
    with pytest.raises(bench.BenchError, match="--kill must be in 1..4, got 5"):
        bench.main(["--sessions", "4", "--kill", "5"])
