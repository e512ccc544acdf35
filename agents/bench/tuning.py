"""Step-size tuning for the learning benches: every method compared at its own best step size.

Methods compared by learning at one shared step size are compared partly by the size of their
step: a method that adds a per-decision term to GRPO's advantage enlarges the update, and at a
small shared step size that alone looks like faster learning. The learning benches
(``twice bench learn``, ``twice bench ablations``) therefore tune each method on its own:

1. every step size of a geometric grid is run on *tuning seeds* (:func:`tuning_seeds`), which
   never serve as reporting seeds;
2. the score of a step size is the mean over the tuning seeds of the normalised area under the
   exact-value curve (:func:`area`); the pick is the highest score, a tie going to the smaller
   step size, where scores within :data:`TIE` of the highest count as tied (:data:`SELECTION_RULE`):
   where the curve saturates, ever larger steps gain a few thousandths of area on the tuning seeds
   while risking a collapse (a step so large that one unlucky batch makes the policy deterministic
   on a wrong action) that two tuning seeds rarely show;
3. a pick at an end of the grid is flagged and the grid widened there, one step of the grid's
   own ratio at a time (:func:`next_step_size`), until the pick is interior or ``max_widen``
   step sizes were added at that end (the pick is then reported ``at_edge``);
4. the caller reports every method at its pick on fresh seeds.

A grid of fewer than two step sizes cannot tune anything and is refused (:func:`check_grid`).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from typing import Callable, Hashable, Optional, Sequence

import numpy as np

from twice_envs.agents import stats as cs

#: The first tuning seed is the base seed plus this offset; reporting seeds stay below it.
TUNE_SEED_OFFSET = 1_000_000
#: Default grid of step sizes (geometric, ratio 4: four values keep the benches' tuning affordable).
DEFAULT_GRID = (1.0, 4.0, 16.0, 64.0)
#: Default bound of the widening: step sizes the grid may gain beyond each end.
DEFAULT_MAX_WIDEN = 3
#: Mean tuning areas within this of the highest count as tied (the smallest tied step size is picked).
TIE = 0.005
#: How a step size is picked from its tuning scores.
SELECTION_RULE = (f"highest mean area over the tuning seeds, areas within {TIE} of the highest counting as tied and "
                  "a tie going to the smallest step size; a pick at an end of the grid widens the grid there by the "
                  "grid's ratio, up to max_widen step sizes per end")


def tuning_seeds(base: int, n: int) -> list[int]:
    """The ``n`` tuning seeds of a bench whose reporting seeds start at ``base`` (and stay below
    ``base + TUNE_SEED_OFFSET``)."""
    return [base + TUNE_SEED_OFFSET + k for k in range(n)]


def check_grid(values: Sequence[float], name: str = "lr_grid") -> tuple[float, ...]:
    """The grid sorted, or ``ValueError`` naming ``name`` when it cannot tune: fewer than two distinct
    step sizes, or one that is not a finite positive number."""
    try:
        grid = tuple(sorted({float(v) for v in values}))
    except (TypeError, ValueError):
        raise ValueError(f"{name} must hold numbers, got {list(values)!r}") from None
    bad = [v for v in grid if not (math.isfinite(v) and v > 0)]
    if bad:
        raise ValueError(f"{name}: every step size must be a finite number above 0, got {bad[0]!r}")
    if len(grid) < 2:
        raise ValueError(f"{name} needs two step sizes or more to tune, got {list(values)!r}: one value picks "
                         "nothing (to run every method at one fixed step size, give it as lr: --lr on the command "
                         "line)")
    return grid


def parse_grid(text: str, name: str = "--lr-grid") -> tuple[float, ...]:
    """``"0.5,1,2"`` -> the checked grid (:func:`check_grid`); ``ValueError`` naming ``name`` otherwise."""
    try:
        values = [float(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise ValueError(f"{name} must be comma-separated numbers such as 0.5,1,2,4, got {text!r}") from None
    return check_grid(values, name)


def area(curve: Sequence[float]) -> float:
    """The area under an exact-value curve (values before and after each update) divided by the number
    of updates, by the trapezoid rule: the mean value over the run, on the value's own scale."""
    v = np.asarray(curve, dtype=np.float64)
    if len(v) < 2:
        raise ValueError(f"a learning curve needs a value before and after one update at least, got {len(v)}")
    return float((v[:-1] + v[1:]).sum() / (2 * (len(v) - 1)))


def pick(scores: dict, tie: float = TIE) -> float:
    """The step size with the highest mean score (NaN counts as lowest), the smallest of those within
    ``tie`` of it."""
    means = {lr: float(np.mean(s)) if len(s) else float("nan") for lr, s in scores.items()}
    best = max((m for m in means.values() if np.isfinite(m)), default=float("nan"))
    if not np.isfinite(best):
        return min(means)
    return min(lr for lr, m in means.items() if m >= best - tie - 1e-12)


def _edge(scores: dict, lr: float) -> Optional[str]:
    tried = sorted(scores)
    return "high" if lr == tried[-1] else "low" if lr == tried[0] else None


def next_step_size(scores: dict, grid: Sequence[float], max_widen: int) -> Optional[float]:
    """The step size to try next: beyond the end of the tried ones where the pick sits, one step of the
    ratio of the two tried step sizes at that end; None when the pick is interior or ``max_widen`` step
    sizes were already added beyond that end of ``grid``."""
    tried = sorted(scores)
    side = _edge(scores, pick(scores))
    added = sum(lr > max(grid) for lr in tried) if side == "high" else sum(lr < min(grid) for lr in tried)
    if side is None or added >= max_widen:
        return None
    return tried[-1] ** 2 / tried[-2] if side == "high" else tried[0] ** 2 / tried[1]


