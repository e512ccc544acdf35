"""Keyed sampling: the top-p nucleus, the keyed argmax and the distribution it draws from.

A sampled token is ``argmax_v [logits_v / tau + g_v]`` over the top-p nucleus, where
``g`` is the keyed Gumbel noise of :mod:`twice_envs.noise.philox`. Sampling
(:func:`keyed_sample`, :func:`keyed_choice`) and its distribution
(:func:`sampling_logprobs`) share one definition of the top-p nucleus, see
:func:`nucleus_mask`. Sampling forms ``logits / tau + g`` in float64 and, by default,
computes noise only for the tokens that the bounded noise lets win (an exact shortcut,
proved below). The float64 Gumbel values may differ across backends in the last bit,
so two backends can only disagree on a token when two candidates tie to within ~1e-15.

:func:`keyed_choice` is the one sampling step every backend adapter runs; the ``*_np``
functions are the numpy references.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from twice_envs.noise.philox import (
    G_RANGE,
    MASK32,
    _Block,
    _chunk_calls,
    _chunks,
    _scatter_words,
    _scratch,
    _torch,
    _words_at,
    _words_to_gumbel,
    _words_to_neglog_u,
    gumbel_np,
    token_keys_torch,
)

if TYPE_CHECKING:  # torch is optional: imported inside the torch functions
    import torch

__all__ = [
    "KeyedChoice",
    "SKIP_GAP",
    "keyed_choice",
    "keyed_sample",
    "keyed_sample_np",
    "nucleus_mask",
    "nucleus_mask_np",
    "sampling_logprobs",
    "sampling_logprobs_np",
]


# --------------------------------------------------------------------------- nucleus
#
# The nucleus. Let s = logits / tau (float64) and p = softmax(s). Rank the tokens by s,
# highest first, equal s by lower token id (p is increasing in s, so this is the order
# by probability, with ties broken exactly). The nucleus is the shortest prefix of this
# ranking whose mass is >= top_p: the token of rank r is in it iff the mass of the
# tokens ranked before it is < top_p. The first token is always in it; top_p >= 1 keeps
# every token. Masses are computed in float64 as exp(s - max s) against top_p * sum,
# which is what both :func:`keyed_sample` and :func:`sampling_logprobs` use, so a sample
# always lies in the support those log-probs describe.


def _check_sampling(temperature: float, top_p: float) -> None:
    if not temperature >= 0.0 or math.isinf(temperature):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must lie in (0, 1], got {top_p!r}")


def nucleus_mask(logits: "torch.Tensor", temperature: float = 1.0, top_p: float = 1.0) -> "torch.Tensor":
    """Boolean ``(B, V)`` mask of the top-p nucleus of ``softmax(logits / temperature)``.

    See the definition above; temperature 0 (greedy) gives the single argmax token.
    """
    torch = _torch()
    _check_sampling(temperature, top_p)
    if temperature == 0.0:
        mask = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)
        return mask.scatter_(-1, logits.argmax(-1, keepdim=True), True)
    if top_p >= 1.0:
        return torch.ones(logits.shape, dtype=torch.bool, device=logits.device)
    s = logits.detach().to(torch.float64) / temperature
    return _nucleus_of_scaled(s, top_p)


def _nucleus_of_scaled(s: "torch.Tensor", top_p: float) -> "torch.Tensor":
    torch = _torch()
    vals, order = torch.sort(s, dim=-1, descending=True, stable=True)
    e = torch.exp(vals - vals[:, :1])
    before = torch.cumsum(e, dim=-1) - e  # mass ranked strictly before each token
    before[:, 0] = 0.0
    keep = before < top_p * e.sum(dim=-1, keepdim=True)
    return torch.zeros_like(keep).scatter_(-1, order, keep)


def sampling_logprobs(logits: "torch.Tensor", temperature: float = 1.0, top_p: float = 1.0) -> "torch.Tensor":
    """Log-probabilities ``(B, V)`` of the distribution :func:`keyed_sample` draws from.

    ``log_softmax(logits / temperature)`` renormalised over the nucleus, ``-inf`` outside
    it; temperature 0 gives 0 at the argmax and ``-inf`` elsewhere. Differentiable in
    ``logits``; computed in float64 and returned in the dtype of ``logits``.
    """
    torch = _torch()
    mask = nucleus_mask(logits, temperature, top_p)
    out_dtype = logits.dtype if logits.dtype.is_floating_point else torch.float32
    if temperature == 0.0:
        zero = torch.zeros((), dtype=out_dtype, device=logits.device)
        return torch.where(mask, zero, torch.full_like(zero, -math.inf))
    s = logits.to(torch.float64) / temperature
    s = torch.where(mask, s, torch.full_like(s, -math.inf))
    return torch.log_softmax(s, dim=-1).to(out_dtype)


# Why noise may be skipped (the exact shortcut of keyed_sample).
#
# Bound. w is an integer in [0, 2**32 - 1], so u = (w + 0.5) / 2**32 (exact in float64)
# lies in [2**-33, 1 - 2**-33], and g = -log(-log(u)) is increasing in u: every noise
# value lies in [G_MIN, G_MAX] = [g(w=0), g(w=2**32-1)] ~ [-3.1300, 22.8739]. The
# float64 logs are accurate to a few ulps, so computed values stray outside by < 1e-13.
#
# Claim. Let m be a token with the largest scaled logit s_m = x_m / tau. A token v with
# s_v < s_m - G_RANGE can never be the argmax of s + g, whatever the keys:
#     s_v + g_v <= s_v + G_MAX < s_m - G_RANGE + G_MAX = s_m + G_MIN <= s_m + g_m,
# so v is strictly behind m and needs no noise.
#
# In floating point. Candidates are the v with x_v >= thr_x, where thr_x is
# x_max - tau * SKIP_GAP (SKIP_GAP = G_RANGE + _SKIP_MARGIN) computed in float64 and
# then rounded *down* into the dtype of x; so every skipped token has
# x_v / tau < x_max / tau - G_RANGE - _SKIP_MARGIN in exact arithmetic. Forming
# s = x / tau in float64 (relative error 2**-53), the computed noise (error < 1e-13)
# and the sums s + g (relative error 2**-53) all move values by far less than
# _SKIP_MARGIN for any |s| < 1e11, so a skipped token stays strictly behind m in the
# computed sums as well: the argmax over the candidates is the argmax over the full
# block (tests check both paths agree, including logits placed on the boundary).
_SKIP_MARGIN = 1e-3
#: Scaled logits more than this far below the row maximum never win the keyed argmax.
SKIP_GAP: float = G_RANGE + _SKIP_MARGIN
# The candidate path does one Philox call per candidate instead of one per 4 ids; it
# pays when candidates are a small share of the block.
_CANDIDATE_SHARE = 1.0 / 16.0


def keyed_sample(
    logits: "torch.Tensor",
    key_rows: "torch.Tensor",
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    greedy: bool = False,
    shortcut: bool = True,
) -> "torch.Tensor":
    """Sample one token per row: ``argmax_v [logits_v / temperature + g_v]`` over the nucleus.

    ``g`` is the keyed Gumbel noise of ``key_rows`` ``(B, 6)``; the result ``(B,)`` int64 is
    an exact draw from ``exp(sampling_logprobs(logits, temperature, top_p))`` that
    depends on the keys only. Temperature 0 or ``greedy=True`` is the plain argmax
    (lowest id on ties). With ``shortcut`` (default) noise is only computed for tokens
    within ``SKIP_GAP`` of the row maximum, which gives the same token (see the proof
    above); ``shortcut=False`` computes the full block.
    """
    torch = _torch()
    _check_sampling(temperature, top_p)
    if logits.dim() != 2:
        raise ValueError(f"logits must be (B, V), got {tuple(logits.shape)}")
    B, V = logits.shape
    if key_rows.shape[0] != B:
        raise ValueError(f"key_rows has {key_rows.shape[0]} rows for {B} rows of logits")
    with torch.no_grad():
        if greedy or temperature == 0.0:
            return logits.argmax(dim=-1)
        key_rows = key_rows.to(logits.device)
        x = logits.detach()
        if x.dtype not in (torch.float32, torch.float64):
            x = x.float()  # exact for half types
        scale = float(temperature)  # s = x / scale, always formed in float64
        if top_p < 1.0:
            x = x.to(torch.float64) / scale
            x.masked_fill_(~_nucleus_of_scaled(x, top_p), -math.inf)
            scale = 1.0
        if shortcut:
            # s_v >= s_max - SKIP_GAP  <=>  x_v >= x_max - scale * SKIP_GAP; the threshold
            # is rounded down into x's dtype, so the candidates can only be more.
            thr = x.amax(dim=-1, keepdim=True).to(torch.float64) - scale * SKIP_GAP
            thr_x = thr.to(x.dtype)
            thr_x = torch.where(thr_x.to(torch.float64) > thr, torch.nextafter(thr_x, torch.full_like(thr_x, -math.inf)), thr_x)
            cand = x >= thr_x
            if int(cand.sum()) <= _CANDIDATE_SHARE * B * V:
                rows, cols = cand.nonzero(as_tuple=True)  # row-major: ids ascending in a row
                s = x[rows, cols].to(torch.float64) / scale
                return _argmax_candidates(s, rows, cols, key_rows, B, V)
        return _argmax_full(x, scale, key_rows)


def _argmax_candidates(s, rows, cols, key_rows, B: int, V: int) -> "torch.Tensor":
    """Per row, the candidate with the largest ``s + g`` (lowest id on ties)."""
    torch = _torch()
    keys = token_keys_torch(key_rows).to(s.device)
    w = _words_at(keys[rows], cols)
    val = s + _words_to_gumbel(w, torch.empty(w.shape, dtype=torch.float64, device=s.device))
    best = torch.full((B,), -math.inf, dtype=torch.float64, device=s.device)
    best.scatter_reduce_(0, rows, val, reduce="amax")
    win = val == best[rows]
    out = torch.full((B,), V, dtype=torch.int64, device=s.device)
    out.scatter_reduce_(0, rows[win], cols[win], reduce="amin")
    return out.masked_fill_(out == V, 0)  # a row of -inf logits: id 0, like argmax


def _argmax_full(x: "torch.Tensor", scale: float, key_rows: "torch.Tensor") -> "torch.Tensor":
    """``argmax_v (x_v / scale + g_v)`` with the full noise block, chunk by chunk (float64)."""
    torch = _torch()
    keys = token_keys_torch(key_rows).to(x.device)
    B, V = x.shape
    Q = (V + 3) // 4
    n_max = _chunk_calls(B, Q)
    block = _Block(keys, n_max)
    g_slots = _scratch("f64", 4 * B * n_max, torch.float64, x.device)
    g_words = _scratch("f64b", 4 * B * n_max, torch.float64, x.device)
    val = _scratch("f64c", 4 * B * n_max, torch.float64, x.device).view(B, 4 * n_max)
    best = torch.full((B,), -math.inf, dtype=torch.float64, device=x.device)
    best_id = torch.zeros(B, dtype=torch.int64, device=x.device)
    for s, e in _chunks(B, Q):
        n, lo, hi = e - s, 4 * s, min(V, 4 * e)
        slots = block.run(s, e)
        slots[2:4].bitwise_and_(MASK32)
        h = _words_to_neglog_u(slots, g_slots[: 4 * B * n].view(4, B, n)).log_()
        gw = g_words[: 4 * B * n].view(B, n, 4)
        _scatter_words(h, gw, negate=True)
        v = val[:, : hi - lo]
        v.copy_(x[:, lo:hi])
        if scale != 1.0:
            v.div_(scale)
        v.add_(gw.reshape(B, 4 * n)[:, : hi - lo])
        m, i = v.max(dim=-1)
        better = m > best  # strict: an earlier chunk (lower ids) keeps a tie
        best = torch.where(better, m, best)
        best_id = torch.where(better, i + lo, best_id)
    return best_id


# --------------------------------------------------------------------------- numpy sampling


def nucleus_mask_np(logits: np.ndarray, temperature: float = 1.0, top_p: float = 1.0) -> np.ndarray:
    """Numpy reference of :func:`nucleus_mask`."""
    _check_sampling(temperature, top_p)
    logits = np.asarray(logits)
    if temperature == 0.0:
        mask = np.zeros(logits.shape, dtype=bool)
        np.put_along_axis(mask, logits.argmax(-1)[:, None], True, axis=-1)
        return mask
    if top_p >= 1.0:
        return np.ones(logits.shape, dtype=bool)
    s = logits.astype(np.float64) / temperature
    order = np.argsort(-s, axis=-1, kind="stable")
    vals = np.take_along_axis(s, order, axis=-1)
    e = np.exp(vals - vals[:, :1])
    before = np.cumsum(e, axis=-1) - e
    before[:, 0] = 0.0
    keep = before < top_p * e.sum(axis=-1, keepdims=True)
    mask = np.zeros_like(keep)
    np.put_along_axis(mask, order, keep, axis=-1)
    return mask


def sampling_logprobs_np(logits: np.ndarray, temperature: float = 1.0, top_p: float = 1.0) -> np.ndarray:
    """Numpy reference of :func:`sampling_logprobs` (float64)."""
    mask = nucleus_mask_np(logits, temperature, top_p)
    if temperature == 0.0:
        return np.where(mask, 0.0, -np.inf)
    s = np.where(mask, np.asarray(logits, dtype=np.float64) / temperature, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    return s - m - np.log(np.exp(s - m).sum(axis=-1, keepdims=True))


def keyed_sample_np(
    logits: np.ndarray, key_rows: np.ndarray, temperature: float = 1.0, top_p: float = 1.0
) -> np.ndarray:
    """Numpy reference of :func:`keyed_sample` (full noise block, float64): ``(B,)`` int64."""
    logits = np.asarray(logits)
    _check_sampling(temperature, top_p)
    if temperature == 0.0:
        return logits.argmax(-1).astype(np.int64)
    s = logits.astype(np.float64) / temperature
    s = np.where(nucleus_mask_np(logits, temperature, top_p), s, -np.inf)
    return (s + gumbel_np(key_rows, s.shape[1])).argmax(-1).astype(np.int64)


# --------------------------------------------------------------------------- sampling step


class KeyedChoice(NamedTuple):
    """One sampling step of a batch: the emitted tokens and their statistics (all ``(B,)``)."""

    tokens: "torch.Tensor"
    """The emitted token of every row (int64)."""
    logprobs: "torch.Tensor"
    """Log-prob of each emitted token under the sampling distribution (float64)."""
    entropy: "torch.Tensor"
    """Entropy of each row's sampling distribution (float64)."""


