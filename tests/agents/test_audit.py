"""The credit audit: the summary statistics, and an end-to-end run on CreditToy."""

import numpy as np
import pytest

from twice_envs.agents.lab import audit

from .train_helpers import one_torch_thread, small_policy  # noqa: F401


def test_summary_statistics_on_known_values():
    oracle = np.array([0.5, -0.5, 0.2, 0.01, -0.3])
    credit = {
        "grpo": np.array([0.1, 0.1, 0.1, 0.1, 0.1]),
        "twice": np.array([1.0, -1.0, 0.0, 0.0, 1.0]),
    }
    rows = {r["method"]: r for r in audit.summarize(oracle, credit, {"twice": 7}, 0.05)}
    # |A*| >= 0.05: decisions 0, 1, 2, 4
    assert rows["grpo"]["scored"] == 4
    assert rows["grpo"]["wrong_sign"] == pytest.approx(2 / 4)  # decisions 1 and 4
    assert rows["twice"]["wrong_sign"] == pytest.approx(1 / 4)  # decision 4; decision 2 is a zero
    assert rows["twice"]["zero_credit"] == pytest.approx(1 / 4)
    assert rows["grpo"]["mse_vs_grpo"] == pytest.approx(1.0)
    mse_t = np.mean((credit["twice"] - oracle) ** 2)
    assert rows["twice"]["mse_vs_grpo"] == pytest.approx(mse_t / np.mean((credit["grpo"] - oracle) ** 2))
    assert rows["twice"]["pearson"] == pytest.approx(np.corrcoef(credit["twice"], oracle)[0, 1])
    assert rows["twice"]["aux_tokens"] == 7
    pairs = audit.summarize_pair_set("twice", np.array([[1, 0], [0, 1], [1, 1], [0, 0], [1, 0]], float), oracle, 0.05)
    assert pairs["tie_share"] == pytest.approx(2 / 5) and pairs["reversal_share"] == pytest.approx(1 / 4)


def test_audit_end_to_end_on_the_toy(tmp_path):
    cfg = audit.AuditConfig(env="CreditToy-v0", questions=4, group_size=3, oracle_rollouts=3, max_new_tokens=3,
                            max_turns=3, indexed_tasks=False, pairs=(1, 2), vine_k=(1, 2), n_boot=50)
    res = audit.run_audit(small_policy(0), cfg)
    assert set(res.credit) == {"grpo", "gigpo", "twice J1", "twice J2", "crr J1", "crr J2", "vineppo K1", "vineppo K2",
                               "twice-train", "twice-train+traj"}
    n = len(res.oracle)
    assert n >= 3 and all(len(c) == n for c in res.credit.values()) and len(res.episodes) == n
    assert res.aux_tokens["grpo"] == res.aux_tokens["gigpo"] == 0
    for m in ("twice", "crr", "vineppo"):
        one, two = (f"{m} J1", f"{m} J2") if m != "vineppo" else ("vineppo K1", "vineppo K2")
        assert 0 < res.aux_tokens[one] < res.aux_tokens[two]
    # J = 2 averages the first pair with a second one
    assert not np.allclose(res.credit["twice J2"], res.credit["twice J1"]) or np.all(res.credit["twice J1"] == 0)
    np.testing.assert_allclose(res.credit["twice-train+traj"], res.credit["grpo"] + res.credit["twice-train"])
    for r in res.rows:
        for k in ("wrong_sign", "zero_credit", "pearson", "mse_vs_grpo"):
            e = r[k]
            assert set(e) == {"value", "lo", "hi"}
            if np.isfinite(e["lo"]):
                assert e["lo"] <= e["value"] + 1e-9 and e["value"] <= e["hi"] + 1e-9
    assert "ceiling" in res.row("twice J2") and "ceiling" not in res.row("grpo")
    assert "rho_bar" in res.row("twice J1") and "rho_bar" in res.row("crr J1")
    assert [p["pairs"] for p in res.pair_rows] == ["twin", "independent"]
    assert sum(r["decisions"] for r in res.per_turn) == n
    assert res.comparisons and np.isfinite(res.budget_ratio)
    text = audit.format_table(res)
    assert "wrong-sign" in text and "twice-train" in text and "per turn" in text
    paths = audit.write_outputs(res, tmp_path)
    for p in paths.values():
        assert p.exists() and p.stat().st_size > 0
    assert (tmp_path / "audit_decisions.csv").read_text().splitlines()[0].startswith("episode,turn,oracle,grpo")
    header = (tmp_path / "audit.csv").read_text().splitlines()[0].split(",")
    assert header[0] == "method" and {"pearson", "pearson_lo", "pearson_hi", "ceiling"} <= set(header)


