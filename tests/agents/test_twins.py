"""Running twins for credit: the evidence coin, token ids, self-twins, pairs and coupling."""

from dataclasses import replace

import numpy as np
import pytest

from twice_envs.agents.credit import crr, twice
from twice_envs.agents.credit.twice import BranchPlan, TwiceConfig
from twice_envs.agents.rollout.episodes import Task, rollout
from twice_envs.agents.rollout.twins import run_twins
from twice_envs.agents.sampling.policy import Generation, SamplingConfig

from ._tiny import tiny_policy

SAMPLING = SamplingConfig(temperature=1.0, max_new_tokens=24)
QUESTION = {"split": "dev", "index": 0}  # "Who founded Chitrain Company?" -> Baimist Babraigill
SEARCH = "<search> Chitrain Company </search>"
RIGHT = "<answer> Baimist Babraigill </answer>"
WRONG = "<answer> Nobody </answer>"


class ScriptedPolicy:
    """Writes the turns ``script(turn, branch)`` says; records every request it gets.

    ``spell``: branches whose turns are encoded one character at a time (valid token ids
    that decode to the same text, but not what ``tokenizer.encode`` gives back).
    """

    def __init__(self, script, spell=()):
        self.tokenizer = tiny_policy().tokenizer
        self.script, self.spell, self.requests = script, set(spell), []

    def encode(self, text, spelled):
        if spelled:
            return [i for c in text for i in self.tokenizer.encode(c, add_special_tokens=False)]
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def generate(self, requests, sampling):
        out = []
        for r in requests:
            self.requests.append(r)
            text = self.script(r.noise_key.turn, r.noise_key.branch)
            ids = self.encode(text, r.noise_key.branch in self.spell)
            out.append(Generation(text, ids, [-0.5] * len(ids), 0.3, "stop"))
        return out


def _factual(policy):
    eps = rollout(policy, "SearchQA-v0", [Task(0, QUESTION)], group_size=1, sampling=SAMPLING, noise_seed=3)
    assert [t.text for t in eps[0].turns] == [SEARCH, RIGHT] and eps[0].utility == 1.0
    return eps


def _factual_script(turn):
    return SEARCH if turn == 0 else RIGHT


def test_alternatives_that_end_the_episode_keep_their_outcome_and_skip_the_evidence_coin():
    # Factual: search, then the right answer. Twins answer wrongly at turn 0 (the twin ends,
    # the factual does not) and at turn 1 (both end; both observations are "").
    policy = ScriptedPolicy(lambda t, b: _factual_script(t) if b == 0 else WRONG)
    eps = _factual(policy)
    config = TwiceConfig(q_same=0.25)
    for seed in range(12):
        tw = run_twins(policy, eps, [(0, 0), (0, 1)], config, SAMPLING, np.random.default_rng(seed))
        assert tw.kept == [True, True]
        for rec in tw.records:
            assert not rec.same_evidence and twice.evidence_exponent(rec) == 0
            assert rec.utility == 0.0 and len(rec.turns) == 1  # the outcome from phase 1, nothing continued
        assert tw.aux_tokens == 2 * len(policy.encode(WRONG, False))
        plan = BranchPlan([(0, 0), (0, 1)], np.ones(2), np.zeros(2), np.array([0.5, 0.2]), np.array([True, True]))
        assert twice.twin_credit(eps, tw.records, plan, tw.kept, config).a_hat.tolist() == pytest.approx([2.0, 5.0])


def test_sampled_alternative_token_ids_are_carried_into_the_continuation():
    # the alternative search is spelled one character per token: re-encoding its text gives other ids
    alt = "<search> look right </search>"
    policy = ScriptedPolicy(lambda t, b: alt if (b and t == 0) else _factual_script(t), spell={1})
    eps = _factual(policy)
    policy.requests.clear()
    tw = run_twins(policy, eps, [(0, 0)], TwiceConfig(q_same=0.25), SAMPLING, np.random.default_rng(0))
    rec = tw.records[0]
    spelled = policy.encode(alt, True)
    assert spelled != policy.encode(alt, False)
    assert tw.kept == [True] and not rec.same_evidence and len(rec.turns) == 2
    assert rec.turns[0].token_ids == spelled
    # the model saw its own sampled ids before the twin's next turn
    nxt = [r for r in policy.requests if r.noise_key.turn == 1]
    assert len(nxt) == 1
    assert nxt[0].prompt_ids == rec.prompt_ids + spelled + rec.turns[0].obs_token_ids
    assert tw.aux_tokens == len(spelled) + rec.turns[1].num_tokens


def test_self_twins_are_detected_by_token_ids_not_text():
    # branch 1 repeats the factual search with the factual ids; branch 2 spells the same text
    policy = ScriptedPolicy(lambda t, b: _factual_script(t), spell={2})
    eps = _factual(policy)
    config = TwiceConfig(q_same=1.0, star=2)
    tw = run_twins(policy, eps, [(0, 0)], config, SAMPLING, np.random.default_rng(0))
    same_ids, same_text = tw.records
    assert same_ids.self_twin and len(same_ids.turns) == 1
    assert same_text.turns[0].text == eps[0].turns[0].text and not same_text.self_twin
    assert len(same_text.turns) == 2 and same_text.turns[0].token_ids != eps[0].turns[0].token_ids


