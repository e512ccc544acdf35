"""Section (d): the step rate read from the build's step lines; a build past its time is killed."""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from twice_envs.agents.gpu_check.build import run_build, step_rate  # noqa: E402
from twice_envs.agents.gpu_check.report import run_section  # noqa: E402


def test_step_rate():
    rate = step_rate([(10.0, 1), (20.0, 26), (30.0, 50)])
    assert rate["steps_per_s"] == round(49 / 20, 3) and rate["last_stretch_steps_per_s"] == round(24 / 10, 3)
    assert step_rate([(1.0, 1)]) is None


def _stepper(pid_file) -> list:
    code = (f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
            "for i in range(1, 1000):\n"
            "    print(f'[build-tiny] step {i}/999 loss 1.0', flush=True)\n"
            "    time.sleep(0.1)\n")
    return [sys.executable, "-c", code]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_build_past_its_timeout_is_killed(tmp_path):
    res = run_build(_stepper(tmp_path / "pid"), dict(os.environ), 2.0, cwd=tmp_path)
    assert res["timed_out"] and res["rc"] != 0
    assert res["stamps"] and [s for _, s in res["stamps"]] == list(range(1, len(res["stamps"]) + 1))
    assert _gone(int((tmp_path / "pid").read_text()))


def test_a_stopped_section_stops_its_build(tmp_path):
    sec = run_section("d", "build", lambda s, dl: run_build(_stepper(tmp_path / "pid"), dict(os.environ), 60,
                                                          cwd=tmp_path), 1.0, hard=True, grace=0.5)
    assert sec["status"] == "FAIL" and "time budget" in sec["error"]
    assert _gone(int((tmp_path / "pid").read_text()))
