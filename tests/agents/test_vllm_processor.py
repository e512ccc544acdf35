"""The vLLM processors' per-request logic, without vLLM.

* V1 interface (:class:`KeyedBatchState`, the state inside ``TwiceKeyedLogitsProcessor``):
  requests follow vLLM's batch updates (add, remove, swap).
* V2 interface (:class:`KeyedSlotState`, the state inside ``TwiceKeyedV2LogitsProcessor``):
  requests live in recycled slots, logits rows are mapped through a fake ``LogitsContext``.

Both are held to the transformers processor's tokens in all four key modes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from twice_envs.agents.sampling.processor import KeyedLogitsProcessor
from twice_envs.agents.sampling.vllm import KeyedBatchState, keyed_extra_args
from twice_envs.keys import NoiseKey
from twice_envs.noise import KEY_MODES

V = 64
NEWLINE = torch.zeros(V, dtype=torch.bool)
NEWLINE[[3, 17]] = True
PROMPTS = {r: [20 + r, 1, 2 + r % 2, 9, 30 + r] for r in range(8)}


def _logits(req: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * req + step)
    return torch.randn(V, generator=g) * 3


def _reference(key: NoiseKey, history: list[int], logits: torch.Tensor, mode: str, tau: float, top_p: float,
               prompt=(1, 2), counter: int = 0) -> int:
    proc = KeyedLogitsProcessor([key], NEWLINE, temperature=tau, top_p=top_p, key_mode=mode, contexts=[list(prompt)],
                                token_counters=[counter])
    for t in history:
        proc.advance(torch.tensor([t]))
    return int(proc.choose(logits[None].clone())[0])


@pytest.mark.parametrize("mode", KEY_MODES)
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
            extra = keyed_extra_args(keys[r], temperature=params[r][0], top_p=params[r][1], key_mode=mode,
                                     token_counter=5 * r)
            added.append((i, extra, PROMPTS[r], outputs[r]))
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
            expect = _reference(keys[r], outputs[r], _logits(r, len(outputs[r])), mode, *params[r], PROMPTS[r], 5 * r)
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


# ----------------------------------------------------------------------------- Model Runner V2
class _FakeContext:
    """The fields of vLLM's ``LogitsContext`` that the V2 processor reads."""

    def __init__(self, rows, fed, pos, local=None):
        self.expanded_idx_mapping = torch.tensor(rows, dtype=torch.int32)
        self.input_ids = torch.tensor(fed, dtype=torch.int64)
        self.pos = torch.tensor(pos, dtype=torch.int64)
        self.expanded_local_pos = torch.tensor(local if local is not None else [0] * len(rows), dtype=torch.int32)


class _FakeReqStates:
    """vLLM's per-slot buffers: ``prompt_len`` as a host-backed buffer, ``all_token_ids`` as a device tensor."""

    def __init__(self, slots: int, width: int):
        self.prompt_len = type("Uva", (), {})()
        self.prompt_len.np = np.zeros(slots, dtype=np.int32)
        self.all_token_ids = type("Staged", (), {})()
        self.all_token_ids.gpu = torch.zeros(slots, width, dtype=torch.int32)

    def admit(self, slot: int, prompt: list[int]) -> None:
        self.prompt_len.np[slot] = len(prompt)
        self.all_token_ids.gpu[slot].zero_()
        self.all_token_ids.gpu[slot, : len(prompt)] = torch.tensor(prompt)


