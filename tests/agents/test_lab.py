"""The credit lab audit and bench learn on small SearchToy settings."""

import argparse
import json

import numpy as np
import pytest

from twice_envs import progress
from twice_envs.agents.bench import learn as bench_learn
from twice_envs.agents.credit.registry import methods as registered_methods
from twice_envs.agents.lab import cli, lab_audit, policies, report
from twice_envs.agents.lab.search_toy import SearchToySetting
from twice_envs.agents.lab.text_setting import TextLabSetting
from twice_envs.envs.searchtoy.env import SearchToyConfig


@pytest.fixture(scope="module")
def small_audit():
    cfg = lab_audit.LabAuditConfig(groups=40, pairs=(1, 2), vine_k=(1,), warmup_batches=2, n_boot=200, seed=3)
    return lab_audit.run_lab_audit(cfg)


def test_lab_audit_rows_have_cis_and_the_expected_order(small_audit):
    res = small_audit
    rows = {r["method"]: r for r in res.rows}
    # the diagnostic rows, then one row per registered method without one (its update's advantage)
    diagnostic = {"grpo", "grpo 2G", "gigpo", "twice J1", "twice J2", "crr J1", "crr J2", "vineppo K1", "twice-train"}
    assert set(rows) == diagnostic | set(registered_methods())
    # GRPO (2x) spends G more factual episodes per group: about the audited batch's own tokens
    assert 0.7 < rows["grpo-2x"]["aux_tokens"] / res.policy_tokens < 1.4
    # Twice's diagnostic comparisons are made among the diagnostic rows; its update credit against the
    # methods spending the same budget
    diag = [c for c in res.comparisons if c["twice"] != "twice"]
    assert {c["baseline"] for c in diag} == {"grpo", "grpo 2G", "gigpo", "crr J1", "crr J2", "vineppo K1"}
    budgeted = {c["baseline"] for c in res.comparisons if c["twice"] == "twice"}
    assert budgeted == set(res.budget) - {"twice"}
    assert {"crr", "crr-added", "tree-grpo", "tree-grpo-coupled", "twice-igpo"} <= budgeted
    # a comparison with a baseline that spends no auxiliary tokens says so
    for c in res.comparisons:
        assert c["equal_tokens"] == (c["baseline_tokens"] > 0 and c["label"] != "unequal: Twice's cheapest row "
                                     "spends more"), c
    for r in res.rows:
        for fig in ("wrong_sign", "wrong_sign_nonzero", "zero_credit", "pearson", "mse_vs_grpo"):
            e = r[fig]
            assert e["lo"] <= e["value"] <= e["hi"], (r["method"], fig, e)
    # coupling: a twin's sign errors are rarer than an independent counterfactual's, clearly
    cmp = next(c for c in res.comparisons if c["baseline"] == "crr J1" and c["figure"] == "wrong_sign")
    assert cmp["twice"] == "twice J1" and cmp["significant"] and cmp["diff"]["hi"] < 0
    assert cmp["ratio"]["value"] == pytest.approx(rows["twice J1"]["wrong_sign"]["value"] / rows["crr J1"]["wrong_sign"]["value"])
    assert cmp["ratio"]["hi"] < 1
    # two pairs beat one; every Pearson stays under its J-pair ceiling (up to sampling noise)
    assert rows["twice J2"]["pearson"]["value"] > rows["twice J1"]["pearson"]["value"]
    for name in ("twice J1", "twice J2", "crr J1"):
        assert rows[name]["pearson"]["lo"] <= rows[name]["ceiling"]["value"]
    # within-decision correlation of twins is positive and CRR's about zero
    assert rows["twice J1"]["rho_bar"]["lo"] > 0.2
    assert abs(rows["crr J1"]["rho_bar"]["value"]) < 0.1
    # the budget's accounted tokens are near the target on one batch (coin noise), generated ones below
    assert 0.8 < res.budget["twice"]["accounted_ratio"] < 1.25
    assert res.budget["twice"]["generated_ratio"] < res.budget["twice"]["accounted_ratio"]
    # the zero shares: A_hat alone is mostly zero, the update credit (GRPO's term added) rarely
    assert rows["twice-train"]["zero_credit"]["value"] > rows["twice"]["zero_credit"]["value"]
    # GiGPO's credit points the right way (its rows are aligned with the audited decisions)
    assert rows["gigpo"]["pearson"]["lo"] > 0.2 and rows["gigpo"]["aux_tokens"] == 0
    assert "significant" in report.format_lab(res)