def test_without_the_shortcut_identical_alternatives_are_continued_through_the_evidence_coin():
    policy = ScriptedPolicy(lambda t, b: _factual_script(t))
    eps = _factual(policy)
    config = replace(TwiceConfig(q_same=0.25), self_twin_shortcut=False)
    turn_tokens = len(policy.encode(SEARCH, False))
    kept = []
    for seed in range(40):
        tw = run_twins(policy, eps, [(0, 0)], config, SAMPLING, np.random.default_rng(seed))
        rec = tw.records[0]
        assert not rec.self_twin and rec.same_evidence and twice.evidence_exponent(rec) == 1
        kept.append(tw.kept[0])
        if tw.kept[0]:  # continued like any twin: it reproduces the factual episode
            assert [t.token_ids for t in rec.turns] == [t.token_ids for t in eps[0].turns]
            assert rec.utility == eps[0].utility
            assert tw.aux_tokens == eps[0].num_generated_tokens
        else:  # dropped by the coin: only its alternative turn was paid
            assert len(rec.turns) == 1 and tw.aux_tokens == turn_tokens
    # Bern(0.25) over 40 draws: 10 expected; 2..20 is a > 99.9% interval
    assert 2 <= sum(kept) <= 20


def test_independent_pairs_replay_the_factual_turn_on_their_own_seed():
    policy = ScriptedPolicy(lambda t, b: _factual_script(t) if b == 0 else "<search> Baimist </search>")
    eps = _factual(policy)
    seed0 = eps[0].trajectory["noise"]["episode_seed"]
    config = TwiceConfig(q_same=1.0, pairs=3, star=2)
    assert twice.twins_per_decision(config) == 8
    assert twice.twins_per_decision(crr.crr_config(config)) == 6  # counterfactuals need no replicas
    tw = run_twins(policy, eps, [(0, 0)], config, SAMPLING, np.random.default_rng(0), noise_seed=5)
    assert [(r.pair, r.branch) for r in tw.records] == [(j, k) for j in range(3) for k in (1, 2)]
    seeds = {}
    for rec in tw.records:
        seeds.setdefault(rec.pair, set()).update(t.noise_key.episode_seed for t in rec.turns)
        assert tuple(rec.turns[0].noise_key)[1:] == (0, rec.branch, 0, 0)
        assert all(tuple(t.noise_key)[1:] == (u, 0, 0, 0) for u, t in enumerate(rec.turns[1:], start=1))
    assert seeds[0] == {seed0}
    assert all(len(seeds[j]) == 1 for j in (1, 2)) and len(seeds[0] | seeds[1] | seeds[2]) == 3
    assert sorted(r.pair for r in tw.replicas) == [1, 2]
    for rep in tw.replicas:
        assert rep.turns[0].token_ids == eps[0].turns[0].token_ids  # the factual turn, replayed
        assert {t.noise_key.episode_seed for t in rep.turns[1:]} == seeds[rep.pair]
        for rec in tw.records:
            if rec.pair == rep.pair:
                assert rec.pair_utility == rep.utility
    assert all(r.pair_utility is None for r in tw.records if r.pair == 0)
    assert tw.aux_tokens == sum(r.num_generated_tokens for r in tw.records + tw.replicas)


def test_coupled_twins_continue_on_the_factual_keys_and_reproduce_identical_alternatives():
    """Fails when twins continue on fresh noise: the keys differ, and so do the tokens."""
    import tests.toy_envs  # noqa: F401  (registers CoinChain-v0)

    policy = tiny_policy()
    sampling = SamplingConfig(temperature=0.5, max_new_tokens=2)
    eps = rollout(policy, "CoinChain-v0", [Task(s, {"goal": 4}) for s in range(3)], group_size=3, sampling=sampling,
                  max_turns=4, noise_seed=2)
    decisions = [(i, t) for i, ep in enumerate(eps) for t in range(len(ep.turns) - 1)]
    config = replace(TwiceConfig(q_same=1.0), self_twin_shortcut=False)
    tw = run_twins(policy, eps, decisions, config, sampling, np.random.default_rng(0))
    identical = continued = 0
    for rec in tw.records:
        i, t = rec.twin_of
        ep = eps[i]
        seed = ep.trajectory["noise"]["episode_seed"]
        assert tuple(rec.turns[0].noise_key) == (seed, t, 1, 0, 0)
        for m, turn in enumerate(rec.turns[1:], start=t + 1):
            assert tuple(turn.noise_key) == tuple(ep.turns[m].noise_key) == (seed, m, 0, 0, 0)
        continued += len(rec.turns) > 1
        if rec.turns[0].token_ids == ep.turns[t].token_ids:
            identical += 1
            assert [x.token_ids for x in rec.turns] == [x.token_ids for x in ep.turns[t:]]
            assert rec.utility == ep.utility
    assert identical >= 3 and continued - identical >= 3
