"""Keyed sampling in vLLM: the per-request logic shared by both processor interfaces,
and the processor for vLLM's V1 model runner (the ``BatchUpdate`` interface).

vLLM keeps a persistent batch whose rows are added, removed and moved between steps,
so the sampler state lives per *request* (a :class:`KeyedRequest` around the core's
:class:`~twice_envs.noise.KeyState`), and the row index is only where the request sits
now. A request opts in by carrying its key base in ``SamplingParams.extra_args``::

    SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=128, extra_args={
        "twice_key": [episode_seed, turn, branch],     # the env's info["noise_key"] base
        "twice_temperature": 1.0, "twice_top_p": 1.0,  # the keyed sampling distribution
        "twice_key_mode": "line", "twice_token_counter": 0})

(:func:`keyed_extra_args` builds it.) The processor replaces the row's logits by ``0``
at the keyed sample (:func:`twice_envs.noise.keyed_choice`) and ``-inf`` elsewhere, so
whatever vLLM's own sampler does next, it emits that token: exactly the token
:class:`~twice_envs.agents.sampling.processor.KeyedLogitsProcessor` emits for the same logits and
key. Leave vLLM's own temperature at 1 and top-p at 1 (its scaling cannot change a
forced row's argmax, but its top-k/top-p could only waste time).

Which interface: vLLM >= 0.32 on CUDA runs Model Runner V2, which accepts only
processors of its own interface (:mod:`twice_envs.agents.sampling.vllm_v2`); older
vLLM, and vLLM on CPU (where Model Runner V2 is not available), run the V1 model runner
and this module's processor. :func:`make_vllm_processor_class` picks by the installed
version. The state logic is plain Python and torch, tested without vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import torch

from twice_envs.agents.sampling.processor import force_tokens, newline_token_table
from twice_envs.keys import NoiseKey
from twice_envs.noise import KEY_MODES, KeyState, keyed_choice, state_rows

EXTRA_KEY = "twice_key"


def keyed_extra_args(key: NoiseKey, *, temperature: float = 1.0, top_p: float = 1.0, key_mode: str = "line",
                     token_counter: int = 0) -> dict:
    """The ``SamplingParams.extra_args`` that make a vLLM request sample with ``key``."""
    return {
        EXTRA_KEY: [int(key.episode_seed), int(key.turn), int(key.branch)],
        "twice_temperature": float(temperature),
        "twice_top_p": float(top_p),
        "twice_key_mode": key_mode,
        "twice_token_counter": int(token_counter),
    }


@dataclass
class KeyedRequest:
    """The keyed-sampling state of one vLLM request (moves with the request, never with a row)."""

    state: KeyState
    """The core key state (key base, mode, line/pos counters, n-gram context)."""
    temperature: float
    """Temperature of the keyed sampling distribution."""
    top_p: float
    """Nucleus mass of the keyed sampling distribution."""
    seen: int = 0
    """Output tokens already folded into :attr:`state`."""

    @classmethod
    def from_extra_args(cls, extra: Optional[Mapping], prompt_ids: Optional[Sequence[int]] = ()) -> Optional["KeyedRequest"]:
        """The request's state from its ``extra_args`` (``None`` when it carries no key); bad values raise ``ValueError``."""
        if not extra or EXTRA_KEY not in extra:
            return None
        try:
            seed, turn, branch = (int(v) for v in extra[EXTRA_KEY])
            tau = float(extra.get("twice_temperature", 1.0))
            top_p = float(extra.get("twice_top_p", 1.0))
            counter = int(extra.get("twice_token_counter", 0))
        except (TypeError, ValueError) as e:
            raise ValueError(f"bad keyed sampling extra_args {dict(extra)!r}: {e}") from None
        mode = str(extra.get("twice_key_mode", "line"))
        if mode not in KEY_MODES:
            raise ValueError(f"twice_key_mode must be one of {KEY_MODES}, got {mode!r}")
        if not tau > 0 or not 0 < top_p <= 1:
            raise ValueError(f"bad keyed sampling parameters: temperature {tau}, top_p {top_p}")
        return cls(KeyState(NoiseKey(seed, turn, branch), mode, counter, list(prompt_ids or ())), tau, top_p)

    def catch_up(self, outputs: Sequence[int], newline_table: torch.Tensor, start: int = 0) -> None:
        """Fold ``outputs`` (the request's output tokens ``start, start + 1, ...``) past :attr:`seen`."""
        n = newline_table.numel()
        for i in range(self.seen - start, len(outputs)):
            t = int(outputs[i])
            self.state.advance(t, 0 <= t < n and bool(newline_table[t]))
            self.seen += 1