@pytest.mark.parametrize("mode", KEY_MODES)
def test_v2_state_follows_slots_and_rows(mode):
    """Requests enter recycled slots, rows are reordered every step, one request is preempted and resumed."""
    from twice_envs.agents.sampling.vllm_v2 import apply_with_context, slot_state_for

    rng = np.random.default_rng(1)
    n_slots = 4
    req_states = _FakeReqStates(n_slots, 64)
    state = slot_state_for(NEWLINE, req_states)
    keys = {r: NoiseKey(50 + r, r % 3, r % 2) for r in range(7)}
    params = {r: (1.0 if r % 2 else 0.7, 1.0 if r < 3 else 0.9) for r in range(7)}
    outputs = {r: [] for r in range(7)}
    slot_req: dict[int, int] = {}  # slot -> request (request 6 carries no key)
    pending = list(range(7))
    resumed = False
    total = 0
    for step in range(40):
        # finish requests at random, admit new ones into free slots (state must be reset there)
        for slot in list(slot_req):
            if rng.random() < 0.08 or len(outputs[slot_req[slot]]) >= 12:
                del slot_req[slot]
        for slot in range(n_slots):
            if slot not in slot_req and pending:
                r = pending.pop(0)
                slot_req[slot] = r
                req_states.admit(slot, PROMPTS[r])
                extra = None if r == 6 else keyed_extra_args(keys[r], temperature=params[r][0], top_p=params[r][1],
                                                                key_mode=mode, token_counter=5 * r)
                assert state.add_request(slot, extra) == (r != 6)
        if not slot_req:
            break
        # preemption: a request's slot is re-filled with its prompt and partial output (several tokens at once)
        if not resumed:
            for slot, r in slot_req.items():
                if r != 6 and len(outputs[r]) == 5:
                    state.add_request(slot, keyed_extra_args(keys[r], temperature=params[r][0], top_p=params[r][1],
                                                             key_mode=mode, token_counter=5 * r))
                    resumed = True
                    break
        slots = [int(s) for s in rng.permutation(sorted(slot_req))]
        fed, pos = [], []
        for s in slots:
            r = slot_req[s]
            seq = PROMPTS[r] + outputs[r]
            fed.append(seq[-1])
            pos.append(len(seq) - 1)
        logits = torch.stack([_logits(slot_req[s], len(outputs[slot_req[s]])) for s in slots])
        out = apply_with_context(state, logits.clone(), _FakeContext(slots, fed, pos))
        for row, s in enumerate(slots):
            r = slot_req[s]
            if r == 6:
                assert torch.equal(out[row], logits[row])  # declined request: untouched
                tok = int(torch.argmax(out[row]))
            else:
                tok = int(torch.argmax(out[row]))
                assert torch.isinf(out[row]).sum() == V - 1
                expect = _reference(keys[r], outputs[r], _logits(r, len(outputs[r])), mode, *params[r],
                                    PROMPTS[r], 5 * r)
                assert tok == expect, (step, r)
                total += 1
            outputs[r].append(tok)
            req_states.all_token_ids.gpu[s, len(PROMPTS[r]) + len(outputs[r]) - 1] = tok
    assert resumed and total > 40


def test_v2_skips_prompt_chunks_and_rejects_speculative_rows():
    from twice_envs.agents.sampling.vllm_v2 import apply_with_context, slot_state_for

    req_states = _FakeReqStates(2, 32)
    req_states.admit(0, [4, 5, 6, 7, 8, 9])
    state = slot_state_for(NEWLINE, req_states)
    state.add_request(0, keyed_extra_args(NoiseKey(1, 0, 0)))
    logits = torch.randn(1, V)
    # a partial prefill chunk (position 2 of a 6-token prompt): no token is sampled there
    out = apply_with_context(state, logits.clone(), _FakeContext([0], [6], [2]))
    assert torch.equal(out, logits)
    out = apply_with_context(state, logits.clone(), _FakeContext([0], [9], [5]))
    assert torch.isinf(out).sum() == V - 1
    with pytest.raises(RuntimeError, match="speculative"):
        apply_with_context(state, torch.randn(2, V), _FakeContext([0, 0], [9, 1], [6, 7], [0, 1]))


def test_interface_choice_follows_version_and_device():
    from twice_envs.agents.sampling.vllm_engine import uses_v2_interface

    assert uses_v2_interface("0.32.0") and uses_v2_interface("0.33.1+cu129") and uses_v2_interface("1.0.0")
    assert not uses_v2_interface("0.31.2") and not uses_v2_interface("0.10.1.1")
    assert not uses_v2_interface("0.32.0", "cpu")  # vLLM on CPU runs the V1 model runner
