"""PPO credit: turn-level GAE on hand-computed cases, the order of reading and fitting the critic,
PPO + twin credit, and the lab critic against exact values."""

import numpy as np
import pytest

from twice_envs.agents.credit import ppo, twice
from twice_envs.agents.credit.registry import CreditContext, Runners, get_method
from twice_envs.agents.credit.twice import TwiceConfig
from twice_envs.agents.credit.vineppo import whiten
from twice_envs.agents.lab import toy
from twice_envs.agents.lab.critic import LabCritic
from twice_envs.agents.lab.runner import LabAuditConfig, lab_policy, lab_runners, update_credit
from twice_envs.agents.types import EpisodeRecord, TurnRecord


def _episode(rewards, utility=None, group=0):
    turns = [TurnRecord([1], [0.0], "a", (0, t, 0, 0, 0), reward=r) for t, r in enumerate(rewards)]
    return EpisodeRecord("E", 0, {}, group=group, turns=turns, utility=sum(rewards) if utility is None else utility)


def test_gae_with_gamma_lambda_one_is_the_return_minus_the_value():
    """Break: bootstrapping the last turn from V(s_{T-1}) instead of 0 changes A_2 to 2 - 0.25 + 0.25."""
    r, v = [0.5, 0.0, 2.0], [1.0, 0.5, 0.25]
    adv, ret = ppo.gae(r, v, 1.0, 1.0)
    assert adv == pytest.approx([2.5 - 1.0, 2.0 - 0.5, 2.0 - 0.25])  # G_t - V(s_t)
    assert ret == pytest.approx([2.5, 2.0, 2.0])


def test_gae_with_general_gamma_and_lambda_matches_a_hand_computation():
    """Break: dropping gamma from gamma * lam * A_{t+1} gives A_0 = 0.7 - 0.2 * 0.5 ... (not 0.655)."""
    r, v, g, lam = [1.0, 0.0, 1.0], [0.5, 0.4, 0.3], 0.9, 0.5
    d2 = 1.0 + 0.0 - 0.3              # 0.7
    d1 = 0.0 + 0.9 * 0.3 - 0.4        # -0.13
    d0 = 1.0 + 0.9 * 0.4 - 0.5        # 0.86
    a2 = d2
    a1 = d1 + 0.45 * a2               # 0.185
    a0 = d0 + 0.45 * a1               # 0.94325
    adv, ret = ppo.gae(r, v, g, lam)
    assert adv == pytest.approx([a0, a1, a2])
    assert ret == pytest.approx([a0 + 0.5, a1 + 0.4, a2 + 0.3])


def test_a_graded_utility_puts_its_difference_on_the_last_turn():
    """Break: leaving the rewards as they are makes G_0 = 0.5, not the utility 0.8."""
    ep = _episode([0.2, 0.0, 0.3], utility=0.8)
    r = ppo.turn_rewards(ep)
    assert r == pytest.approx([0.2, 0.0, 0.6])
    _, ret = ppo.gae(r, np.zeros(3))
    assert ret[0] == pytest.approx(0.8) and ret == pytest.approx([0.8, 0.6, 0.6])


class RecordingCritic:
    """A fake critic: fixed values, and a log of the order of calls."""

    def __init__(self, values):
        self.v, self.calls = values, []

    def values(self, episodes):
        self.calls.append("values")
        return [np.array(x, dtype=float) for x in self.v]

    def fit(self, episodes, targets):
        self.calls.append("fit")
        self.targets = [np.array(t) for t in targets]
        self.v = [np.zeros(len(x)) for x in self.v]  # a fit that changes the values
        return {"value_loss": 1.25}


def test_ppo_reads_values_before_it_fits_the_critic_and_whitens():
    """Break: fitting first reads the refitted zeros, so the advantages become the whitened returns."""
    eps = [_episode([0.0, 1.0]), _episode([0.0, 0.0, 0.0])]
    critic = RecordingCritic([[0.5, 0.75], [0.25, 0.5, 0.0]])
    res = get_method("ppo")(eps, CreditContext(critic=critic))
    assert critic.calls == ["values", "fit"]
    raw = [np.array([0.5, 0.25]), np.array([-0.25, -0.5, 0.0])]
    for a, b in zip(res.advantages, whiten(raw)):
        assert a == pytest.approx(b)
    assert [list(t) for t in critic.targets] == [[1.0, 1.0], [0.0, 0.0, 0.0]]
    assert res.stats["value_loss"] == 1.25 and np.isfinite(res.stats["explained_variance"])
    assert res.aux_tokens == 0
    with pytest.raises(ValueError, match="needs a critic"):
        get_method("ppo")(eps, CreditContext())
    assert get_method("ppo").needs == {"critic"} and get_method("ppo-twice").needs == {"critic", "twins"}


