"""The loss of chosen turns (twice_envs.agents.training.choice_loss): one categorical decision each."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from tests.agents._tiny import tiny_dir, tiny_policy
from tests.agents.test_choice_rollout import SAMPLING
from twice_envs.agents.rollout.episodes import Task, rollout
from twice_envs.agents.sampling.choice import ChoicePolicy
from twice_envs.agents.sampling.policy import HFPolicy
from twice_envs.agents.training.choice_loss import choice_logprobs
from twice_envs.agents.training.config import TrainConfig
from twice_envs.agents.training.loss import pack
from twice_envs.agents.training.trainer import init_state, policy_update


def _episodes(policy, score="sum", temperature=1.0):
    sampling = SAMPLING if temperature == 1.0 else type(SAMPLING)(max_new_tokens=8, temperature=temperature)
    return rollout(ChoicePolicy(policy, score=score), "MixedCoin-v0", [Task(s) for s in range(3)], group_size=2,
                   sampling=sampling, max_turns=6, noise_seed=11)


def _encode(policy):
    return lambda text: policy.tokenizer.encode(text, add_special_tokens=False)


def _chosen(batch, eps):
    return [(c, eps) for c in batch.choices]


def test_pack_takes_a_chosen_turns_tokens_out_of_the_token_loss_and_lists_the_turn():
    eps = _episodes(tiny_policy())
    batch = pack(eps, [np.arange(len(e.turns), dtype=float) for e in eps])
    want = [(e, k) for e in eps for k, t in enumerate(e.turns) if t.choice is not None]
    assert len(batch.choices) == len(want) > 0
    generated = sum(t.num_tokens for e in eps for t in e.turns if t.choice is None)
    assert batch.num_tokens == generated and batch.num_units == generated + len(want)
    for c, (e, k) in zip(batch.choices, want):
        n = e.turns[k].num_tokens
        assert batch.input_ids[c.row, c.start: c.start + n].tolist() == e.turns[k].token_ids
        assert batch.loss_mask[c.row, c.start: c.start + n].sum() == 0
        assert c.advantage == k and c.choice is e.turns[k].choice


@pytest.mark.parametrize("score,temperature", [("sum", 1.0), ("mean", 1.0), ("sum", 0.7)])
def test_the_choice_log_prob_in_training_is_the_one_the_policy_drew_with(score, temperature):
    """Ratio 1 before any update: the packed, differentiable scoring reproduces the sampling-time scores.
    Break: trie tokens seeing the row up to the last chosen turn instead of their own context -> differs."""
    policy = tiny_policy()
    eps = _episodes(policy, score, temperature)
    batch = pack(eps, [np.zeros(len(e.turns)) for e in eps])
    lp = choice_logprobs(policy.model, batch.input_ids, batch.choices, _encode(policy), policy.tokenizer.eos_token_id)
    old = torch.tensor([c.choice["logprob"] for c in batch.choices], dtype=lp.dtype)
    assert lp.shape == old.shape
    torch.testing.assert_close(lp, old, atol=1e-5, rtol=0)


def _brute_force(model, policy, batch) -> torch.Tensor:
    """log softmax(S / tau)[i] with each candidate scored by a forward pass of its context and itself alone."""
    out = []
    for c in batch.choices:
        ctx = batch.input_ids[c.row, : c.start].tolist()
        scores = []
        for j, text in enumerate(c.choice["candidates"]):
            ids = list(c.tokens) if j == c.choice["index"] else _encode(policy)(text)
            if len(ids) + 1 == c.choice["token_counts"][j]:
                ids.append(policy.tokenizer.eos_token_id)
            seq = torch.tensor([ctx + ids])
            logp = torch.log_softmax(model(input_ids=seq).logits[0, len(ctx) - 1: -1].double(), -1)
            lp = logp.gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)
            scores.append(lp.sum() if c.choice["score"] == "sum" else lp.mean())
        out.append(torch.log_softmax(torch.stack(scores) / c.choice["temperature"], -1)[c.choice["index"]])
    return torch.stack(out)


def test_the_choice_log_prob_matches_scoring_each_candidate_alone_with_gradients_after_a_change_of_weights():
    policy = tiny_policy()
    eps = _episodes(policy)
    batch = pack(eps, [np.zeros(len(e.turns)) for e in eps])
    model = copy.deepcopy(policy.model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    lp = choice_logprobs(model, batch.input_ids, batch.choices, _encode(policy), policy.tokenizer.eos_token_id)
    with torch.no_grad():
        want = _brute_force(model, policy, batch)
    torch.testing.assert_close(lp.detach(), want, atol=1e-5, rtol=0)
    old = torch.tensor([c.choice["logprob"] for c in batch.choices], dtype=lp.dtype)
    assert (lp.detach() - old).abs().max() > 1e-3  # the weights changed what the choice's probability is
    lp.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_an_update_with_credit_on_chosen_turns_only_moves_the_choice_the_credit_favours():
    """Chosen turns that took the most frequent candidate X get advantage +1, the other chosen turns -1, generated
    turns 0: X's probability rises where it was taken. Break: the trainer leaving out the chosen turns' term ->
    the loss is the KL term alone (0 at the reference), nothing moves."""
    policy = HFPolicy.from_pretrained(tiny_dir())
    eps = _episodes(policy)
    texts = [t.text for e in eps for t in e.turns if t.choice is not None]
    x = max(set(texts), key=texts.count)
    assert 0 < texts.count(x) < len(texts)
    adv = [np.array([0.0 if t.choice is None else (1.0 if t.text == x else -1.0) for t in e.turns]) for e in eps]
    config = TrainConfig(env="MixedCoin-v0", lr=1e-3, minibatches=1, warmup_steps=0)
    state = init_state(config, ChoicePolicy(policy))
    batch = pack(eps, adv)
    args = (batch.input_ids, batch.choices, _encode(policy), policy.tokenizer.eos_token_id)
    took_x = torch.tensor([c.advantage > 0 for c in batch.choices])
    with torch.no_grad():
        before = choice_logprobs(policy.model, *args)
    stats = policy_update(state, eps, adv, config)
    with torch.no_grad():
        after = choice_logprobs(policy.model, *args)
    assert stats["pg_loss"] != 0
    assert float((after - before)[took_x].mean()) > 1e-3
    assert float((after - before)[~took_x].mean()) < -1e-3


def test_a_record_whose_candidates_this_tokenizer_does_not_write_is_refused_naming_the_turn():
    policy = tiny_policy()
    eps = _episodes(policy)
    batch = pack(eps, [np.zeros(len(e.turns)) for e in eps])
    c = batch.choices[0]
    other = next(j for j in range(len(c.choice["candidates"])) if j != c.choice["index"])
    c.choice = dict(c.choice, token_counts=[n + 5 if j == other else n for j, n in enumerate(c.choice["token_counts"])])
    with pytest.raises(ValueError, match=rf"{c.where}: candidate {other} .* the record was not written by this"):
        choice_logprobs(policy.model, batch.input_ids, batch.choices, _encode(policy), policy.tokenizer.eos_token_id)
