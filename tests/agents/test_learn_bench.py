"""``twice bench learn``'s step sizes: each method tuned on its own, picks at the grid's edge widened,
a grid of one value refused, the JSON's fields, and the wording at one shared step size.

Most tests replace :func:`train_one` by a hand-made learner whose exact-value curve depends on the
method and the step size in a known way, so the picks are known in advance and nothing trains."""

import json
import math

import numpy as np
import pytest

from twice_envs.agents.bench import learn, tuning

#: The step size at which each hand-made method learns fastest.
BEST = {"grpo": 4.0, "twice": 1.0, "crr": 64.0}


def fake_train_one(calls: list):
    """A learner whose curve rises fastest at ``BEST[method]`` (a bell in log2 lr), a little slower on
    odd seeds; it records every call."""

    def train_one(method, seed, config, *, lr=None, twice_config=None):
        lr = config.lr if lr is None else lr
        calls.append((method, seed, lr))
        rate = 0.3 * math.exp(-(math.log2(lr) - math.log2(BEST[method])) ** 2 / 4) * (1 - 0.05 * (seed % 2))
        values = [0.5 + 0.5 * (1 - math.exp(-rate * u)) for u in range(config.updates + 1)]
        n = config.updates
        return learn.RunTrace(values, [0] * n, [10] * n, [0.0] * n, [False] * n, [7.0] * n, [0.0] * n)

    return train_one


def test_each_method_is_reported_at_its_own_best_step_size_on_seeds_it_was_not_tuned_on(monkeypatch, tmp_path):
    """Break: picking one step size for every method (the best of grpo) -> twice's lr is 4, not 1."""
    calls = []
    monkeypatch.setattr(learn, "train_one", fake_train_one(calls))
    cfg = learn.LearnConfig(methods=("grpo", "twice"), lr_grid=(0.25, 1, 4, 16), tune_seeds=2, seeds=3, updates=6)
    res = learn.run_learn(cfg)
    assert {m: r["lr"] for m, r in res["methods"].items()} == {"grpo": 4.0, "twice": 1.0}
    assert res["step_sizes"]["chosen"] == {"grpo": 4.0, "twice": 1.0}
    tune = set(tuning.tuning_seeds(0, 2))
    report = [c for c in calls if c[1] not in tune]
    assert {c[1] for c in calls} - tune == {0, 1, 2}  # reporting seeds, apart from the tuning ones
    assert sorted(report) == sorted([(m, s, BEST[m]) for m in ("grpo", "twice") for s in range(3)])
    assert {(m, lr) for m, s, lr in calls if s in tune} == {(m, lr) for m in ("grpo", "twice") for lr in cfg.lr_grid}
    # the written JSON holds the grid, the rule, the seeds, each pick and its scores
    doc = json.loads(learn.write_learn(res, tmp_path)["json"].read_text())
    st = doc["step_sizes"]
    assert st["mode"] == "tuned" and st["grid"] == [0.25, 1.0, 4.0, 16.0] and "highest mean area" in st["rule"]
    assert st["tune_seeds"] == sorted(tune) and st["reporting_seeds"] == [0, 1, 2]
    t = doc["methods"]["twice"]["tuning"]
    assert t["lr"] == 1.0 and t["edge_of_grid"] is None and t["widened"] == []
    assert max(t["mean_area"], key=t["mean_area"].get) == "1"
    # the headline area: the trapezoid mean of the reported curves, with its paired difference from GRPO's
    twice = doc["methods"]["twice"]
    assert twice["area"]["value"] == pytest.approx(np.mean([tuning.area(c) for c in
                                                            [fake_curve("twice", s, 1.0, 6) for s in range(3)]]))
    d = twice["vs_grpo"]["area"]
    assert d["n"] == 3 and d["ci"][0] <= d["mean"] <= d["ci"][1] and "significant" in d
    assert doc["threshold"]["rule"].startswith("GRPO's final mean V(s0) at its lr 4")
    assert "updates_to_target" in twice["vs_grpo"] and "area_seeds" in twice
    text = learn.format_learn(res)
    assert "each method at its own, tuned on lr grid 0.25, 1, 4, 16" in text and "shared" not in text


