"""IGPO and Twice + IGPO: information-gain turn rewards on hand-computed cases, the gold answers of the
envs, the lab's and the LLM's answer probabilities, and the refusal of envs without a gold answer."""

import math

import numpy as np
import pytest

import twice_envs
from twice_envs.agents.credit import twice
from twice_envs.agents.credit.igpo import IGPOConfig, igpo_credit, information_gain, turn_rewards
from twice_envs.agents.credit.registry import CreditContext, Runners, check_env, get_method
from twice_envs.agents.lab import toy
from twice_envs.agents.lab.runner import LabAuditConfig, lab_runners, lab_step_fns, run_lab_audit
from twice_envs.agents.lab.search_toy import search_toy_policy
from twice_envs.agents.lab.text_lab import text_lab_policy
from twice_envs.agents.types import EpisodeRecord, TurnRecord
from twice_envs.keys import NoiseKey


def _episode(texts, utility=0.0, group=0, env_id="SearchToy-v0"):
    turns = [TurnRecord([1], [0.0], x, NoiseKey(0, t)) for t, x in enumerate(texts)]
    return EpisodeRecord(env_id, 0, {}, group=group, turns=turns, utility=utility)


# --------------------------------------------------------------------------- the formulas by hand


def test_information_gain_is_the_change_of_probability_over_the_non_final_turns():
    # p_0 .. p_3 of a 3-turn episode: turns 1 and 2 gain 0.3 - 0.1 and 0.2 - 0.3; p_3 is not used
    assert np.allclose(information_gain([0.1, 0.3, 0.2, 0.9]), [0.2, -0.1])
    assert np.allclose(information_gain([0.1, 0.3, 0.2, 0.0]), [0.2, -0.1])
    assert information_gain([0.4, 0.7]).size == 0  # one turn: its only reward is the outcome
    with pytest.raises(ValueError):
        information_gain([0.5])


def test_turn_rewards_put_the_outcome_at_the_last_turn_and_weight_the_gains():
    ep = _episode(["search q0", "search q1", "answer"], utility=1.0)
    assert np.allclose(turn_rewards(ep, [0.1, 0.3, 0.2, 0.9]), [0.2, -0.1, 1.0])
    assert np.allclose(turn_rewards(ep, [0.1, 0.3, 0.2, 0.9], IGPOConfig(ig_weight=0.5)), [0.1, -0.05, 1.0])
    with pytest.raises(ValueError, match="4 answer probabilities"):
        turn_rewards(ep, [0.1, 0.3, 0.2])


def test_igpo_normalises_all_turn_rewards_of_a_group_jointly_then_sums_discounted():
    a = _episode(["search q0", "search q1", "answer"], utility=1.0)  # rewards 0.2, -0.1, 1.0
    b = _episode(["search q3", "answer"], utility=0.0)  # rewards 0.05 - 0.1 = -0.05, 0.0
    probs = [[0.1, 0.3, 0.2, 0.9], [0.1, 0.05, 0.5]]
    # the five rewards: sum 1.05, mean 0.21; squared deviations 0.0001 0.0961 0.6241 0.0676 0.0441 -> var 0.1664
    std = math.sqrt(0.1664)
    za = np.array([0.2 - 0.21, -0.1 - 0.21, 1.0 - 0.21]) / std
    zb = np.array([-0.05 - 0.21, 0.0 - 0.21]) / std
    out = igpo_credit([a, b], probs, IGPOConfig(gamma=0.5, eps=0.0))
    assert np.allclose(out[0], [za[0] + 0.5 * za[1] + 0.25 * za[2], za[1] + 0.5 * za[2], za[2]])
    assert np.allclose(out[1], [zb[0] + 0.5 * zb[1], zb[1]])
    # the default gamma (1): plain sums of the normalised rewards from the turn on
    out1 = igpo_credit([a, b], probs, IGPOConfig(eps=0.0))
    assert np.allclose(out1[0], [za.sum(), za[1:].sum(), za[2]])
    # another task's episodes are normalised apart: a second group leaves the first one's advantages alone
    c = _episode(["answer"], utility=5.0, group=1)
    d = _episode(["answer"], utility=3.0, group=1)
    out2 = igpo_credit([a, b, c, d], probs + [[0.2, 0.9], [0.3, 0.1]], IGPOConfig(gamma=0.5, eps=0.0))
    assert np.allclose(out2[0], out[0]) and np.allclose(out2[1], out[1])
    assert np.allclose([out2[2][0], out2[3][0]], [1.0, -1.0])