def test_lab_audit_prints_the_published_table_and_the_coupling(small_audit, tmp_path):
    res = small_audit
    rows = {r["method"]: r for r in res.rows}
    # the published table: each method's raw per-decision credit; the update rows are supplementary
    table = {e["method"]: e["row"] for e in res.table2}
    assert table == {"grpo": "grpo", "grpo-2x": "grpo 2G", "gigpo": "gigpo", "vineppo": None, "crr": "crr J1",
                     "twice": "twice J1"}  # this audit runs K = 1 only, so VinePPO's row is missing
    assert {n for n, r in rows.items() if r["table"] == "published"} == set(table.values()) - {None}
    assert rows["twice"]["table"] == rows["crr"]["table"] == rows["grpo-2x"]["table"] == "update"
    assert rows["twice J2"]["table"] == rows["twice-train"]["table"] == "diagnostic"
    # GRPO (2x)'s raw row reads the same further episodes as its update row
    assert rows["grpo 2G"]["aux_tokens"] == rows["grpo-2x"]["aux_tokens"] > 0
    # coupling: one coupled twin (twice J1) and one independent counterfactual (crr J1) per decision, exact rho-bar
    c = res.coupling
    d_c, d_i = res.credit["twice J1"], res.credit["crr J1"]
    assert c["oracle"] == "exact" and c["decisions"] == len(res.oracle)
    assert c["lower_bound"]["value"] == pytest.approx(1 - np.var(d_c) / np.var(d_i))
    assert c["rho_bar"]["value"] == pytest.approx(rows["twice J1"]["rho_bar"]["value"])
    assert c["tie_share_coupled"]["value"] == pytest.approx(np.mean(d_c == 0))
    assert c["tie_share_coupled"]["value"] > c["tie_share_independent"]["value"] and c["self_twin_share"]["value"] > 0
    assert c["lower_bound"]["lo"] > 0 and c["worth"]["lower_bound"]["determined"]
    assert c["worth"]["rho_bar"]["value"] == pytest.approx(1 / (1 - c["rho_bar"]["value"]))
    text = report.format_lab(res)
    assert text.index("published credit table (Table 2)") < text.index("supplementary: update credit")
    assert "VinePPO      not in this run (needs the row 'vineppo K2')" in text
    assert "rho-bar (exact oracle)" in text and "oracle-free lower bound" in text and c["line"] in text
    assert c["line"].startswith("coupling is worth about ")
    report.write_lab(res, tmp_path)
    doc = json.loads((tmp_path / "lab_audit.json").read_text())
    assert doc["coupling"]["lower_bound"] == pytest.approx(c["lower_bound"]) and doc["table2"] == res.table2
    assert {r["method"]: r["table"] for r in doc["rows"]} == {n: r["table"] for n, r in rows.items()}


def test_twice_row_is_the_credit_its_update_uses():
    """The ``twice`` row is ``A_traj + omega A_hat / sigma_hat`` after the predictor warm-up, at the budget."""
    from twice_envs.agents.credit.grpo import episode_advantages
    from twice_envs.agents.lab import toy

    cfg = lab_audit.LabAuditConfig(groups=30, warmup_batches=2, seed=5)
    policy = policies.lab_policy()
    eps, envs = toy.toy_rollouts(policy, cfg.groups, cfg.group_size, noise_seed=cfg.seed)
    tt = lab_audit.training_time_twice(policy, eps, envs, cfg)
    a_traj = episode_advantages([e.utility for e in eps], [e.group for e in eps])
    traj = np.concatenate([np.full(len(e.turns), a_traj[i]) for i, e in enumerate(eps)])
    np.testing.assert_allclose(tt.update, traj + tt.a_hat / tt.stats["sigma_hat"], atol=1e-9)
    assert 0 < np.mean(tt.a_hat != 0) < 0.5  # at the budget, not every decision
    assert tt.stats["mean_q"] != pytest.approx(0.3)  # past the warm-up's fixed q


def test_lab_outputs(small_audit, tmp_path):
    paths = report.write_lab(small_audit, tmp_path)
    assert paths["png"].stat().st_size > 5000
    lines = paths["csv"].read_text().splitlines()
    assert len(lines) == 1 + len(small_audit.oracle)


