"""Keyed sampling for vLLM's Model Runner V2 (vLLM >= 0.32; the only runner from 0.34 on).

The V2 runner has no batch-update ledger. A processor gets

* ``__init__(vllm_config, req_states)``: ``req_states`` exposes per-slot buffers
  (``prompt_len``, ``all_token_ids``), read-only;
* ``add_request(req_idx, sampling_params) -> bool``: a request enters slot ``req_idx``
  (slots are recycled: all per-slot state is reset here; the request's tokens are only
  readable from the next ``apply`` on); the return value says whether the processor
  modifies that request's logits (False for requests without a key, and for the sampler
  warm-up's requests in vLLM >= 0.33);
* ``apply_staged_writes()``: before the forward pass (every step in 0.32-0.33, only on
  steps that admit requests from 0.34 on; nothing here depends on it);
* ``apply(logits, ctx)``: once per step for the whole batch, after penalties and before
  temperature/top-p. Logits rows are *not* requests: ``ctx.expanded_idx_mapping`` maps
  each row to its slot, ``ctx.input_ids`` is the token fed at the row's position
  ``ctx.pos``, and under speculative decoding a request owns several rows
  (``ctx.expanded_local_pos``).

Per slot the processor keeps a :class:`~twice_envs.agents.sampling.vllm.KeyedRequest`
(the same state the V1 processor keeps per request). At a slot's first ``apply`` it
reads what the key needs from the prompt (n-gram context, a resumed turn's earlier
output: :meth:`~twice_envs.agents.sampling.vllm.KeyedRequest.begin`). At each ``apply``
a row's emitted output count is ``pos + 1 - prompt_len``; when it is one more than the
tokens already folded in, the fed token is the newly emitted one (the common decode
step); any other gap (a request resumed after preemption) is read from
``all_token_ids``. The logic is :class:`KeyedSlotState`, plain Python and torch, tested
without vLLM through a fake context.

Not supported: speculative decoding (a request with more than one logits row raises,
since draft rows would need keys of tokens not yet accepted).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Union

import torch

from twice_envs._deps import require
from twice_envs.agents.sampling.vllm import (
    KeyedRequest,
    NewlineTable,
    engine_runner,
    force_keyed_rows,
    model_newline_table,
    parse_keyed_args,
    vllm_symbol,
    wrong_runner,
)


def host_tensor(buffer: Any) -> torch.Tensor:
    """A readable tensor of a vLLM per-slot buffer (host copy where the buffer keeps one).

    vLLM's buffers wrap a host array (``.np``) and/or a device tensor (``.gpu``, named
    ``.device_tensor`` in some releases); plain tensors (as in tests) pass through.
    """
    if isinstance(buffer, torch.Tensor):
        return buffer
    for name in ("np", "cpu", "gpu", "device_tensor"):
        value = getattr(buffer, name, None)
        if value is not None:
            return value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    raise TypeError(f"cannot read vLLM buffer of type {type(buffer).__name__}")


class KeyedSlotState:
    """Slot index -> :class:`KeyedRequest`, driven by Model Runner V2's calls.

    Args:
        newline_table: per token id, whether its text contains a newline (a tensor, or a
            function that builds it on first use).
        prompt_len: ``slot -> prompt length`` (reads vLLM's ``req_states.prompt_len``).
        history: ``(slot, start, stop) -> token ids`` at those positions of the slot's
            sequence (reads ``req_states.all_token_ids``).
    """

    def __init__(self, newline_table: Union[torch.Tensor, Callable[[], torch.Tensor], NewlineTable],
                 prompt_len: Callable[[int], int], history: Callable[[int, int, int], Sequence[int]]) -> None:
        self.newlines = newline_table if isinstance(newline_table, NewlineTable) else NewlineTable(newline_table)
        self.prompt_len = prompt_len
        self.history = history
        self.slots: dict[int, KeyedRequest] = {}

    def add_request(self, slot: int, extra_args: Optional[dict]) -> bool:
        """(Re)initialise ``slot``; True when the request samples with a key."""
        slot = int(slot)
        self.slots.pop(slot, None)
        req = KeyedRequest.from_extra_args(extra_args)
        if req is None:
            return False
        self.slots[slot] = req
        return True

    def _catch_up(self, slot: int, req: KeyedRequest, fed_token: int, n_out: int) -> None:
        if not req.started:
            # the prompt is readable from the first apply on (add_request runs before the
            # runner writes the request's tokens)
            req.begin(self.prompt_len(slot), lambda a, b: self.history(slot, a, b), self.newlines)
        if n_out == req.seen + 1:
            req.catch_up([fed_token], self.newlines, start=req.seen)
        elif n_out > req.seen:
            p = self.prompt_len(slot)
            req.catch_up(self.history(slot, p + req.seen, p + n_out), self.newlines, start=req.seen)
        elif n_out < req.seen:
            raise RuntimeError(f"keyed sampling: request in slot {slot} went back from {req.seen} to {n_out} "
                               "output tokens (a rollback is not supported)")

    def apply(self, logits: torch.Tensor, row_slots: Sequence[int], fed_tokens: Sequence[int],
              positions: Sequence[int], local_pos: Optional[Sequence[int]] = None) -> torch.Tensor:
        """Force every keyed row of ``logits`` to its keyed sample, in place.

        Per row: its slot, the token fed at its position, the position, and its offset
        among its request's rows (speculative decoding; ``None``: one row per request).
        Rows of a partial prompt chunk (no output position yet) are left alone.
        """
        rows, reqs = [], []
        for r, slot in enumerate(row_slots):
            req = self.slots.get(int(slot))
            if req is None:
                continue
            if local_pos is not None and int(local_pos[r]) != 0:
                raise RuntimeError("keyed sampling does not support speculative decoding "
                                   "(a request has more than one logits row)")
            n_out = int(positions[r]) + 1 - self.prompt_len(int(slot))
            if n_out < 0:
                continue  # still inside the prompt: this row's sample is discarded
            self._catch_up(int(slot), req, int(fed_tokens[r]), n_out)
            rows.append(r)
            reqs.append(req)
        if rows:
            force_keyed_rows(logits, rows, reqs)
        return logits


def slot_state_for(newline_table: Union[torch.Tensor, Callable[[], torch.Tensor], NewlineTable],
                   req_states: Any) -> KeyedSlotState:
    """A :class:`KeyedSlotState` that reads vLLM's ``req_states`` buffers."""

    def prompt_len(slot: int) -> int:
        return int(host_tensor(req_states.prompt_len)[slot])

    def history(slot: int, start: int, stop: int) -> list[int]:
        return host_tensor(req_states.all_token_ids)[slot, start:stop].tolist()

    return KeyedSlotState(newline_table, prompt_len, history)


def apply_with_context(state: KeyedSlotState, logits: torch.Tensor, ctx: Any) -> torch.Tensor:
    """:meth:`KeyedSlotState.apply` with the row layout read from a ``LogitsContext``."""
    if not state.slots:
        return logits
    slots_now = getattr(ctx, "idx_mapping_np", None)  # host copy: no device sync to find nothing to do
    if slots_now is not None and not any(int(s) in state.slots for s in slots_now):
        return logits
    row_slots = ctx.expanded_idx_mapping.tolist()
    if not any(int(s) in state.slots for s in row_slots):
        return logits
    local = getattr(ctx, "expanded_local_pos", None)
    return state.apply(logits, row_slots, ctx.input_ids.tolist(), ctx.pos.tolist(),
                       local.tolist() if local is not None else None)


_V2Base = vllm_symbol("v2", "LogitsProcessor")

if _V2Base is not None:

    class TwiceKeyedV2LogitsProcessor(_V2Base):
        """Keyed Gumbel sampling per request slot, Model Runner V2 (module level: vLLM loads it by name)."""

        def __init__(self, vllm_config: Any, *runner_args: Any, **runner_kwargs: Any) -> None:
            runner = engine_runner(vllm_config, runner_args, runner_kwargs)
            if runner != "v2":
                raise wrong_runner(type(self), runner)
            req_states = runner_args[0] if runner_args else runner_kwargs["req_states"]
            self.state = slot_state_for(lambda: model_newline_table(vllm_config), req_states)

        @classmethod
        def validate_params(cls, sampling_params: Any) -> None:
            parse_keyed_args(sampling_params.extra_args)

        def is_argmax_invariant(self) -> bool:
            return False

        def add_request(self, req_idx: int, sampling_params: Any) -> bool:
            return self.state.add_request(req_idx, getattr(sampling_params, "extra_args", None))

        def apply_staged_writes(self) -> None:
            pass  # all state is host-side; nothing to flush to the device

        def apply(self, logits: torch.Tensor, ctx: Any) -> torch.Tensor:
            return apply_with_context(self.state, logits, ctx)

    _V1Base = vllm_symbol("v1", "LogitsProcessor")
    if _V1Base is not None:
        # the V1 runner's loader accepts it, so that its constructor can name the class to use there
        _V1Base.register(TwiceKeyedV2LogitsProcessor)


def make_v2_processor_class() -> type:
    """vLLM's Model Runner V2 ``LogitsProcessor`` subclass around :class:`KeyedSlotState` (needs vLLM >= 0.32)."""
    vllm = require("vllm", "vllm", "the vLLM backend")
    if _V2Base is None:
        raise ImportError(f"vLLM {vllm.__version__} has no Model Runner V2 logits processor interface "
                          "(vllm.v1.worker.gpu.sample.logits_processor); use the V1 processor")
    return TwiceKeyedV2LogitsProcessor
