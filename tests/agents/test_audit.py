"""The credit audit: the summary statistics, and an end-to-end run on CreditToy."""

import numpy as np
import pytest

from twice_envs.agents import audit

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
    pairs = audit.summarize_pairs(oracle, {"twice": np.array([[1, 0], [0, 1], [1, 1], [0, 0], [1, 0]], float)}, 0.05)
    assert pairs[0]["tie_share"] == pytest.approx(2 / 5) and pairs[0]["reversal_share"] == pytest.approx(1 / 4)


def test_audit_end_to_end_on_the_toy(tmp_path):
    from twice_envs.agents import toy  # noqa: F401  (registers CreditToy-v0)

    cfg = audit.AuditConfig(env="CreditToy-v0", questions=3, group_size=3, oracle_rollouts=3, max_new_tokens=3,
                            max_turns=3, indexed_tasks=False)
    res = audit.run_audit(small_policy(0), cfg)
    assert set(res.credit) == {"grpo", "twice", "crr", "vineppo"}
    n = len(res.oracle)
    assert n >= 3 and all(len(c) == n for c in res.credit.values())
    assert res.aux_tokens["vineppo"] > 0 and res.aux_tokens["grpo"] == 0
    text = audit.format_table(res)
    assert "wrong-sign" in text and "twin" in text
    paths = audit.write_outputs(res, tmp_path)
    for p in paths.values():
        assert p.exists() and p.stat().st_size > 0
    assert (tmp_path / "audit.csv").read_text().splitlines()[0].startswith("method,")


def test_mixed_groups_keeps_the_groups_whose_outcomes_differ():
    u = [0, 0, 0, 1, 0, 1, 1, 1, 1, 0, 0.5, 0.5]
    assert audit.mixed_groups(u, 3) == [3, 9]
    assert audit.mixed_groups([1.0] * 6, 3) == []


def test_audit_of_mixed_groups_only_on_the_toy(tmp_path):
    from twice_envs.agents import toy  # noqa: F401  (registers CreditToy-v0)

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
