"""The section runner: a section past its budget is stopped, one that raises is an ERROR, and the
section's status is its worst check's."""

from __future__ import annotations

import time

from twice_envs.agents.gpu_check.report import run_section, worst


def test_a_section_past_its_budget_is_stopped_and_the_next_runs():
    def slow(sec, deadline):
        time.sleep(5)

    t0 = time.monotonic()
    sec = run_section("x", "slow", slow, 0.2, hard=True, grace=0.2)
    assert time.monotonic() - t0 < 3
    assert sec["status"] == "FAIL" and "time budget" in sec["error"]

    def broken(sec, deadline):
        raise RuntimeError("boom")

    sec = run_section("y", "broken", broken, 5)
    assert sec["status"] == "ERROR" and "boom" in sec["error"]


def test_worst_status():
    assert worst(["PASS", "INFO", "FAIL"]) == "FAIL"
    assert worst(["FAIL", "ERROR"]) == "ERROR"
    assert worst(["INFO", "PASS"]) == "PASS"
    assert worst(["SKIP", "INFO"]) == "INFO"
    assert worst([]) == "SKIP"
