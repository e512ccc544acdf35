"""`twice bench alfworld --quick` runs end to end; its figures are the ones it prints and hold together
(speed itself is not asserted)."""

import json
import re

import pytest


def _printed(text: str, pattern: str) -> list[float]:
    m = re.search(pattern, text)
    assert m, pattern
    return [float(g) for g in m.groups()]


@pytest.mark.slow
def test_bench_quick(tmp_path, capsys):
    pytest.importorskip("alfworld")
    pytest.importorskip("fast_downward")
    from twice_envs.cli import main

    out_json = tmp_path / "fig.json"
    assert main(["bench", "alfworld", "--quick", "--seconds", "1", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    fig = json.loads(out_json.read_text())
    for key in ("step_ms_raw_plain", "step_ms_raw_same_engine", "step_ms_ours", "wrapper_alone_us", "fork_0_ms", "fork_10_ms",
                "fork_12_ms", "load_fresh_s_plain", "steps_per_s_1_workers", "steps_per_s_2_workers"):
        assert fig[key] > 0, key
    # what was asked for: 2 repetitions, a 12-action episode, forks at 0, 10 and 12
    assert fig["reps"] == 2 and f"game {fig['game']}, 12 admissible non-winning actions, 2 runs" in out
    assert sorted(k for k in fig if k.startswith("fork_")) == ["fork_0_ms", "fork_10_ms", "fork_12_ms"]

    # derived figures are the quotients of the figures they compare
    assert fig["wrapper_overhead"] == pytest.approx(fig["step_ms_ours"] / fig["step_ms_raw_same_engine"] - 1, rel=1e-9)
    assert fig["speedup_vs_plain"] == pytest.approx(fig["step_ms_raw_plain"] / fig["step_ms_ours_run_average"], rel=1e-9)
    assert fig["wrapper_alone_share"] == pytest.approx(fig["wrapper_alone_us"] / 1e3 / fig["step_ms_raw_same_engine"],
                                                       rel=1e-9)
    # the mean of per-action bests is never above the best run's mean
    assert fig["step_ms_ours"] <= fig["step_ms_ours_run_average"]
    # every timed fork (3 lengths x 2 repetitions) reuses a pooled engine
    assert fig["engines_reused"] >= 6 and fig["engines_created"] >= 1

    # the printed lines show the saved figures
    raw, = _printed(out, r"step, raw ALFWorld \(same engine, lockstep, best per action\)\s+([\d.]+) ms")
    ours, overhead = _printed(out, r"step, ALFWorld-v0  \(same engine, lockstep, best per action\)\s+([\d.]+) ms\s+"
                                   r"wrapper overhead ([+-][\d.]+)%")
    assert (raw, ours) == (round(fig["step_ms_raw_same_engine"], 2), round(fig["step_ms_ours"], 2))
    assert overhead == round(100 * fig["wrapper_overhead"], 1)
    run_avg, speedup = _printed(out, r"step, ALFWorld-v0  \(best run average\)\s+([\d.]+) ms\s+([\d.]+)x faster")
    assert (run_avg, speedup) == (round(fig["step_ms_ours_run_average"], 2), round(fig["speedup_vs_plain"], 1))
    load, = _printed(out, r"load game fresh \(plain engine: new env, parse, translate, reset\):\s+([\d.]+) ms")
    assert load == round(fig["load_fresh_s_plain"] * 1e3, 1)
    for t in (0, 10, 12):
        ms, share = _printed(out, rf"fork\({t:2d}\) by replay on a pooled engine:\s+([\d.]+) ms\s+= ([\d.]+)x a fresh load")
        assert ms == round(fig[f"fork_{t}_ms"], 1)
        assert share == round(fig[f"fork_{t}_ms"] / 1e3 / fig["load_fresh_s_plain"], 2)
    created, reused = _printed(out, r"engine pool: (\d+) library copies created, (\d+) reuses")
    assert (created, reused) == (fig["engines_created"], fig["engines_reused"])
    for workers in (1, 2):
        sps, = _printed(out, rf"throughput, {workers} worker process(?:es)?:\s+([\d.]+) steps/s")
        assert sps == round(fig[f"steps_per_s_{workers}_workers"], 1)
