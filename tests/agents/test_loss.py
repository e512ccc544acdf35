import math

import numpy as np
import pytest
import torch

from twice_envs.agents.training.loss import LossConfig, pack, ppo_loss
from twice_envs.agents.types import EpisodeRecord, TurnRecord
from twice_envs.keys import NoiseKey


def _ep():
    k = NoiseKey(1, 0)
    turns = [TurnRecord([5, 6], [-0.5, -0.25], "a", k, obs_token_ids=[7, 8, 9]), TurnRecord([10], [-1.0], "b", k)]
    return EpisodeRecord("E", 0, {}, prompt_ids=[1, 2, 3], turns=turns, utility=1.0)


def test_pack_puts_advantages_on_generated_tokens_only():
    b = pack([_ep()], [np.array([2.0, -3.0])], pad_id=0)
    assert b.input_ids[0].tolist() == [1, 2, 3, 5, 6, 7, 8, 9, 10]
    assert b.loss_mask[0].tolist() == [0, 0, 0, 1, 1, 0, 0, 0, 1]
    assert b.advantages[0].tolist() == [0, 0, 0, 2, 2, 0, 0, 0, -3]
    assert b.old_logprobs[0].tolist() == [0, 0, 0, -0.5, -0.25, 0, 0, 0, -1.0]


def test_ppo_clip_and_kl():
    cfg = LossConfig(clip_eps=0.2, kl_coef=0.5)
    old = torch.zeros(1, 4)
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    adv = torch.tensor([[9.0, 1.0, 1.0, -1.0]])
    new = torch.tensor([[5.0, np.log(1.5), np.log(0.5), np.log(0.5)]], dtype=torch.float32, requires_grad=True)
    loss, st = ppo_loss(new, old, new.detach(), adv, mask, cfg)  # reference = new: KL 0
    # token 1: ratio 1.5 clipped to 1.2 -> -1.2; token 2: ratio 0.5, A>0 -> -0.5; token 3: A<0, ratio 0.5 -> clip 0.8 -> 0.8
    assert float(loss.detach()) == pytest.approx((-1.2 - 0.5 + 0.8) / 3, rel=1e-5)
    assert st["kl"] == pytest.approx(0.0) and st["clip_frac"] == pytest.approx(1.0)
    loss.backward()
    assert new.grad[0, 0] == 0 and new.grad[0, 1] == 0  # masked token and clipped token carry no gradient
    ref = torch.zeros(1, 4)
    _, st = ppo_loss(new.detach(), old, ref, torch.zeros(1, 4), mask, cfg)
    d = -np.log([1.5, 0.5, 0.5])
    assert st["kl"] == pytest.approx(float(np.mean(np.exp(d) - d - 1)), rel=1e-5)


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_ratio_is_one_on_the_first_minibatch(top_p):
    """The loss takes log-probs under the rollout's own distribution (temperature and nucleus)."""
    from tests.agents._tiny import tiny_policy
    from twice_envs.agents.rollout.episodes import Task, rollout
    from twice_envs.agents.sampling.policy import SamplingConfig
    from twice_envs.agents.training.loss import token_logprobs

    policy = tiny_policy()
    tau = 1.3  # not 1: a loss that forgot the temperature would fail too
    sampling = SamplingConfig(temperature=tau, top_p=top_p, max_new_tokens=12)
    eps = rollout(policy, "CoinChain-v0", [Task(3), Task(4)], group_size=3, sampling=sampling, max_turns=3, noise_seed=11)
    batch = pack(eps, [np.ones(len(e.turns)) for e in eps])
    with torch.no_grad():
        new = token_logprobs(policy.model, batch, tau, top_p)
    m = batch.loss_mask > 0
    ratio = torch.exp(new[m].double() - batch.old_logprobs[m].double())
    assert m.sum() > 50
    assert float((ratio - 1).abs().max()) < 1e-6
    _, stats = ppo_loss(new, batch.old_logprobs, new, batch.advantages, batch.loss_mask, LossConfig(), None)
    assert stats["clip_frac"] == 0.0
    if top_p < 1:  # the nucleus mattered: without it the log-probs would differ
        with torch.no_grad():
            plain = token_logprobs(policy.model, batch, tau, 1.0)
        assert float((plain[m] - batch.old_logprobs[m]).abs().max()) > 1e-3


def test_tokens_outside_the_nucleus_give_finite_loss():
    cfg = LossConfig(kl_coef=0.1)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    new = torch.tensor([[-0.5, -math.inf, -math.inf]], requires_grad=True)  # the masked position holds -inf too
    ref = torch.tensor([[-math.inf, -0.2, 0.0]])
    loss, st = ppo_loss(new, torch.tensor([[-0.5, -1.0, 0.0]]), ref, torch.tensor([[1.0, -1.0, 0.0]]), mask, cfg)
    loss.backward()
    assert math.isfinite(float(loss.detach())) and bool(torch.isfinite(new.grad).all())
    # token 2 left the nucleus: ratio 0, clipped to 0.8 with A = -1 -> pg 0.8; no KL term for either token
    assert float(loss.detach()) == pytest.approx((-1.0 + 0.8) / 2)


def test_causal_attention_mask_drops_only_right_padding():
    from twice_envs.agents.training.loss import causal_attention_mask

    right = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    assert causal_attention_mask(right) is None
    for kept in ([[0, 1, 1, 1], [1, 1, 1, 1]],  # left padding
                 [[1, 0, 1, 0], [1, 1, 1, 1]]):  # a gap: a real token after a pad
        mask = torch.tensor(kept)
        assert causal_attention_mask(mask) is mask


def test_log_probs_without_the_padding_mask_are_those_with_it():
    """A right-padded batch runs as one causal kernel: the same log-probs up to float rounding; a batch
    padded otherwise keeps its mask (with the causal mask alone its pads would be read)."""
    from tests.agents._tiny import tiny_policy
    from twice_envs.agents.rollout.episodes import Task, rollout
    from twice_envs.agents.sampling.policy import SamplingConfig
    from twice_envs.agents.training.loss import PackedBatch, token_logprobs

    policy = tiny_policy()
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=12)
    eps = rollout(policy, "CoinChain-v0", [Task(3), Task(4)], group_size=3, sampling=sampling, max_turns=3,
                  noise_seed=5)
    batch = pack(eps, [np.ones(len(e.turns)) for e in eps])
    lengths = batch.attention_mask.sum(-1)
    assert len(set(lengths.tolist())) > 1  # rows of different lengths: there is padding to drop
    m = batch.loss_mask > 0
    with torch.no_grad():
        causal = token_logprobs(policy.model, batch)
        masked = token_logprobs(policy.model, batch, padding_mask=True)
        # the same rows left-padded (each row rolled right by its padding): the mask must stay
        shift = [int(batch.input_ids.shape[1] - n) for n in lengths]
        roll = lambda t: torch.stack([torch.roll(r, s) for r, s in zip(t, shift)])  # noqa: E731
        left = PackedBatch(*(roll(t) for t in (batch.input_ids, batch.attention_mask, batch.loss_mask,
                                                batch.advantages, batch.old_logprobs)))
        left_lp = token_logprobs(policy.model, left)
    assert float((causal[m] - masked[m]).abs().max()) < 1e-4
    assert float((roll(masked)[roll(m.float()) > 0] - left_lp[left.loss_mask > 0]).abs().max()) < 1e-4
