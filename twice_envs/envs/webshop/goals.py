"""Shopping goals: synthetic (one per product option combination) and human-written.

Construction follows the original:

* **synthetic**: every product with an instruction and instruction attributes gives one
  goal per combination of its option values (option names sorted, values in product
  order, the last name varying fastest); the text is
  ``"<instruction> with <name>: <value>, and <name>: <value>, and price lower than P dollars"``.
  Weight: the mean over the goal's attributes of ``1 / (goals having that attribute)``.
* **human**: every instruction in ``items_human_ins.json`` that has attributes, products
  in catalogue order; the text is the instruction without trailing periods plus the price
  clause; weight 1.
* The goal list is then shuffled with Python's ``random.Random(233)`` (the original's
  fixed shuffle), so goal ``i`` is the original's goal ``i`` for the same files.
* Price cap: the prices ``10, 20, ..., 990`` above the product's price, first four of
  them; two drawn, the larger is the cap (with fewer than two candidates: no price clause
  and a cap of 1,000,000). A price range gets a price drawn uniformly inside it. Both
  draws are keyed by ``price_seed`` and the product's asin (not drawn in sequence), so a
  goal and a price are identical on every machine and in every catalogue subset.

Splits by goal index, as the original: test = goals ``[0, 500)``, eval = ``[500, 1500)``,
train = ``[1500, N)``. Goal sets with fewer than 2,000 goals (the embedded default has
more) are split 10% / 10% / 80% in the same order.

Goals, their order and their splits are a function of the data files alone (no process,
worker count, hash seed or build order enters), so ``{"split": s, "index": k}`` names the
same goal in every process. Synthetic goals live in flat arrays (:class:`GoalTable`:
goal -> product and option combination, weights, each split's cumulative weights), which
the disk cache stores as memory-mapped files shared by all processes.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

import numpy as np

from twice_envs.envs.webshop.catalogue import Catalogue, Product
from twice_envs.errors import DataFormatError

PRICE_RANGE = tuple(10.0 * i for i in range(1, 100))
NO_CAP = 1000000
SHUFFLE_SEED = 233
SPLITS = ("test", "eval", "train", "all")


@dataclass(frozen=True)
class Goal:
    """One shopping task.

    Attributes:
        index: position in the (shuffled) goal list.
        product_index: catalogue position of the target product.
        asin: the target product.
        instruction_text: what the shopper is told.
        attributes: attribute phrases the purchase should have.
        goal_options: ``((name, value), ...)`` for synthetic goals, option texts for human ones.
        options_are_pairs: True for synthetic goals (options named), False for human ones.
        price_upper: the price cap.
        query, category, product_category, name: of the target product (for ``r_type``).
        weight: sampling weight.
    """

    index: int
    product_index: int
    asin: str
    instruction_text: str
    attributes: tuple[str, ...]
    goal_options: tuple
    options_are_pairs: bool
    price_upper: float
    query: str
    category: str
    product_category: str
    name: str
    weight: float

    def options_for_reward(self) -> Union[dict, tuple]:
        return dict(self.goal_options) if self.options_are_pairs else self.goal_options

    def to_json(self) -> dict:
        d = dict(self.__dict__)
        d["attributes"] = list(self.attributes)
        d["goal_options"] = [list(o) for o in self.goal_options] if self.options_are_pairs else list(self.goal_options)
        return d


def _unit(*key: object) -> float:
    """A uniform number in [0, 1) named by ``key`` (same on every machine)."""
    h = hashlib.sha256("|".join(map(str, key)).encode()).digest()
    return int.from_bytes(h[:8], "big") / 2.0**64


def product_price(product: Product, price_seed: int) -> float:
    """The price charged for ``product``: its price, or a draw inside its range."""
    if len(product.pricing) == 1:
        return float(product.pricing[0])
    lo, hi = product.pricing[:2]
    return lo + (hi - lo) * _unit(price_seed, "price", product.asin)


def price_cap(price: float, price_seed: int, *key: object) -> Optional[float]:
    """The goal's price cap (None: no cap clause)."""
    cands = [p for p in PRICE_RANGE if p > price][:4]
    if len(cands) < 2:
        return None
    n = len(cands)
    a = int(_unit(price_seed, "cap", *key, 0) * n)
    b = int(_unit(price_seed, "cap", *key, 1) * (n - 1))
    if b >= a:
        b += 1
    return cands[max(a, b)]


