"""Keyed sampling in vLLM (V1 engine): a logits processor with per-request state.

vLLM keeps a persistent batch whose rows are added, removed and moved between steps,
so the sampler state lives per *request* (a :class:`RequestKeyState`), and the row
index is only where the request sits now. A request opts in by carrying its key base
in ``SamplingParams.extra_args``::

    SamplingParams(temperature=1.0, max_tokens=128, extra_args={
        "twice_key": [episode_seed, turn, branch],     # the env's info["noise_key"] base
        "twice_temperature": 1.0, "twice_top_p": 1.0,  # the keyed sampling distribution
        "twice_key_mode": "line", "twice_token_counter": 0})

The processor replaces the row's logits by ``0`` at the keyed sample and ``-inf``
elsewhere, so whatever vLLM's own sampler does next, it emits that token (exactly the
token :class:`~twice_envs.agents.sampling.KeyedLogitsProcessor` emits for the same
logits and key). The state logic (:class:`KeyedBatchState`) is plain Python and
torch, tested without vLLM; :func:`make_vllm_processor_class` wraps it in vLLM's
``LogitsProcessor`` interface and needs vLLM installed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import torch

from twice_envs.agents.sampling import KEY_MODES, keyed_argmax, ngram_hash, sampling_logits, seed_words
from twice_envs.keys import NoiseKey

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
class RequestKeyState:
    """The keyed-sampling state of one request (moves with the request, never with a row)."""

    key: NoiseKey
    temperature: float
    top_p: float
    key_mode: str
    token_counter: int
    output_ids: list  # a live reference to the request's output tokens (vLLM appends to it)
    prompt_tail: list = field(default_factory=list)
    seen: int = 0
    line: int = 0
    pos: int = 0

    @classmethod
    def from_extra_args(cls, extra: Optional[Mapping], prompt_ids: Optional[Sequence[int]],
                        output_ids: list) -> Optional["RequestKeyState"]:
        if not extra or EXTRA_KEY not in extra:
            return None
        seed, turn, branch = (int(v) for v in extra[EXTRA_KEY])
        mode = str(extra.get("twice_key_mode", "line"))
        if mode not in KEY_MODES:
            raise ValueError(f"twice_key_mode must be one of {KEY_MODES}, got {mode!r}")
        tau = float(extra.get("twice_temperature", 1.0))
        top_p = float(extra.get("twice_top_p", 1.0))
        if not tau > 0 or not 0 < top_p <= 1:
            raise ValueError(f"bad keyed sampling parameters: temperature {tau}, top_p {top_p}")
        return cls(NoiseKey(seed, turn, branch), tau, top_p, mode, int(extra.get("twice_token_counter", 0)),
                   output_ids, list(prompt_ids or [])[-4:])

    def catch_up(self, newline_table: torch.Tensor) -> None:
        """Advance line/pos past the output tokens appended since the last step."""
        n = newline_table.numel()
        while self.seen < len(self.output_ids):
            t = int(self.output_ids[self.seen])
            if 0 <= t < n and bool(newline_table[t]):
                self.line, self.pos = self.line + 1, 0
            else:
                self.pos += 1
            self.seen += 1

    def key_row(self) -> list[int]:
        lo, hi = seed_words(self.key.episode_seed)
        k = self.key
        if self.key_mode == "line":
            return [lo, hi, k.turn, k.branch, self.line, self.pos]
        if self.key_mode == "flat":
            return [lo, hi, k.turn, k.branch, 0, self.seen]
        if self.key_mode == "counter":
            return [lo, hi, 0, k.branch, 0, self.token_counter + self.seen]
        context = (self.prompt_tail + [int(t) for t in self.output_ids])[-4:]
        return [lo, hi, ngram_hash(context), k.branch, 0, 0]


class KeyedBatchState:
    """Row index -> :class:`RequestKeyState`, updated from vLLM's batch updates."""

    def __init__(self, newline_table: torch.Tensor) -> None:
        self.newline_table = newline_table
        self.rows: dict[int, RequestKeyState] = {}

    def update(self, removed: Sequence[int], added: Sequence[tuple], moved: Sequence[tuple]) -> None:
        """Apply a batch update in vLLM's order: removed, added, moved.

        ``added``: ``(index, extra_args, prompt_ids, output_ids)``; ``moved``:
        ``(i, j, swap)`` where ``swap`` is True for a two-way swap, False for a move i -> j.
        """
        for i in removed:
            self.rows.pop(int(i), None)
        for index, extra, prompt_ids, output_ids in added:
            state = RequestKeyState.from_extra_args(extra, prompt_ids, output_ids)
            if state is None:
                self.rows.pop(int(index), None)
            else:
                self.rows[int(index)] = state
        for i, j, swap in moved:
            a, b = self.rows.pop(int(i), None), self.rows.pop(int(j), None)
            if a is not None:
                self.rows[int(j)] = a
            if swap and b is not None:
                self.rows[int(i)] = b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Force each keyed row's logits to its keyed sample (other rows are left alone)."""
        if not self.rows:
            return logits
        groups: dict[tuple[float, float], list[int]] = {}
        for i, st in self.rows.items():
            if i < logits.shape[0]:
                st.catch_up(self.newline_table)
                groups.setdefault((st.temperature, st.top_p), []).append(i)
        for (tau, top_p), idx in groups.items():
            rows = torch.tensor(idx, dtype=torch.long, device=logits.device)
            z = sampling_logits(logits[rows].float(), tau, top_p)
            keys = torch.tensor([self.rows[i].key_row() for i in idx], dtype=torch.int64)
            tokens = keyed_argmax(z, keys.to(z.device))
            forced = torch.full((len(idx), logits.shape[1]), float("-inf"), dtype=logits.dtype, device=logits.device)
            forced.scatter_(1, tokens[:, None], 0.0)
            logits[rows] = forced
        return logits