def test_a_group_whose_rewards_all_tie_gets_zero():
    a, b = _episode(["answer"], utility=1.0), _episode(["answer"], utility=1.0)
    assert [x.tolist() for x in igpo_credit([a, b], [[0.2, 0.5], [0.7, 0.1]])] == [[0.0], [0.0]]


def test_igpo_needs_the_answer_probabilities_from_its_caller():
    m = get_method("igpo")
    assert m.needs == {"answer_probs"} and m.display == "IGPO" and m.config is IGPOConfig and "learn" in m.benches
    assert get_method("twice-igpo").needs == {"answer_probs", "twins"}
    with pytest.raises(ValueError, match=r"needs the gold answer's probabilities \(need 'answer_probs'\)"):
        m([_episode(["answer"])], CreditContext())


def test_twice_igpo_is_igpo_plus_the_twin_terms():
    policy = search_toy_policy()
    eps, envs = toy.toy_rollouts(policy, 6, 4, noise_seed=3)

    def ctx(config=twice.TwiceConfig(beta=0.7)):
        tf, vf = lab_runners(envs)
        return CreditContext(policy=policy, rng=np.random.default_rng(5), config=config,
                             runners=Runners(twins=tf, values=vf, answer_probs=toy.answer_probs))

    res = get_method("twice-igpo")(eps, ctx())
    terms = twice.twin_terms(eps, ctx())
    base = igpo_credit(eps, toy.answer_probs(policy, eps))
    assert any(np.any(t != 0) for t in terms.advantages)  # some decisions were branched
    for got, b, t in zip(res.advantages, base, terms.advantages):
        assert np.allclose(got, b + t)
    assert res.predictor_state is not None and res.aux_tokens == terms.aux_tokens > 0
    plain = get_method("igpo")(eps, ctx(None))
    assert all(np.allclose(p, b) for p, b in zip(plain.advantages, base))


# --------------------------------------------------------------------------- envs without a gold answer


@pytest.mark.parametrize("env", ["ALFWorld-v0", "WebShop-v0", "CreditToy-v0"])
@pytest.mark.parametrize("method", ["igpo", "twice-igpo"])
def test_check_env_refuses_envs_without_a_gold_answer(method, env):
    with pytest.raises(ValueError, match=rf"'{method}' needs each task's gold answer.*{env}"):
        check_env(method, env)


@pytest.mark.parametrize("env", ["SearchQA-v0", "SearchToy-v0", "TextLab-v0"])
def test_check_env_accepts_envs_with_a_gold_answer(env):
    check_env("igpo", env)


def test_training_igpo_on_webshop_fails_before_any_rollout(tmp_path):
    from twice_envs.agents.training.config import TrainConfig
    from twice_envs.agents.training.trainer import train

    class NoPolicy:
        def __getattr__(self, name):
            raise AssertionError(f"the policy was used ({name}) before the env was refused")

    with pytest.raises(ValueError, match="'igpo' needs each task's gold answer.*WebShop-v0"):
        train(TrainConfig(env="WebShop-v0", method="igpo", out_dir=str(tmp_path / "run")), policy=NoPolicy())
    assert not (tmp_path / "run").exists()


def test_the_lab_audit_on_credittoy_leaves_gold_answer_methods_out_with_a_reason(capsys):
    res = run_lab_audit(LabAuditConfig(env="CreditToy-v0", groups=6, group_size=3, pairs=(1,), vine_k=(1,),
                                       warmup_batches=1, n_boot=20))
    err = capsys.readouterr().err
    for name in ("igpo", "twice-igpo"):
        assert name not in res.credit
        assert f"lab audit: {name} left out: credit method '{name}' needs each task's gold answer" in err
    assert "grpo" in res.credit and "twice" in res.credit


# --------------------------------------------------------------------------- gold answers of the envs


def test_envs_with_a_gold_answer_name_it():
    env = twice_envs.make("SearchToy-v0")
    env.reset(seed=0)
    assert env.unwrapped.has_gold_answer and env.unwrapped.gold_answers() == ("answer",)
    lab = twice_envs.make("TextLab-v0")
    lab.reset(seed=0)
    assert lab.unwrapped.gold_answers() == ("answer",) and lab.unwrapped.answer_action("answer") == "answer"
    toy_env = twice_envs.make("CreditToy-v0")
    assert not toy_env.unwrapped.has_gold_answer
    with pytest.raises(NotImplementedError):
        toy_env.unwrapped.gold_answers()