def _price_text(cap: Optional[float]) -> str:
    return f", and price lower than {cap:.2f} dollars" if cap is not None else ""


def synthetic_table(products: Sequence[Product] | list) -> tuple[np.ndarray, np.ndarray]:
    """Per product: number of synthetic goals and their weight (0 when none)."""
    counts = np.zeros(len(products), dtype=np.int64)
    attrs_of: list[tuple[str, ...]] = []
    for i, p in enumerate(products):
        attrs_of.append(())
        if p.instruction is None or not p.instruction_attributes:
            continue
        n = 1
        for _, values in p.options:
            n *= len(values)
        counts[i] = n
        attrs_of[i] = p.instruction_attributes
    return counts, synthetic_weights(counts, attrs_of)


def synthetic_weights(counts: np.ndarray, attrs_of: list[tuple[str, ...]]) -> np.ndarray:
    """Per product: the weight of its synthetic goals (mean of 1 / goals per attribute)."""
    cnt: dict[str, int] = {}
    for n, attrs in zip(counts.tolist(), attrs_of):
        if n:
            for a in attrs:
                cnt[a] = cnt.get(a, 0) + n
    w = np.zeros(len(counts), dtype=np.float64)
    for i, (n, attrs) in enumerate(zip(counts.tolist(), attrs_of)):
        if n:
            w[i] = sum(1.0 / cnt[a] for a in attrs) / len(attrs)
    return w