@dataclass
class Tuned:
    """One method's tuning: the scores of every step size tried and the pick."""

    lr: float
    """The picked step size."""
    grid: list
    """The grid as given."""
    scores: dict = field(default_factory=dict)
    """Step size -> the tuning seeds' areas."""
    widened: list = field(default_factory=list)
    """Step sizes added beyond the grid's ends, in order."""
    edge_of_grid: Optional[str] = None
    """``low``/``high``: the pick on the given grid alone sat at that end (so the grid was widened)."""
    at_edge: Optional[str] = None
    """``low``/``high``: the final pick still sits at that end of the widened grid (``max_widen`` reached)."""

    def as_dict(self) -> dict:
        return {"lr": self.lr, "grid": list(self.grid), "widened": list(self.widened),
                "edge_of_grid": self.edge_of_grid, "at_edge": self.at_edge,
                "tried": sorted(self.scores), "mean_area": {f"{lr:g}": float(np.mean(s)) for lr, s in
                                                            sorted(self.scores.items())},
                "areas": {f"{lr:g}": [float(x) for x in s] for lr, s in sorted(self.scores.items())}}


def tune_all(score_many: Callable[[list], list], keys: Sequence[Hashable], grid: Sequence[float],
             max_widen: int) -> dict:
    """Tune every key (a method, an ablation row) at once: ``score_many([(key, lr), ...])`` returns
    the tuning seeds' areas of each pair, in order (so the caller can run them all in parallel).
    Rounds of widening follow the grid's round until every pick is interior or bounded."""
    grid = check_grid(grid)
    scores: dict = {k: {} for k in keys}
    pending = [(k, lr) for k in keys for lr in grid]
    while pending:
        for (k, lr), s in zip(pending, score_many(pending)):
            scores[k][lr] = list(s)
        pending = [(k, nxt) for k in keys if (nxt := next_step_size(scores[k], grid, max_widen)) is not None]
    out = {}
    for k in keys:
        on_grid = {lr: s for lr, s in scores[k].items() if lr in grid}
        best = pick(scores[k])
        out[k] = Tuned(lr=best, grid=list(grid), scores=scores[k],
                       widened=[lr for lr in scores[k] if lr not in grid],
                       edge_of_grid=_edge(on_grid, pick(on_grid)), at_edge=_edge(scores[k], best))
    return out


def paired_difference(a: Sequence[float], b: Sequence[float]) -> dict:
    """``a - b`` paired seed by seed: the mean with its 95% Student t interval over the seeds
    (:func:`~twice_envs.agents.stats.paired_mean`); NaN with fewer than two seeds."""
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if len(d) < 2:
        return {"mean": float(d.mean()) if len(d) else float("nan"), "ci": [float("nan")] * 2, "n": len(d),
                "significant": False}
    return cs.paired_mean(d)


def describe_pick(name: str, t: Tuned) -> Optional[str]:
    """A line on a pick at an edge (the grid widened, or its bound reached); None for an interior pick."""
    if t.edge_of_grid is None and t.at_edge is None:
        return None
    added = ", ".join(f"{lr:g}" for lr in t.widened) or "nothing"
    line = (f"{name}: lr {t.lr:g}; the pick on the given grid sat at its {t.edge_of_grid or t.at_edge} end, "
            f"so the grid was widened by {added}")
    if t.at_edge:
        line += f"; the pick is still at the {t.at_edge} end of the widened grid (bound reached: a better step size "
        line += "may lie beyond it)"
    return line


def add_step_size_args(p: argparse.ArgumentParser, *, what: str, tune_seeds: int, max_widen: int, lr: float) -> None:
    """The learning benches' step-size flags: ``--tune-seeds``, ``--lr-grid`` or ``--lr`` (exclusive) and
    ``--max-widen``; ``what`` names the compared things in the help ("method", "row")."""
    p.add_argument("--tune-seeds", type=int, default=tune_seeds, help="tuning seeds per step size")
    steps = p.add_mutually_exclusive_group()
    steps.add_argument("--lr-grid", default=None,
                       help=f"step sizes tuned per {what}, comma-separated, two or more (default "
                            f"{','.join(f'{x:g}' for x in DEFAULT_GRID)})")
    steps.add_argument("--lr", type=float, default=None,
                       help=f"one step size shared by every {what}: no tuning (no difference is then a {what}'s win; "
                            f"default when tuning is off: {lr:g})")
    p.add_argument("--max-widen", type=int, default=max_widen,
                   help="step sizes the grid may gain beyond an end where a pick sits there")


def step_size_settings(a: argparse.Namespace, lr: float) -> dict:
    """The config fields the flags of :func:`add_step_size_args` set: ``--lr X`` turns tuning off (an empty
    grid, every run at ``X``); otherwise the given grid (checked) or :data:`DEFAULT_GRID`, and ``lr``."""
    grid = () if a.lr is not None else parse_grid(a.lr_grid) if a.lr_grid else DEFAULT_GRID
    return {"lr_grid": grid, "lr": a.lr if a.lr is not None else lr, "tune_seeds": a.tune_seeds,
            "max_widen": a.max_widen}
