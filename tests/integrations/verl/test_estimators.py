"""The registered verl estimators are the project's own methods on the same episodes, chosen by their needs."""

import numpy as np
import pytest

pytest.importorskip("verl")
torch = pytest.importorskip("torch")

from omegaconf import OmegaConf  # noqa: E402
from verl.trainer.ppo.core_algos import get_adv_estimator_fn  # noqa: E402

from twice_envs.agents.credit import gigpo, twice  # noqa: E402
from twice_envs.agents.credit.registry import get_method  # noqa: E402
from twice_envs.agents.types import EpisodeRecord, TurnRecord  # noqa: E402
from twice_envs.integrations.episodes import response_row  # noqa: E402
from twice_envs.integrations.verl import estimators as est  # noqa: E402
from twice_envs.integrations.verl import plugin  # noqa: E402,F401  (registers)
from twice_envs.keys import NoiseKey  # noqa: E402


def _batch(seed=0, groups=4, G=5):
    """Random episodes: 1-4 turns of 1-5 tokens, 0-3 observation tokens, shared anchors, some invalid turns."""
    rng = np.random.default_rng(seed)
    eps = []
    for g in range(groups):
        for j in range(G):
            n = int(rng.integers(1, 5))
            turns = [TurnRecord(list(rng.integers(5, 50, int(rng.integers(1, 6)))), [0.0] * 0, f"a{t}",
                                NoiseKey(seed, t, 0), obs=f"s{int(rng.integers(0, 2))}",
                                obs_token_ids=list(rng.integers(50, 60, int(rng.integers(0, 4)))),
                                reward=float(rng.integers(0, 2)) * (t == n - 1), invalid=bool(rng.random() < 0.2))
                     for t in range(n)]
            for t in turns:
                t.logprobs = [-0.5] * len(t.token_ids)
            eps.append(EpisodeRecord("Hand-v0", g, {}, group=g, prompt_ids=[1, 2, 3], turns=turns,
                                     utility=sum(t.reward for t in turns), trajectory={"observations": ["start"]}))
    return eps


def _verl_inputs(episodes, pad=3):
    rows = [response_row(ep) for ep in episodes]
    T = max(len(r.response_ids) for r in rows) + pad
    rewards = torch.zeros(len(rows), T)
    mask = torch.zeros(len(rows), T, dtype=torch.int64)
    extra = []
    for b, (ep, r) in enumerate(zip(episodes, rows)):
        n = len(r.response_ids)
        mask[b, :n] = torch.tensor(r.mask)
        rewards[b, n - 1] = ep.utility  # verl puts the score on the last response token
        anchors = ["start"] + [t.obs for t in ep.turns[:-1]]
        extra.append({est.TURN_OF_TOKEN: r.turn_of_token,
                      est.TURN_REWARDS: [t.reward for t in ep.turns], est.TURN_INVALID: [t.invalid for t in ep.turns],
                      est.ANCHORS: anchors})
    uid = np.array([f"uid-{ep.group}" for ep in episodes], dtype=object)
    return rewards, mask, uid, extra, rows


def _expected_tokens(rows, per_turn, T):
    out = torch.zeros(len(rows), T)
    for b, r in enumerate(rows):
        for k, t in enumerate(r.turn_of_token):
            if t >= 0:
                out[b, k] = torch.tensor(per_turn[b][t], dtype=torch.float32)
    return out


def _twin_credit(episodes, seed=1):
    """A real twin-credit pass: warm-up branch coins and twins with made-up outcomes."""
    cfg = twice.TwiceConfig()
    rng = np.random.default_rng(seed)
    plan = twice.plan_branches(episodes, cfg, None, rng, update=0)
    twins = []
    for i, t in plan.branched_decisions:
        tw = EpisodeRecord("Hand-v0", 0, {}, twin_of=(i, t), branch=1, utility=float(rng.integers(0, 2)))
        twins.append(tw)
    credit = twice.twin_credit(episodes, twins, plan, [True] * len(twins), cfg)
    a_hat = [np.zeros(len(ep.turns)) for ep in episodes]
    for (i, t), a in zip(plan.index, credit.a_hat):
        a_hat[i][t] = a
    assert any(a.any() for a in a_hat), "the test batch has no twin credit"
    return plan, credit, a_hat


@pytest.mark.parametrize("name", ["twice", "crr", "crr-added", "vineppo"])
def test_a_method_that_asks_for_rollouts_spreads_the_twin_phases_credit(name):
    """Break: spreading turn t's credit on turn t + 1's tokens, or leaving a method out of the table."""
    episodes = _batch()
    plan, credit, _ = _twin_credit(episodes)
    per_turn = twice.combine(episodes, plan.index, credit.a_hat, twice.TwiceConfig())
    rewards, mask, uid, extra, rows = _verl_inputs(episodes)
    for ef, adv in zip(extra, per_turn):
        ef[est.TURN_CREDIT] = [float(a) for a in adv]
    assert est.runs_phase(name)
    adv, ret = get_adv_estimator_fn(name)(token_level_rewards=rewards, response_mask=mask, index=uid,
                                          config=OmegaConf.create({}), extra_fields=extra)
    want = _expected_tokens(rows, per_turn, mask.shape[1])
    assert torch.equal(adv, want) and torch.equal(ret, want)
    assert torch.all(adv[mask == 0] == 0)