def test_ppo_twice_is_ppo_plus_the_twin_terms():
    """Break: adding the twin terms to GRPO's term (Twice's base) instead of PPO's fails the sum."""
    policy = lab_policy("SearchToy-v0")
    eps, envs = toy.toy_rollouts(policy, 8, 5, noise_seed=3)
    tf, vf = lab_runners(envs)

    def ctx(critic, config=TwiceConfig(beta=0.7)):
        return CreditContext(policy=policy, rng=np.random.default_rng(1), noise_seed=5, config=config,
                             runners=Runners(twins=tf, values=vf), critic=critic)

    warm = LabCritic(policy)
    warm.fit(eps, [np.full(len(e.turns), 0.5) for e in eps])  # non-zero values, the same for both runs
    c1, c2 = LabCritic(policy), LabCritic(policy)
    c1.table, c2.table = dict(warm.table), dict(warm.table)
    both = get_method("ppo-twice")(eps, ctx(c1))
    alone = get_method("ppo")(eps, ctx(c2, None))
    terms = twice.twin_terms(eps, ctx(LabCritic(policy)))
    assert any(np.any(t != 0) for t in terms.advantages)
    for a, p, t in zip(both.advantages, alone.advantages, terms.advantages):
        assert a == pytest.approx(p + t)
    assert both.predictor_state is not None and both.aux_tokens == terms.aux_tokens > 0
    assert "explained_variance" in both.stats and "sigma_hat" in both.stats
    assert c1.table == c2.table  # both fitted the critic once, on the same returns


def test_the_lab_critic_converges_to_the_exact_values_on_search_toy():
    """Break: fitting each state towards its first visit's target (not the mean of its visits) leaves
    the frequent states' values far off."""
    policy = lab_policy("SearchToy-v0")
    critic = LabCritic(policy)
    for k in range(12):
        eps, _ = toy.toy_rollouts(policy, 100, 5, noise_seed=100 + k)
        critic.fit(eps, [ppo.gae(ppo.turn_rewards(e), np.zeros(len(e.turns)))[1] for e in eps])
    eps, _ = toy.toy_rollouts(policy, 120, 5, noise_seed=7)
    states = [s for e in eps for s in critic.states(e)]
    fitted = np.concatenate(critic.values(eps))
    exact = np.concatenate([policy.episode_values([policy.action_of(t.text) for t in e.turns]) for e in eps])
    counts = {s: states.count(s) for s in set(states)}
    frequent = np.array([counts[s] >= 50 for s in states])  # states met >= 50 times in 600 episodes
    assert frequent.mean() > 0.4
    assert np.max(np.abs(fitted - exact)[frequent]) < 0.07  # seen: 0.037
    assert np.mean(np.abs(fitted - exact)) < 0.07  # every visit, rare states too; seen: 0.042


def test_the_audit_scores_a_critic_method_with_a_warmed_critic():
    """Break: handing update_credit's step a fresh critic leaves every value at 0."""
    cfg = LabAuditConfig(groups=40, warmup_batches=4)
    policy = lab_policy("SearchToy-v0")
    eps, envs = toy.toy_rollouts(policy, cfg.groups, cfg.group_size, noise_seed=cfg.seed)
    res, adv, _ = update_credit("ppo", policy, eps, envs, [], [], cfg)
    assert res.stats["value_mean"] > 0.2  # the batch's mean return is about 0.5
    assert adv.shape == (sum(len(e.turns) for e in eps),)


def test_the_audit_row_of_a_twin_composition_plans_at_the_budget_after_a_warmed_predictor():
    """Break: running update_credit's step at update 0 under the default warm-up branches at q 0.3, off budget."""
    cfg = LabAuditConfig(groups=40, warmup_batches=2)
    policy = lab_policy("SearchToy-v0")
    eps, envs = toy.toy_rollouts(policy, cfg.groups, cfg.group_size, noise_seed=cfg.seed)
    res, _, _ = update_credit("ppo-twice", policy, eps, envs, [], [], cfg)
    assert res.stats["warmup"] is False and res.predictor_state is not None
    assert res.stats["aux_planned"] == pytest.approx(res.stats["aux_target"], rel=1e-3)
