"""The pruned BM25 query path: MaxScore with block maxima, exact to the last bit.

:meth:`BM25Index.search_ids <.bm25.BM25Index.search_ids>` runs one :class:`_MaxScore` per
pruned query; the algorithm, its bounds and why they are exact are described in :mod:`.bm25`.
When the pruning would cost about what the unpruned sum costs, :class:`_MaxScore` raises
:class:`_TooMany` and the caller sums without pruning.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from twice_envs.envs.searchqa.bm25_index import BLOCK

#: Blocks of the first long list scored to get a first k-th score: ``1/SEED_SHARE`` of them,
#: at least ``SEED_BLOCKS`` and at most ``SEED_BLOCKS_MAX``.
SEED_BLOCKS = 2
SEED_SHARE = 64
SEED_BLOCKS_MAX = 32
#: The pruned path counts its work in postings added by the exhaustive sum, and gives up
#: for the unpruned sum once it has spent about as much as that would cost: a lookup by
#: binary search costs ``LOOKUP_UNITS``, each batch of candidates ``BATCH_UNITS`` per term.
LOOKUP_UNITS = 4
BATCH_UNITS = 200
#: First batch of candidates scored (best bound first) when a list yields many; batches then double.
REFINE = 512


def _kth_largest(vals: np.ndarray, k: int) -> float:
    """The k-th largest of ``vals`` (``1 <= k <= len(vals)``)."""
    if len(vals) > 16 * k:
        # the smallest of the maxima of k disjoint slices is at most the k-th largest value
        bound = np.maximum.reduceat(vals, np.arange(k) * (len(vals) // k)).min()
        vals = vals[vals >= bound]
    top = vals.max()
    if k == 1 or np.count_nonzero(vals == top) >= k:  # a tie at the top (partition is slow on long ties)
        return float(top)
    return float(np.partition(vals, len(vals) - k)[len(vals) - k])


def _find(sorted_docs: np.ndarray, items: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where the sorted, distinct ``items`` occur in ``sorted_docs``: (positions in it, positions in items)."""
    loc = np.searchsorted(sorted_docs, items)
    inside = np.flatnonzero(loc < len(sorted_docs))
    hit = inside[sorted_docs[loc[inside]] == items[inside]]
    return loc[hit], hit


class _TooMany(Exception):
    pass


