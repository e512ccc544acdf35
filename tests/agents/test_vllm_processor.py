"""The vLLM processors' per-request logic, without vLLM.

* V1 interface (:class:`KeyedBatchState`, the state inside ``TwiceKeyedLogitsProcessor``):
  requests follow vLLM's batch updates (add, remove, swap).
* V2 interface (:class:`KeyedSlotState`, the state inside ``TwiceKeyedV2LogitsProcessor``):
  requests live in recycled slots, logits rows are mapped through a fake ``LogitsContext``.
* Resumed requests (prompt = the turn's prompt + its output so far) continue the turn's keys.
* Malformed keyed fields are refused with a message naming the field.
* ``TwiceKeyedProcessor`` picks the runner's interface (stand-in configs, and a stand-in
  ``vllm`` package in a subprocess for the class definitions and the loaders' type checks).
* The vLLM symbols the processors use match the installed vLLM (skipped without vLLM).

Both states are held to the transformers processor's tokens in all four key modes.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from twice_envs._deps import available
from twice_envs.agents.sampling.processor import KeyedLogitsProcessor
from twice_envs.agents.sampling.vllm import KeyedBatchState, keyed_extra_args
from twice_envs.keys import NoiseKey
from twice_envs.noise import KEY_MODES

V = 64
NEWLINE = torch.zeros(V, dtype=torch.bool)
NEWLINE[[3, 17]] = True
PROMPTS = {r: [20 + r, 1, 2 + r % 2, 9, 30 + r] for r in range(8)}
REQUIRE_VLLM = os.environ.get("TWICE_REQUIRE_VLLM") == "1"


def _logits(req: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * req + step)
    return torch.randn(V, generator=g) * 3


def _reference(key: NoiseKey, history: list[int], logits: torch.Tensor, mode: str, tau: float, top_p: float,
               prompt=(1, 2), counter: int = 0, newline: torch.Tensor = NEWLINE) -> int:
    proc = KeyedLogitsProcessor([key], newline, temperature=tau, top_p=top_p, key_mode=mode, contexts=[list(prompt)],
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
        self.idx_mapping_np = np.array(sorted(set(rows)), dtype=np.int32)


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


# ----------------------------------------------------------------------------- resumed requests
# a newline every fourth token id, so that a turn's first tokens move line/pos
DENSE_NEWLINE = torch.arange(V) % 4 == 0


def _run_v1(key, mode, prompt, n, step0, extra_kw, counter=5, newline=DENSE_NEWLINE):
    """Generate ``n`` tokens for one request through :class:`KeyedBatchState`; logits of turn step ``step0 + j``."""
    state = KeyedBatchState(newline)
    out: list[int] = []
    extra = keyed_extra_args(key, temperature=0.8, top_p=0.9, key_mode=mode, token_counter=counter, **extra_kw)
    state.update([], [(0, extra, prompt, out)], [])
    for j in range(n):
        row = state.apply(_logits(7, step0 + j)[None].clone())
        out.append(int(torch.argmax(row[0])))
    return out


def _run_v2(key, mode, prompt, n, step0, extra_kw, counter=5, newline=DENSE_NEWLINE):
    """The same through :class:`KeyedSlotState` (slot 2 of a fake ``req_states``)."""
    from twice_envs.agents.sampling.vllm_v2 import apply_with_context, slot_state_for

    req_states = _FakeReqStates(4, 64)
    req_states.admit(2, prompt)
    state = slot_state_for(newline, req_states)
    extra = keyed_extra_args(key, temperature=0.8, top_p=0.9, key_mode=mode, token_counter=counter, **extra_kw)
    assert state.add_request(2, extra)
    out: list[int] = []
    for j in range(n):
        seq = prompt + out
        row = apply_with_context(state, _logits(7, step0 + j)[None].clone(), _FakeContext([2], [seq[-1]], [len(seq) - 1]))
        out.append(int(torch.argmax(row[0])))
        req_states.all_token_ids.gpu[2, len(seq)] = out[-1]
    return out


@pytest.mark.parametrize("runner", ["v1", "v2"])
@pytest.mark.parametrize("mode", KEY_MODES)
def test_a_resumed_request_continues_the_turn_keys(mode, runner):
    """verl's partial rollouts re-send a turn as prompt + output so far; with ``twice_prompt_len`` the rest of
    the turn is token for token the uninterrupted one (and the transformers processor's)."""
    run = _run_v1 if runner == "v1" else _run_v2
    key, prompt, n, k = NoiseKey(99, 2, 1), [4, 3, 8, 17, 9, 21], 14, 6
    whole = run(key, mode, prompt, n, 0, {})
    for j in range(n):  # the uninterrupted request is the transformers processor's sample
        assert whole[j] == _reference(key, whole[:j], _logits(7, j), mode, 0.8, 0.9, prompt, 5, DENSE_NEWLINE)
    assert any(t % 4 == 0 for t in whole[:k])  # a newline before the cut: line/pos moved
    resumed = run(key, mode, prompt + whole[:k], n - k, k, {"prompt_len": len(prompt)})
    assert resumed == whole[k:]
    # twice_prompt_len = the request's own prompt: the same as leaving it out
    assert run(key, mode, prompt, n, 0, {"prompt_len": len(prompt)}) == whole
    if mode != "ngram":  # ngram keys read only the last tokens, which a resumed prompt carries anyway
        assert run(key, mode, prompt + whole[:k], n - k, k, {}) != whole[k:]  # keys restarted at the request


def test_resume_length_past_the_prompt_is_clamped(caplog):
    out = _run_v1(NoiseKey(1, 0, 0), "flat", [4, 5], 3, 0, {"prompt_len": 9})
    assert out == _run_v1(NoiseKey(1, 0, 0), "flat", [4, 5], 3, 0, {}) and "exceeds" in caplog.text


def test_forced_rows_are_left_alone_and_the_newline_table_is_built_lazily():
    """A second copy of the processor (named twice in ``logits_processors``) finds its rows forced already;
    an engine that never sees a keyed request never builds the newline table."""
    built = []

    def table():
        built.append(1)
        return NEWLINE

    copies = [KeyedBatchState(table), KeyedBatchState(table)]  # the same processor named twice
    for state in copies:
        state.update([], [(0, None, [1], []), (1, {"unrelated": 1}, [1], [])], [])
        state.apply(torch.randn(2, V))
    assert built == []
    out: list[int] = []
    for state in copies:
        state.update([], [(0, keyed_extra_args(NoiseKey(3, 0, 0), key_mode="line"), [1, 2], out)], [])
    for step in range(4):
        first = copies[0].apply(_logits(0, step)[None].clone())
        assert torch.equal(copies[1].apply(first.clone()), first)
        out.append(int(torch.argmax(first[0])))
        assert out[-1] == _reference(NoiseKey(3, 0, 0), out[:-1], _logits(0, step), "line", 1.0, 1.0)
    assert built == [1, 1]  # each copy built its table once, at its first keyed token


# ----------------------------------------------------------------------------- bad input
GOOD = {"twice_key": [5, 1, 0]}

BAD_INPUT = [
    ({"twice_key": [5, "x", 0]}, "extra_args['twice_key'][1] (turn) must be an integer in [0, 2**32), got 'x'"),
    ({"twice_key": [True, 1, 0]}, "extra_args['twice_key'][0] (episode_seed) must be an integer in [0, 2**64)"),
    ({"twice_key": [5, 1.5, 0]}, "extra_args['twice_key'][1] (turn) must be an integer"),
    ({"twice_key": [5.0, 1, 0]}, "extra_args['twice_key'][0] (episode_seed) must be an integer"),
    ({"twice_key": [-1, 1, 0]}, "(episode_seed) must be an integer in [0, 2**64), got -1"),
    ({"twice_key": [2**64, 1, 0]}, "(episode_seed) must be an integer in [0, 2**64)"),
    ({"twice_key": [5, 2**32, 0]}, "extra_args['twice_key'][1] (turn) must be an integer in [0, 2**32)"),
    ({"twice_key": [5, 1, -2]}, "extra_args['twice_key'][2] (branch) must be an integer in [0, 2**32)"),
    ({"twice_key": [5, 1]}, "extra_args['twice_key'] must be [episode_seed, turn, branch] (3 integers), got 2"),
    ({"twice_key": [5, 1, 0, 0, 0]}, "must be [episode_seed, turn, branch] (3 integers), got 5"),
    ({"twice_key": "5,1,0"}, "extra_args['twice_key'] must be a list [episode_seed, turn, branch]"),
    ({"twice_key": 5}, "extra_args['twice_key'] must be a list"),
    ({"twice_key": None}, "extra_args['twice_key'] must be a list"),
    ({"twice_top_p": 0.9}, "no 'twice_key'"),
    ({**GOOD, "twice_topp": 0.9}, "unknown keyed sampling field extra_args['twice_topp']"),
    ({**GOOD, "twice_temperature": 0}, "extra_args['twice_temperature'] must be > 0, got 0.0"),
    ({**GOOD, "twice_temperature": "hot"}, "extra_args['twice_temperature'] must be a finite number, got 'hot'"),
    ({**GOOD, "twice_temperature": True}, "extra_args['twice_temperature'] must be a finite number"),
    ({**GOOD, "twice_temperature": float("nan")}, "extra_args['twice_temperature'] must be a finite number"),
    ({**GOOD, "twice_temperature": float("inf")}, "extra_args['twice_temperature'] must be a finite number"),
    ({**GOOD, "twice_top_p": 0.0}, "extra_args['twice_top_p'] must lie in (0, 1], got 0.0"),
    ({**GOOD, "twice_top_p": 1.5}, "extra_args['twice_top_p'] must lie in (0, 1]"),
    ({**GOOD, "twice_top_p": None}, "extra_args['twice_top_p'] must be a finite number, got None"),
    ({**GOOD, "twice_key_mode": "lines"}, "extra_args['twice_key_mode'] must be one of"),
    ({**GOOD, "twice_key_mode": 3}, "extra_args['twice_key_mode'] must be one of"),
    ({**GOOD, "twice_token_counter": -1}, "extra_args['twice_token_counter'] must be an integer in [0, 2**32)"),
    ({**GOOD, "twice_token_counter": 2.0}, "extra_args['twice_token_counter'] must be an integer"),
    ({**GOOD, "twice_token_counter": "3"}, "extra_args['twice_token_counter'] must be an integer"),
    ({**GOOD, "twice_prompt_len": -4}, "extra_args['twice_prompt_len'] must be an integer in [0, 2**32)"),
    ({**GOOD, "twice_prompt_len": 12.5}, "extra_args['twice_prompt_len'] must be an integer"),
    ({**GOOD, "twice_prompt_len": [12]}, "extra_args['twice_prompt_len'] must be an integer"),
]


class _Params:
    """A stand-in for ``SamplingParams`` (``validate_params`` reads only ``extra_args``)."""

    def __init__(self, extra_args):
        self.extra_args = extra_args


@pytest.mark.parametrize("extra, message", BAD_INPUT, ids=[str(i) for i in range(len(BAD_INPUT))])
def test_malformed_keys_are_refused_by_validate_params(extra, message):
    from twice_envs.agents.sampling.vllm_engine import TwiceKeyedProcessor

    with pytest.raises(ValueError) as info:
        TwiceKeyedProcessor.validate_params(_Params(extra))
    assert message in str(info.value)


def test_good_and_unkeyed_extra_args_pass():
    from twice_envs.agents.sampling.vllm import parse_keyed_args
    from twice_envs.agents.sampling.vllm_engine import TwiceKeyedProcessor

    for extra in (None, {}, {"unrelated": [1, 2]}, GOOD, {"twice_key": (np.uint64(2**64 - 1), np.int32(3), 0)},
                  keyed_extra_args(NoiseKey(2**64 - 1, 2**32 - 1, 7), temperature=0.5, top_p=0.3, key_mode="ngram",
                                   token_counter=2**32 - 1, prompt_len=0)):
        TwiceKeyedProcessor.validate_params(_Params(extra))
    assert parse_keyed_args({"unrelated": 1}) is None and parse_keyed_args(None) is None
    args = parse_keyed_args({"twice_key": [np.uint64(2**64 - 1), 3, 0], "twice_prompt_len": 7})
    assert args.key == NoiseKey(2**64 - 1, 3, 0) and args.prompt_len == 7 and args.mode == "line"
    with pytest.raises(ValueError, match="twice_top_p"):  # the client-side helper runs the same checks
        keyed_extra_args(NoiseKey(1, 0, 0), top_p=2.0)


def test_v2_declines_requests_without_a_key():
    """Requests without a key, and the sampler warm-up's params in vLLM >= 0.33 (no extra_args), are declined."""
    from twice_envs.agents.sampling.vllm_v2 import slot_state_for

    req_states = _FakeReqStates(2, 16)
    state = slot_state_for(NEWLINE, req_states)
    assert state.add_request(0, keyed_extra_args(NoiseKey(1, 0, 0)))
    assert not state.add_request(0, None) and not state.add_request(1, {"other": 1}) and state.slots == {}


# ----------------------------------------------------------------------------- runner choice
class _Config:
    """A stand-in ``VllmConfig``: ``flag`` is ``use_v2_model_runner``, or absent (old vLLM, and 0.34)."""

    def __init__(self, flag=None):
        if flag is not None:
            self.use_v2_model_runner = flag


class _BrokenConfig:
    @property
    def use_v2_model_runner(self):
        raise ValueError("cannot say")


def test_engine_runner_follows_the_config_then_the_arguments():
    from twice_envs.agents.sampling.vllm import engine_runner

    assert engine_runner(_Config(True), ("req_states",)) == "v2"
    assert engine_runner(_Config(False), ("cpu", False)) == "v1"
    assert engine_runner(_Config(), ("cpu", False)) == "v1"  # vLLM without the flag and a V1 runner
    assert engine_runner(_Config(), ("req_states",)) == "v2"  # vLLM 0.34: Model Runner V2 only
    assert engine_runner(_Config(), (), {"req_states": 1}) == "v2"
    assert engine_runner(_BrokenConfig(), ("cpu", False)) == "v1"
    with pytest.raises(RuntimeError, match="use_v2_model_runner is True"):
        engine_runner(_Config(True), ("cpu", False))


def test_the_chooser_names_the_runner_when_vllm_lacks_its_interface(monkeypatch):
    from twice_envs.agents.sampling import vllm_engine

    monkeypatch.setattr(vllm_engine.v2, "_V2Base", None)
    with pytest.raises(RuntimeError, match="runs vLLM's Model Runner V2, but vLLM .* has no V2 logits processor"):
        vllm_engine.TwiceKeyedProcessor(_Config(True), "req_states")
    monkeypatch.setattr(vllm_engine.v1, "_VLLMLogitsProcessor", None)
    with pytest.raises(RuntimeError, match="runs vLLM's V1 model runner, but vLLM .* has no V1 logits processor"):
        vllm_engine.TwiceKeyedProcessor(_Config(False), "cpu", False)


# A stand-in vllm package with both processor interfaces (or only V2, like vLLM 0.34), so the real class
# definitions, the cross-registration and the loaders' issubclass checks run without vLLM.
_FAKE_VLLM = {
    "vllm/__init__.py": "__version__ = '{version}'\n",
    "vllm/v1/__init__.py": "",
    "vllm/v1/worker/__init__.py": "",
    "vllm/v1/worker/gpu/__init__.py": "",
    "vllm/v1/worker/gpu/sample/__init__.py": "",
    "vllm/v1/worker/gpu/sample/logits_processor/__init__.py": """
from abc import ABC, abstractmethod
class LogitsProcessor(ABC):
    def __init__(self, vllm_config, req_states): pass
    @classmethod
    def validate_params(cls, sampling_params): pass
    def add_request(self, req_idx, sampling_params): return True
    def apply_staged_writes(self): pass
    @abstractmethod
    def apply(self, logits, ctx): ...
""",
}
_FAKE_V1 = {
    "vllm/v1/sample/__init__.py": "",
    "vllm/v1/sample/logits_processor/__init__.py": """
from abc import ABC, abstractmethod
from enum import Enum, auto
class MoveDirectionality(Enum):
    UNIDIRECTIONAL = auto()
    SWAP = auto()
class LogitsProcessor(ABC):
    @classmethod
    def validate_params(cls, sampling_params): pass
    @abstractmethod
    def __init__(self, vllm_config, device, is_pin_memory): ...
    @abstractmethod
    def apply(self, logits): ...
    @abstractmethod
    def is_argmax_invariant(self): ...
    @abstractmethod
    def update_state(self, batch_update): ...
""",
}

_CHOOSER_SCRIPT = r"""
import sys
from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as V2Base
from twice_envs.agents.sampling import vllm as v1, vllm_v2 as v2, vllm_engine as eng

class Config:
    def __init__(self, flag=None):
        if flag is not None:
            self.use_v2_model_runner = flag

class Params:
    extra_args = None

has_v1 = sys.argv[1] == "both"
chooser = eng.make_vllm_processor_class()
assert chooser is eng.TwiceKeyedProcessor
# what both runners' loaders check
for cls in (chooser, v1.TwiceKeyedLogitsProcessor, v2.TwiceKeyedV2LogitsProcessor):
    assert issubclass(cls, V2Base), cls
if has_v1:
    from vllm.v1.sample.logits_processor import LogitsProcessor as V1Base
    for cls in (chooser, v1.TwiceKeyedLogitsProcessor, v2.TwiceKeyedV2LogitsProcessor):
        assert issubclass(cls, V1Base), cls
    p = chooser(Config(False), "cpu", False)
    assert type(p) is v1.TwiceKeyedLogitsProcessor and not p.is_argmax_invariant()
    p.update_state(None)
    assert eng.make_vllm_processor_class("v1") is v1.TwiceKeyedLogitsProcessor
    try:
        v2.TwiceKeyedV2LogitsProcessor(Config(False), "cpu", False)
        raise SystemExit("the V2 processor was built by the V1 runner")
    except RuntimeError as e:
        print("V2_IN_V1:", e)
else:
    try:
        eng.make_vllm_processor_class("v1")
        raise SystemExit("vLLM without a V1 interface gave a V1 class")
    except ImportError as e:
        print("NO_V1:", e)
p = chooser(Config(True) if has_v1 else Config(), "req_states")
assert type(p) is v2.TwiceKeyedV2LogitsProcessor
assert p.add_request(0, Params()) is False  # the warm-up's params: declined
try:
    v1.TwiceKeyedLogitsProcessor(Config(True) if has_v1 else Config(), "req_states")
    raise SystemExit("the V1 processor was built by Model Runner V2")
except RuntimeError as e:
    print("V1_IN_V2:", e)
print("OK")
"""


@pytest.mark.parametrize("interfaces", ["both", "v2-only"])
def test_processor_classes_with_a_stand_in_vllm(tmp_path, interfaces):
    """The chooser passes both runners' loaders and builds the runner's processor; a single-interface class
    constructed by the other runner raises an error that names that runner and the class to use."""
    import os
    import subprocess
    import sys

    files = dict(_FAKE_VLLM, **(_FAKE_V1 if interfaces == "both" else {}))
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.replace("{version}", "0.33.0" if interfaces == "both" else "0.34.0"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, "-c", _CHOOSER_SCRIPT, interfaces], capture_output=True, text=True,
                         env=env, timeout=300)
    assert res.returncode == 0 and "OK" in res.stdout, res.stdout + res.stderr
    use = "pass logits_processors=['twice_envs.agents.sampling.vllm_engine:TwiceKeyedProcessor']"
    line = next(x for x in res.stdout.splitlines() if x.startswith("V1_IN_V2:"))
    assert "TwiceKeyedLogitsProcessor" in line and "this engine runs vLLM's Model Runner V2" in line and use in line
    if interfaces == "both":
        line = next(x for x in res.stdout.splitlines() if x.startswith("V2_IN_V1:"))
        assert "TwiceKeyedV2LogitsProcessor" in line and "this engine runs vLLM's V1 model runner" in line
        assert use in line
    else:
        assert "has no V1 logits processor interface" in res.stdout


