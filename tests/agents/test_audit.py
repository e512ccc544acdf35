"""The credit audit: the summary statistics, and an end-to-end run on CreditToy."""

import json

import numpy as np
import pytest

from twice_envs import progress
from twice_envs.agents.credit.grpo import episode_advantages
from twice_envs.agents.credit.registry import get_method
from twice_envs.agents.credit.registry import methods as registered_methods
from twice_envs.agents.lab import audit, cli, coupling, scoring

from .train_helpers import one_torch_thread, small_policy  # noqa: F401


def test_summary_statistics_on_known_values():
    oracle = np.array([0.5, -0.5, 0.2, 0.01, -0.3])
    credit = {
        "grpo": np.array([0.1, 0.1, 0.1, 0.1, 0.1]),
        "twice": np.array([1.0, -1.0, 0.0, 0.0, 1.0]),
    }
    rows = {r["method"]: r for r in scoring.summarize(oracle, credit, {"twice": 7}, 0.05)}
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
    d = np.array([[1, 0], [0, 1], [1, 1], [0, 0], [1, 0]], float)
    pairs = coupling.summarize_pair_set("twice", d, oracle, 0.05)
    assert pairs["tie_share"] == pytest.approx(2 / 5) and pairs["reversal_share"] == pytest.approx(1 / 4)