def test_searchqa_gold_answers_are_the_questions_golden_answers():
    env = twice_envs.make("SearchQA-v0")
    env.reset(seed=0, options={"index": 3})
    u = env.unwrapped
    assert u.has_gold_answer and u.gold_answers() == tuple(u.task.golden_answers) and u.gold_answers()
    gold = u.gold_answers()[0]
    assert u.answer_action(gold) == f"<answer> {gold} </answer>"
    _, reward, done, _, info = env.step(u.answer_action(gold))
    assert done and info["em"] == 1.0  # the formatted gold answer is a correct final answer


# --------------------------------------------------------------------------- the lab's answer probability


def test_lab_answer_probability_is_the_policys_probability_of_answering_at_each_state():
    policy = search_toy_policy()
    Q = policy.config.queries
    ep = _episode(["search q0", "search q1", "answer"])
    p = toy.answer_probs(policy, [ep])[0]
    assert p.shape == (4,)
    # hand-built states (found bitmask, previous action): none found, no previous action; then facts 0 and 1
    assert p[0] == policy.table[0b000, Q + 1, Q]
    assert p[1] == policy.table[0b001, 0, Q]
    assert p[2] == policy.table[0b011, 1, Q]
    assert p[3] == policy.table[0b011, Q, Q]
    # the same states as the policy reads them from a live env
    env = twice_envs.make("SearchToy-v0", **policy.env_kwargs)
    env.reset(seed=0)
    assert policy.action_probs(policy.state(env))[Q] == p[0]
    for k, turn in enumerate(ep.turns[:2], start=1):
        env.step(turn.text)
        assert policy.action_probs(policy.state(env))[Q] == p[k]
    assert lab_step_fns([]).answer_probs is toy.answer_probs


def test_text_lab_answer_probability_matches_the_live_env_states():
    policy = text_lab_policy()
    eps, _ = toy.toy_rollouts(policy, 2, 3, noise_seed=4)
    probs = toy.answer_probs(policy, eps)
    for ep, p in zip(eps, probs):
        env = twice_envs.make(policy.env_id, **policy.env_kwargs)
        env.reset(seed=0, options=dict(ep.options))
        assert len(p) == len(ep.turns) + 1
        assert np.isclose(policy.action_probs(policy.state(env))[policy.answer_action], p[0])
        for k, turn in enumerate(ep.turns[:-1], start=1):
            env.step(turn.text)
            assert np.isclose(policy.action_probs(policy.state(env))[policy.answer_action], p[k])


def test_credittoy_policy_has_no_gold_answer():
    policy = toy.toy_policy()
    eps, _ = toy.toy_rollouts(policy, 1, 2, noise_seed=0)
    with pytest.raises(ValueError, match="no gold answer"):
        toy.answer_probs(policy, eps)


# --------------------------------------------------------------------------- the LLM's answer probability


def test_llm_answer_probability_is_the_geometric_mean_of_the_answer_tokens():
    import torch

    from tests.agents._tiny import tiny_policy
    from twice_envs.agents.rollout.context import turn_context
    from twice_envs.agents.rollout.episodes import Task, rollout
    from twice_envs.agents.sampling.policy import SamplingConfig
    from twice_envs.agents.training.gold_answer import answer_probs

    policy = tiny_policy()
    eps = rollout(policy, "SearchToy-v0", [Task(0)], group_size=2, sampling=SamplingConfig(max_new_tokens=4),
                  max_turns=3, noise_seed=1)
    for ep in eps:
        assert ep.info["gold_answers"] == ["answer"] and ep.info["gold_actions"] == ["answer"]
        assert EpisodeRecord.from_json(ep.to_json()).info["gold_actions"] == ["answer"]
    probs = answer_probs(policy, eps, batch_size=3)
    assert [len(p) for p in probs] == [len(ep.turns) + 1 for ep in eps]
    ep = eps[0]
    answer = policy.tokenizer.encode("answer", add_special_tokens=False)
    for k in (0, 1):
        ctx = turn_context(ep, k)
        with torch.no_grad():
            logits = policy.model(input_ids=torch.tensor([ctx + answer])).logits[0].double()
        logp = torch.log_softmax(logits, -1)
        direct = math.exp(np.mean([float(logp[len(ctx) - 1 + j, a]) for j, a in enumerate(answer)]))
        assert probs[0][k] == pytest.approx(direct, rel=1e-5)
    assert all(np.all((p > 0) & (p < 1)) for p in probs)
