"""Keyed sampling: noise identity, exactness end to end, line re-synchronisation, key modes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.agents._tiny import tiny_policy
from twice_envs import noise
from twice_envs.agents.rollout.context import initial_prompt_ids
from twice_envs.agents.sampling import processor as S
from twice_envs.agents.sampling.policy import GenerationRequest, SamplingConfig
from twice_envs.keys import NoiseKey


def _chi2_sf(stat: float, dof: int) -> float:
    """Upper tail of the chi-square distribution: Q(dof / 2, stat / 2)."""
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


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

    def choose(self, scores):
        z = noise.sampling_logprobs(scores.double(), 1.0, self.top_p)
        g = noise.gumbel_torch(self.key_rows(), z.shape[-1], dtype=torch.float64)
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
    probs = noise.sampling_logprobs(logits[None].double(), tau, top_p)[0].exp().numpy()
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
    probs = noise.sampling_logprobs(logits[None].double(), 1.5, 1.0)[0].exp().numpy()
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
            out.append(proc.key_rows().tolist()[0])
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
    ng = S.KeyedLogitsProcessor(base, table, key_mode="ngram", contexts=[[9, 1, 2, 3, 4]])
    assert ng.key_rows().tolist()[0][2] == noise.ngram_hash([1, 2, 3, 4])
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


# ----------------------------------------------------------------------------- every adapter, one rule
V_X = 97  # not a multiple of 4: the last Philox block is partial
NEWLINE_X = torch.zeros(V_X, dtype=torch.bool)
NEWLINE_X[[5, 40, 41]] = True
KINDS = ("random", "tied", "flat", "peaked")


def _step_logits(kind: str, B: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(10_000 * KINDS.index(kind) + step)
    if kind == "random":
        return torch.randn(B, V_X, generator=g) * 4
    if kind == "tied":  # few distinct values: many exact ties, inside and at the nucleus edge
        return torch.randint(0, 3, (B, V_X), generator=g).float()
    if kind == "flat":
        return torch.zeros(B, V_X)
    x = torch.randn(B, V_X, generator=g)  # peaked: one token far ahead (often a newline), the rest pruned
    peak = torch.tensor([[5, 40, 7, 60][(b + step) % 4] for b in range(B)])
    return x.scatter(1, peak[:, None], 30.0)


def _reference_tokens(kind, dtype, mode, tau, top_p, keys, prompts, counters, steps):
    """Per row, per step: the numpy reference sampler (float64) on the row's core key state."""
    states = [noise.KeyState(k, mode, c, p) for k, c, p in zip(keys, counters, prompts)]
    out = [[] for _ in keys]
    for step in range(steps):
        x = _step_logits(kind, len(keys), step).to(dtype).double().numpy()
        rows = noise.state_rows(states)
        toks = noise.keyed_sample_np(x, rows, tau, top_p)
        for b, t in enumerate(toks.tolist()):
            out[b].append(t)
            states[b].advance(t, bool(NEWLINE_X[t]))
    return out


def _hf_tokens(kind, dtype, mode, tau, top_p, keys, prompts, counters, steps):
    # through __call__, as model.generate drives it (contexts read from input_ids)
    proc = S.KeyedLogitsProcessor(keys, NEWLINE_X, temperature=tau, top_p=top_p, key_mode=mode, token_counters=counters)
    ids = torch.tensor(prompts)
    for step in range(steps):
        scores = proc(ids, _step_logits(kind, len(keys), step).to(dtype))
        assert scores.dtype == dtype and bool((torch.isfinite(scores).sum(-1) == 1).all())
        ids = torch.cat([ids, scores.argmax(-1)[:, None]], dim=1)
    return ids[:, len(prompts[0]):].tolist()


def _v1_tokens(kind, dtype, mode, tau, top_p, keys, prompts, counters, steps):
    from twice_envs.agents.sampling.vllm import KeyedBatchState, keyed_extra_args

    B = len(keys)
    state = KeyedBatchState(NEWLINE_X)
    outputs = [[] for _ in keys]
    perm = list(range(B))  # row -> request; rows are swapped every step like vLLM's persistent batch
    state.update([], [(i, keyed_extra_args(keys[i], temperature=tau, top_p=top_p, key_mode=mode,
                                            token_counter=counters[i]), prompts[i], outputs[i]) for i in range(B)], [])
    for step in range(steps):
        i, j = step % B, (3 * step + 1) % B
        if i != j:
            perm[i], perm[j] = perm[j], perm[i]
            state.update([], [], [(i, j, True)])
        x = _step_logits(kind, B, step).to(dtype)
        out = state.apply(x[perm].clone())
        for row, r in enumerate(perm):
            outputs[r].append(int(out[row].argmax()))
    return outputs