def keyed_choice(
    logits: "torch.Tensor",
    key_rows: "torch.Tensor",
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    greedy: bool = False,
) -> KeyedChoice:
    """:func:`keyed_sample` together with the log-prob of each token and the entropy.

    The one sampling step every backend adapter runs (transformers, vLLM, the toy envs):
    the nucleus is computed once and shared by the sample and its log-probs, so a token
    always lies in the support its log-prob describes. Tokens are exactly those of
    ``keyed_sample(logits, key_rows, temperature=..., top_p=...)`` (the scaled float64
    logits are formed by the same operations); ``greedy`` emits the plain argmax and
    still reports the sampling distribution's log-prob.
    """
    torch = _torch()
    _check_sampling(temperature, top_p)
    if temperature == 0.0:
        raise ValueError("keyed_choice needs temperature > 0 (use greedy=True for the argmax)")
    if logits.dim() != 2:
        raise ValueError(f"logits must be (B, V), got {tuple(logits.shape)}")
    with torch.no_grad():
        s = logits.detach().to(torch.float64) / float(temperature)
        if top_p < 1.0:
            s.masked_fill_(~_nucleus_of_scaled(s, top_p), -math.inf)
        if greedy:
            tokens = s.argmax(dim=-1)
        else:
            # s is already scaled and restricted, so keyed_sample adds nothing to it
            tokens = keyed_sample(s, key_rows, temperature=1.0, top_p=1.0)
        logp = torch.log_softmax(s, dim=-1)
        p = logp.exp()
        entropy = -(p * torch.where(p > 0, logp, torch.zeros_like(logp))).sum(-1)
        return KeyedChoice(tokens, logp.gather(-1, tokens[:, None]).squeeze(-1), entropy)