def fake_curve(method, seed, lr, updates):
    calls = []
    return fake_train_one(calls)(method, seed, learn.LearnConfig(updates=updates), lr=lr).values


def test_a_pick_at_the_edge_of_the_grid_is_flagged_and_the_grid_widened(monkeypatch):
    """Break: no widening (next_step_size returns None) -> crr's pick stays at 16, at the edge."""
    monkeypatch.setattr(learn, "train_one", fake_train_one([]))
    cfg = learn.LearnConfig(methods=("grpo", "crr"), lr_grid=(1, 4, 16), tune_seeds=1, seeds=2, updates=4,
                            max_widen=3)
    res = learn.run_learn(cfg)
    t = res["methods"]["crr"]["tuning"]
    assert t["edge_of_grid"] == "high" and t["widened"] == [64.0, 256.0] and t["lr"] == 64.0 and t["at_edge"] is None
    assert res["methods"]["grpo"]["tuning"]["widened"] == []
    text = learn.format_learn(res)
    assert ("edge: crr: lr 64; the pick on the given grid sat at its high end, so the grid was widened by 64, 256"
            in text)
    # bounded: one step beyond the grid at most, the pick stays at the edge and says so
    res = learn.run_learn(learn.LearnConfig(methods=("grpo", "crr"), lr_grid=(1, 4, 16), tune_seeds=1, seeds=2,
                                            updates=4, max_widen=1))
    t = res["methods"]["crr"]["tuning"]
    assert t["widened"] == [64.0] and t["at_edge"] == "high"
    assert "still at the high end of the widened grid" in learn.format_learn(res)


def test_a_grid_of_one_value_is_refused_before_anything_runs(monkeypatch, capsys):
    """Break: accepting a one-value grid in check_grid -> no error is raised."""
    calls = []
    monkeypatch.setattr(learn, "train_one", fake_train_one(calls))
    with pytest.raises(ValueError, match="lr_grid needs two step sizes or more"):
        learn.LearnConfig(lr_grid=(4.0,))
    with pytest.raises(ValueError, match="lr_grid needs two step sizes or more"):
        learn.LearnConfig(lr_grid=(4.0, 4.0))
    for bad, says in ((["--lr-grid", "4"], "--lr-grid needs two step sizes or more"),
                      (["--lr-grid", "1,x"], "--lr-grid must be comma-separated numbers"),
                      (["--lr-grid", "0,1"], "--lr-grid: every step size must be a finite number above 0"),
                      (["--lr", "1", "--lr-grid", "1,2"], "not allowed with argument")):
        with pytest.raises(SystemExit):
            learn.main(bad + ["--methods", "grpo", "twice"])
        assert says in capsys.readouterr().err
    assert calls == []


def test_one_shared_step_size_is_said_and_no_difference_is_called_a_win(monkeypatch):
    """Break: printing the tuned header in shared mode -> "one shared lr=2" is missing."""
    monkeypatch.setattr(learn, "train_one", fake_train_one([]))
    res = learn.run_learn(learn.LearnConfig(methods=("grpo", "twice"), lr_grid=(), lr=2.0, seeds=2, updates=4))
    assert res["step_sizes"]["mode"] == "shared" and res["step_sizes"]["tune_seeds"] == []
    assert all(r["lr"] == 2.0 and r["tuning"] is None for r in res["methods"].values())
    text = learn.format_learn(res)
    assert "one shared lr=2 for every method, not tuned" in text and "none is a method's win" in text
    assert "tuned on lr grid" not in text and "tuning:" not in text


def test_a_fixed_threshold_replaces_grpo_s_final_value(monkeypatch):
    monkeypatch.setattr(learn, "train_one", fake_train_one([]))
    res = learn.run_learn(learn.LearnConfig(methods=("grpo", "twice"), lr_grid=(), seeds=2, updates=8,
                                            threshold=0.6))
    assert res["threshold"] == {"value": 0.6, "rule": "a fixed V(s0)"}
    curve = np.array(res["methods"]["twice"]["curve"])
    assert res["methods"]["twice"]["updates_to_target"] == int(np.flatnonzero(curve >= 0.6)[0])