def test_the_processor_path_names_the_chooser():
    import importlib

    from twice_envs.agents.sampling.vllm import processor_path

    module, name = processor_path().split(":")
    assert getattr(importlib.import_module(module), name).__name__ == "TwiceKeyedProcessor"
    # no vllm.logits_processors entry point: it would load the processor into every engine of the environment
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert "vllm.logits_processors" not in pyproject


# ----------------------------------------------------------------------------- vLLM symbols
def _release(version: str) -> tuple[int, int]:
    parts = [int("".join(ch for ch in p if ch.isdigit()) or 0) for p in version.split("+")[0].split(".")[:2]]
    return parts[0], parts[1]


def _in_range(rel, rng) -> bool:
    first, end = rng
    return first <= rel and (end is None or rel < end)


def _resolve(module: str, name: str):
    import importlib

    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _check_symbol(sym) -> None:
    import dataclasses
    import inspect
    import typing

    obj = _resolve(sym.module, sym.name)
    if sym.kind == "class":
        assert isinstance(obj, type)
    elif sym.kind == "params":
        assert tuple(inspect.signature(obj).parameters) == tuple(sym.expected)
    elif sym.kind == "fields":
        names = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()
        names |= set(getattr(obj, "__annotations__", {})) | set(getattr(obj, "__struct_fields__", ()))
        assert set(sym.expected) <= names, sorted(names)
    elif sym.kind == "members":
        assert set(sym.expected) <= set(obj.__members__)
    elif sym.kind == "attrs":
        source = inspect.getsource(obj.__init__)
        for attr in sym.expected:
            assert f"self.{attr} =" in source, attr
    elif sym.kind == "arity":
        assert len(typing.get_args(obj)) == sym.expected
    elif sym.kind == "value":
        assert obj == sym.expected
    elif sym.kind == "attribute":
        pass  # resolving it was the check
    else:  # pragma: no cover - a new kind needs a check here
        raise AssertionError(sym.kind)


