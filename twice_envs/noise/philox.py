"""The noise generator: Philox4x32-10 words, uniforms and Gumbel noise at a key.

Bit-exact in every backend:

* Philox4x32-10 (Random123), ``philox(counter: 4 x uint32, key: 2 x uint32) -> 4 x uint32``.
* Per-token key: the first two words of
  ``philox(counter=(turn, branch, line, pos), key=(seed_lo32, seed_hi32))``.
* Word for vocabulary id ``v``: word ``v % 4`` of ``philox(counter=(v // 4, 0, 0, 0),
  key=token_key)``; one Philox call serves four consecutive ids.
* ``u = (w + 0.5) / 2**32`` (never 0 or 1), ``g = -log(-log(u))``.

A key is passed around as a *key row*, an int64 vector
``[seed_lo32, seed_hi32, turn, branch, line, pos]`` (every entry in ``[0, 2**32)``), so
a batch of keys is one ``(B, 6)`` array or tensor.

Numpy functions (``*_np``, :func:`philox4x32_10`) are the reference; the torch
functions run the same arithmetic on CPU or CUDA with int64 tensors (torch has no
uint32 multiply-high: a 32x32-bit product is formed in int64, where it wraps modulo
2**64 and keeps its low 64 bits exactly, and the high word is recovered by an
arithmetic shift and a mask). The words are bit-identical across backends; the
float64 Gumbel values may differ in the last bit (each backend's ``log``).

Speed (``twice bench noise``): the torch block kernel runs Philox as five tensor ops
per round on stacked ``(2, batch, chunk)`` int64 buffers, cache-sized chunks, with
reused scratch memory; see the benchmark for the ratio to ``torch.rand``. The kernel's
pieces (:class:`_Block`, the word-to-noise transforms) are shared with the keyed argmax
of :mod:`twice_envs.noise.sampling`.
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING, Optional, Sequence, Tuple, Union

import numpy as np

from twice_envs._deps import require
from twice_envs.keys import NoiseKey, UINT32_MAX, UINT64_MAX

if TYPE_CHECKING:  # torch is optional: imported inside the torch functions
    import torch

__all__ = [
    "G_MAX",
    "G_MIN",
    "G_RANGE",
    "MASK32",
    "PHILOX_M0",
    "PHILOX_M1",
    "PHILOX_ROUNDS",
    "PHILOX_W0",
    "PHILOX_W1",
    "ROW_FIELDS",
    "gumbel_np",
    "gumbel_torch",
    "key_rows",
    "key_tensor",
    "philox4x32_10",
    "philox4x32_10_torch",
    "philox_words_np",
    "philox_words_torch",
    "token_key",
    "token_keys_np",
    "token_keys_torch",
    "uniforms_np",
    "uniforms_torch",
]

# Random123 Philox4x32 constants: round multipliers and Weyl key increments.
PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
PHILOX_ROUNDS = 10

MASK32 = UINT32_MAX

#: Bounds of the noise. ``w`` ranges over ``[0, 2**32 - 1]``, so ``u`` over
#: ``[2**-33, 1 - 2**-33]``; ``g = -log(-log(u))`` is increasing in ``u``, hence
#: ``G_MIN = -log(33 ln 2) ~ -3.1300`` and ``G_MAX = -log(-log1p(-2**-33)) ~ 22.8739``
#: (``-log1p(-x) = x + x**2/2 + ...``, so ``G_MAX`` is ``33 ln 2`` up to ``2**-34``).
G_MIN: float = -math.log(33.0 * math.log(2.0))
G_MAX: float = -math.log(-math.log1p(-(2.0**-33)))
#: Widest possible gap between two noise values.
G_RANGE: float = G_MAX - G_MIN

#: The entries of a key row.
ROW_FIELDS = ("seed_lo32", "seed_hi32", "turn", "branch", "line", "pos")


# --------------------------------------------------------------------------- numpy reference


def _mulhilo_np(a: np.ndarray, m: int) -> Tuple[np.ndarray, np.ndarray]:
    # a < 2**32 and m < 2**32, so the product is < 2**64: exact in uint64.
    p = a * np.uint64(m)
    return p >> np.uint64(32), p & np.uint64(MASK32)


def philox4x32_10(counter: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Philox4x32-10 of ``counter`` ``(..., 4)`` uint32 under ``key`` ``(..., 2)`` uint32.

    Leading dimensions broadcast; returns ``(..., 4)`` uint32.
    """
    counter = np.asarray(counter)
    key = np.asarray(key)
    if counter.shape[-1:] != (4,) or key.shape[-1:] != (2,):
        raise ValueError(f"counter must be (..., 4) and key (..., 2), got {counter.shape} and {key.shape}")
    for name, arr in (("counter", counter), ("key", key)):
        if arr.dtype.kind not in "ui" or (arr.size and (arr.min() < 0 or arr.max() > MASK32)):
            raise ValueError(f"{name} words must be integers in [0, 2**32)")
    c0, c1, c2, c3 = (counter[..., i].astype(np.uint64) for i in range(4))
    k0, k1 = (key[..., i].astype(np.uint64) for i in range(2))
    mask = np.uint64(MASK32)
    for r in range(PHILOX_ROUNDS):
        if r:
            k0 = (k0 + np.uint64(PHILOX_W0)) & mask
            k1 = (k1 + np.uint64(PHILOX_W1)) & mask
        hi0, lo0 = _mulhilo_np(c0, PHILOX_M0)
        hi1, lo1 = _mulhilo_np(c2, PHILOX_M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    out = np.stack(np.broadcast_arrays(c0, c1, c2, c3), axis=-1)
    return out.astype(np.uint32)


def _check_rows_np(rows: np.ndarray) -> np.ndarray:
    rows = np.asarray(rows)
    if rows.ndim != 2 or rows.shape[1] != 6:
        raise ValueError(f"key rows must have shape (B, 6) = {ROW_FIELDS}, got {rows.shape}")
    if rows.dtype.kind not in "ui":
        raise ValueError(f"key rows must be integers, got dtype {rows.dtype}")
    if rows.size and (rows.min() < 0 or rows.max() > MASK32):
        raise ValueError("every key-row entry must lie in [0, 2**32)")
    return rows.astype(np.int64, copy=False)


def key_rows(keys: Sequence[NoiseKey]) -> np.ndarray:
    """The ``(B, 6)`` int64 key rows ``[seed_lo32, seed_hi32, turn, branch, line, pos]`` of ``keys``."""
    rows = np.zeros((len(keys), 6), dtype=np.int64)
    for i, key in enumerate(keys):
        seed, turn, branch, line, pos = (int(v) for v in key)
        if not 0 <= seed <= UINT64_MAX:
            raise ValueError(f"episode_seed must be a uint64, got {seed}")
        for name, value in (("turn", turn), ("branch", branch), ("line", line), ("pos", pos)):
            if not 0 <= value <= MASK32:
                raise ValueError(f"NoiseKey.{name} must lie in [0, 2**32), got {value}")
        rows[i] = (seed & MASK32, seed >> 32, turn, branch, line, pos)
    return rows


def token_keys_np(rows: np.ndarray) -> np.ndarray:
    """Per-token Philox keys ``(B, 2)`` uint32 of key rows ``(B, 6)``."""
    rows = _check_rows_np(rows)
    return philox4x32_10(rows[:, 2:6], rows[:, 0:2])[:, :2]


def token_key(key: NoiseKey) -> Tuple[int, int]:
    """The per-token Philox key of one :class:`NoiseKey`."""
    k = token_keys_np(key_rows([key]))[0]
    return int(k[0]), int(k[1])


def philox_words_np(rows: np.ndarray, vocab_size: int, token_ids: Optional[np.ndarray] = None) -> np.ndarray:
    """The uint32 noise words ``(B, V)`` (or ``(B, K)`` for ``token_ids``) of key rows ``(B, 6)``."""
    keys = token_keys_np(rows)
    if token_ids is None:
        ids = np.arange(int(vocab_size), dtype=np.int64)[None, :]
    else:
        ids = np.asarray(token_ids, dtype=np.int64)
        if ids.ndim != 2 or ids.shape[0] != keys.shape[0]:
            raise ValueError(f"token_ids must be (B, K) with B={keys.shape[0]}, got {ids.shape}")
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ValueError("token_ids out of range")
    ids = np.broadcast_to(ids, (keys.shape[0], ids.shape[1]))
    counter = np.zeros(ids.shape + (4,), dtype=np.uint32)
    counter[..., 0] = ids // 4
    blocks = philox4x32_10(counter, keys[:, None, :])  # (B, K, 4): one call per id
    return np.take_along_axis(blocks, (ids % 4)[..., None], axis=-1)[..., 0]


def uniforms_np(rows: np.ndarray, vocab_size: int, token_ids: Optional[np.ndarray] = None) -> np.ndarray:
    """Uniforms ``u = (w + 0.5) / 2**32`` as float64, ``(B, V)`` or ``(B, K)``."""
    w = philox_words_np(rows, vocab_size, token_ids).astype(np.float64)
    return (w + 0.5) * 2.0**-32


def gumbel_np(rows: np.ndarray, vocab_size: int, token_ids: Optional[np.ndarray] = None) -> np.ndarray:
    """Gumbel noise ``g = -log(-log(u))`` as float64, ``(B, V)`` or ``(B, K)``."""
    return -np.log(-np.log(uniforms_np(rows, vocab_size, token_ids)))


# --------------------------------------------------------------------------- torch


_TORCH = None


def _torch():
    global _TORCH
    if _TORCH is None:
        _TORCH = require("torch", "torch", "keyed noise in torch")
    return _TORCH


def key_tensor(keys: Union[Sequence[NoiseKey], np.ndarray, "torch.Tensor"], device=None) -> "torch.Tensor":
    """Key rows ``(B, 6)`` int64 tensor from NoiseKeys (or from key rows already built)."""
    torch = _torch()
    if isinstance(keys, torch.Tensor):
        rows = keys.to(device=device, dtype=torch.int64)
    else:
        if isinstance(keys, np.ndarray):
            arr = _check_rows_np(keys)
        else:
            arr = key_rows(list(keys))
        rows = torch.from_numpy(np.ascontiguousarray(arr)).to(device)
    _check_rows_torch(rows)
    return rows


def _check_rows_torch(rows: "torch.Tensor") -> None:
    if rows.dim() != 2 or rows.shape[1] != 6:
        raise ValueError(f"key rows must have shape (B, 6) = {ROW_FIELDS}, got {tuple(rows.shape)}")
    if rows.dtype.is_floating_point or rows.dtype.is_complex or rows.dtype == _torch().bool:
        raise ValueError(f"key rows must be an integer tensor, got {rows.dtype}")


def _philox_rounds_torch(c0, c1, c2, c3, k0, k1):
    """Ten Philox rounds on int64 tensors (or ints) holding uint32 values; broadcasts.

    ``c1``/``c3`` may carry garbage above bit 31 between rounds (they are only xor-ed,
    and the xor result is masked before it is multiplied); the returned words are masked.
    """
    for r in range(PHILOX_ROUNDS):
        if r:
            k0 = (k0 + PHILOX_W0) & MASK32
            k1 = (k1 + PHILOX_W1) & MASK32
        p0 = c0 * PHILOX_M0  # < 2**64: wraps in int64, low 64 bits exact
        p1 = c2 * PHILOX_M1
        c0 = ((p1 >> 32) ^ c1 ^ k0) & MASK32
        c2 = ((p0 >> 32) ^ c3 ^ k1) & MASK32
        c1, c3 = p1, p0
    return c0, c1 & MASK32, c2, c3 & MASK32


def philox4x32_10_torch(counter: "torch.Tensor", key: "torch.Tensor") -> "torch.Tensor":
    """Philox4x32-10 in torch: ``counter`` ``(..., 4)`` and ``key`` ``(..., 2)`` int64 tensors
    holding uint32 values -> ``(..., 4)`` int64 words in ``[0, 2**32)``."""
    torch = _torch()
    counter = counter.to(torch.int64)
    key = key.to(torch.int64)
    words = _philox_rounds_torch(counter[..., 0], counter[..., 1], counter[..., 2], counter[..., 3], key[..., 0], key[..., 1])
    return torch.stack(torch.broadcast_tensors(*words), dim=-1)


def _philox_int(c0: int, c1: int, c2: int, c3: int, k0: int, k1: int) -> Tuple[int, int, int, int]:
    """Philox4x32-10 on Python ints (fast for a handful of keys)."""
    for r in range(PHILOX_ROUNDS):
        if r:
            k0 = (k0 + PHILOX_W0) & MASK32
            k1 = (k1 + PHILOX_W1) & MASK32
        p0 = c0 * PHILOX_M0
        p1 = c2 * PHILOX_M1
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & MASK32, (p0 >> 32) ^ c3 ^ k1, p0 & MASK32
    return c0, c1, c2, c3


# Up to this many CPU key rows, token keys and the per-row terms of the block kernel
# are computed on Python ints (tensor ops on a few elements cost more in dispatch than
# the arithmetic itself).
_SMALL_BATCH = 8


def token_keys_torch(key_rows: "torch.Tensor") -> "torch.Tensor":
    """Per-token Philox keys ``(B, 2)`` int64 of key rows ``(B, 6)`` (on the rows' device)."""
    torch = _torch()
    _check_rows_torch(key_rows)
    rows = key_rows.to(torch.int64)
    if rows.device.type == "cpu":
        if rows.shape[0] <= _SMALL_BATCH:
            keys = [_philox_int(r[2], r[3], r[4], r[5], r[0], r[1])[:2] for r in rows.tolist()]
            return torch.tensor(keys, dtype=torch.int64).view(-1, 2)
        return torch.from_numpy(token_keys_np(rows.numpy()).astype(np.int64))
    return _token_keys_device(rows)


def _token_keys_device(rows: "torch.Tensor") -> "torch.Tensor":
    w = _philox_rounds_torch(rows[:, 2], rows[:, 3], rows[:, 4], rows[:, 5], rows[:, 0], rows[:, 1])
    return _torch().stack((w[0], w[1]), dim=1)


# Philox calls (4 vocabulary ids each) per chunk of the block kernel, summed over the
# batch: the working set (6 int64 slots + the float64/float32 chunk, ~1.8 MB) stays
# in the L2/L3 caches while ops stay large enough to amortise their dispatch.
_CHUNK_CALLS = 1 << 14


_WORKSPACE = threading.local()


def _scratch(name: str, numel: int, dtype: "torch.dtype", device: "torch.device") -> "torch.Tensor":
    """A flat scratch tensor reused across calls (per thread, name, dtype and device).

    Chunk buffers are small (about a megabyte); keeping them avoids paying fresh
    pages on every call, which costs as much as the arithmetic for small blocks.
    """
    torch = _torch()
    cache = getattr(_WORKSPACE, "bufs", None)
    if cache is None:
        cache = _WORKSPACE.bufs = {}
    key = (name, dtype, str(device))
    buf = cache.get(key)
    if buf is None or buf.numel() < numel:
        buf = cache[key] = torch.empty(max(numel, 1), dtype=dtype, device=device)
    return buf[:numel]


class _Block:
    """Philox4x32-10 over counters ``(q, 0, 0, 0)`` for a batch of keys.

    The state is kept stacked, ``E = (c0, c2)`` (the words that get multiplied) and
    ``L = (c0 * M0, c2 * M1)`` of the previous round (whose low halves are ``c3, c1``),
    so each round is five tensor ops on ``(2, B, n)`` int64 buffers (multiply; shift
    and xor in one int32 pass; key xor; mask into the next ``E``, swapping the halves)
    with no allocation. The first round and a half of a zero counter depend on the
    row or the column only and are formed on ``(B, 1)`` / ``(1, n)`` tensors.
    All four output words of a call are used, for four consecutive vocabulary ids.
    """

    #: word j of a call sits in slot SLOT_OF_WORD[j] of :meth:`run`'s result
    SLOT_OF_WORD = (0, 3, 1, 2)

    def __init__(self, keys: "torch.Tensor", n_max: int):
        torch = _torch()
        self.torch = torch
        device = keys.device
        self.B = B = keys.shape[0]
        consts = _constants(device)
        self.mult = consts["mult"]
        if device.type == "cpu" and B <= _SMALL_BATCH:
            self._row_terms_small(keys)
        else:
            self.k0 = keys[:, 0:1].to(torch.int64)
            self.k1 = keys[:, 1:2].to(torch.int64)
            # round r (0-based) uses key + r * W; X = (hi(p0) ^ c3 ^ k1, hi(p1) ^ c1 ^ k0)
            kk = torch.stack((self.k1, self.k0)).unsqueeze(0)  # (1, 2, B, 1)
            kx = (kk + consts["weyl"]).bitwise_and_(MASK32)  # (rounds, 2, B, 1)
            self.kx = kx.unbind(0)
            # round-2 row terms: p0 = k0 * M0 (wraps in int64) and hi(p0) ^ k1 of round 2
            self.ka0 = kx[1, 1]
            self.p0 = self.k0 * PHILOX_M0
            self.row_c2 = ((self.p0 >> 32) ^ kx[1, 0]) & MASK32
        self._views: dict = {}
        self.state = _scratch("state", 6 * B * n_max, torch.int64, device)
        self.device = device

    def _row_terms_small(self, keys: "torch.Tensor") -> None:
        """The per-row terms of ``__init__`` on Python ints: one tensor build, no op chain."""
        torch = self.torch
        B = self.B
        k = keys.tolist()
        k0 = [int(r[0]) for r in k]
        k1 = [int(r[1]) for r in k]
        flat: list = []
        for r in range(PHILOX_ROUNDS):
            flat += [(x + r * PHILOX_W1) & MASK32 for x in k1]
            flat += [(x + r * PHILOX_W0) & MASK32 for x in k0]
        p0 = [x * PHILOX_M0 for x in k0]  # exact; stored wrapped to int64 like the tensor path
        flat += [p - (1 << 64) if p >= 1 << 63 else p for p in p0]
        flat += [((p >> 32) ^ ((x + PHILOX_W1) & MASK32)) & MASK32 for p, x in zip(p0, k1)]
        flat += k0 + k1
        t = torch.tensor(flat, dtype=torch.int64)
        n_kx = PHILOX_ROUNDS * 2 * B
        kx = t[:n_kx].view(PHILOX_ROUNDS, 2, B, 1)
        self.kx = kx.unbind(0)
        self.ka0 = kx[1, 1]
        self.p0, self.row_c2, self.k0, self.k1 = t[n_kx:].view(4, B, 1).unbind(0)

    def run(self, q_start: int, q_stop: int, q: Optional["torch.Tensor"] = None) -> "torch.Tensor":
        """``(4, B, n)`` int64: slots ``(c0, c2, c3, c1)`` of the output (c3/c1 unmasked).

        Counters ``q_start .. q_stop - 1`` for every row, or, with ``q`` ``(B, 1)``, one
        counter per row (``n = 1``). A view of the internal buffer, overwritten by the
        next call.
        """
        torch = self.torch
        n = q_stop - q_start if q is None else 1
        views = self._views.get(n)
        if views is None:
            views = self._views[n] = self._make_views(n)
        S, bufs = views
        # Three rotating buffers: E (state words c0, c2), L (last products, whose low
        # halves are c3, c1) and a free one F. Starting from E = S[2:4], L = S[4:6],
        # the eight rotations below leave E in S[0:2] and L in S[2:4].
        F, E, L = bufs
        # Round 1 on counter (q, 0, 0, 0): state c0 = k0 (row), c1 = 0,
        # c2 = hi(q M0) ^ k1, c3 = lo(q M0) (column).
        if q is None:
            hq, lq = _columns(self.device, q_start, q_stop)
        else:
            pq = q * PHILOX_M0  # q < 2**30: no wrap, the shift needs no mask
            hq, lq = pq >> 32, pq & MASK32
        # Round 2: p1 = c2 * M1 over the block, p0 = k0 * M0 per row.
        torch.bitwise_xor(hq, self.k1, out=L[2])
        L[2].mul_(PHILOX_M1)
        torch.bitwise_right_shift(L[2], 32, out=E[1])
        E[1].bitwise_xor_(self.ka0).bitwise_and_(MASK32)
        torch.bitwise_xor(lq, self.row_c2, out=E[2])
        L[1].copy_(self.p0.expand(-1, n))
        # Little-endian int32 views (index 3): int64 element i is int32 elements 2i
        # (low) and 2i + 1 (high). One xor of F32[1:] with L32[:-1] puts
        # hi(F_i) ^ lo(L_i) into the low half of element i (the high half gets
        # garbage, masked below): the shift and the xor in one pass.
        for r in range(2, PHILOX_ROUNDS):
            torch.mul(E[0], self.mult, out=F[0])  # (c0 M0, c2 M1): wraps in int64, low 64 bits exact
            torch.bitwise_xor(F[3][1:], L[3][:-1], out=E[3][:-1])  # E's words are spent
            E[0].bitwise_xor_(self.kx[r])  # (c2', c0') with garbage above bit 31
            torch.bitwise_and(E[2], MASK32, out=L[1])
            torch.bitwise_and(E[1], MASK32, out=L[2])
            E, L, F = L, F, E
        return S[0:4]

    def _make_views(self, n: int):
        torch = self.torch
        S = self.state[: 6 * self.B * n].view(6, self.B, n)
        bufs = []
        for i in range(3):
            b = S[2 * i : 2 * i + 2]
            bufs.append((b, b[0], b[1], b.reshape(-1).view(torch.int32)))
        return S, bufs


def _constants(device: "torch.device") -> dict:
    """Per-device constant tensors of the block kernel (cached)."""
    cache = _CONSTANTS.get(str(device))
    if cache is None:
        torch = _torch()
        steps = torch.arange(PHILOX_ROUNDS, dtype=torch.int64, device=device).view(-1, 1, 1, 1)
        weyl = torch.tensor([PHILOX_W1, PHILOX_W0], dtype=torch.int64, device=device).view(1, 2, 1, 1)
        cache = _CONSTANTS[str(device)] = {
            "mult": torch.tensor([PHILOX_M0, PHILOX_M1], dtype=torch.int64, device=device).view(2, 1, 1),
            "weyl": steps * weyl,
            "cols": None,
            "half_ulp": torch.tensor(2.0**-33, dtype=torch.float64, device=device),
        }
    return cache


_CONSTANTS: dict = {}


def _columns(device: "torch.device", q_start: int, q_stop: int) -> Tuple["torch.Tensor", "torch.Tensor"]:
    """``(hi(q M0), lo(q M0))`` for ``q`` in ``[q_start, q_stop)``, each ``(1, n)`` (cached).

    ``q < 2**31`` so ``q * M0 < 2**63``: the shift needs no mask.
    """
    consts = _constants(device)
    cols = consts["cols"]
    if cols is None or cols[0].shape[1] < q_stop:
        torch = _torch()
        size = max(q_stop, 1 << 12)
        if size > 1 << 30:
            raise ValueError("vocabulary too large for the noise counter")
        pq = torch.arange(size, dtype=torch.int64, device=device).unsqueeze(0) * PHILOX_M0
        cols = consts["cols"] = (pq >> 32, pq & MASK32)
    return cols[0][:, q_start:q_stop], cols[1][:, q_start:q_stop]


def _scatter_words(slots: "torch.Tensor", out: "torch.Tensor", negate: bool = False) -> None:
    """Copy (or negate) ``(4, B, n)`` slots ``(c0, c2, c3, c1)`` into ``out`` ``(B, n, 4)``."""
    # one 2-D op per word: a single copy over a (2, B, n) view would iterate its
    # innermost loop over the 2 slots
    torch = _torch()
    for word, slot in enumerate(_Block.SLOT_OF_WORD):
        if negate:
            torch.neg(slots[slot], out=out[..., word])
        else:
            out[..., word].copy_(slots[slot])


def _chunk_calls(B: int, Q: int) -> int:
    """Philox calls per row in one chunk of the block kernel (``Q`` calls per row in all)."""
    return min(Q, max(1, _CHUNK_CALLS // max(B, 1)))


def _chunks(B: int, Q: int):
    step = max(1, min(Q, _CHUNK_CALLS // max(B, 1)))
    for s in range(0, Q, step):
        yield s, min(Q, s + step)


def philox_words_torch(
    key_rows: "torch.Tensor", vocab_size: int, *, token_ids: Optional["torch.Tensor"] = None
) -> "torch.Tensor":
    """The noise words (uint32 values in int64) ``(B, V)``, or ``(B, K)`` for ``token_ids``."""
    torch = _torch()
    keys = token_keys_torch(key_rows)
    B, V = keys.shape[0], int(vocab_size)
    if token_ids is not None:
        return _candidate_words(keys, _check_ids(token_ids, B, V))
    Q = (V + 3) // 4
    out = torch.empty((B, Q, 4), dtype=torch.int64, device=keys.device)
    block = _Block(keys, _chunk_calls(B, Q))
    for s, e in _chunks(B, Q):
        slots = block.run(s, e)
        slots[2:4].bitwise_and_(MASK32)
        _scatter_words(slots, out[:, s:e])
    return _trim(out.view(B, 4 * Q), V)


def _check_ids(token_ids: "torch.Tensor", B: int, V: int) -> "torch.Tensor":
    torch = _torch()
    if token_ids.dim() != 2 or token_ids.shape[0] != B:
        raise ValueError(f"token_ids must be (B, K) with B={B}, got {tuple(token_ids.shape)}")
    ids = token_ids.to(torch.int64)
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= V):
        raise ValueError(f"token_ids must lie in [0, {V})")
    return ids


def _candidate_words(keys: "torch.Tensor", ids: "torch.Tensor") -> "torch.Tensor":
    """Words ``(B, K)`` of token ids ``(B, K)`` under per-row keys ``(B, 2)``."""
    B, K = ids.shape
    flat_keys = keys.unsqueeze(1).expand(B, K, 2).reshape(B * K, 2)
    return _words_at(flat_keys, ids.reshape(-1)).view(B, K)


# Up to this many single ids on the CPU, their Philox calls run on Python ints.
_FEW_IDS = 48


def _words_at(keys: "torch.Tensor", ids: "torch.Tensor") -> "torch.Tensor":
    """Word of id ``ids[i]`` under key ``keys[i]`` for each i: ``(N,)`` int64.

    One Philox call per id (only the needed word is kept).
    """
    torch = _torch()
    N = ids.shape[0]
    if N == 0:
        return torch.zeros(0, dtype=torch.int64, device=ids.device)
    if ids.device.type == "cpu" and N <= _FEW_IDS:
        out = [
            _philox_int(v >> 2, 0, 0, 0, k0, k1)[v & 3] for v, (k0, k1) in zip(ids.tolist(), keys.tolist())
        ]
        return torch.tensor(out, dtype=torch.int64)
    block = _Block(keys, 1)
    slots = block.run(0, 1, q=(ids >> 2).unsqueeze(1))[:, :, 0]  # (4, N) slots (c0, c2, c3, c1)
    slot = torch.tensor(_Block.SLOT_OF_WORD, dtype=torch.int64, device=ids.device)[ids & 3]
    return slots.gather(0, slot.unsqueeze(0)).squeeze(0) & MASK32


def _words_to_gumbel(words: "torch.Tensor", out: "torch.Tensor") -> "torch.Tensor":
    """``out = -log(-log((w + 0.5) / 2**32))`` computed in float64 (``out`` float64)."""
    _words_to_neglog_u(words, out)
    return out.log_().neg_()


def _words_to_neglog_u(words: "torch.Tensor", out: "torch.Tensor") -> "torch.Tensor":
    """``out = -log(u)``, ``u = (w + 0.5) / 2**32`` exact in float64 (33 significant bits)."""
    return _words_to_log_u(words, out).neg_()


def _words_to_log_u(words: "torch.Tensor", out: "torch.Tensor") -> "torch.Tensor":
    """``out = log(u)``, ``u = (w + 0.5) / 2**32`` formed exactly in float64."""
    torch = _torch()
    out.copy_(words)  # exact: w < 2**32
    # u = 2**-33 + 2**-32 * w in one op; exact (33 significant bits)
    torch.add(_constants(out.device)["half_ulp"], out, alpha=2.0**-32, out=out)
    return out.log_()


def uniforms_torch(
    key_rows: "torch.Tensor",
    vocab_size: int,
    *,
    token_ids: Optional["torch.Tensor"] = None,
) -> "torch.Tensor":
    """Uniforms ``u = (w + 0.5) / 2**32`` (float64, exact) ``(B, V)`` or ``(B, K)``."""
    w = philox_words_torch(key_rows, vocab_size, token_ids=token_ids)
    return (w.to(_torch().float64) + 0.5) * 2.0**-32


def gumbel_torch(
    key_rows: "torch.Tensor",
    vocab_size: int,
    *,
    dtype: "Optional[torch.dtype]" = None,
    token_ids: Optional["torch.Tensor"] = None,
) -> "torch.Tensor":
    """Gumbel noise ``(B, V)`` for key rows ``(B, 6)``, or ``(B, K)`` at ``token_ids``.

    Computed in float64 from the exact words and rounded to ``dtype`` (default float32).
    """
    torch = _torch()
    dtype = torch.float32 if dtype is None else dtype
    keys = token_keys_torch(key_rows)
    B, V = keys.shape[0], int(vocab_size)
    if token_ids is not None:
        w = _candidate_words(keys, _check_ids(token_ids, B, V))
        g = _words_to_gumbel(w, torch.empty(w.shape, dtype=torch.float64, device=w.device))
        return g.to(dtype)
    Q = (V + 3) // 4
    n_max = _chunk_calls(B, Q)
    block = _Block(keys, n_max)
    f64 = _scratch("f64", 4 * B * n_max, torch.float64, keys.device)
    low = _scratch("low", 4 * B * n_max, dtype, keys.device) if dtype != torch.float64 else None
    out = torch.empty((B, Q, 4), dtype=dtype, device=keys.device)
    for s, e in _chunks(B, Q):
        n = e - s
        slots = block.run(s, e)
        slots[2:4].bitwise_and_(MASK32)
        lu = _words_to_log_u(slots, f64[: 4 * B * n].view(4, B, n))
        if low is None:
            h = lu.neg_().log_()
        else:
            # log(u) needs float64 (u is within 2**-33 of 1); the outer log only needs
            # the output precision.
            h = low[: 4 * B * n].view(4, B, n)
            h.copy_(lu)
            h.neg_().log_()
        _scatter_words(h, out[:, s:e], negate=True)  # g = -log(-log(u))
    return _trim(out.view(B, 4 * Q), V)


def _trim(block: "torch.Tensor", V: int) -> "torch.Tensor":
    return block if block.shape[1] == V else block[:, :V].contiguous()
