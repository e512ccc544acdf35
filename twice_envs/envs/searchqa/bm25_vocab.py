"""The term table of a BM25 index: term -> id by open addressing over memory-mapped arrays.

:func:`_build_table` lays out the hash table (linear probing, ``-1`` = empty) from the terms'
CRC-32s when an index is written; :class:`Vocabulary` looks terms up in the files
``vocab_bytes.npy``, ``vocab_offsets.npy`` and ``vocab_table.npy`` (described in
:mod:`.bm25_index`, which writes and checks them), holding no term as a Python object.
"""

from __future__ import annotations

import zlib
from typing import Optional

import numpy as np

_HASH_MUL = 0x9E3779B1


def _slot(term: bytes, shift: int) -> int:
    return ((zlib.crc32(term) * _HASH_MUL) & 0xFFFFFFFF) >> shift


def _encode(term: str) -> bytes:
    return term.encode("utf-8", "surrogatepass")


class Vocabulary:
    """Term -> id over the memory-mapped vocabulary files (the files: :mod:`.bm25_index`)."""

    def __init__(self, blob: np.ndarray, offsets: np.ndarray, table: np.ndarray, max_probe: int, cache_items: int = 1 << 16) -> None:
        self._mv = memoryview(blob) if len(blob) else memoryview(b"")
        self._offsets = offsets
        self._table = table
        self._mask = len(table) - 1
        self._shift = 32 - (len(table).bit_length() - 1)
        self._probes = int(max_probe) + 1
        self._cache: dict[str, int] = {}
        self._cache_items = cache_items

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def term(self, tid: int) -> str:
        a, b = int(self._offsets[tid]), int(self._offsets[tid + 1])
        return bytes(self._mv[a:b]).decode("utf-8", "surrogatepass")

    def get(self, term: str) -> Optional[int]:
        """The id of ``term``, or None if the index has no such term."""
        tid = self._cache.get(term)
        if tid is not None:
            return tid if tid >= 0 else None
        key = _encode(term)
        s = _slot(key, self._shift)
        table, offsets, mv, n = self._table, self._offsets, self._mv, len(key)
        tid = -1
        for _ in range(self._probes):  # never more than the longest probe the builder made
            cand = int(table[s])
            if cand < 0:
                break
            a = int(offsets[cand])
            if int(offsets[cand + 1]) - a == n and mv[a : a + n] == key:
                tid = cand
                break
            s = (s + 1) & self._mask
        if len(self._cache) >= self._cache_items:
            self._cache.clear()
        self._cache[term] = tid
        return tid if tid >= 0 else None

    def __contains__(self, term: str) -> bool:
        return self.get(term) is not None


def _build_table(hashes: np.ndarray) -> tuple[np.ndarray, int]:
    """Open-addressing table of ids by home slot ``hashes`` (linear probing); returns (table, longest probe)."""
    n = len(hashes)
    bits = max(1, int(2 * max(n, 1) - 1).bit_length())  # size >= 2n: load factor <= 1/2
    size = 1 << bits
    if bits > 32:
        raise ValueError(f"a vocabulary of {n} terms is too large")
    itype = np.int32 if size <= (1 << 31) else np.int64
    table = np.full(size, -1, dtype=itype)
    slots = (((hashes.astype(np.uint64) * np.uint64(_HASH_MUL)) & np.uint64(0xFFFFFFFF)) >> np.uint64(32 - bits)).astype(itype)
    pending = np.arange(n, dtype=itype)
    home = slots.copy()
    while len(pending):
        s = slots[pending]
        free = table[s] < 0
        # of the pending ids whose slot is free, the lowest id per slot takes it
        fs, first = np.unique(s[free], return_index=True)
        winners = pending[free][first]
        table[fs] = winners
        placed = np.zeros(len(pending), dtype=bool)
        placed[np.flatnonzero(free)[first]] = True
        moved = pending[~free]  # their slot was taken before this round: probe the next one
        slots[moved] = (slots[moved] + 1) & (size - 1)
        pending = pending[~placed]
    longest = int(((slots - home) & (size - 1)).max()) if n else 0
    return table, longest
