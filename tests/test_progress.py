"""The shared progress line: shown only on a terminal, off under --no-progress, with done/total and time left."""

import argparse
import io

import pytest

from twice_envs import progress
from twice_envs.progress import Progress, track


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture(autouse=True)
def default_rule(monkeypatch):
    monkeypatch.delenv("TWICE_PROGRESS", raising=False)
    progress.set_enabled(None)
    yield
    progress.set_enabled(None)


def test_a_terminal_sees_done_of_total_and_time_left_and_a_final_newline():
    out = Terminal()
    with Progress("lab audit", 4, unit="tasks", stream=out, every_s=0) as bar:
        bar.update()
        assert "lab audit: 1/4 tasks (25%)" in out.getvalue() and "left" in out.getvalue()
        bar.update(3)
    text = out.getvalue()
    assert text.endswith("\n") and "4/4 tasks (100%)" in text.splitlines()[-1].split("\r")[-1]
    assert "left" not in text.split("\r")[-1]


def test_a_pipe_a_forced_off_and_the_environment_switch_see_nothing(monkeypatch):
    pipe = io.StringIO()
    with Progress("x", 3, stream=pipe, every_s=0) as bar:
        bar.update(3)
    assert pipe.getvalue() == ""
    out = Terminal()
    progress.set_enabled(False)
    with Progress("x", 3, stream=out, every_s=0) as bar:
        bar.update(3)
    assert out.getvalue() == ""
    progress.set_enabled(None)
    monkeypatch.setenv("TWICE_PROGRESS", "0")
    assert not progress.enabled(Terminal())


def test_the_no_progress_flag_turns_it_off():
    p = argparse.ArgumentParser()
    progress.add_argument(p)
    assert progress.apply(p.parse_args(["--no-progress"])) is False
    assert not progress.enabled(Terminal())


def test_redraws_are_throttled_and_track_counts_each_item():
    out = Terminal()
    bar = Progress("x", 1000, stream=out, every_s=3600)
    for _ in range(999):
        bar.update()
    assert out.getvalue().count("\r") == 1  # the first update only; the rest fall inside every_s
    bar.update()
    assert out.getvalue().count("\r") == 2  # the last unit always draws
    assert list(track([1, 2, 3], "t", show=False)) == [1, 2, 3]
    with pytest.raises(ValueError, match="total must be >= 0"):
        Progress("x", -1)


def test_an_unknown_total_shows_the_count_only():
    bar = Progress("x", None, unit="rows", show=False)
    bar.update(5)
    assert bar.line().startswith("x: 5 rows,") and "left" not in bar.line()
