"""``twice bench ablations`` on tiny sizes: every figure per row and seed, and bad names refused."""

import json
from dataclasses import replace

import numpy as np
import pytest

from twice_envs.agents.bench import ablations, learn


def test_a_tiny_run_gives_every_figure_with_a_ci(tmp_path):
    cfg = ablations.AblationConfig(envs=("SearchToy-v0", "TextLab-v0"), rows=("full", "independent-twins", "star"),
                                   seeds=2, audit_groups=8, warmup_batches=1, updates=2, groups=4, lr_grid=())
    res = ablations.run_ablations(cfg)
    for env in cfg.envs:
        rows = res["envs"][env]
        assert set(rows) == {"full", "independent-twins", "star"}
        for figs in rows.values():
            assert set(figs) == set(ablations.FIGURES)
            for f in figs.values():
                assert len(f["seeds"]) == 2 and (not np.isfinite(f["value"]) or f["lo"] <= f["value"] <= f["hi"])
        # star shares full's noise layout, so its rho-bar per seed is the same measurement
        assert rows["star"]["rho_bar"]["seeds"] == rows["full"]["rho_bar"]["seeds"]
        assert rows["independent-twins"]["rho_bar"]["seeds"] != rows["full"]["rho_bar"]["seeds"]
    paths = ablations.write_ablations(res, tmp_path)
    assert json.loads(paths["json"].read_text())["envs"]["TextLab-v0"]["full"]["final_value"]["n"] == 2
    assert paths["png"].stat().st_size > 5000
    assert "rho-bar" in ablations.format_ablations(res)


def test_an_unknown_ablation_lists_the_ones_that_exist(capsys):
    with pytest.raises(ValueError, match="no-line-resync"):
        ablations.AblationConfig(rows=("full", "no-resync"))
    with pytest.raises(SystemExit):
        ablations.main(["--rows", "nope"])
    assert "choose from full, independent-twins" in capsys.readouterr().err


def test_every_published_row_is_an_ablation():
    assert set(ablations.TABLE3) <= set(ablations.ABLATIONS)
    assert len(ablations.TABLE3) == 11


def test_rev_scores_the_twin_credit_of_the_decisions_that_realised_a_pair():
    # four decisions: 0 wrong-signed, 1 a tie (zero is never wrong), 2 right, 3 wrong but no pair realised
    dec = {"a_hat": [-2.0, 0.0, 4.0, -1.0], "realised": [1, 2, 1, 0], "branched": [True, True, True, True]}
    oracle = np.array([0.5, -0.5, 0.3, 0.4])
    figs = ablations.twin_figures(dec, oracle, [0.0, 1.0, 1.0, 1.0], scales=True)
    assert figs["rev"] == pytest.approx(1 / 3)
    assert figs["sigma_batch"] == pytest.approx(np.sqrt(3) / 4)  # std of (0, 1, 1, 1)
    assert figs["sigma_rms"] == pytest.approx(np.sqrt((4 + 0 + 16 + 1) / 4))
    off = ablations.twin_figures(dec, oracle, [0.0, 1.0, 1.0, 1.0], scales=False)
    assert np.isnan(off["sigma_batch"]) and np.isnan(off["sigma_rms"]) and off["rev"] == figs["rev"]


def test_twin_credit_only_and_unweighted_rows_read_as_full_twice_on_rev():
    # as in the published table: neither the episode term nor positive weights change the twin credit's sign
    cfg = ablations.AblationConfig(envs=("SearchToy-v0",), rows=("full", "twin-credit-only", "no-inverse-weights"),
                                   seeds=1, audit_groups=12, warmup_batches=1)
    figs = {row: ablations.credit_figures("SearchToy-v0", cfg, row, seed=3) for row in cfg.rows}
    assert np.isfinite(figs["full"]["rev"])
    assert figs["twin-credit-only"]["rev"] == figs["full"]["rev"] == figs["no-inverse-weights"]["rev"]
    # the update's credit does differ (the column that stays, labelled "update")
    assert figs["twin-credit-only"]["wrong_sign"] != figs["full"]["wrong_sign"]
    assert np.isfinite(figs["full"]["sigma_batch"]) and np.isfinite(figs["full"]["sigma_rms"])
    assert np.isnan(figs["twin-credit-only"]["sigma_rms"])


