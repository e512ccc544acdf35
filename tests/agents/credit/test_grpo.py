import numpy as np
import pytest

from twice_envs.agents.credit import grpo
from twice_envs.agents.types import EpisodeRecord, TurnRecord
from twice_envs.keys import NoiseKey


def test_group_normalised_and_broadcast():
    key = NoiseKey(0, 0)
    eps = [EpisodeRecord("E", 0, {}, group=g, turns=[TurnRecord([1], [0.0], "x", key)] * n, utility=u)
           for g, n, u in [(0, 1, 1.0), (0, 2, 0.0), (0, 3, 0.0), (1, 2, 0.5), (1, 1, 0.5)]]
    adv = grpo.grpo_credit(eps)
    mean, std = 1 / 3, np.std([1, 0, 0])
    assert adv[0].tolist() == pytest.approx([(1 - mean) / std], rel=1e-5)
    assert adv[2].tolist() == pytest.approx([-mean / std] * 3, rel=1e-5)
    assert adv[3].tolist() == [0.0, 0.0] and adv[4].tolist() == [0.0]
    raw = grpo.grpo_credit(eps, normalize=False)
    assert raw[1].tolist() == pytest.approx([-mean, -mean])
