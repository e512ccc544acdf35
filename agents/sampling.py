"""Keyed sampling for transformers: a ``LogitsProcessor`` that samples with keyed Gumbel noise.

Each row ``b`` of a batch carries a key base ``(episode_seed, turn, branch, 0, 0)``.
At every step the processor

1. scales the logits by ``1 / temperature`` and restricts them to the top-p nucleus,
2. adds the Gumbel noise addressed by the row's current key (DESIGN section 2),
3. forces the argmax: every other score becomes ``-inf``, so ``generate`` (greedy)
   or any argmax loop emits exactly the keyed sample.

The argmax of ``z_v + g_v`` with i.i.d. standard Gumbel ``g`` is an exact sample from
``softmax(z)`` (the Gumbel-max trick), so each token is an exact draw from the
sampling distribution, and the noise is a pure function of the key, never of the
draw order or of the batch a row sits in.

Key modes (``SamplingConfig.key_mode``):

* ``line`` (default): ``(seed, turn, branch, line, pos)``; ``line`` counts newline
  tokens emitted in the turn, ``pos`` the position inside the line, so a twin whose
  turn re-synchronises at a newline reads the factual noise from the next line on.
* ``flat``: ``(seed, turn, branch, 0, pos_in_turn)``: no re-synchronisation.
* ``counter``: ``(seed, 0, branch, 0, episode_token_counter)``: one running counter
  per episode (an ablation: a twin's different turn length shifts all later noise).
* ``ngram``: ``(seed, hash(last 4 tokens), branch, 0, 0)``: inexact (keys repeat
  whenever a 4-gram repeats); an ablation only.

The processor also records, per step, the log-prob of the emitted token and the
entropy of the sampling distribution, so a policy gets them without a second pass.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from twice_envs.keys import NoiseKey

from twice_envs import noise as _noise

try:
    from transformers import LogitsProcessor as _LogitsProcessorBase
except ImportError:  # pragma: no cover - the processor also works as a plain callable
    _LogitsProcessorBase = object

KEY_MODES = ("line", "flat", "counter", "ngram")

#: With 32-bit uniforms ``u = (w + 0.5) / 2**32`` the Gumbel value lies in
#: ``[-log(-log(2**-33)), -log(-log(1 - 2**-33))] = [-3.1302, 22.8739]``, a span of
#: 26.004. A token whose scaled logit is more than that span below the row maximum
#: can never win the argmax (its best case is below the leader's worst case), so
#: its noise need not be computed. The margin adds 0.5 for float32 rounding of the
#: logits and the noise.
GUMBEL_SPAN = _noise.G_RANGE + 0.5

_NGRAM = 4
_MASK32 = 0xFFFFFFFF


# ----------------------------------------------------------------------------- noise
def gumbel_noise(key_rows: torch.Tensor, vocab_size: int, token_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Keyed Gumbel noise (:func:`twice_envs.noise.gumbel_torch`) for ``(B, 6)`` key rows, over the
    vocabulary or the ``(B, K)`` ``token_ids``, as float32."""
    return _noise.gumbel_torch(key_rows, vocab_size, token_ids=token_ids).to(torch.float32)


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


def seed_words(seed: int) -> tuple[int, int]:
    """``(seed_lo32, seed_hi32)`` of a 64-bit seed."""
    return int(seed) & _MASK32, (int(seed) >> 32) & _MASK32


def ngram_hash(tokens: Sequence[int]) -> int:
    """A 32-bit hash of the last :data:`_NGRAM` tokens (FNV-1a over the ids; process-independent)."""
    h = 0x811C9DC5
    for t in list(tokens)[-_NGRAM:]:
        for shift in (0, 8, 16, 24):
            h ^= (int(t) >> shift) & 0xFF
            h = (h * 0x01000193) & _MASK32
    return h