def force_keyed_rows(logits: torch.Tensor, rows: Sequence[int], requests: Sequence[KeyedRequest]) -> None:
    """Force ``logits[rows[i]]`` (in place) to the keyed sample of ``requests[i]``.

    Rows are grouped by sampling distribution; each group is one :func:`keyed_choice` call.
    """
    groups: dict[tuple[float, float], list[int]] = {}
    for i, req in enumerate(requests):
        groups.setdefault((req.temperature, req.top_p), []).append(i)
    for (tau, top_p), members in groups.items():
        idx = torch.tensor([rows[i] for i in members], dtype=torch.long, device=logits.device)
        keys = torch.from_numpy(state_rows([requests[i].state for i in members])).to(logits.device)
        tokens = keyed_choice(logits[idx], keys, temperature=tau, top_p=top_p).tokens
        logits[idx] = force_tokens(logits[idx], tokens)


class KeyedBatchState:
    """Row index -> keyed request, updated from the V1 runner's batch updates."""

    def __init__(self, newline_table: torch.Tensor) -> None:
        self.newline_table = newline_table.cpu()
        #: row -> (request state, live reference to the request's output tokens)
        self.rows: dict[int, tuple[KeyedRequest, list]] = {}

    def update(self, removed: Sequence[int], added: Sequence[tuple], moved: Sequence[tuple]) -> None:
        """Apply a batch update in vLLM's order: removed, added, moved.

        ``added``: ``(index, extra_args, prompt_ids, output_ids)`` where ``output_ids`` is
        the live list vLLM appends to; ``moved``: ``(i, j, swap)`` where ``swap`` is True
        for a two-way swap, False for a move i -> j.
        """
        for i in removed:
            self.rows.pop(int(i), None)
        for index, extra, prompt_ids, output_ids in added:
            req = KeyedRequest.from_extra_args(extra, prompt_ids)
            if req is None:
                self.rows.pop(int(index), None)
            else:
                self.rows[int(index)] = (req, output_ids)
        for i, j, swap in moved:
            a, b = self.rows.pop(int(i), None), self.rows.pop(int(j), None)
            if a is not None:
                self.rows[int(j)] = a
            if swap and b is not None:
                self.rows[int(i)] = b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Force each keyed row's logits to its keyed sample (other rows are left alone)."""
        rows, reqs = [], []
        for i, (req, outputs) in self.rows.items():
            if i < logits.shape[0]:
                req.catch_up(outputs, self.newline_table)
                rows.append(i)
                reqs.append(req)
        if rows:
            force_keyed_rows(logits, rows, reqs)
        return logits


def model_newline_table(vllm_config: Any) -> torch.Tensor:
    """:func:`~twice_envs.agents.sampling.processor.newline_token_table` of a vLLM engine's model (at engine start)."""
    from transformers import AutoTokenizer

    cfg = vllm_config.model_config
    tok = AutoTokenizer.from_pretrained(cfg.tokenizer, trust_remote_code=bool(getattr(cfg, "trust_remote_code", False)))
    return newline_token_table(tok, cfg.get_vocab_size())


try:  # the vLLM class exists only where vLLM is installed
    from vllm.v1.sample.logits_processor import BatchUpdate as _BatchUpdate
    from vllm.v1.sample.logits_processor import LogitsProcessor as _VLLMLogitsProcessor
    from vllm.v1.sample.logits_processor import (
        MoveDirectionality as _MoveDirectionality,
    )
except ImportError:
    _VLLMLogitsProcessor = None

if _VLLMLogitsProcessor is not None:

    class TwiceKeyedLogitsProcessor(_VLLMLogitsProcessor):
        """Keyed Gumbel sampling per request, V1 model runner (module level: vLLM pickles it into its workers)."""

        def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
            self.state = KeyedBatchState(model_newline_table(vllm_config))

        @classmethod
        def validate_params(cls, sampling_params: Any) -> None:
            KeyedRequest.from_extra_args(sampling_params.extra_args)

        def is_argmax_invariant(self) -> bool:
            return False

        def update_state(self, batch_update: Optional["_BatchUpdate"]) -> None:
            if batch_update is None:
                return
            added = [(i, params.extra_args if params is not None else None, prompt, out)
                     for i, params, prompt, out in batch_update.added]
            moved = [(i, j, d == _MoveDirectionality.SWAP) for i, j, d in batch_update.moved]
            self.state.update(batch_update.removed, added, moved)

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            return self.state.apply(logits)
