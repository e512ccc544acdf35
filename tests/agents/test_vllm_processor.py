"""The vLLM processor's per-request logic (no vLLM needed), and vLLM == transformers when vLLM runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from twice_envs.agents.sampling import KeyedLogitsProcessor
from twice_envs.agents.vllm_processor import KeyedBatchState, keyed_extra_args
from twice_envs.keys import NoiseKey

V = 64
NEWLINE = torch.zeros(V, dtype=torch.bool)
NEWLINE[[3, 17]] = True


def _logits(req: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * req + step)
    return torch.randn(V, generator=g) * 3


def _reference(key: NoiseKey, history: list[int], logits: torch.Tensor, mode: str, tau: float, top_p: float) -> int:
    proc = KeyedLogitsProcessor([key], NEWLINE, temperature=tau, top_p=top_p, key_mode=mode)
    for t in history:
        proc.advance(torch.tensor([t]))
    return int(proc.choose(logits[None].clone())[0])


@pytest.mark.parametrize("mode", ["line", "flat"])
def test_state_follows_requests_through_reordering(mode):
    rng = np.random.default_rng(0)
    state = KeyedBatchState(NEWLINE)
    keys = {r: NoiseKey(10 + r, r % 3, r % 2) for r in range(6)}
    params = {r: (1.0 if r % 2 else 0.7, 1.0 if r < 3 else 0.9) for r in range(6)}
    outputs = {r: [] for r in range(6)}
    rows: list[int] = []  # row index -> request
    pending = list(range(6))
    for step in range(30):
        removed, added, moved = [], [], []
        # finish a request now and then, admit new ones, shuffle rows like a persistent batch
        if rows and rng.random() < 0.2:
            i = int(rng.integers(len(rows)))
            removed.append(i)
            rows[i] = None
        while pending and (None in rows or len(rows) < 4):
            r = pending.pop(0)
            i = rows.index(None) if None in rows else len(rows)
            if i == len(rows):
                rows.append(r)
            else:
                rows[i] = r
            extra = keyed_extra_args(keys[r], temperature=params[r][0], top_p=params[r][1], key_mode=mode)
            added.append((i, extra, [1, 2], outputs[r]))
        if len(rows) >= 2 and rng.random() < 0.5:
            i, j = (int(x) for x in rng.choice(len(rows), 2, replace=False))
            rows[i], rows[j] = rows[j], rows[i]
            moved.append((i, j, True))
        state.update(removed, added, moved)
        live = [(i, r) for i, r in enumerate(rows) if r is not None]
        if not live:
            continue
        logits = torch.full((len(rows), V), 0.0)
        for i, r in live:
            logits[i] = _logits(r, len(outputs[r]))
        out = state.apply(logits.clone())
        for i, r in live:
            tok = int(torch.argmax(out[i]))
            assert torch.isinf(out[i]).sum() == V - 1
            expect = _reference(keys[r], outputs[r], _logits(r, len(outputs[r])), mode, *params[r])
            assert tok == expect, (step, r)
            outputs[r].append(tok)  # vLLM appends to the live output list
    assert sum(len(o) for o in outputs.values()) > 40


def test_rows_without_a_key_are_untouched_and_bad_params_fail():
    state = KeyedBatchState(NEWLINE)
    state.update([], [(0, None, [1], []), (1, keyed_extra_args(NoiseKey(1, 0, 0)), [1], [])], [])
    logits = torch.randn(2, V)
    out = state.apply(logits.clone())
    assert torch.equal(out[0], logits[0]) and torch.isinf(out[1]).sum() == V - 1
    with pytest.raises(ValueError):
        KeyedBatchState(NEWLINE).update([], [(0, {"twice_key": [1, 0, 0], "twice_top_p": 0.0}, [], [])], [])
