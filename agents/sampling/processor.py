"""Keyed sampling for transformers: a ``LogitsProcessor`` over the keyed-sampler core.

Each row ``b`` of a batch carries a key base ``(episode_seed, turn, branch)`` and a
:class:`~twice_envs.noise.KeyState` (the key mode and the line/pos counters). At
every step the processor runs :func:`twice_envs.noise.keyed_choice` (temperature,
top-p nucleus, keyed Gumbel argmax, all in float64) and forces its result: every
other score becomes ``-inf``, so ``generate`` (greedy) or any argmax loop emits
exactly the keyed sample.

The argmax of ``z_v + g_v`` with i.i.d. standard Gumbel ``g`` is an exact sample from
``softmax(z)`` (the Gumbel-max trick), so each token is an exact draw from the
sampling distribution, and the noise is a pure function of the key, never of the
draw order or of the batch a row sits in. Key modes are described in
:class:`~twice_envs.noise.KeyState`.

The processor also records, per step, the log-prob of the emitted token and the
entropy of the sampling distribution, so a policy gets them without a second pass.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from twice_envs import noise as _noise
from twice_envs.keys import NoiseKey
from twice_envs.noise import KEY_MODES, KeyState

try:
    from transformers import LogitsProcessor as _LogitsProcessorBase
except ImportError:  # pragma: no cover - the processor also works as a plain callable
    _LogitsProcessorBase = object

__all__ = ["KEY_MODES", "KeyedLogitsProcessor", "force_tokens", "newline_token_table"]


def force_tokens(scores: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Scores that make ``tokens`` the only possible choice: 0 there, ``-inf`` elsewhere."""
    forced = torch.full_like(scores, float("-inf"))
    return forced.scatter_(-1, tokens[:, None].to(scores.device), 0.0)


# ----------------------------------------------------------------------------- tokens
def newline_token_table(tokenizer, vocab_size: Optional[int] = None) -> torch.Tensor:
    """A bool tensor: ``table[v]`` is True when token ``v``'s text contains a newline.

    Computed once per tokenizer (cached on it); ``vocab_size`` pads to the model's
    embedding size (ids past the tokenizer's vocabulary never contain a newline).
    """
    cached = getattr(tokenizer, "_twice_newline_table", None)
    n_tok = len(tokenizer)
    size = max(vocab_size or 0, n_tok)
    if cached is None or cached.numel() < size:
        table = torch.zeros(size, dtype=torch.bool)
        for v in range(n_tok):
            text = tokenizer.decode([v], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            if "\n" in text:
                table[v] = True
        try:
            tokenizer._twice_newline_table = table
        except AttributeError:  # pragma: no cover - tokenizers without a dict
            pass
        cached = table
    return cached[:size] if vocab_size is None else cached[:vocab_size]


# ----------------------------------------------------------------------------- processor
class KeyedLogitsProcessor(_LogitsProcessorBase):
    """A transformers ``LogitsProcessor`` that emits the keyed sample of every row.

    Args:
        key_bases: one key base per batch row (the env's ``info["noise_key"]``).
        newline_table: :func:`newline_token_table` of the tokenizer.
        temperature, top_p: the sampling distribution.
        key_mode: one of :data:`KEY_MODES`.
        token_counters: per row, tokens generated earlier in the episode (``counter`` mode).
        contexts: per row, the prompt's last tokens (``ngram`` mode); when ``None`` the
            first ``__call__`` reads them from ``input_ids``.
        greedy: emit the plain argmax instead (evaluation).

    :attr:`states` holds one :class:`~twice_envs.noise.KeyState` per row. After each
    step, :attr:`last_tokens`, :attr:`logprobs` and :attr:`entropies` hold the emitted
    tokens and their statistics (one list entry per step).
    """

    def __init__(
        self,
        key_bases: Sequence[NoiseKey],
        newline_table: torch.Tensor,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        key_mode: str = "line",
        token_counters: Optional[Sequence[int]] = None,
        contexts: Optional[Sequence[Sequence[int]]] = None,
        greedy: bool = False,
    ) -> None:
        if key_mode not in KEY_MODES:
            raise ValueError(f"key_mode must be one of {KEY_MODES}, got {key_mode!r}")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature!r}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
        n = len(key_bases)
        counters = list(token_counters) if token_counters is not None else [0] * n
        ctx = list(contexts) if contexts is not None else [()] * n
        self.states = [KeyState(NoiseKey(*k), key_mode, int(c), x) for k, c, x in zip(key_bases, counters, ctx)]
        self._need_context = key_mode == "ngram" and contexts is None
        self.newline_table = newline_table
        self._newline = newline_table.cpu()
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.key_mode = key_mode
        self.greedy = greedy
        self.step = 0
        self.logprobs: list[torch.Tensor] = []
        self.entropies: list[torch.Tensor] = []
        self.last_tokens: Optional[torch.Tensor] = None

    def advance(self, emitted: torch.Tensor) -> None:
        """Move every row's key state past the token it just emitted (one per row)."""
        ids = emitted.cpu().to(torch.int64)
        nl = self._newline[ids.clamp(0, self._newline.numel() - 1)] & (ids < self._newline.numel())
        for st, t, n in zip(self.states, ids.tolist(), nl.tolist()):
            st.advance(t, n)
        self.step += 1

    def key_rows(self) -> torch.Tensor:
        """The ``(B, 6)`` key rows ``[seed_lo, seed_hi, turn, branch, line, pos]`` of the next token."""
        return torch.from_numpy(_noise.state_rows(self.states))

    def choose(self, scores: torch.Tensor) -> torch.Tensor:
        """The emitted token of every row for next-token ``scores`` ``(B, V)``; records statistics."""
        rows = self.key_rows().to(scores.device)
        c = _noise.keyed_choice(scores, rows, temperature=self.temperature, top_p=self.top_p, greedy=self.greedy)
        self.logprobs.append(c.logprobs.float())
        self.entropies.append(c.entropy.float())
        self.last_tokens = c.tokens
        return c.tokens

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        # generate() calls us once per step; the token emitted at the previous step is
        # the last column of input_ids from the second call on.
        if self.last_tokens is not None:
            self.advance(input_ids[:, -1])
        elif self._need_context:
            for st, row in zip(self.states, input_ids[:, -_noise.NGRAM:].tolist()):
                st.context = row
            self._need_context = False
        return force_tokens(scores, self.choose(scores))