def test_twice_audit_cli_dispatches_to_the_lab(tmp_path, capsys):
    assert cli.audit_main(["--env", "SearchToy-v0", "--groups", "12", "--pairs", "1", "--vine-k", "1", "--n-boot", "50",
                       "--hops", "2", "--out", str(tmp_path)]) == 0
    assert "twice J1" in capsys.readouterr().out


def test_policy_gradient_points_uphill_on_the_exact_value():
    # the sampled REINFORCE gradient with exact advantages points uphill: one step raises exact V(s0)
    from twice_envs.agents.lab import toy
    from twice_envs.agents.lab.search_toy import search_toy_policy

    p = search_toy_policy(SearchToySetting())
    eps, _ = toy.toy_rollouts(p, 200, 5, noise_seed=9)
    g = p.policy_gradient(eps, toy.exact_advantages(p, eps))
    eps_fd = 1e-4
    # directional derivative of the exact V(s0) along g, by finite differences
    fd = (p.with_logits(p.logits + eps_fd * g).value - p.with_logits(p.logits - eps_fd * g).value) / (2 * eps_fd)
    assert fd > 0
    step = p.with_logits(p.logits + 1.0 * g)
    assert step.value > p.value + 0.005


def test_bench_learn_small():
    cfg = bench_learn.LearnConfig(seeds=2, updates=4, groups=4, methods=("grpo", "twice"), lr_grid=())
    res = bench_learn.run_learn(cfg)
    for m in ("grpo", "twice"):
        r = res["methods"][m]
        assert len(r["curve"]) == 5 and r["curve"][0] == pytest.approx(res["methods"]["grpo"]["curve"][0])
        assert all(lo <= c + 1e-12 and c <= hi + 1e-12 for c, lo, hi in zip(r["curve"], r["lo"], r["hi"]))
    assert res["methods"]["grpo"]["curve"][-1] > res["methods"]["grpo"]["curve"][0]  # learning happens
    assert res["methods"]["grpo"]["aux"] == 0 and res["methods"]["twice"]["aux"] > 0
    assert res["methods"]["grpo"]["budget_ratio"] == 0 and res["methods"]["twice"]["budget_ratio"] > 0
    assert "updates to threshold" in bench_learn.format_learn(res)


def _episode(group: int, utility: float, turns: int, tokens: int = 1):
    from twice_envs.agents.types import EpisodeRecord, TurnRecord

    turn = lambda t: TurnRecord([7] * tokens, [0.0] * tokens, "a", (0, t, 0, 0, 0))  # noqa: E731
    return EpisodeRecord("SearchToy-v0", 0, {}, group=group, turns=[turn(t) for t in range(turns)], utility=utility)


def test_grpo_2x_row_normalises_over_the_enlarged_group():
    # audited (G = 2): group 0 U = (1, 0), the first episode of two turns; group 1 U = (0, 0)
    eps = [_episode(0, 1.0, 2), _episode(0, 0.0, 1), _episode(1, 0.0, 1), _episode(1, 0.0, 1)]
    # G more per group: group 0 (1, 1) -> (1, 0, 1, 1), mean 3/4, std sqrt(3)/4;
    # group 1 (1, 0) -> (0, 0, 1, 0), mean 1/4, std sqrt(3)/4
    extra = [_episode(0, 1.0, 1, 3), _episode(0, 1.0, 1, 3), _episode(1, 1.0, 1, 3), _episode(1, 0.0, 1, 3)]
    cfg = lab_audit.LabAuditConfig(group_size=2)
    r3 = np.sqrt(3.0)
    _, adv, aux = lab_audit.update_credit("grpo-2x", None, eps, [], extra, [], cfg)
    np.testing.assert_allclose(adv, [1 / r3, 1 / r3, -r3, -1 / r3, -1 / r3], rtol=1e-5)
    assert aux == 12  # the extra episodes' factual tokens
    # without the extra episodes: GRPO over G (group 1 ties, so 0)
    _, adv, aux = lab_audit.update_credit("grpo", None, eps, [], [], [], cfg)
    np.testing.assert_allclose(adv, [1, 1, -1, 0, 0], rtol=1e-5)
    assert aux == 0