def test_without_the_twin_phase_a_rollout_method_is_refused():
    """verl's own compute_advantage (stock trainer) reaches the estimator without the twin phase's credit."""
    from verl.protocol import DataProto
    from verl.trainer.ppo.ray_trainer import compute_advantage

    episodes = _batch(4)
    rewards, mask, uid, _, _ = _verl_inputs(episodes)
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask},
                               non_tensors={"uid": uid})
    with pytest.raises(ValueError, match="twice estimator needs the twin phase's per-turn credit.*trainer_mode"):
        compute_advantage(data, adv_estimator="twice", config=OmegaConf.create({}))


def test_settings_come_from_the_algorithm_section_of_the_methods_flag_prefix():
    """Twice and CRR read ``algorithm.twice`` (their flags are ``--twice.*``), GiGPO ``algorithm.gigpo``."""
    algo = OmegaConf.create({"twice": {"omega": 0.5, "sigma_min": 0.3}, "gigpo": {"omega": 2.0}})
    assert est.method_settings(get_method("crr"), algo) == twice.TwiceConfig(omega=0.5, sigma_min=0.3)
    assert est.method_settings(get_method("gigpo"), algo) == gigpo.GiGPOConfig(omega=2.0)
    assert est.method_settings(get_method("grpo"), algo) is None
    with pytest.raises(ValueError, match="unknown settings"):
        est.method_settings(get_method("twice"), OmegaConf.create({"twice": {"omgea": 1}}))


def test_registered_gigpo_equals_gigpo_credit():
    episodes = _batch(5)
    expected = gigpo.gigpo_credit(episodes)
    assert any(np.any(a != 0) for a in gigpo.step_term(episodes)), "no step groups in the test batch"
    rewards, mask, uid, extra, rows = _verl_inputs(episodes)
    adv, _ = get_adv_estimator_fn("gigpo")(token_level_rewards=rewards, response_mask=mask, index=uid,
                                           config=OmegaConf.create({}), extra_fields=extra)
    assert torch.equal(adv, _expected_tokens(rows, expected, mask.shape[1]))
    with pytest.raises(ValueError, match="trainer_mode"):
        get_adv_estimator_fn("gigpo")(rewards, mask, uid, None)


@pytest.mark.parametrize("env_id, given, mode, penalty", [
    ("SearchQA-v0", {}, "mean_std_norm", 0.01),
    ("WebShop-v0", {}, "mean_norm", 0.1),
    ("ALFWorld-v0", {"gamma": 0.9}, "mean_std_norm", 0.1),
    ("SearchQA-v0", {"mode": "mean_norm"}, "mean_std_norm", 0.01),
    ("SearchQA-v0", {"mode": "mean_norm", "reference": False}, "mean_norm", 0.1),
    ("SearchQA-v0", {"invalid_penalty": 0.5, "reference": False}, "mean_norm", 0.5),
    ("", {}, gigpo.GiGPOConfig().mode, gigpo.GiGPOConfig().invalid_penalty),
])
def test_gigpo_takes_the_envs_reference_settings_unless_told_not_to(env_id, given, mode, penalty):
    """The rows' env picks GiGPO's reference mode and penalty; ``algorithm.gigpo.reference=false`` keeps those
    set under algorithm.gigpo."""
    episodes = _batch(5)
    rewards, mask, uid, extra, rows = _verl_inputs(episodes)
    for ef in extra:
        ef[est.ENV_ID] = env_id
    config = OmegaConf.create({"gigpo": given})
    cfg = gigpo.config_for(env_id, est.method_settings(get_method("gigpo"), config))
    assert (cfg.mode, cfg.invalid_penalty) == (mode, penalty) and cfg.gamma == given.get("gamma", 0.95)
    adv, _ = get_adv_estimator_fn("gigpo")(token_level_rewards=rewards, response_mask=mask, index=uid,
                                           config=config, extra_fields=extra)
    assert torch.equal(adv, _expected_tokens(rows, gigpo.gigpo_credit(episodes, cfg), mask.shape[1]))


def test_a_method_registered_in_a_test_reaches_verls_registry():
    """One registration is all it takes: ``register()`` puts the method into verl's own table,
    and verl's GRPO keeps its own estimator."""
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY

    from twice_envs.agents.credit.registry import CreditResult, register_credit, unregister_credit

    @register_credit("ones-test", description="credit 1 on every turn (a test method)")
    def ones(episodes, rollouts, ctx):
        return CreditResult([np.ones(len(ep.turns)) for ep in episodes])

    try:
        est.register()
        episodes = _batch()
        rewards, mask, uid, extra, rows = _verl_inputs(episodes)
        adv, _ = get_adv_estimator_fn("ones-test")(token_level_rewards=rewards, response_mask=mask, index=uid,
                                                  config=OmegaConf.create({}), extra_fields=extra)
        want = _expected_tokens(rows, [np.ones(len(ep.turns)) for ep in episodes], mask.shape[1])
        assert torch.equal(adv, want)
        assert ADV_ESTIMATOR_REGISTRY["grpo"].__module__.startswith("verl.")
    finally:
        unregister_credit("ones-test")
        ADV_ESTIMATOR_REGISTRY.pop("ones-test", None)
