"""Keyed sampling: noise identity, exactness end to end, line re-synchronisation, key modes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.agents._tiny import tiny_policy
from twice_envs.agents import sampling as S
from twice_envs.agents.policy import GenerationRequest, SamplingConfig
from twice_envs.agents.sequence import initial_prompt_ids
from twice_envs.keys import NoiseKey


def _chi2_sf(stat: float, dof: int) -> float:
    """Upper tail of the chi-square distribution: Q(dof / 2, stat / 2)."""
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def test_sampler_noise_is_the_reference_noise():
    from twice_envs import noise

    rng = np.random.default_rng(0)
    rows = torch.tensor(rng.integers(0, 2**32, size=(5, 6)), dtype=torch.int64)
    ids = torch.tensor(rng.integers(0, 5000, size=(5, 40)), dtype=torch.int64)
    ref = noise.gumbel_np(rows.numpy(), 5000, token_ids=ids.numpy())
    np.testing.assert_allclose(S.gumbel_noise(rows, 5000, ids).numpy(), ref, rtol=1e-6, atol=1e-6)
    full = S.gumbel_noise(rows, 5000)
    torch.testing.assert_close(full.gather(1, ids), S.gumbel_noise(rows, 5000, ids), rtol=1e-6, atol=1e-6)


def test_candidate_shortcut_equals_full_argmax():
    g = torch.Generator().manual_seed(1)
    z = torch.randn(64, 3000, generator=g) * 8  # spread logits: many tokens pruned
    rows = torch.randint(0, 2**31, (64, 6), generator=g)
    full = torch.argmax(z + S.gumbel_noise(rows, 3000), dim=-1)
    assert torch.equal(S.keyed_argmax(z, rows), full)


def test_nucleus_keeps_smallest_set_reaching_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    z = S.sampling_logits(logits, 1.0, 0.8)
    assert torch.isfinite(z).tolist() == [[True, True, False, False]]
    z = S.sampling_logits(logits, 1.0, 0.81)
    assert torch.isfinite(z).tolist() == [[True, True, True, False]]


def _first_token_counts(policy, prompt, keys, sampling, processor_cls=S.KeyedLogitsProcessor):
    counts = np.zeros(policy.vocab_size, dtype=np.int64)
    logits = policy.model(input_ids=torch.tensor([prompt])).logits[0, -1]
    batch = 500
    for start in range(0, len(keys), batch):
        ks = keys[start: start + batch]
        if processor_cls is S.KeyedLogitsProcessor:
            # end to end: the policy's own generate call, one fresh forward pass per batch
            policy.prefix_reuse = False
            try:
                gens = policy.generate([GenerationRequest(prompt, k) for k in ks],
                                       SamplingConfig(temperature=sampling.temperature, top_p=sampling.top_p,
                                                      max_new_tokens=1))
            finally:
                policy.prefix_reuse = True
            toks = [g.token_ids[0] for g in gens]
        else:
            proc = processor_cls(ks, policy.newline_table, temperature=sampling.temperature, top_p=sampling.top_p)
            toks = proc.choose(logits.expand(len(ks), -1).clone()).tolist()
        np.add.at(counts, toks, 1)
    return counts, logits


def _gof_pvalue(counts, probs):
    n = counts.sum()
    expected = probs * n
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] < 5:  # fold a small remainder into the last big bin
        obs[-2] += obs[-1]
        exp[-2] += exp[-1]
        obs, exp = obs[:-1], exp[:-1]
    stat = float(((obs - exp) ** 2 / exp).sum())
    return _chi2_sf(stat, len(obs) - 1)


class _BiasedProcessor(S.KeyedLogitsProcessor):
    """A sampler with a classic bug: the noise is added to the logits before the temperature scaling."""

    def choose(self, scores, input_ids=None):
        z = S.sampling_logits(scores, 1.0, self.top_p)
        g = S.gumbel_noise(self.key_rows(), z.shape[-1])
        tokens = torch.argmax((z + g) / self.temperature, dim=-1)
        self.last_tokens = tokens
        return tokens


PROMPT = "Walk to the coin. Actions: left, right, look.\nYou are at 0."
N_KEYS = 3000


@pytest.mark.parametrize("tau,top_p", [(1.0, 1.0), (1.5, 1.0), (0.7, 0.9)])
@torch.no_grad()
def test_exactness_end_to_end_first_token_matches_softmax(tau, top_p):
    policy = tiny_policy()
    prompt = initial_prompt_ids(policy.tokenizer, PROMPT)
    keys = [NoiseKey(1234567 + i, 0, 0) for i in range(N_KEYS)]
    sampling = SamplingConfig(temperature=tau, top_p=top_p)
    counts, logits = _first_token_counts(policy, prompt, keys, sampling)
    probs = torch.softmax(S.sampling_logits(logits[None], tau, top_p)[0], -1).double().numpy()
    assert counts[probs == 0].sum() == 0, "sampled a token outside the nucleus"
    assert probs.max() < 0.9  # a degenerate distribution could not reveal a bias
    assert _gof_pvalue(counts, probs) > 1e-3


@torch.no_grad()
def test_goodness_of_fit_rejects_a_biased_sampler():
    policy = tiny_policy()
    prompt = initial_prompt_ids(policy.tokenizer, PROMPT)
    keys = [NoiseKey(1234567 + i, 0, 0) for i in range(N_KEYS)]
    sampling = SamplingConfig(temperature=1.5)
    counts, logits = _first_token_counts(policy, prompt, keys, sampling)
    probs = torch.softmax(S.sampling_logits(logits[None], 1.5, 1.0)[0], -1).double().numpy()
    biased, _ = _first_token_counts(policy, prompt, keys, sampling, _BiasedProcessor)
    assert _gof_pvalue(counts, probs) > 1e-3
    assert _gof_pvalue(biased, probs) < 1e-6


def test_line_counters_resync_after_newline():
    """A twin whose first line differs reads the factual keys from the next line on (line mode)."""
    policy = tiny_policy()
    table = policy.newline_table
    nl = int(torch.nonzero(table)[0])
    plain = [int(v) for v in torch.nonzero(~table).squeeze(-1)[:10]]
    factual = [plain[0], plain[1], plain[2], nl, plain[3], plain[4], plain[5]]
    alternative = [plain[6], nl, plain[3], plain[7], plain[8]]
    base = [NoiseKey(77, 3, 0)]

    def rows(tokens, mode):
        proc = S.KeyedLogitsProcessor(base, table, key_mode=mode)
        out = []
        for t in tokens:
            out.append(proc.key_rows(torch.tensor([tokens])).tolist()[0])
            proc.advance(torch.tensor([t]))
        return out

    f, a = rows(factual, "line"), rows(alternative, "line")
    # factual line 0 has 3 tokens + newline, the alternative's 1 token + newline:
    # both then read (line 1, pos 0), (line 1, pos 1), ... = the same keys
    assert f[4:] == a[2:]
    assert f[4][4:] == [1, 0] and f[3][4:] == [0, 3]
    ff, fa = rows(factual, "flat"), rows(alternative, "flat")
    assert ff[4] != fa[2]  # flat keys do not re-synchronise

    # with logits that do not depend on the context, the twin's second line is the factual one token for token
    scores = torch.randn(1, policy.vocab_size, generator=torch.Generator().manual_seed(3))

    def run(prefix):
        proc = S.KeyedLogitsProcessor(base, table)
        for t in prefix:
            proc.advance(torch.tensor([t]))
        toks = []
        for _ in range(5):
            t = int(proc.choose(scores.clone())[0])
            toks.append(t)
            proc.advance(torch.tensor([t]))
            if table[t]:
                break
        return toks

    assert run(factual[:4]) == run(alternative[:2])


def test_key_modes_differ_and_counter_uses_episode_counter():
    table = torch.zeros(10, dtype=torch.bool)
    base = [NoiseKey(5, 2, 1)]
    line = S.KeyedLogitsProcessor(base, table, key_mode="line").key_rows()
    counter = S.KeyedLogitsProcessor(base, table, key_mode="counter", token_counters=[17]).key_rows()
    assert line.tolist()[0] == [5, 0, 2, 1, 0, 0]
    assert counter.tolist()[0] == [5, 0, 0, 1, 0, 17]
    ng = S.KeyedLogitsProcessor(base, table, key_mode="ngram")
    assert ng.key_rows(torch.tensor([[1, 2, 3, 4]])).tolist()[0][2] == S.ngram_hash([1, 2, 3, 4])
    with pytest.raises(ValueError):
        S.KeyedLogitsProcessor(base, table, key_mode="nope")


def test_processor_drives_hf_generate_like_the_policy_loop():
    policy = tiny_policy()
    prompt = initial_prompt_ids(policy.tokenizer, "You are at 2. It feels warm.")
    reqs = [GenerationRequest(prompt, NoiseKey(9, 0, b)) for b in range(3)]
    sampling = SamplingConfig(max_new_tokens=8, top_p=0.95)
    gens = policy.generate(reqs, sampling)
    proc = policy.new_processor(reqs, sampling)
    inp = torch.tensor([prompt] * 3)
    out = policy.model.generate(inp, attention_mask=torch.ones_like(inp), logits_processor=[proc], do_sample=False,
                                max_new_tokens=8, pad_token_id=policy.pad_id, eos_token_id=None)
    for b, g in enumerate(gens):
        assert out[b, len(prompt):].tolist()[: len(g.token_ids)] == g.token_ids
    assert len({tuple(g.token_ids) for g in gens}) > 1  # different branches, different noise