def test_bench_learn_grpo_2x_samples_twice_the_episodes(monkeypatch):
    sizes = []
    real = bench_learn.toy.toy_rollouts

    def spy(policy, n_groups, group_size, **kw):
        sizes.append(group_size)
        return real(policy, n_groups, group_size, **kw)

    monkeypatch.setattr(bench_learn.toy, "toy_rollouts", spy)
    cfg = bench_learn.LearnConfig(seeds=2, updates=3, groups=4, methods=("grpo", "grpo-2x"), lr_grid=())
    res = bench_learn.run_learn(cfg)
    assert sizes == [5] * 6 + [10] * 6
    g1, g2 = res["methods"]["grpo"], res["methods"]["grpo-2x"]
    assert 1.6 < g2["policy"] / g1["policy"] < 2.4 and g2["aux"] == 0
    assert "grpo-2x" in bench_learn.format_learn(res)


def test_breakdowns_say_n_a_where_a_figure_is_undefined():
    import io

    nan = float("nan")
    per_turn = [{"turn": 0, "decisions": 3, "grpo pearson": 0.5, "grpo wrong_sign": 0.0,
                 "twice J1 pearson": nan, "twice J1 wrong_sign": 0.0}]
    comparisons = [
        {"figure": "pearson", "twice": "twice J1", "twice_tokens": 9, "baseline": "grpo", "baseline_tokens": 0,
         "diff": {"value": nan, "lo": nan, "hi": nan}, "significant": False},
        {"figure": "wrong_sign", "twice": "twice J1", "twice_tokens": 9, "baseline": "grpo", "baseline_tokens": 0,
         "diff": {"value": -0.2, "lo": -0.3, "hi": -0.1}, "significant": True},
    ]
    out = io.StringIO()
    report.write_breakdowns(out, per_turn, comparisons, ("grpo", "twice J1"), ratios=False)
    text = out.getvalue()
    assert "nan" not in text.lower().replace("n/a", "")
    assert "grpo: 0.50/0  twice J1: n/a/0" in text
    assert "grpo (0 tok): n/a: the figure is undefined" in text
    assert "grpo (0 tok): -0.200 [-0.300, -0.100] significant" in text


def test_setting_flags_compose_one_world():
    p = argparse.ArgumentParser()
    policies.add_setting_args(p)
    a = p.parse_args(["--hops", "2", "--horizon", "4", "--wording", "0.5", "--memory", "0.25", "--key-mode", "flat"])
    search = SearchToySetting(SearchToyConfig(hops=2, horizon=4), wording=0.5)
    assert policies.setting_from_args(a) == search
    assert policies.text_setting_from_args(a) == TextLabSetting(search, memory=0.25, key_mode="flat")


def test_twice_audit_refuses_a_bad_world_with_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.lab_main(["--env", "SearchToy-v0", "--hops", "0", "--out", str(tmp_path)])
    assert "hops must be in 1..10, got 0" in capsys.readouterr().err
    assert not (tmp_path / "lab_audit.json").exists()


@pytest.fixture
def progress_shown():
    """Progress forced on (as on a terminal), restored afterwards."""
    progress.set_enabled(True)
    yield
    progress.set_enabled(None)


def test_the_lab_audit_shows_its_progress_to_the_end(progress_shown, capsys):
    cfg = lab_audit.LabAuditConfig(env="CreditToy-v0", groups=4, pairs=(1, 2), vine_k=(1,), warmup_batches=1, n_boot=20)
    lab_audit.run_lab_audit(cfg)
    steps = 5 + 2 * 2 + len(registered_methods())
    assert f"lab audit CreditToy-v0: {steps}/{steps} steps (100%)" in capsys.readouterr().err


class _Stop(Exception):
    pass


def test_both_forms_of_twice_audit_take_no_progress(progress_shown, monkeypatch):
    seen = []

    def stop(*args, **kwargs):
        seen.append(progress.enabled())
        raise _Stop

    monkeypatch.setattr(cli, "run_lab_audit", stop)
    monkeypatch.setattr(cli, "run_audit", stop)
    monkeypatch.setattr(cli, "load_policy", lambda name: name)
    for argv in (["--env", "CreditToy-v0"], ["--checkpoint", "tiny", "--env", "SearchQA-v0"]):
        progress.set_enabled(True)
        with pytest.raises(_Stop):
            cli.audit_main(argv + ["--no-progress"])
    assert seen == [False, False]
