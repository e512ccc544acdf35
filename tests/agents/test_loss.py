import numpy as np
import pytest
import torch

from twice_envs.agents.loss import LossConfig, pack, ppo_loss
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
