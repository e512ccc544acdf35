"""``twice bench coupling`` (agents/bench/coupling.py, coupling_probe.py, coupling_report.py) on tiny sizes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from twice_envs.agents.bench import coupling, coupling_probe as probe
from twice_envs.agents.bench.coupling_report import format_coupling, worth_cell
from twice_envs.agents.lab.choice_lab import ChoiceLabSetting, choice_lab_policy
from twice_envs.cli import BENCHES

TINY = ChoiceLabSetting(world=coupling.QUICK_WORLD)


def test_exact_gradient_matches_finite_differences():
    rng = np.random.default_rng(0)
    policy = choice_lab_policy(TINY).with_logits(rng.normal(0, 1.0, TINY.world.attributes))
    g = probe.exact_gradient(policy)
    eps = 1e-6
    def value(w):
        return policy.with_logits(w).value

    fd = np.array([(value(policy.logits + eps * e) - value(policy.logits - eps * e)) / (2 * eps)
                   for e in np.eye(len(g))])
    assert np.abs(fd).max() > 1e-3
    np.testing.assert_allclose(g, fd, atol=1e-7)


def test_exact_advantage_batches_average_to_the_exact_gradient():
    policy = choice_lab_policy(TINY)
    grads = probe.sampled_gradients("exact-advantage", TINY, beta=0.7, batches=40, warmup=0, groups=8, group_size=3)
    mean = grads.mean(axis=0)
    exact = probe.exact_gradient(policy)
    assert mean @ exact / np.linalg.norm(mean) / np.linalg.norm(exact) > 0.95


def test_gradient_figures_cosine_and_error():
    exact = np.array([1.0, 2.0, 0.0])
    same = probe.gradient_figures(np.array([exact, 3 * exact]), exact)
    assert same["cosine"]["value"] == pytest.approx(1.0) and same["error"]["value"] == pytest.approx(0.2)
    against = probe.gradient_figures(np.array([-exact, -exact]), exact)
    assert against["cosine"]["value"] == pytest.approx(-1.0) and against["error"]["value"] == pytest.approx(1.0)


def test_wrong_sign_counts_every_nonzero_advantage_and_never_zero_credit():
    oracle = np.array([0.01, -0.01, 0.01, -0.01, 0.0])
    coupled = np.array([0.5, 0.0, 0.5, -0.5, -1.0])  # one zero credit (not wrong), A* = 0 not counted
    independent = np.array([0.5, 0.5, -0.5, -0.5, 1.0])  # two of four wrong
    idx = [np.arange(5)] * 3
    f = probe.wrong_sign_figures(coupled, independent, oracle, idx)
    assert f["wrong_sign_coupled"]["value"] == 0.0
    assert f["wrong_sign_independent"]["value"] == 0.5
    assert f["wrong_sign_ratio"]["value"] == 0.0
    assert f["zero_credit_coupled"]["value"] == pytest.approx(0.2)


def test_pair_audit_coupled_twins_at_shuffle_zero_are_never_wrong_signed():
    a = probe.pair_audit(ChoiceLabSetting(world=TINY.world, shuffle=0.0), 4, n_boot=50)
    assert a["wrong_sign_coupled"]["value"] == 0.0
    assert a["wrong_sign_independent"]["value"] > 0.05
    assert a["rho_bar"]["value"] > 0.5


def test_budget_for_area_interpolates_in_log_budget_and_bounds_outside():
    budgets, areas = (0.5, 1.0, 2.0, 4.0), (0.1, 0.2, 0.3, 0.4)
    assert coupling.budget_for_area(budgets, areas, 0.25) == pytest.approx(np.sqrt(2))
    assert coupling.budget_for_area(budgets, areas, 0.2) == pytest.approx(1.0)
    assert coupling.budget_for_area(budgets, areas, 0.05) == float("-inf")
    assert coupling.budget_for_area(budgets, areas, 0.45) == float("inf")
    # a dip is read on the running maximum (0.3 at budget 2, not 0.2): 0.35 lies halfway from 0.3 to 0.4
    assert coupling.budget_for_area(budgets, (0.1, 0.3, 0.2, 0.4), 0.35) == pytest.approx(2 * np.sqrt(2))
    assert coupling.area_at_budget(budgets, areas, 2 * np.sqrt(2)) == pytest.approx(0.35)


def test_exchange_rate_reports_bounds_not_extrapolations():
    independent = {1.0: [0.50, 0.52, 0.51], 2.0: [0.55, 0.56, 0.57]}
    draws = [np.array([0, 1, 2]), np.array([0, 0, 1]), np.array([2, 2, 1])]
    w = coupling.exchange_rate([0.70, 0.71, 0.72], independent, draws)
    assert w["value"] == w["lo"] == w["hi"] == float("inf")
    assert worth_cell(w) == ">2 [>2, >2]"
    inside = coupling.exchange_rate([0.535, 0.54, 0.545], independent, draws)
    assert 1.0 < inside["value"] < 2.0


def test_rho_range_out_of_reach_is_refused_with_the_range_reached():
    coupling.check_rho_range([0.23, 0.5, 0.95], (0.25, 0.9))
    with pytest.raises(coupling.RhoRangeError, match=r"reached \[0.230, 0.950\]"):
        coupling.check_rho_range([0.23, 0.5, 0.95], (0.05, 0.99))


@pytest.mark.parametrize("kwargs, match", [({"lr_grid": (8.0,)}, "lr_grid needs two step sizes"),
                                           ({"budgets": (2.0, 4.0)}, "including 1"),
                                           ({"shuffles": (0.0, 1.5)}, r"\[0, 1\]"),
                                           ({"rho_range": (0.9, 0.1)}, "rho_range")])
def test_config_refuses_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        coupling.quick_config(**kwargs)


def test_cli_refuses_unreachable_range_before_learning(tmp_path, capsys):
    assert BENCHES["coupling"] == "twice_envs.agents.bench.coupling:main"
    with pytest.raises(SystemExit) as exc:
        coupling.main(["--quick", "--rho-range", "0.05", "0.99", "--out", str(tmp_path), "--no-progress"])
    assert exc.value.code == 2
    assert "reached [" in capsys.readouterr().err
    assert not (tmp_path / "runs.jsonl").exists()


def test_cli_refuses_a_grid_of_one_step_size(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        coupling.main(["--quick", "--lr-grid", "8", "--out", str(tmp_path)])
    assert exc.value.code == 2 and "two step sizes" in capsys.readouterr().err


def test_quick_run_writes_the_curve_and_resumes_from_kept_runs(tmp_path, monkeypatch):
    cfg = coupling.quick_config()
    res = coupling.run_coupling(cfg, out_dir=tmp_path)
    assert [p["shuffle"] for p in res["points"]] == [0.0, 1.0]
    assert set(res["arms"]) == {"twice@0", "twice@1", "independent x1", "independent x2", "crr"}
    for p in res["points"]:
        assert len(res["arms"][f"twice@{p['shuffle']:g}"]["areas"]) == cfg.seeds
        assert p["gain"]["n"] == cfg.seeds and {"value", "lo", "hi"} <= set(p["worth_measured"])
    paths = coupling.write_coupling(res, tmp_path)
    assert json.loads(paths["json"].read_text())["knob"] == "shuffle" and paths["png"].stat().st_size > 0
    assert "worth measured" in format_coupling(res)

    def no_training(*a, **k):
        raise AssertionError("a kept run was trained again")

    monkeypatch.setattr(coupling.learn, "train_one", no_training)
    again = coupling.run_coupling(cfg, out_dir=tmp_path)
    assert [p["gain"]["mean"] for p in again["points"]] == [p["gain"]["mean"] for p in res["points"]]