def split_bounds(n: int) -> dict[str, tuple[int, int]]:
    """``split -> (start, stop)`` goal indices for a goal set of ``n`` goals (``all`` included)."""
    if n >= 2000:
        bounds = {"test": (0, 500), "eval": (500, 1500), "train": (1500, n)}
    else:
        a = max(1, n // 10) if n >= 3 else 0
        bounds = {"test": (0, a), "eval": (a, 2 * a), "train": (2 * a, n)}
    bounds["all"] = (0, n)
    return bounds


def shuffled_order(n: int) -> np.ndarray:
    """The original's goal order: ``list(range(n))`` shuffled by ``random.Random(233)``."""
    perm = list(range(n))
    random.Random(SHUFFLE_SEED).shuffle(perm)
    return np.asarray(perm, dtype=np.int64)


class GoalTable:
    """The synthetic goals of a catalogue as flat arrays.

    Goal ``i`` is raw goal ``perm[i]``; raw goals ``starts[p]:starts[p + 1]`` are product
    ``p``'s option combinations. ``weights[i]`` is goal ``i``'s weight, and each split's
    cumulative weights and total (what :meth:`GoalSet.sample` draws with) are kept too, so
    loaded from the cache (memory-mapped) they cost a process nothing to compute or hold.
    """

    ARRAYS = ("starts", "perm", "weights")

    def __init__(self, starts: np.ndarray, perm: np.ndarray, weights: np.ndarray,
                 split_sums: Optional[dict[str, tuple[np.ndarray, float]]] = None) -> None:
        self.starts, self.perm, self.weights = starts, perm, weights
        self._sums: dict[str, tuple[np.ndarray, float]] = dict(split_sums or {})

    @classmethod
    def from_counts(cls, counts: Any, product_weights: Any) -> "GoalTable":
        """From each product's number of goals and their weight (:func:`synthetic_table`)."""
        counts = np.asarray(counts, dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        n = int(starts[-1])
        raw = np.repeat(np.asarray(product_weights, dtype=np.float64), counts)
        perm = shuffled_order(n)
        return cls(starts, perm, raw[perm] if n else np.zeros(0))

    def __len__(self) -> int:
        return len(self.perm)

    def split_sums(self, split: str) -> tuple[np.ndarray, float]:
        """``(cumulative weights, total weight)`` of ``split``'s goals."""
        got = self._sums.get(split)
        if got is None:
            got = cumulative(self.weights, split_bounds(len(self))[split])
            self._sums[split] = got
        return got

    def write_files(self, writer, prefix: str = "goal_") -> dict:
        """Write the arrays (``<prefix><name>.npy``, one ``<prefix>cum_<split>.npy`` per split);
        return the metadata to keep beside them."""
        for name in self.ARRAYS:
            writer.array(f"{prefix}{name}.npy", getattr(self, name))
        totals = {}
        for split in SPLITS:
            cum, total = self.split_sums(split)
            writer.array(f"{prefix}cum_{split}.npy", cum)
            totals[split] = total
        return {"goals": len(self), "products": len(self.starts) - 1, "totals": totals}

    @classmethod
    def from_files(cls, files, meta: dict, prefix: str = "goal_") -> "GoalTable":
        """The table written by :meth:`write_files` (arrays memory-mapped read-only)."""
        a = {name: files.array(f"{prefix}{name}.npy") for name in cls.ARRAYS}
        n, totals = meta.get("goals"), meta.get("totals")
        starts = a["starts"]
        problem = None
        if not isinstance(n, int) or not isinstance(totals, dict) or set(totals) != set(SPLITS):
            problem = "the goal metadata lacks 'goals' or 'totals'"
        elif a["perm"].dtype != np.int64 or starts.dtype != np.int64 or a["weights"].dtype != np.float64:
            problem = "goal arrays of the wrong type"
        elif len(a["perm"]) != n or len(a["weights"]) != n or len(starts) < 1 or starts[0] != 0 or starts[-1] != n:
            problem = "goal arrays disagree with the number of goals"
        if problem:
            raise DataFormatError(files.manifest_path, None, f"inconsistent goal table: {problem}")
        sums = {}
        for split, (lo, hi) in split_bounds(n).items():
            cum = files.array(f"{prefix}cum_{split}.npy")
            if len(cum) != hi - lo or not isinstance(totals[split], (int, float)):
                raise DataFormatError(files.manifest_path, None, f"inconsistent goal table: split {split!r}")
            sums[split] = (cum, float(totals[split]))
        return cls(starts, a["perm"], a["weights"], sums)


def cumulative(weights: np.ndarray, bounds: tuple[int, int]) -> tuple[np.ndarray, float]:
    """``(np.cumsum(w), w.sum())`` of ``weights[start:stop]`` (what sampling draws with)."""
    w = weights[bounds[0] : bounds[1]]
    return np.cumsum(w), float(w.sum())


class GoalSet:
    """The goals of a catalogue, built lazily: ``goals[i]`` makes goal ``i`` on demand.

    ``table`` (synthetic goals): a :class:`GoalTable`, or ``(counts, product_weights)``
    from :func:`synthetic_table`; None computes it from the catalogue.
    """

    #: Goals kept made; beyond this the memo starts again (a goal is cheap to remake).
    MEMO_MAX = 1 << 16

    def __init__(
        self,
        catalogue: Catalogue,
        kind: str,
        price_seed: int,
        table: Union[GoalTable, tuple[np.ndarray, np.ndarray], None] = None,
    ) -> None:
        if kind not in ("synthetic", "human"):
            raise ValueError(f"goal kind must be 'synthetic' or 'human', got {kind!r}")
        self.catalogue, self.kind, self.price_seed = catalogue, kind, int(price_seed)
        self._human_refs: list[tuple[int, int]] = []
        if kind == "synthetic":
            if not isinstance(table, GoalTable):
                table = GoalTable.from_counts(*(table if table is not None else synthetic_table(catalogue.products)))
            self.table = table
        else:
            refs = []
            for i in self._human_products():
                for k, ins in enumerate(catalogue.human[catalogue[i].asin]):
                    if ins.attributes:
                        refs.append((i, k))
            self._human_refs = refs
            n = len(refs)
            self.table = GoalTable(np.zeros(1, dtype=np.int64), shuffled_order(n), np.ones(n))
        self._starts, self._perm, self.weights = self.table.starts, self.table.perm, self.table.weights
        self._memo: dict[int, Goal] = {}

    def _human_products(self) -> list[int]:
        """Catalogue positions of products with human instructions, in catalogue order."""
        out = []
        for asin in self.catalogue.human:
            try:
                out.append(self.catalogue.index_of(asin))
            except KeyError:
                continue  # instructions for a product outside this catalogue
        return sorted(out)

    def __len__(self) -> int:
        return len(self._perm)

    def __getitem__(self, i: int) -> Goal:
        if not isinstance(i, (int, np.integer)) or isinstance(i, bool):
            raise TypeError(f"goal index must be an int, got {type(i).__name__}")
        if not 0 <= i < len(self):
            raise IndexError(f"goal index {i} is out of range: this goal set has {len(self)} goals (0..{len(self) - 1})")
        g = self._memo.get(int(i))
        if g is None:
            g = self._make(int(i))
            if len(self._memo) >= self.MEMO_MAX:
                self._memo.clear()
            self._memo[int(i)] = g
        return g

    def _make(self, i: int) -> Goal:
        r = int(self._perm[i])
        w = float(self.weights[i])
        if self.kind == "synthetic":
            p_idx = int(np.searchsorted(self._starts, r, side="right") - 1)
            sub = r - int(self._starts[p_idx])
            p = self.catalogue[p_idx]
            named = sorted(p.options, key=lambda o: o[0])
            chosen = []
            for name, values in reversed(named):
                sub, k = divmod(sub, len(values))
                chosen.append((name, values[k]))
            chosen.reverse()
            cap = price_cap(product_price(p, self.price_seed), self.price_seed, p.asin)
            option_text = ", and ".join(f"{k}: {v}" for k, v in chosen)
            option_text = " with " + option_text if option_text else ""
            text = f"{p.instruction}{option_text}{_price_text(cap)}"
            return Goal(
                i, p_idx, p.asin, text, p.instruction_attributes, tuple(chosen), True,
                cap if cap is not None else NO_CAP, p.query, p.category, p.product_category, p.title, w,
            )
        p_idx, k = self._human_refs[r]
        p = self.catalogue[p_idx]
        ins = self.catalogue.human[p.asin][k]
        cap = price_cap(product_price(p, self.price_seed), self.price_seed, p.asin, k)
        text = ins.instruction.strip(".") + _price_text(cap)
        return Goal(
            i, p_idx, p.asin, text, ins.attributes, ins.options, False, cap if cap is not None else NO_CAP,
            p.query, p.category, p.product_category, p.title, w,
        )

    # ------------------------------------------------------------------ splits
    def split_range(self, split: str) -> range:
        """Goal indices of ``split`` (``test``, ``eval``, ``train`` or ``all``)."""
        bounds = split_bounds(len(self))
        if split not in bounds:
            raise ValueError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
        lo, hi = bounds[split]
        return range(lo, hi)

    def sample(self, rng: np.random.Generator, split: str) -> int:
        """A goal index of ``split`` drawn with the goals' weights (from ``rng``)."""
        r = self.split_range(split)
        if len(r) == 0:
            raise ValueError(f"split {split!r} has no goals (goal set of {len(self)})")
        cum, total = self.table.split_sums(split)
        if not math.isfinite(total) or total <= 0:
            return r.start + int(rng.integers(len(r)))
        pos = float(rng.random()) * total
        return r.start + min(int(np.searchsorted(cum, pos, side="right")), len(r) - 1)

    def check_usable(self, split: str, products_path: Optional[str], attributes_path: Optional[str],
                     human_path: Optional[str]) -> None:
        """Raise :class:`DataFormatError` saying why, when ``split`` has no goal to reset to."""
        n = len(self)
        if n and len(self.split_range(split)):
            return
        if n == 0 and self.kind == "synthetic":
            source = products_path or "<generated catalogue>"
            why = (f"no usable goals: none of the {len(self.catalogue)} products has an instruction with "
                   "instruction_attributes, which synthetic goals are made from")
            why += (f" (none in {attributes_path})" if attributes_path else
                    "; pass attributes_path (items_ins_v2*.json), or human_path with goals='human'")
        elif n == 0:
            source = human_path or "<human instructions>"
            why = ("no usable goals: no human instruction with instruction_attributes names a product of this "
                   f"catalogue ({len(self.catalogue)} products"
                   + (f" from {products_path})" if products_path else ")"))
        else:
            source = products_path or human_path or "<generated catalogue>"
            why = (f"split {split!r} has no goals: {n} {self.kind} goal(s) all fall in other splits "
                   "(test and eval take 10% each); use split='all' or more data")
        raise DataFormatError(source, None, why)