def test_audit_end_to_end_on_the_toy(tmp_path, monkeypatch, capsys):
    cfg = audit.AuditConfig(env="CreditToy-v0", questions=4, group_size=3, oracle_rollouts=3, max_new_tokens=3,
                            max_turns=3, indexed_tasks=False, pairs=(1, 2), vine_k=(1, 2), n_boot=50)
    value_calls, real = [], audit.branch_rollouts

    def keep(policy, eps, requests, **kwargs):
        recs = real(policy, eps, requests, **kwargs)
        value_calls.append((eps, recs))
        return recs

    monkeypatch.setattr(audit, "branch_rollouts", keep)
    progress.set_enabled(True)  # as on a terminal: the audit draws its stages done out of the total
    try:
        res = audit.run_audit(small_policy(0), cfg)
    finally:
        progress.set_enabled(None)
    stages = 6 + len(registered_methods())
    assert f"audit CreditToy-v0: {stages}/{stages} stages (100%)" in capsys.readouterr().err
    own = {"grpo", "grpo 2G", "gigpo", "twice J1", "twice J2", "crr J1", "crr J2", "vineppo K1", "vineppo K2",
           "twice-train", "twice", "crr", "vineppo"}
    # every other registered method has an update row, or says why not (a critic to train; no gold answer or exact
    # values here)
    assert set(res.credit) - own == set(registered_methods()) - own - set(res.skipped)
    assert res.skipped and all(get_method(m).needs & {"critic", "answer_probs", "exact_advantages"} for m in res.skipped)
    assert "grpo-2x" in res.credit and res.aux_tokens["grpo-2x"] > 0  # its further factual episodes
    n = len(res.oracle)
    assert n >= 3 and all(len(c) == n for c in res.credit.values()) and len(res.episodes) == n
    assert res.aux_tokens["grpo"] == res.aux_tokens["gigpo"] == 0
    for m in ("twice", "crr", "vineppo"):
        one, two = (f"{m} J1", f"{m} J2") if m != "vineppo" else ("vineppo K1", "vineppo K2")
        assert 0 < res.aux_tokens[one] < res.aux_tokens[two]
    # J = 2 averages the first pair with a second one
    assert not np.allclose(res.credit["twice J2"], res.credit["twice J1"]) or np.all(res.credit["twice J1"] == 0)
    # the update rows: each method's advantage as its update uses it
    u = np.array(res.group_utilities)
    groups = np.arange(len(u)) // cfg.group_size
    a_traj_ep = episode_advantages(u, groups)
    a_traj = a_traj_ep[res.episodes]
    scale = max(float(np.std([u[i] for i in sorted(set(res.episodes))])), 0.1)
    np.testing.assert_allclose(res.credit["twice"], a_traj + res.credit["twice-train"] / scale, atol=1e-9)
    replaced = ~np.isclose(res.credit["crr"], a_traj)
    np.testing.assert_allclose(res.credit["crr"][replaced], res.credit["crr J1"][replaced])
    raw = res.credit["vineppo K2"]
    np.testing.assert_allclose(res.credit["vineppo"], (raw - raw.mean()) / (raw.std() + 1e-8))
    assert {"twice", "crr", "tree-grpo"} <= set(res.budget) and res.budget["crr"]["target"] > 0
    # Twice's update row is compared with every other budgeted update row, at the same budget
    assert {c["baseline"] for c in res.comparisons if c["twice"] == "twice"} == set(res.budget) - {"twice"}
    for r in res.rows:
        for k in ("wrong_sign", "zero_credit", "pearson", "mse_vs_grpo"):
            e = r[k]
            assert set(e) == {"value", "lo", "hi"}
            if np.isfinite(e["lo"]):
                assert e["lo"] <= e["value"] + 1e-9 and e["value"] <= e["hi"] + 1e-9
    assert "ceiling" in res.row("twice J2") and "ceiling" not in res.row("grpo")
    # the coupling figures: pair 0's coupled twin and the first independent counterfactual at every decision
    d_c, d_i = res.credit["twice J1"], res.credit["crr J1"]
    assert res.coupling["oracle"] == "estimated" and res.coupling["decisions"] == n
    if np.var(d_i) > 0:
        assert res.coupling["lower_bound"]["value"] == pytest.approx(1 - np.var(d_c) / np.var(d_i))
    assert res.coupling["tie_share_coupled"]["value"] == pytest.approx(np.mean(d_c == 0))
    assert {e["method"]: e["row"] for e in res.table2}["twice"] == "twice J1"
    assert res.row("twice J1")["table"] == "published" and res.row("twice")["table"] == "update"
    assert res.row("twice-train")["table"] == res.row("twice J2")["table"] == "diagnostic"
    assert "rho_bar" in res.row("twice J1") and "rho_bar" in res.row("crr J1")
    assert [p["pairs"] for p in res.pair_rows] == ["twin", "independent"]
    assert sum(r["decisions"] for r in res.per_turn) == n
    assert res.comparisons and np.isfinite(res.budget["twice"]["accounted_ratio"])
    # the SE of A* from the oracle's rollouts (the first value rollouts): independent sets, exact V(s_T) = U
    eps, recs = value_calls[0]
    utils = {}
    for r in recs:
        utils.setdefault(tuple(r.twin_of), []).append(r.utility)
    assert {len(u) for u in utils.values()} == {3}
    for k, (i, t) in enumerate(zip(res.episodes, res.turns)):
        var_next = 0.0 if t + 1 == len(eps[i].turns) else np.var(utils[(i, t + 1)], ddof=1) / 3
        assert res.oracle_se[k] == pytest.approx(np.sqrt(var_next + np.var(utils[(i, t)], ddof=1) / 3))
    assert len(res.oracle_se) == n and np.all(np.isfinite(res.oracle_se))
    se = res.oracle_resolution()
    assert se["median_se"] == pytest.approx(np.median(res.oracle_se))
    assert se["p90_se"] == pytest.approx(np.percentile(res.oracle_se, 90))
    text = audit.format_table(res)
    assert "wrong-sign" in text and "twice-train" in text and "per turn" in text
    assert all(f"{m}: no row (" in text for m in res.skipped)
    assert f"median {se['median_se']:.3f}, 90th percentile {se['p90_se']:.3f}" in text
    paths = audit.write_outputs(res, tmp_path)
    for p in paths.values():
        assert p.exists() and p.stat().st_size > 0
    decisions_csv = (tmp_path / "audit_decisions.csv").read_text().splitlines()
    assert decisions_csv[0].startswith("episode,turn,oracle,grpo") and decisions_csv[0].endswith(",oracle_se")
    assert json.loads((tmp_path / "audit.json").read_text())["oracle_se"]["median_se"] == pytest.approx(
        se["median_se"])
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
    res = scoring.summarize_audit(cfg, oracle, episodes, np.tile(np.arange(4), 100), credit, aux, pairs_of,
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
    two = scoring.summarize_audit(cfg, oracle, episodes, np.tile(np.arange(4), 100),
                                {"grpo": credit["grpo"], "twice J2": credit["twice J1"]}, {"grpo": 0, "twice J2": 200},
                                {"grpo": 0, "twice J2": 2}, {"twice": np.stack([u, u2], 1)}, v_before, v_after)
    assert two.pair_rows[0]["rho_bar"] == pytest.approx(rho) and "rho_bar" not in two.row("twice J2")
    assert two.row("twice J2")["ceiling"]["value"] > tw["ceiling"]["value"]  # two pairs raise the ceiling


def test_an_audit_asked_for_more_decisions_audits_further_episodes_of_each_group():
    cfg = audit.AuditConfig(env="CreditToy-v0", questions=2, group_size=3, oracle_rollouts=2, max_new_tokens=3,
                            max_turns=3, indexed_tasks=False, n_boot=20, decisions=8, training_row=False)
    res = audit.run_audit(small_policy(0), cfg)
    assert len(res.oracle) >= 8 and res.questions == 2  # three turns per episode: three episodes at least
    assert set(res.episodes) - {0, 3}  # beyond the first episode of each group
    assert "fewer than" not in audit.format_table(res)
    res.config.decisions = 100  # more than the two groups hold: the header says so
    assert "fewer than the 100 asked for" in audit.format_table(res)


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


def test_an_audit_with_no_mixed_group_says_there_is_nothing_to_audit(monkeypatch):
    cfg = audit.AuditConfig(env="CreditToy-v0", questions=2, group_size=3, oracle_rollouts=2, max_new_tokens=3,
                            max_turns=3, indexed_tasks=False, mixed_only=True)
    monkeypatch.setattr(audit, "mixed_groups", lambda utilities, group_size: [])  # every group ends alike
    with pytest.raises(audit.NothingToAudit, match="nothing to audit: none of the 2 questions"):
        audit.run_audit(small_policy(0), cfg)


def _record_rollout_seeds(monkeypatch):
    """Wrap the audit's rollout calls; return the list they fill with one entry per rollout:
    ``(stream, seed, episode, turn, branch, replica)``, ``stream`` naming the audit's call it came from
    (``factual``, ``values #n``, ``twins #n``, ``train``, ``branches``), ``seed`` the fresh noise seed of an independent
    rollout or, for a coupled twin, ``("coupled", factual seed)``."""
    from twice_envs.agents.rollout import episodes, twins

    seen, stream = [], ["?"]
    calls = {"values": 0, "twins": 0}

    def tagged(fn, name):
        def wrapper(*args, **kwargs):
            before = stream[0]
            if name in calls:
                calls[name] += 1
                stream[0] = f"{name} #{calls[name]}"
            else:
                stream[0] = name
            try:
                return fn(*args, **kwargs)
            finally:
                stream[0] = before
        return wrapper

    real_start = episodes.start_twins

    def start(policy, factual, requests, **kwargs):
        for r in requests:
            fact = factual[r.episode].trajectory["noise"]["episode_seed"]
            seed = ("coupled", fact) if r.coupled else int(r.noise_seed)
            seen.append((stream[0], seed, r.episode, r.turn, r.branch, r.alternative is not None))
        return real_start(policy, factual, requests, **kwargs)

    real_rollout = audit.rollout

    def factual(*args, **kwargs):
        eps = real_rollout(*args, **kwargs)
        seen.extend(("factual", e.trajectory["noise"]["episode_seed"], k, 0, 0, False) for k, e in enumerate(eps))
        return eps

    monkeypatch.setattr(episodes, "start_twins", start)
    monkeypatch.setattr(twins, "start_twins", start)
    monkeypatch.setattr(audit, "rollout", factual)
    monkeypatch.setattr(audit, "branch_rollouts", tagged(audit.branch_rollouts, "values"))
    monkeypatch.setattr(audit, "run_twins", tagged(audit.run_twins, "twins"))
    monkeypatch.setattr(audit, "run_credit", tagged(audit.run_credit, "train"))
    monkeypatch.setattr(twins, "run_branches", tagged(twins.run_branches, "branches"))
    return seen


def test_audit_rollouts_never_share_a_seed(monkeypatch):
    """Every fresh noise seed of the audit (oracle, VinePPO, CRR, Twice's independent pairs, the
    training-time row) is used by one stream at one decision only, and never by a factual episode;
    the only seed shared by several rollouts is an independent pair's, by its replica and its twins."""
    seen = _record_rollout_seeds(monkeypatch)
    cfg = audit.AuditConfig(env="CreditToy-v0", questions=2, group_size=3, oracle_rollouts=3, max_new_tokens=3,
                            max_turns=3, indexed_tasks=False, pairs=(1, 2), vine_k=(2,), n_boot=20)
    audit.run_audit(small_policy(0), cfg)
    streams = {s for s, *_ in seen}
    assert {"factual", "values #1", "values #2", "twins #1", "twins #2", "train"} <= streams
    by_seed = {}
    for s, seed, i, t, branch, replica in seen:
        if not isinstance(seed, tuple):
            by_seed.setdefault(seed, []).append((s, i, t, branch, replica))
    shared = {seed: uses for seed, uses in by_seed.items() if len(uses) > 1}
    for seed, uses in shared.items():
        assert len({(s, i, t) for s, i, t, _, _ in uses}) == 1, f"seed {seed} used by {uses}"
        # one independent pair: its replica of the factual turn and its twins (distinct branches)
        twins_of_pair = [b for *_, b, rep in uses if not rep]
        assert sum(rep for *_, rep in uses) == 1 and len(set(twins_of_pair)) == len(twins_of_pair), uses
    assert shared, "the independent pairs of the diagnostic row share a seed within each pair"
    # coupled twins read their factual episode's seed, never a fresh one; an episode grown from a boundary
    # (methods that grow the batch) is factual, on the fresh seed it grew on
    factual_seeds = {seed for s, seed, *_ in seen if s in ("factual", "branches")}
    assert "branches" in streams
    assert {seed[1] for _, seed, *_ in seen if isinstance(seed, tuple)} <= factual_seeds


def _resolution_result(se):
    oracle = np.array([0.3, -0.2, 0.1, 0.0, 0.4, -0.1])
    credit = {"grpo": oracle * 0.5, "twice J1": oracle + 0.1}
    return scoring.summarize_audit(audit.AuditConfig(n_boot=20), oracle, np.arange(6), np.zeros(6, int), credit,
                                 {"grpo": 0, "twice J1": 10}, {"grpo": 0, "twice J1": 1}, {}, oracle + 0.5,
                                 np.full(6, 0.5), oracle_se=se)


def test_the_table_says_when_the_oracle_cannot_resolve_the_threshold(tmp_path):
    assert audit.AuditConfig().oracle_rollouts == 64
    noisy = _resolution_result([0.04, 0.06, 0.07, 0.08, 0.09, 0.2])  # median 0.075 > 0.05
    r = noisy.oracle_resolution()
    assert r["median_se"] == pytest.approx(0.075) and r["p90_se"] == pytest.approx(np.percentile(noisy.oracle_se, 90))
    assert r["threshold"] == 0.05 and r["resolves"] is False
    text = audit.format_table(noisy)
    assert "oracle SE of A*: median 0.075, 90th percentile 0.145; threshold |A*| >= 0.05" in text
    assert "cannot resolve the |A*| >= 0.05 threshold at this size" in text
    audit.write_outputs(noisy, tmp_path)
    assert json.loads((tmp_path / "audit.json").read_text())["oracle_se"] == {
        "median_se": pytest.approx(0.075), "p90_se": pytest.approx(0.145), "threshold": 0.05, "resolves": False}
    sharp = _resolution_result([0.01, 0.02, 0.02, 0.03, float("nan"), 0.2])  # NaN: a state with one rollout
    assert sharp.oracle_resolution()["median_se"] == pytest.approx(0.02) and sharp.oracle_resolution()["resolves"]
    assert "median 0.020" in audit.format_table(sharp) and "cannot resolve" not in audit.format_table(sharp)
    # exact oracles (no SE given) print no SE line; one rollout per state says it cannot estimate one
    assert "oracle SE" not in audit.format_table(_resolution_result(None))
    assert "not estimated" in audit.format_table(_resolution_result([float("nan")] * 6))


def _coupled_case(n_boot=200):
    """Four decisions tiled 25 times, one audited episode each: U, a coupled twin's U' and an independent
    counterfactual's U' (D coupled (1, 0, 0, 0): Var 3/16; D independent (1, -1, 0, 1): Var 11/16), the oracle
    A* = (0.5, -0.5, 0.3, 0.2) and an update credit of the opposite sign to the twin credit."""
    u, u_twin, u_indep = np.array([1.0, 0, 1, 1]), np.array([0.0, 0, 1, 1]), np.array([0.0, 1, 1, 0])
    oracle = np.tile([0.5, -0.5, 0.3, 0.2], 25)
    u, u_twin, u_indep = np.tile(u, 25), np.tile(u_twin, 25), np.tile(u_indep, 25)
    credit = {"grpo": np.tile([0.4, 0.4, -0.6, -0.2], 25), "twice J1": u - u_twin, "crr J1": u - u_indep,
              "twice": -(u - u_twin)}
    aux = {"grpo": 0, "twice J1": 100, "crr J1": 120, "twice": 40}
    pairs_of = {"grpo": 0, "twice J1": 1, "crr J1": 1, "twice": 0}
    self_twin = np.tile([False, True, True, False], 25)
    return scoring.summarize_audit(audit.AuditConfig(n_boot=n_boot), oracle, np.arange(100), np.zeros(100, int), credit,
                                 aux, pairs_of, {"twice": np.stack([u, u_twin], 1), "crr": np.stack([u, u_indep], 1)},
                                 np.full(100, 0.5), np.full(100, 0.5), policy_tokens=200, questions=100,
                                 diagnostic=["grpo", "twice J1", "crr J1"], self_twin=self_twin)


def test_the_audit_prints_the_lower_bound_and_what_coupling_is_worth(tmp_path):
    res = _coupled_case()
    c = res.coupling
    assert c["oracle"] == "estimated" and c["decisions"] == 100
    assert c["lower_bound"]["value"] == pytest.approx(1 - (3 / 16) / (11 / 16))  # 8/11, by hand
    assert 0 < c["lower_bound"]["lo"] < 8 / 11 < c["lower_bound"]["hi"]
    assert c["rho_bar"]["value"] == pytest.approx(0.5)  # centred on V = 0.5: (.5 -.5 .5 .5).(-.5 -.5 .5 .5) / 1
    assert c["tie_share_coupled"]["value"] == 0.75 and c["self_twin_share"]["value"] == 0.5
    worth = c["worth"]["lower_bound"]
    assert worth["value"] == pytest.approx(11 / 3) and worth["lo"] == pytest.approx(1 / (1 - c["lower_bound"]["lo"]))
    text = audit.format_table(res)
    assert "oracle-free lower bound 1 - Var(D coupled) / Var(D independent): 0.727 [" in text
    assert "rho-bar (estimated oracle): 0.5 [" in text
    assert f"coupling is worth about 3.67 [{worth['lo']:.3g}, {worth['hi']:.3g}] times the budget of independent " \
           "counterfactuals here" in text
    assert "ties (D = 0) %: coupled 75 [" in text and "self-twins % 50 [" in text
    audit.write_outputs(res, tmp_path)
    doc = json.loads((tmp_path / "audit.json").read_text())
    assert doc["coupling"]["lower_bound"]["value"] == pytest.approx(8 / 11) and doc["coupling"]["line"] == c["line"]


def test_the_audits_headline_table_is_the_raw_credit(tmp_path):
    res = _coupled_case(n_boot=50)
    text = audit.format_table(res)
    lines = text.splitlines()
    head = lines.index(next(ln for ln in lines if ln.startswith("published credit table (Table 2)")))
    sup = lines.index(next(ln for ln in lines if ln.startswith("supplementary: update credit")))
    twice = next(ln for ln in lines[head:sup] if ln.startswith("Twice "))
    # one coupled twin, D = (1, 0, 0, 0): never wrong (its ties are never wrong), zero at three in four decisions
    cells = twice.split()
    assert cells[1:4] == ["twice", "J1", "1.50x"] and cells[4:7] == ["0", "[0,", "0]"]
    assert cells[7] == "75" and cells[10:13] == ["0", "[0,", "0]"]  # zero share, then non-zero wrong-sign
    # the update's advantage (A_traj + omega A_hat / sigma_hat) has the opposite sign: it sits below, labelled
    update = next(ln for ln in lines[sup:] if ln.startswith("twice "))
    cells = update.split()
    assert cells[2] == "25" and cells[8:11] == ["100", "[100,", "100]"]  # wrong wherever it is not zero
    audit.write_outputs(res, tmp_path)
    doc = json.loads((tmp_path / "audit.json").read_text())
    assert {r["method"]: r["table"] for r in doc["rows"]} == {"grpo": "published", "twice J1": "published",
                                                              "crr J1": "published", "twice": "update"}
    assert {e["method"]: e["row"] for e in doc["table2"]}["twice"] == "twice J1"


def test_audited_episodes_add_further_episodes_of_each_group_up_to_the_decisions_asked_for():
    turns = [2, 1, 3, 2, 2, 2, 1, 1, 1]  # three groups of three
    assert audit.audited_episodes([0, 3, 6], turns, 3) == [0, 3, 6]  # 5 decisions: the first of each group
    assert audit.audited_episodes([0, 3, 6], turns, 3, decisions=6) == [0, 1, 3, 6]
    assert audit.audited_episodes([0, 3, 6], turns, 3, decisions=9) == [0, 1, 3, 4, 6, 7]
    assert audit.audited_episodes([0, 3, 6], turns, 3, decisions=100) == list(range(9))  # all there is
    assert audit.audited_episodes([3], turns, 3, decisions=5) == [3, 4, 5]  # mixed groups only: their episodes


@pytest.mark.parametrize("args, says", [
    (["--questions", "501"], "--split 'dev' / --questions 501: index must be an int in 0..499 for split 'dev'"),
    (["--split", "nope"], "--split 'nope' / --questions 16: split 'nope' not found"),
    (["--decisions", "-1"], "--decisions >= 0"),
])
def test_the_audit_refuses_questions_the_split_does_not_hold(args, says, capsys):
    with pytest.raises(SystemExit):
        cli.audit_main(["--checkpoint", "tiny", "--env", "SearchQA-v0", "--out", "unused"] + args)
    assert says in capsys.readouterr().err
