"""Contexts and training sequences, with and without a history window."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.agents._tiny import tiny_policy
from twice_envs.agents.rollout.context import (
    check_window,
    pack_episode,
    pack_segments,
    segments,
    text_sequences,
    turn_context,
    twin_prefix,
)
from twice_envs.agents.rollout.episodes import (
    BranchRequest,
    Task,
    branch_rollouts,
    rollout,
)
from twice_envs.agents.sampling.policy import SamplingConfig
from twice_envs.agents.training.loss import pack, token_logprobs
from twice_envs.agents.types import EpisodeRecord, TurnRecord
from twice_envs.keys import NoiseKey

SAMPLING = SamplingConfig(max_new_tokens=10, temperature=1.0)


def _turn(k: int) -> TurnRecord:
    return TurnRecord([100 + k], [-0.5], f"t{k}", NoiseKey(1, k, 0), f"o{k}", [200 + k, 300 + k])


def test_turn_context_and_segments_by_hand():
    ep = EpisodeRecord("X", 0, {}, prompt_ids=[1, 2], turns=[_turn(k) for k in range(5)], window=2)
    assert turn_context(ep, 0) == [1, 2]
    assert turn_context(ep, 2) == [1, 2, 100, 200, 300, 101, 201, 301]
    assert turn_context(ep, 4) == [1, 2, 102, 202, 302, 103, 203, 303]
    assert turn_context(ep, 5) == [1, 2, 103, 203, 303, 104, 204, 304]
    assert turn_context(EpisodeRecord("X", 0, {}, prompt_ids=[1], turns=ep.turns, window=0), 3) == [1]
    # turns 0-2 saw everything before them; turns 3 and 4 each saw a context of their own
    assert segments(0, 5, 2) == [(0, 3), (3, 4), (4, 5)]
    assert segments(2, 3, 2) == [(0, 1), (1, 2), (2, 3)]
    assert segments(0, 5, None) == [(0, 5)] and segments(0, 0, 2) == []
    packed = pack_segments(ep)
    assert [ids for ids, *_ in packed] == [
        [1, 2, 100, 200, 300, 101, 201, 301, 102],
        turn_context(ep, 3) + [103],
        turn_context(ep, 4) + [104],
    ]
    assert [turn_of for *_, turn_of in packed][0] == [-1, -1, 0, -1, -1, 1, -1, -1, 2]
    with pytest.raises(ValueError, match="pack_segments"):
        pack_episode(ep)
    whole = EpisodeRecord("X", 0, {}, prompt_ids=[1, 2], turns=ep.turns)
    assert pack_segments(whole) == [pack_episode(whole)]
    # a twin at turn 4 keeps the first prompt and the two factual turns its window holds
    prompt, history = twin_prefix(ep, 4)
    assert prompt == [1, 2] and [t.text for t in history] == ["t2", "t3"]
    assert twin_prefix(whole, 2) == (turn_context(whole, 2), [])


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_bad_windows_are_refused(bad):
    with pytest.raises(ValueError, match="window"):
        check_window(bad)


@pytest.fixture(scope="module")
def windowed():
    return rollout(tiny_policy(), "CoinChain-v0", [Task(1), Task(2)], group_size=3, sampling=SAMPLING, max_turns=5,
                   noise_seed=5, window=1)


def test_windowed_rollout_packs_to_what_the_model_saw(windowed):
    assert max(len(e.turns) for e in windowed) >= 3
    assert all(e.window == 1 for e in windowed)
    batch = pack(windowed, [np.ones(len(e.turns)) for e in windowed])
    assert batch.input_ids.shape[0] > len(windowed)  # turns that dropped out got sequences of their own
    with torch.no_grad():
        new = token_logprobs(tiny_policy().model, batch, SAMPLING.temperature, SAMPLING.top_p)
    m = batch.loss_mask > 0
    assert int(m.sum()) == sum(e.num_generated_tokens for e in windowed)
    assert float((new[m].double() - batch.old_logprobs[m].double()).abs().max()) < 1e-4
    # the whole-episode context would not give the recorded log-probs: the window mattered
    whole = [EpisodeRecord.from_json({**e.to_json(), "window": None}) for e in windowed]
    wb = pack(whole, [np.ones(len(e.turns)) for e in whole])
    with torch.no_grad():
        wnew = token_logprobs(tiny_policy().model, wb, SAMPLING.temperature, SAMPLING.top_p)
    wm = wb.loss_mask > 0
    assert float((wnew[wm] - wb.old_logprobs[wm]).abs().max()) > 1e-3


def test_windowed_twin_reproduces_the_factual_episode(windowed):
    i = max(range(len(windowed)), key=lambda j: len(windowed[j].turns))
    ep = windowed[i]
    t = 2
    req = BranchRequest(i, t, branch=1, action=ep.turns[t].text)
    tw = branch_rollouts(tiny_policy(), windowed, [req], sampling=SAMPLING, detect_self_twins=False)[0]
    assert tw.window == 1 and [h.token_ids for h in tw.history] == [ep.turns[t - 1].token_ids]
    assert [x.token_ids for x in tw.turns[1:]] == [x.token_ids for x in ep.turns[t + 1:]]
    assert tw.utility == ep.utility
    for k in range(len(tw.turns)):
        assert turn_context(tw, k) == turn_context(ep, t + k)
    back = EpisodeRecord.from_json(tw.to_json())
    assert back.history == tw.history and pack_segments(back) == pack_segments(tw)


def test_transcripts_get_the_rollouts_sequences(windowed):
    ep = max(windowed, key=lambda e: len(e.turns))
    blocks = [(t.token_ids, t.obs_token_ids) for t in ep.turns]
    got = text_sequences(ep.prompt_ids, blocks, ep.window)
    packed = pack_segments(ep)
    assert [ids for ids, *_ in got] == [ids for ids, *_ in packed]
    for (ids, spans, first), (_, mask, _, turn_of) in zip(got, packed):
        assert sorted(i for a, b in spans for i in range(a, b)) == [i for i, m in enumerate(mask) if m]
        assert [turn_of[a] for a, _b in spans] == list(range(first, first + len(spans)))