@pytest.mark.skipif(not available("vllm") and not REQUIRE_VLLM, reason="vLLM is not installed")
def test_vllm_symbols_match_the_installed_vllm():
    """Every module, class, method signature and field in VLLM_SYMBOLS is as the processors expect, in
    the installed vLLM, for the groups its release has; so an interface change fails here, loudly."""
    import vllm

    from twice_envs.agents.sampling.vllm import VLLM_RELEASES, VLLM_SYMBOLS, vllm_symbol

    rel = _release(vllm.__version__)
    groups = {g for g, rng in VLLM_RELEASES.items() if _in_range(rel, rng)}
    assert groups & {"v1", "v2"}, f"vLLM {vllm.__version__} is outside every release range of VLLM_RELEASES"
    failures = []
    for sym in VLLM_SYMBOLS:
        if sym.interface not in groups:
            continue
        try:
            _check_symbol(sym)
        except Exception as e:  # noqa: BLE001 - collect them all
            failures.append(f"{sym.module}:{sym.name} ({sym.kind}, expected {sym.expected!r}): "
                            f"{type(e).__name__} {e}")
    assert not failures, f"vLLM {vllm.__version__}:\n" + "\n".join(failures)
    # and the code sees the same interfaces
    assert (vllm_symbol("v1", "LogitsProcessor") is not None) == ("v1" in groups)
    assert (vllm_symbol("v2", "LogitsProcessor") is not None) == ("v2" in groups)
    print(f"vLLM {vllm.__version__}: {sum(s.interface in groups for s in VLLM_SYMBOLS)} symbols checked "
          f"({', '.join(sorted(groups))})")