def _learner(calls: list):
    """Learning runs whose curve rises fastest at lr 8 for coupled twins and at lr 1 for independent ones."""
    def train_one(method, seed, config, *, lr=None, twice_config=None):
        calls.append((twice_config.coupled, seed, lr))
        rate = 0.3 * np.exp(-(np.log2(lr) - (3.0 if twice_config.coupled else 0.0)) ** 2 / 4) * (1 - 0.1 * (seed % 3))
        n = config.updates
        return learn.RunTrace([0.5 + 0.5 * (1 - np.exp(-rate * u)) for u in range(n + 1)], [0] * n, [1] * n,
                              [0.0] * n, [False] * n, [1.0] * n, [0.0] * n)
    return train_one


def test_each_row_learns_at_its_own_step_size_and_is_compared_with_full_twice_paired(monkeypatch):
    """Break: tuning full Twice alone and running every row at its step size -> independent twins at lr 8."""
    calls = []
    monkeypatch.setattr(learn, "train_one", _learner(calls))
    # the audit figures are the other tests' business: constants here, so only the learning runs are measured
    monkeypatch.setattr(ablations, "layout_rho", lambda *a: 0.3)
    audit = [f for f in ablations.FIGURES if f not in ("rho_bar", "area", "final_value")]
    monkeypatch.setattr(ablations, "credit_figures", lambda *a: dict.fromkeys(audit, 0.5))
    cfg = ablations.AblationConfig(envs=("SearchToy-v0",), rows=("full", "independent-twins"), seeds=2,
                                   audit_groups=6, warmup_batches=1, updates=5, groups=2, lr_grid=(0.5, 2, 8, 32),
                                   tune_seeds=1)
    res = ablations.run_ablations(cfg)
    steps = res["step_sizes"]["SearchToy-v0"]
    # independent twins: 0.5 and 2 tie (an octave either side of 1), the smaller is picked; it sits at the
    # grid's low end, so the grid gains 0.125, which scores lower
    assert steps["full"]["lr"] == 8.0 and steps["independent-twins"]["lr"] == 0.5
    assert steps["independent-twins"]["tuning"]["edge_of_grid"] == "low"
    assert steps["independent-twins"]["tuning"]["widened"] == [0.125]
    reported = {(c, s) for c, s, lr in calls if lr == (8.0 if c else 0.5) and s in (0, 1000)}
    assert reported == {(True, 0), (True, 1000), (False, 0), (False, 1000)}
    d = res["vs_full"]["SearchToy-v0"]["independent-twins"]
    rows = res["envs"]["SearchToy-v0"]
    assert d["mean"] == pytest.approx(np.mean(rows["independent-twins"]["area"]["seeds"])
                                      - np.mean(rows["full"]["area"]["seeds"]))
    text = ablations.format_ablations(res)
    assert "each row at its own step size, tuned on lr grid 0.5, 2, 8, 32" in text and "area - full, paired" in text
    shared = ablations.run_ablations(replace(cfg, lr_grid=()))
    text = ablations.format_ablations(shared)
    assert "every row at one shared lr=1, not tuned" in text and "not a row's win" in text
    assert all(s["lr"] == 1.0 and s["tuning"] is None for s in shared["step_sizes"]["SearchToy-v0"].values())


def test_a_one_value_grid_is_refused(capsys):
    with pytest.raises(ValueError, match="lr_grid needs two step sizes or more"):
        ablations.AblationConfig(lr_grid=(2.0,))
    with pytest.raises(SystemExit):
        ablations.main(["--lr-grid", "2"])
    assert "--lr-grid needs two step sizes or more" in capsys.readouterr().err
