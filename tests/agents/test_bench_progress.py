"""Every ``twice bench`` command follows the progress rule: a ``--no-progress`` flag, lines on a
terminal only, and the learning benches' runs counted with the time left."""

import importlib

import pytest

from tests.test_progress import default_rule  # noqa: F401  (the progress rule reset around each test)
from twice_envs import progress
from twice_envs.agents.bench import learn
from twice_envs.agents.bench.output import stderr_log
from twice_envs.cli import BENCHES

@pytest.mark.parametrize("name", sorted(BENCHES))
def test_every_bench_takes_no_progress(name, capsys):
    module, func = BENCHES[name].split(":")
    try:
        main = getattr(importlib.import_module(module), func)
    except ImportError as exc:  # a bench of an optional extra this installation lacks
        pytest.skip(f"{name}: {exc}")
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    assert "--no-progress" in capsys.readouterr().out


def test_bench_log_lines_follow_the_progress_rule(capsys):
    progress.set_enabled(False)
    stderr_log("learn")("tuning 4 methods")
    assert capsys.readouterr().err == ""
    progress.set_enabled(True)
    stderr_log("learn")("tuning 4 methods")
    assert "[bench learn" in capsys.readouterr().err


def test_training_runs_are_counted_with_the_time_left(monkeypatch, capsys):
    monkeypatch.setattr(learn, "_train", lambda run: run)
    progress.set_enabled(True)
    assert learn.train_many([1, 2, 3], jobs=1, what="tuning runs") == [1, 2, 3]
    err = capsys.readouterr().err
    assert "tuning runs: 3/3 runs (100%)" in err and err.endswith("\n")
    progress.set_enabled(False)
    assert learn.train_many([4, 5], jobs=1) == [4, 5]
    assert capsys.readouterr().err == ""