def _v2_tokens(kind, dtype, mode, tau, top_p, keys, prompts, counters, steps):
    from twice_envs.agents.sampling.vllm import keyed_extra_args
    from twice_envs.agents.sampling.vllm_v2 import KeyedSlotState

    B = len(keys)
    slot_of = [7 + 2 * r for r in range(B)]  # requests sit in recycled slots, not rows
    seqs = {slot_of[r]: list(prompts[r]) for r in range(B)}
    plen = {slot_of[r]: len(prompts[r]) for r in range(B)}
    state = KeyedSlotState(NEWLINE_X, plen.__getitem__, lambda s, a, b: seqs[s][a:b])
    for r in range(B):
        assert state.add_request(slot_of[r], keyed_extra_args(keys[r], temperature=tau, top_p=top_p, key_mode=mode,
                                                              token_counter=counters[r]))
    assert not state.add_request(99, None)  # an unkeyed request in the batch: declined, left alone
    rng = np.random.default_rng(steps)
    for step in range(steps):
        order = [int(r) for r in rng.permutation(B)]  # logits rows are reordered every step
        slots = [slot_of[r] for r in order] + [99]
        x = _step_logits(kind, B, step).to(dtype)
        logits = torch.cat([x[order], torch.zeros(1, V_X, dtype=dtype)]).clone()
        fed = [seqs[s][-1] for s in slots[:-1]] + [0]
        pos = [len(seqs[s]) - 1 for s in slots[:-1]] + [0]
        out = state.apply(logits, slots, fed, pos, [0] * len(slots))
        assert torch.equal(out[-1], torch.zeros(V_X, dtype=dtype))
        for row, s in enumerate(slots[:-1]):
            seqs[s].append(int(out[row].argmax()))
    return [seqs[slot_of[r]][len(prompts[r]):] for r in range(B)]


@pytest.mark.parametrize("mode", noise.KEY_MODES)
def test_every_adapter_emits_the_same_tokens(mode):
    """HF processor, vLLM V1 and V2 processors == the numpy reference, on every kind of logits batch.

    Each kind runs with float32 and bfloat16 inputs; across the two, each kind meets both the
    plain (tau 1, top-p 1) and the nucleus (tau 0.7, top-p 0.9) path.
    """
    B, steps = 5, 4
    keys = [NoiseKey(2**40 + 17 * b, b % 3, b % 2) for b in range(B)]
    prompts = [[11 + b, 12, 13 + b % 2, 14, 15 + b] for b in range(B)]
    counters = [0, 3, 50, 7, 2**20][:B]
    adapters = {"hf": _hf_tokens, "vllm-v1": _v1_tokens, "vllm-v2": _v2_tokens}
    for k, kind in enumerate(KINDS):
        for d, dtype in enumerate((torch.float32, torch.bfloat16)):
            tau, top_p = ((1.0, 1.0), (0.7, 0.9))[(k + d) % 2]
            args = (kind, dtype, mode, tau, top_p, keys, prompts, counters, steps)
            ref = _reference_tokens(*args)
            for name, run in adapters.items():
                assert run(*args) == ref, (name, kind, dtype, tau, top_p)
            if kind == "peaked":
                assert any(NEWLINE_X[t] for row in ref for t in row)  # line/pos advance is exercised
            if kind == "flat" and top_p < 1:
                assert max(t for row in ref for t in row) < int(np.ceil(0.9 * V_X))  # ties at the edge: lower ids kept
            if kind == "random":
                assert len({t for row in ref for t in row}) > B  # not a degenerate batch


def test_key_modes_read_different_noise():
    B, steps = 5, 4
    keys = [NoiseKey(2**40 + 17 * b, b % 3, b % 2) for b in range(B)]
    prompts = [[11 + b, 12, 13 + b % 2, 14, 15 + b] for b in range(B)]
    runs = {m: _reference_tokens("random", torch.float32, m, 1.0, 1.0, keys, prompts, [3] * B, steps)
            for m in noise.KEY_MODES}
    assert len({str(v) for v in runs.values()}) == 4


def test_toy_sampler_is_the_core_sampler():
    from twice_envs.agents.lab import toy

    class _Fixed:
        def __init__(self, logits):
            self.logits = logits

        def action_probs(self, state):
            turn = state[0]
            p = np.exp(self.logits[turn] - self.logits[turn].max())
            return p / p.sum()

    rng = np.random.default_rng(4)
    for kind, logits in {"random": rng.normal(size=(40, 4)) * 2, "tied": np.zeros((40, 4)),
                         "peaked": np.where(np.arange(4) == 2, 30.0, 0.0)[None].repeat(40, 0)}.items():
        keys = [NoiseKey(900 + i, i % 3, i % 2) for i in range(40)]
        got = toy.sample_actions(_Fixed(logits), [(i, [0] * (i % 3)) for i in range(40)], keys)
        ref = noise.keyed_sample_np(np.log(np.stack([_Fixed(logits).action_probs((i,)) for i in range(40)])),
                                    noise.key_rows(keys))
        assert got == ref.tolist(), kind
        if kind == "tied":
            assert len(set(got)) == 4