try:  # the vLLM class exists only where vLLM is installed
    from vllm.v1.sample.logits_processor import BatchUpdate as _BatchUpdate
    from vllm.v1.sample.logits_processor import LogitsProcessor as _VLLMLogitsProcessor
    from vllm.v1.sample.logits_processor import MoveDirectionality as _MoveDirectionality
except ImportError:
    _VLLMLogitsProcessor = None

if _VLLMLogitsProcessor is not None:

    class TwiceKeyedLogitsProcessor(_VLLMLogitsProcessor):
        """Keyed Gumbel sampling per request (module level: vLLM pickles it into its workers)."""

        def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
            from transformers import AutoTokenizer

            from twice_envs.agents.sampling import newline_token_table

            tok = AutoTokenizer.from_pretrained(vllm_config.model_config.tokenizer)
            table = newline_token_table(tok, vllm_config.model_config.get_vocab_size())
            self.state = KeyedBatchState(table)

        @classmethod
        def validate_params(cls, sampling_params: Any) -> None:
            RequestKeyState.from_extra_args(sampling_params.extra_args, [], [])

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


def make_vllm_processor_class() -> type:
    """vLLM's ``LogitsProcessor`` subclass around :class:`KeyedBatchState` (needs vLLM).

    Pass it in ``LLM(..., logits_processors=[cls])``; the newline table comes from the
    model's tokenizer at engine start.
    """
    from twice_envs._deps import require

    require("vllm", "vllm", "the vLLM backend")
    return TwiceKeyedLogitsProcessor


class VLLMPolicy:
    """A :class:`~twice_envs.agents.policy.Policy` on a vLLM engine with the keyed processor.

    ``model`` is ``None`` (vLLM holds the weights; train with the transformers backend).
    Log-probs are vLLM's raw log-probs of the emitted tokens, which equal the sampling
    distribution's at ``temperature = 1`` and ``top_p = 1``; ``entropy`` is not reported (0).
    Create it under ``if __name__ == "__main__":`` (vLLM starts worker processes).
    """

    def __init__(self, path: str, **engine_kwargs: Any) -> None:
        from twice_envs._deps import require

        require("vllm", "vllm", "the vLLM backend")
        from transformers import AutoTokenizer
        from vllm import LLM

        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = None
        engine_kwargs.setdefault("logprobs_mode", "raw_logprobs")
        self.llm = LLM(model=path, logits_processors=[make_vllm_processor_class()], **engine_kwargs)

    def generate(self, requests: Sequence[Any], sampling: Any) -> list:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        from twice_envs.agents.policy import Generation

        params = [
            SamplingParams(
                max_tokens=sampling.max_new_tokens, temperature=0.0 if sampling.greedy else 1.0, top_p=1.0,
                stop=list(r.stop) or None, include_stop_str_in_output=True, logprobs=0,
                extra_args=None if sampling.greedy else keyed_extra_args(
                    r.noise_key, temperature=sampling.temperature, top_p=sampling.top_p, key_mode=sampling.key_mode,
                    token_counter=r.token_counter),
            )
            for r in requests
        ]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in requests], params,
                                 use_tqdm=False)
        result = []
        for o in outs:
            c = o.outputs[0]
            ids = list(c.token_ids)
            lps = [float(step[t].logprob) if step and t in step else 0.0 for t, step in zip(ids, c.logprobs or [])]
            reason = "stop" if c.finish_reason == "stop" else "length"
            result.append(Generation(c.text, ids, lps + [0.0] * (len(ids) - len(lps)), 0.0, reason))
        return result
