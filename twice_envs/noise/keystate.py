"""Per-row key state: which key each generated token reads.

A row generating a turn starts from the turn's key base ``(episode_seed, turn,
branch)`` (the env's ``info["noise_key"]``) and keeps one :class:`KeyState`, which
forms the key row of its next token according to the key mode (:data:`KEY_MODES`)
and moves on after each emitted token (line/pos advance, DESIGN section 2).
:func:`state_rows` stacks the next key rows of a batch for the sampling step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Tuple

import numpy as np

from twice_envs.keys import NoiseKey, UINT64_MAX
from twice_envs.noise.philox import MASK32

__all__ = [
    "KEY_MODES",
    "KeyState",
    "NGRAM",
    "advance_line_pos",
    "newline_token_mask",
    "ngram_hash",
    "seed_words",
    "state_rows",
]


# --------------------------------------------------------------------------- line / pos


def advance_line_pos(line: int, pos: int, token_has_newline: bool) -> Tuple[int, int]:
    """The ``(line, pos)`` of the next token after emitting one.

    A token whose text contains a newline ends its line: the next token starts at
    ``(line + 1, 0)``; any other token moves on to ``(line, pos + 1)``.
    """
    return (line + 1, 0) if token_has_newline else (line, pos + 1)


def newline_token_mask(token_texts: Sequence[str]) -> np.ndarray:
    """``mask[v]`` is True when the text of token ``v`` contains a newline."""
    return np.fromiter(("\n" in t for t in token_texts), dtype=bool, count=len(token_texts))


# --------------------------------------------------------------------------- per-row key state

#: How the key of each generated token is formed from the turn's key base (see :class:`KeyState`).
KEY_MODES = ("line", "flat", "counter", "ngram")
#: Context length of the ``ngram`` key mode.
NGRAM = 4


def seed_words(seed: int) -> Tuple[int, int]:
    """``(seed_lo32, seed_hi32)`` of a 64-bit episode seed."""
    seed = int(seed)
    if not 0 <= seed <= UINT64_MAX:
        raise ValueError(f"episode_seed must be a uint64, got {seed}")
    return seed & MASK32, seed >> 32


def ngram_hash(tokens: Sequence[int]) -> int:
    """32-bit FNV-1a hash of the little-endian bytes of the last :data:`NGRAM` token ids.

    Process-independent (no Python ``hash``), so an ``ngram`` key is the same in every backend.
    """
    h = 0x811C9DC5
    for t in list(tokens)[-NGRAM:]:
        for shift in (0, 8, 16, 24):
            h ^= (int(t) >> shift) & 0xFF
            h = (h * 0x01000193) & MASK32
    return h


@dataclass
class KeyState:
    """The key state of one row while it generates a turn: the next token's key row.

    Key modes (:data:`KEY_MODES`), for a turn with key base ``(seed, turn, branch)``:

    * ``line`` (default, DESIGN section 2): ``(seed, turn, branch, line, pos)``, where
      ``line`` counts tokens with a newline emitted in the turn and ``pos`` is the
      position inside the line (:func:`advance_line_pos`), so a twin whose turn
      re-synchronises at a newline reads the factual noise from the next line on.
    * ``flat``: ``(seed, turn, branch, 0, tokens emitted in the turn)``.
    * ``counter``: ``(seed, 0, branch, 0, token_counter + tokens emitted)``: one running
      counter per episode (an ablation: a twin's different turn length shifts all later noise).
    * ``ngram``: ``(seed, ngram_hash(last NGRAM tokens), branch, 0, 0)``: inexact (keys
      repeat when a context repeats); an ablation only.

    Plain Python, one object per row (or per vLLM request): it moves with its row
    whatever batch the row sits in.
    """

    key: NoiseKey
    """Key base of the turn (the env's ``info["noise_key"]``; its line/pos are ignored)."""
    mode: str = "line"
    """One of :data:`KEY_MODES`."""
    token_counter: int = 0
    """Tokens generated earlier in the episode (``counter`` mode)."""
    context: Sequence[int] = ()
    """The prompt's last tokens (``ngram`` mode; only the last :data:`NGRAM` are kept)."""
    line: int = 0
    """Newline tokens emitted in the turn so far."""
    pos: int = 0
    """Position of the next token inside its line."""
    emitted: int = 0
    """Tokens emitted in the turn so far."""

    def __post_init__(self) -> None:
        if self.mode not in KEY_MODES:
            raise ValueError(f"key_mode must be one of {KEY_MODES}, got {self.mode!r}")
        seed, turn, branch = (int(v) for v in tuple(self.key)[:3])
        self._lo, self._hi = seed_words(seed)
        for name, value in (("turn", turn), ("branch", branch), ("token_counter", self.token_counter)):
            if not 0 <= int(value) <= MASK32:
                raise ValueError(f"{name} must lie in [0, 2**32), got {value}")
        self.key = NoiseKey(seed, turn, branch)
        self.context = [int(t) for t in self.context][-NGRAM:]

    def row(self) -> Tuple[int, int, int, int, int, int]:
        """The key row ``[seed_lo32, seed_hi32, turn, branch, line, pos]`` of the next token."""
        k = self.key
        if self.mode == "line":
            return (self._lo, self._hi, k.turn, k.branch, self.line, self.pos)
        if self.mode == "flat":
            return (self._lo, self._hi, k.turn, k.branch, 0, self.emitted)
        if self.mode == "counter":
            return (self._lo, self._hi, 0, k.branch, 0, (self.token_counter + self.emitted) & MASK32)
        return (self._lo, self._hi, ngram_hash(self.context), k.branch, 0, 0)

    def advance(self, token: int, has_newline: bool) -> None:
        """Move past the token just emitted (``has_newline``: its text contains a newline)."""
        self.line, self.pos = advance_line_pos(self.line, self.pos, bool(has_newline))
        self.emitted += 1
        if self.mode == "ngram":
            self.context = (list(self.context) + [int(token)])[-NGRAM:]


def state_rows(states: Sequence[KeyState]) -> np.ndarray:
    """The ``(B, 6)`` int64 key rows of the next token of every state."""
    rows = np.empty((len(states), 6), dtype=np.int64)
    for i, st in enumerate(states):
        rows[i] = st.row()
    return rows