# ----------------------------------------------------------------------------- distribution
def sampling_logits(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """``logits / temperature`` with tokens outside the top-p nucleus set to ``-inf``.

    The nucleus is the smallest set of most likely tokens whose probability reaches
    ``top_p`` (the most likely token is always in it).
    """
    z = logits.float() / max(float(temperature), 1e-6)
    if top_p >= 1.0:
        return z
    sorted_z, order = torch.sort(z, dim=-1, descending=True)
    probs = torch.softmax(sorted_z, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs  # mass of strictly more likely tokens
    drop_sorted = before >= top_p
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return z.masked_fill(drop, float("-inf"))


def keyed_argmax(z: torch.Tensor, key_rows: torch.Tensor) -> torch.Tensor:
    """``argmax_v z_v + g_v`` per row, computing noise only for tokens that can win.

    Exact: a token more than :data:`GUMBEL_SPAN` below its row's maximum cannot beat
    the maximum's token whatever the noise (see :data:`GUMBEL_SPAN`).
    """
    vocab = z.shape[-1]
    zmax = z.max(dim=-1, keepdim=True).values
    alive = z > (zmax - GUMBEL_SPAN)
    k = int(alive.sum(dim=-1).max().item())
    if k * 4 >= vocab:
        g = gumbel_noise(key_rows, vocab)
        return torch.argmax(z + g, dim=-1)
    cand_z, cand_ids = torch.topk(z, k, dim=-1)
    g = gumbel_noise(key_rows, vocab, token_ids=cand_ids)
    best = torch.argmax(cand_z + g, dim=-1, keepdim=True)
    return cand_ids.gather(-1, best).squeeze(-1)


# ----------------------------------------------------------------------------- processor
class KeyedLogitsProcessor(_LogitsProcessorBase):
    """A transformers ``LogitsProcessor`` that emits the keyed sample of every row.

    Args:
        key_bases: one key base per batch row (the env's ``info["noise_key"]``).
        newline_table: :func:`newline_token_table` of the tokenizer.
        temperature, top_p: the sampling distribution.
        key_mode: one of :data:`KEY_MODES`.
        token_counters: per row, tokens generated earlier in the episode (``counter`` mode).
        contexts: per row, the prompt's last tokens (``ngram`` mode; the processor
            reads them from ``input_ids`` when ``None``).
        greedy: emit the plain argmax instead (evaluation).

    After each call, :attr:`last_tokens`, :attr:`logprobs` and :attr:`entropies`
    hold the emitted tokens and their statistics (one list entry per step).
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
        greedy: bool = False,
    ) -> None:
        if key_mode not in KEY_MODES:
            raise ValueError(f"key_mode must be one of {KEY_MODES}, got {key_mode!r}")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature!r}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
        self.key_bases = [NoiseKey(*k) for k in key_bases]
        n = len(self.key_bases)
        self.newline_table = newline_table
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.key_mode = key_mode
        self.greedy = greedy
        self.line = torch.zeros(n, dtype=torch.int64)
        self.pos = torch.zeros(n, dtype=torch.int64)
        self.step = 0
        self.counter = torch.tensor(list(token_counters) if token_counters is not None else [0] * n, dtype=torch.int64)
        base = torch.tensor([[*seed_words(k.episode_seed), k.turn, k.branch] for k in self.key_bases], dtype=torch.int64)
        self._base = base.reshape(n, 4)
        self.logprobs: list[torch.Tensor] = []
        self.entropies: list[torch.Tensor] = []
        self.last_tokens: Optional[torch.Tensor] = None

    def advance(self, emitted: torch.Tensor) -> None:
        """Move the counters past the tokens just emitted (one per row)."""
        nl = self.newline_table.to(emitted.device)[emitted.clamp(0, self.newline_table.numel() - 1)]
        self.line = torch.where(nl, self.line + 1, self.line)
        self.pos = torch.where(nl, torch.zeros_like(self.pos), self.pos + 1)
        self.counter = self.counter + 1
        self.step += 1

    def key_rows(self, input_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The ``(B, 6)`` key rows ``[seed_lo, seed_hi, turn, branch, line, pos]`` of the next token."""
        b = self._base
        n = b.shape[0]
        if self.key_mode == "line":
            rest = torch.stack([b[:, 2], b[:, 3], self.line, self.pos], dim=1)
        elif self.key_mode == "flat":
            rest = torch.stack([b[:, 2], b[:, 3], torch.zeros(n, dtype=torch.int64), torch.full((n,), self.step)], dim=1)
        elif self.key_mode == "counter":
            zero = torch.zeros(n, dtype=torch.int64)
            rest = torch.stack([zero, b[:, 3], zero, self.counter], dim=1)
        else:
            if input_ids is None:
                raise ValueError("ngram keys need the context tokens")
            hashes = torch.tensor([ngram_hash(row) for row in input_ids[:, -_NGRAM:].tolist()], dtype=torch.int64)
            zero = torch.zeros(n, dtype=torch.int64)
            rest = torch.stack([hashes, b[:, 3], zero, zero], dim=1)
        return torch.cat([b[:, :2], rest], dim=1)

    def choose(self, scores: torch.Tensor, input_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The emitted token of every row for next-token ``scores`` ``(B, V)``; records statistics."""
        z = sampling_logits(scores, self.temperature, self.top_p)
        logp = torch.log_softmax(z, dim=-1)
        if self.greedy:
            tokens = torch.argmax(z, dim=-1)
        else:
            tokens = keyed_argmax(z, self.key_rows(input_ids).to(z.device))
        p = logp.exp()
        ent = -(p * torch.where(p > 0, logp, torch.zeros_like(logp))).sum(-1)
        self.logprobs.append(logp.gather(-1, tokens[:, None]).squeeze(-1))
        self.entropies.append(ent)
        self.last_tokens = tokens
        return tokens

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        # generate() calls us once per step; the token emitted at the previous step is
        # the last column of input_ids from the second call on.
        if self.last_tokens is not None:
            self.advance(input_ids[:, -1].cpu())
        tokens = self.choose(scores, input_ids)
        forced = torch.full_like(scores, float("-inf"))
        forced.scatter_(-1, tokens[:, None].to(scores.device), 0.0)
        return forced


def gumbel_bounds() -> tuple[float, float]:
    """The range of the keyed Gumbel noise with 32-bit uniforms."""
    lo = -math.log(-math.log(0.5 / 2**32))
    hi = -math.log(-math.log1p(-0.5 / 2**32))
    return lo, hi