class _MaxScore:
    """One pruned query (the algorithm: the :mod:`.bm25` docstring); :meth:`run` returns (positions, scores).

    Terms are at positions ``0..m-1`` of the summation order. A passage's score is the
    left-to-right float64 sum ``((0 + v_0) + v_1) + ...`` of its weights ``v_j`` (0 for an
    absent term). Rounded addition is monotone, so the same sum with some ``v_j``
    replaced by larger values (the term's or the block's maximum) is a bound that
    holds exactly, without any rounding margin: that lets ties be decided exactly.
    """

    def __init__(self, index: Any, terms: np.ndarray, counts: np.ndarray, ub: np.ndarray, k: int, total: int) -> None:
        # index: the .bm25.BM25Index queried (not imported: bm25 imports this module)
        self.ix, self.k = index, k
        self.m = len(terms)
        ip = index.indptr
        self.lengths = (ip[terms + 1] - ip[terms]).tolist()
        # work allowed (in postings added by the exhaustive sum) before giving up for the exhaustive sum:
        # at worst the query then costs about twice the exhaustive sum
        self.budget = total + index.num_docs // 16
        self.terms, self.counts, self.ub = terms.tolist(), counts.tolist(), ub.tolist()
        self.pool = _Pool(k)
        self.seen = np.zeros(0, dtype=np.int32)  # passages already scored or dismissed, sorted

    def _spend(self, work: int) -> None:
        self.budget -= work
        if self.budget < 0:
            raise _TooMany

    def _complete(self, acc, start: int, known: Optional[tuple[int, object]] = None):
        """``acc`` summed on with the bounds of positions ``start..m-1`` (the known value at ``known[0]``)."""
        ub = self.ub
        for j in range(start, self.m):
            acc = acc + (known[1] if known is not None and j == known[0] else ub[j])
        return acc

    def _floor(self, p: int) -> Optional[np.float32]:
        """A float32 weight of term ``p`` (before its query count) below which no new passage can compete.

        A cheap first filter (it keeps a little more than it must: the exact test follows).
        """
        pool = self.pool
        if not pool.full:
            return None
        # below `need`, the weight plus the later maxima stays under theta by far more than any rounding
        need = (pool.theta * (1.0 - 1e-9) - self._complete(0.0, p + 1) * (1.0 + 1e-9)) / self.counts[p]
        if need <= 0.0:
            return None
        f = np.float32(need)
        return np.nextafter(f, np.float32(-np.inf)) if f > need else f

    def run(self) -> tuple[np.ndarray, np.ndarray]:
        ix, pool = self.ix, self.pool
        for p in range(self.m):
            if pool.full and self._complete(self.ub[p], p + 1) < pool.theta:
                break  # no passage outside those seen can reach the k-th score
            t, c = self.terms[p], self.counts[p]
            a, b = int(ix.indptr[t]), int(ix.indptr[t + 1])
            b0, b1 = int(ix.block_ptr[t]), int(ix.block_ptr[t + 1])
            seed = min(SEED_BLOCKS_MAX, max(SEED_BLOCKS, (b1 - b0) // SEED_SHARE))
            if not pool.full and b1 - b0 > 2 * seed:
                # a first k-th score from the best blocks of this long list
                bm = ix.block_max[b0:b1]
                best = np.sort(np.argpartition(bm, len(bm) - seed)[len(bm) - seed :])
                self._take(p, _block_positions(a, b, best))
            floor = self._floor(p)
            if floor is not None and b1 - b0 > 1:
                sel = np.flatnonzero(ix.block_max[b0:b1] >= floor)
                bound = ix.block_max[b0 + sel].astype(np.float64)
                if c != 1:
                    bound *= c
                first = ix.indices[a + BLOCK * sel]  # each block's first passage
                # a block whose passages all come after the k-th one needs a score above theta; others can tie
                sel = sel[pool.competitive(self._complete(bound, p + 1), first)]
                self._take(p, _block_positions(a, b, sel) if len(sel) < b1 - b0 else slice(a, b))
            else:
                self._take(p, slice(a, b))
        return pool.result()

    def _take(self, p: int, pos) -> None:
        """Score the postings ``pos`` of term ``p`` whose passages are new and whose bound can reach the top k.

        For a passage whose first query term is ``p`` the bound is its weight followed by
        the later terms' maxima. (A passage with an earlier term that was not taken then
        could not reach the top k; it may pass here, and its exact score rejects it.)

        Many candidates are scored best bound first: they are put in buckets of
        decreasing bound (cut at quantiles of a sample, so that the buckets hold about
        ``REFINE``, then twice as many, and so on), each bucket is scored in chunks of
        ascending position, every chunk filtered against the k-th score its predecessors
        raised, and a bucket whose bounds cannot compete ends the list.
        """
        ix, pool = self.ix, self.pool
        raw = ix.data[pos]
        floor = self._floor(p)
        if floor is not None:
            hit = np.flatnonzero(raw >= floor)
            raw = raw[hit]
            pos = pos.start + hit if isinstance(pos, slice) else pos[hit]
        docs = ix.indices[pos]
        self._spend(BATCH_UNITS + len(raw) // 8 + 2 * len(docs) if floor is not None else BATCH_UNITS + 2 * len(docs))
        w = raw.astype(np.float64)
        c = self.counts[p]
        if c != 1:
            w *= c
        seen = self.seen
        if len(seen) and len(docs):
            if len(seen) < len(docs):
                new = np.ones(len(docs), dtype=bool)
                new[_find(docs, seen)[0]] = False
            else:
                loc = np.searchsorted(seen, docs)
                np.minimum(loc, len(seen) - 1, out=loc)
                new = seen[loc] != docs
            docs, w = docs[new], w[new]
        if not len(docs):
            return
        # every passage here is settled by this call: scored, or unable to compete (now and later)
        self.seen = np.sort(np.concatenate([seen, docs]), kind="stable") if len(seen) else docs
        bound = self._complete(w, p + 1)
        n = len(docs)
        if n <= 2 * REFINE:
            self._chunk(docs, w, bound, p)
            return
        sample = np.sort(bound[:: max(1, n // 2048)])[::-1]  # descending
        want = np.minimum(REFINE * (2 ** np.arange(1, 64, dtype=np.float64) - 1), n)  # 1, 3, 7, ... x REFINE best
        want = want[: int(np.searchsorted(want, n)) + 1]
        cuts = np.unique(sample[np.minimum((want / n * len(sample)).astype(np.int64), len(sample) - 1)])  # ascending
        bucket = (len(cuts) - np.searchsorted(cuts, bound, side="right")).astype(np.uint8)  # 0: bounds >= cuts[-1]
        order = np.argsort(bucket, kind="stable")  # by bucket, each in ascending position
        ends = np.cumsum(np.bincount(bucket, minlength=len(cuts) + 1))
        start, size = 0, REFINE
        for j, end in enumerate(ends.tolist()):
            if j > 0 and pool.full and cuts[len(cuts) - j] <= pool.theta:
                return  # every bound from here on is below cuts[-j] <= theta
            while start < end:
                sel = order[start : min(start + size, end)]
                self._chunk(docs[sel], w[sel], bound[sel], p)
                start += size
                size *= 2
            start = end

    def _chunk(self, docs: np.ndarray, w: np.ndarray, bound: np.ndarray, p: int) -> None:
        """Score the candidates (sorted) that can still compete."""
        pool = self.pool
        if pool.full:
            keep = pool.competitive(bound, docs)
            if not keep.all():
                docs, w = docs[keep], w[keep]
        if not len(docs):
            return
        c = len(docs)
        self._spend(sum(BATCH_UNITS + LOOKUP_UNITS * min(c, n) for j, n in enumerate(self.lengths) if j != p))
        self._score(docs, w, p)

    def _score(self, docs: np.ndarray, w: np.ndarray, p: int) -> None:
        """Exact scores of the new candidates ``docs`` (sorted), whose weights for term ``p`` are ``w``."""
        ix, pool = self.ix, self.pool
        acc = np.zeros(len(docs))
        for j in range(self.m):
            v = w if j == p else ix._lookup(self.terms[j], self.counts[j], docs)
            acc += v  # the exact prefix sum over positions 0..j
            if pool.full and j < self.m - 1:
                keep = pool.competitive(self._complete(acc, j + 1, (p, w) if p > j else None), docs)
                if not keep.all():
                    docs, acc, w = docs[keep], acc[keep], w[keep]
                    if not len(docs):
                        return
        pool.add(docs, acc)


def _block_positions(a: int, b: int, blocks: np.ndarray) -> np.ndarray:
    """Posting positions of the given blocks (sorted) of the list ``[a, b)``."""
    pos = (a + blocks[:, None] * BLOCK + np.arange(BLOCK)).reshape(-1)
    return pos[pos < b] if len(pos) and pos[-1] >= b else pos


class _Pool:
    """The best k (score, passage) pairs found so far, best first (score descending, then position).

    Once it holds k, ``theta`` and ``kpos`` are the k-th pair's score and position: a
    passage enters only with a higher score, or the same score and a lower position.
    """

    def __init__(self, k: int) -> None:
        self.k = k
        self.docs = np.zeros(0, dtype=np.int32)
        self.scores = np.zeros(0)
        self.full = False
        self.theta = 0.0
        self.kpos = 0

    def competitive(self, bound: np.ndarray, docs: np.ndarray) -> np.ndarray:
        """Which passages (by an upper bound of their score, or of a block's starting there) can still enter."""
        return (bound > self.theta) | ((bound == self.theta) & (docs < self.kpos))

    def add(self, docs: np.ndarray, scores: np.ndarray) -> None:
        keep = self.competitive(scores, docs) if self.full else scores > 0.0
        if not keep.all():
            docs, scores = docs[keep], scores[keep]
        if not len(docs):
            return
        docs, scores = np.concatenate([self.docs, docs]), np.concatenate([self.scores, scores])
        k = self.k
        if len(scores) > k:
            kth = _kth_largest(scores, k)
            sel = scores >= kth
            docs, scores = docs[sel], scores[sel]
        order = np.lexsort((docs, -scores))[:k]
        self.docs, self.scores = docs[order], scores[order]
        if len(order) == k:
            self.full, self.theta, self.kpos = True, float(self.scores[-1]), int(self.docs[-1])

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        return self.docs.astype(np.int64), self.scores
