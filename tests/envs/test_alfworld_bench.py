"""`twice bench alfworld --quick` runs end to end (a smoke test; it measures nothing asserted)."""

import json

import pytest


@pytest.mark.slow
def test_bench_quick(tmp_path, capsys):
    pytest.importorskip("alfworld")
    pytest.importorskip("fast_downward")
    from twice_envs.cli import main

    out_json = tmp_path / "fig.json"
    assert main(["bench", "alfworld", "--quick", "--seconds", "1", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "wrapper overhead" in out and "wrapper alone" in out and "fork(10)" in out and "2 worker processes" in out
    fig = json.loads(out_json.read_text())
    for key in ("step_ms_raw_plain", "step_ms_raw_same_engine", "step_ms_ours", "wrapper_alone_us", "fork_0_ms", "fork_10_ms",
                "load_fresh_s_plain", "steps_per_s_1_workers", "steps_per_s_2_workers"):
        assert fig[key] > 0
