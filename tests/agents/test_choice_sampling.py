"""The choice policy's scores and keyed Gumbel-max (twice_envs.agents.sampling.choice)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from tests.agents._tiny import tiny_policy
from twice_envs.agents.rollout.episodes import score_tokens
from twice_envs.agents.sampling.candidates import score_batch, score_candidates
from twice_envs.agents.sampling.choice import (
    CHOICE_LINE,
    MAX_CANDIDATES,
    CandidateError,
    ChoicePolicy,
    check_candidates,
    choice_key,
    keyed_candidate,
)
from twice_envs.agents.sampling.policy import GenerationRequest, SamplingConfig
from twice_envs.keys import NoiseKey


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_keyed_gumbel_max_is_an_exact_sample_from_the_softmax_of_the_scores(temperature):
    scores = [-0.3, -1.1, -2.0, -0.7, -3.5, -0.05]
    n = 6000
    counts = np.zeros(len(scores))
    for m in range(n):
        key = choice_key(NoiseKey(1234 + m, m % 7, m % 3))
        counts[keyed_candidate(scores, key, temperature)[0]] += 1
    s = np.array(scores) / temperature
    p = np.exp(s - s.max())
    p /= p.sum()
    chi2, pvalue = stats.chisquare(counts, n * p)
    assert pvalue > 1e-3, (counts, n * p, chi2)


def test_the_draw_reports_the_softmax_log_prob_and_entropy_and_greedy_takes_the_argmax():
    scores = [-1.0, -0.2, -0.9]
    key = choice_key(NoiseKey(7, 3, 1))
    index, logprob, entropy = keyed_candidate(scores, key, 0.5)
    logp = np.array(scores) / 0.5
    logp = logp - np.log(np.exp(logp).sum())
    assert logprob == pytest.approx(logp[index], abs=1e-12)
    assert entropy == pytest.approx(-(np.exp(logp) * logp).sum(), abs=1e-12)
    assert keyed_candidate(scores, key, 0.5, greedy=True)[0] == 1
    # the same key draws the same candidate; the choice reads its own line, apart from every token key
    assert keyed_candidate(scores, key, 0.5) == (index, logprob, entropy)
    assert tuple(key) == (7, 3, 1, CHOICE_LINE, 0) and CHOICE_LINE == 2**32 - 1


@pytest.mark.parametrize("bad, words", [
    ([], "empty"),
    (["left", "right", "left"], "repeats candidate 0"),
    ([f"a{i}" for i in range(MAX_CANDIDATES + 1)], "more than the 1000"),
    (["left", ""], "non-empty string"),
    ("left", "list of strings"),
])
def test_bad_candidate_lists_get_a_clear_error(bad, words):
    with pytest.raises(CandidateError, match=words):
        check_candidates(bad, "the list")
    policy = ChoicePolicy(tiny_policy())
    req = GenerationRequest([1, 2, 3], NoiseKey(1, 0, 0), candidates=bad)
    with pytest.raises(CandidateError, match=words):
        policy.generate([req], SamplingConfig())


def test_a_choice_policy_needs_local_weights_and_a_known_score():
    with pytest.raises(ValueError, match="local weights"):
        ChoicePolicy(object())
    with pytest.raises(ValueError, match="score must be one of"):
        ChoicePolicy(tiny_policy(), score="max")


@pytest.mark.parametrize("chunk, rows_per_pass", [(1024, 1), (1024, 2), (3, 1)])
def test_candidates_sharing_the_context_and_their_prefixes_score_as_full_forward_passes(chunk, rows_per_pass):
    policy = tiny_policy()
    policy.prefix_cache.clear()
    enc = lambda t: list(policy.tokenizer.encode(t, add_special_tokens=False))  # noqa: E731
    contexts = [enc("Walk to the coin. You are at 0."), enc("You are at 3. It feels warm. Where now?")]
    eos = policy.tokenizer.eos_token_id
    rows = [[enc(t) + [eos] for t in ("left", "right", "look around the line", "look around")],
            [enc(t) + [eos] for t in ("right", "right right")]]
    sampling = SamplingConfig(temperature=0.7)
    for _ in range(2):  # the second time the contexts' kept caches are reused
        scored = score_batch(policy, contexts, rows, sampling, chunk=chunk, rows_per_pass=rows_per_pass)
        for context, cands, res in zip(contexts, rows, scored):
            for c, lp, slp in zip(cands, res.model, res.sampling):
                np.testing.assert_allclose(lp, score_tokens(policy, context, c, SamplingConfig())[0], atol=2e-5)
                np.testing.assert_allclose(slp, score_tokens(policy, context, c, sampling)[0], atol=2e-5)
    assert [r.reused for r in scored] == [len(c) - 1 for c in contexts]
    for a, b in zip(score_candidates(policy, contexts[0], rows[0], sampling)[0], scored[0].model):
        np.testing.assert_allclose(a, b, atol=2e-5)


def test_requests_without_candidates_are_generated_and_the_others_chosen_in_request_order():
    inner = tiny_policy()
    policy = ChoicePolicy(inner, score="sum")
    prompt = list(inner.tokenizer.encode("You are at 0.", add_special_tokens=False))
    reqs = [GenerationRequest(prompt, NoiseKey(5, 0, 0), ("\n",), candidates=("left", "right")),
            GenerationRequest(prompt, NoiseKey(5, 0, 0), ("\n",)),
            GenerationRequest(prompt, NoiseKey(6, 2, 1), ("\n",), candidates=("look",))]
    sampling = SamplingConfig(max_new_tokens=6)
    gens = policy.generate(reqs, sampling)
    assert gens[1].choice is None and gens[1].stop_reason != "choice"
    assert gens[1].token_ids == inner.generate([reqs[1]], sampling)[0].token_ids
    for g, r in ((gens[0], reqs[0]), (gens[2], reqs[2])):
        c = g.choice
        assert g.stop_reason == "choice" and g.text == r.candidates[c["index"]]
        assert g.token_ids == policy.candidate_tokens(g.text, r.stop)
        assert c["key"] == list(choice_key(r.noise_key)) and c["score"] == "sum"
        assert c["scores"][c["index"]] == pytest.approx(sum(score_tokens(inner, prompt, g.token_ids,
                                                                         SamplingConfig())[0]), abs=1e-4)
    assert gens[2].choice["logprob"] == 0.0