def test_summaries_carry_bootstrap_intervals_and_per_decision_rho():
    rng = np.random.default_rng(0)
    n = 400
    episodes = np.repeat(np.arange(100), 4)
    v_before = rng.uniform(0.2, 0.8, n)
    oracle = rng.uniform(-0.2, 0.2, n)
    v_after = v_before + oracle
    # pairs drawn with a known within-decision correlation: U ~ Bern(v_after), U' = U or Bern(v_before)
    u = (rng.random(n) < v_after).astype(float)
    same = rng.random(n) < 0.6
    u2 = np.where(same & (rng.random(n) < 0.5), u, (rng.random(n) < v_before).astype(float))
    credit = {"grpo": oracle + rng.normal(0, 0.5, n), "twice J1": u - u2, "crr J1": oracle + rng.normal(0, 0.9, n)}
    aux = {"grpo": 0, "twice J1": 100, "crr J1": 100}
    pairs_of = {"grpo": 0, "twice J1": 1, "crr J1": 1}
    cfg = audit.AuditConfig(n_boot=300)
    res = audit.summarize_audit(cfg, oracle, episodes, np.tile(np.arange(4), 100), credit, aux, pairs_of,
                                {"twice": np.stack([u, u2], 1)}, v_before, v_after)
    tw = res.row("twice J1")
    assert tw["pearson"]["value"] == pytest.approx(np.corrcoef(u - u2, oracle)[0, 1])
    assert tw["pearson"]["lo"] < tw["pearson"]["value"] < tw["pearson"]["hi"]
    assert 0.02 < tw["pearson"]["hi"] - tw["pearson"]["lo"] < 0.5
    centred = (u - v_after, u2 - v_before)
    rho = np.sum(centred[0] * centred[1]) / np.sqrt(np.sum(centred[0] ** 2) * np.sum(centred[1] ** 2))
    assert tw["rho_bar"]["value"] == pytest.approx(rho)
    assert tw["rho_bar"]["lo"] < rho < tw["rho_bar"]["hi"] and rho > 0.15
    assert res.pair_rows[0]["rho_bar"] == pytest.approx(rho)
    assert tw["ceiling"]["value"] == pytest.approx(
        np.sqrt(oracle.var() / (oracle.var() + np.mean(np.abs(oracle)) - np.mean(oracle ** 2))))
    assert [r["turn"] for r in res.per_turn] == ["0", "1", "2", "3"]
    # J = 2 only: no J = 1 row, the pair table still has its rho-bar
    two = audit.summarize_audit(cfg, oracle, episodes, np.tile(np.arange(4), 100),
                                {"grpo": credit["grpo"], "twice J2": credit["twice J1"]}, {"grpo": 0, "twice J2": 200},
                                {"grpo": 0, "twice J2": 2}, {"twice": np.stack([u, u2], 1)}, v_before, v_after)
    assert two.pair_rows[0]["rho_bar"] == pytest.approx(rho) and "rho_bar" not in two.row("twice J2")
    assert two.row("twice J2")["ceiling"]["value"] > tw["ceiling"]["value"]  # two pairs raise the ceiling


def test_mixed_groups_keeps_the_groups_whose_outcomes_differ():
    u = [0, 0, 0, 1, 0, 1, 1, 1, 1, 0, 0.5, 0.5]
    assert audit.mixed_groups(u, 3) == [3, 9]
    assert audit.mixed_groups([1.0] * 6, 3) == []


def test_audit_of_mixed_groups_only_on_the_toy(tmp_path):
    cfg = audit.AuditConfig(env="CreditToy-v0", questions=4, group_size=3, oracle_rollouts=2, max_new_tokens=3,
                            max_turns=3, indexed_tasks=False, mixed_only=True)
    policy = small_policy(0)
    full = audit.run_audit(policy, audit.AuditConfig(**{**cfg.__dict__, "mixed_only": False}))
    res = audit.run_audit(policy, cfg)
    # the same factual groups are sampled; only the mixed ones are audited
    assert res.group_utilities == full.group_utilities
    mixed = audit.mixed_groups(full.group_utilities, 3)
    assert full.questions == 4 and 0 < res.questions == len(mixed) < 4
    assert len(res.oracle) < len(full.oracle)
    assert audit.format_table(res) and audit.write_outputs(res, tmp_path)["audit.png"].exists()