def test_the_symbol_check_fails_on_a_changed_interface():
    from twice_envs.agents.sampling.vllm import VllmSymbol

    _check_symbol(VllmSymbol("t", "json", "dumps", "attribute"))
    with pytest.raises(AssertionError):
        _check_symbol(VllmSymbol("t", "json", "JSONDecoder.decode", "params", ("self", "s", "extra")))
    with pytest.raises(AttributeError):
        _check_symbol(VllmSymbol("t", "json", "no_such_name", "class"))


@pytest.mark.skipif(not available("vllm") and not REQUIRE_VLLM, reason="vLLM is not installed")
def test_the_installed_vllm_loads_the_chooser_for_each_runner():
    """Against the installed vLLM's own base classes: the loaders' type checks pass, the chooser builds the
    runner's processor from a stand-in config, and the sampler warm-up's params (vLLM >= 0.33) are declined."""
    import vllm
    from vllm import SamplingParams

    from twice_envs.agents.sampling import vllm as v1
    from twice_envs.agents.sampling import vllm_v2 as v2
    from twice_envs.agents.sampling.vllm import vllm_symbol
    from twice_envs.agents.sampling.vllm_engine import TwiceKeyedProcessor

    bases = {name: vllm_symbol(name, "LogitsProcessor") for name in ("v1", "v2")}
    assert any(bases.values()), vllm.__version__
    for base in filter(None, bases.values()):
        for cls in (TwiceKeyedProcessor, v1.TwiceKeyedLogitsProcessor):
            assert issubclass(cls, base)
    if bases["v1"] is not None:
        flag = {"flag": False} if _release(vllm.__version__) < (0, 34) else {}
        assert type(TwiceKeyedProcessor(_Config(**flag), torch.device("cpu"), False)) is v1.TwiceKeyedLogitsProcessor
    if bases["v2"] is not None:
        assert issubclass(v2.TwiceKeyedV2LogitsProcessor, bases["v2"])
        flag = {"flag": True} if _release(vllm.__version__) < (0, 34) else {}
        proc = TwiceKeyedProcessor(_Config(**flag), _FakeReqStates(2, 8))
        assert type(proc) is v2.TwiceKeyedV2LogitsProcessor
        warmup = getattr(SamplingParams, "for_sampler_warmup", None)
        if warmup is not None:
            assert proc.add_request(0, warmup()) is False
        assert proc.add_request(1, SamplingParams(extra_args=keyed_extra_args(NoiseKey(1, 0, 0)))) is True
        with pytest.raises(RuntimeError, match="TwiceKeyedLogitsProcessor implements .* V1 model runner"):
            v1.TwiceKeyedLogitsProcessor(_Config(**flag), _FakeReqStates(2, 8))
