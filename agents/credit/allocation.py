"""Twice on factual batches grown from their own prefixes, at Twice's budget: tree sampling and prefix-level allocation.

Both compositions spend what Twice spends, GRPO's factual tokens plus ``beta`` x them in twins (1.70x
GRPO's at ``beta = 0.7``), and redistribute the factual part: they are registered with a root share
of :data:`ROOT_SHARE` (0.4), so callers sample ``round(0.4 G)`` episodes per task (the *roots*;
:func:`~.registry.factual_group_size`), and the step grows further factual episodes from the roots'
turn boundaries until the tokens truly generated reach GRPO's, ``(1 / share - 1)`` x the roots' tokens
(rounds of one new episode per tree or task, the last one's crossing episode kept by a coin, as
:func:`~.tree.grow_in_rounds` does for Tree-GRPO). A new episode copies a root's turns before a
boundary ``s_t`` (its ``prefix``), takes turn ``t`` afresh and plays on, on fresh noise
(:meth:`~twice_envs.agents.types.EpisodeRecord.grow`). The loss trains on every episode of the
batch, each turn with

    A_t = A_traj + omega A_hat_t / sigma_hat

where ``A_traj`` is GRPO's group-normalised return over all the task's episodes (grown ones
included) and ``omega A_hat_t / sigma_hat`` Twice's twin term (:func:`~.twice.twin_terms`): the
branch plan covers the batch's own decisions (a grown episode's start at its prefix; the turns it
copied are its root's), at the budget ``beta`` x the tokens generated for the whole batch, GRPO's.

* ``twice-tree`` (Twice + tree sampling): Tree-GRPO's sampling (:func:`~.tree.grow_trees`): each root
  is a tree expanded at boundaries drawn uniformly among ``0 .. T - 1`` it has not expanded yet.
* ``twice-alloc`` (Twice + prefix-level allocation): each round, every task draws one boundary
  ``s_t`` (``t = 0 .. T - 1``; ``t = 0``: a new episode of the prompt) of its roots, with replacement,
  with probability proportional to ``p_hat (1 - p_hat) + floor``, ``p_hat`` the predicted success of
  that prefix (the success model that mixed-outcome targeting fits, :func:`~.predictor.predict_success`,
  refitted on every batch here): factual rollouts go to the prompts and prefixes whose outcomes are
  predicted to be mixed, where an outcome-based baseline learns most.

Where the composition is not spelled out, our reading:

* the new episodes are factual: trained on and in their groups' baselines;
* a copied prefix is trained in every episode that holds it, with that episode's advantage (each
  root-to-leaf path is an episode, as tree-sampling implementations train their paths);
* the new episodes' generated tokens are reported as the step's auxiliary tokens, beside the twins';
  the batch as sampled is the roots;
* ``twice-alloc``'s ``floor`` (0.05, ``p_hat (1 - p_hat)`` at ``p_hat`` about 0.05) keeps every
  boundary possible, so a wrong prediction cannot starve a prefix; its success model starts
  unfitted (``p_hat = 0.5`` everywhere: uniform allocation) and learns from each batch's outcomes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from twice_envs.agents.credit import predictor
from twice_envs.agents.credit.grpo import episode_advantages
from twice_envs.agents.credit.registry import CreditContext, CreditResult, Rollout, get_method, register_credit
from twice_envs.agents.credit.tree import (
    Forest,
    TreeConfig,
    expansion_budget,
    grow_in_rounds,
    grow_trees,
    require_forkable,
)
from twice_envs.agents.credit.twice import TwiceConfig, add_twin_terms
from twice_envs.agents.types import EpisodeRecord


#: Roots per task as a share of GRPO's group size (2 of 5); the rest of GRPO's factual tokens is grown.
ROOT_SHARE = 0.4


@dataclass(frozen=True)
class AllocationConfig:
    """Settings of ``twice-alloc`` (``twice-tree`` has none besides the twin settings)."""

    floor: float = 0.05
    """Added to every boundary's ``p_hat (1 - p_hat)`` before normalising (every boundary stays possible)."""


def allocation_weights(p_hat: np.ndarray, floor: float) -> np.ndarray:
    """``p_hat (1 - p_hat) + floor``: the weight of a boundary whose predicted success is ``p_hat``."""
    p = np.clip(np.asarray(p_hat, dtype=np.float64), 0.0, 1.0)
    return p * (1.0 - p) + floor


class AllocationDraws:
    """``twice-alloc``'s draws: each round, every task proposes one boundary ``(i, t)`` of its roots,
    ``t = 0 .. T_i - 1`` (``p_hat`` in that order, one per boundary of the batch), drawn with replacement with
    probability proportional to :func:`allocation_weights`; the tasks in a random order."""

    def __init__(self, roots: Sequence[EpisodeRecord], p_hat: np.ndarray, floor: float):
        self.index = [(i, t) for i, ep in enumerate(roots) for t in range(len(ep.turns))]
        if len(p_hat) != len(self.index):
            raise ValueError(f"one p_hat per boundary: {len(self.index)} boundaries, {len(p_hat)} predictions")
        w = allocation_weights(p_hat, floor)
        rows: dict[int, list[int]] = {}
        for r, (i, _) in enumerate(self.index):
            rows.setdefault(roots[i].group, []).append(r)
        self.rows = {g: (np.array(r), w[r] / w[r].sum()) for g, r in rows.items()}

    def propose(self, rng: np.random.Generator) -> list[tuple[int, int]]:
        groups = sorted(self.rows)
        return [self.index[int(rng.choice(self.rows[groups[k]][0], p=self.rows[groups[k]][1]))]
                for k in rng.permutation(len(groups))]

    def take(self, node: tuple[int, int]) -> None:
        """Boundaries are drawn with replacement: nothing to remove."""


def grown_step(forest: Forest, growth: dict, ctx: CreditContext) -> CreditResult:
    """Credit a grown batch with ``A_traj`` over each task's episodes and Twice's twin terms; the grown
    episodes' tokens join the twins' as auxiliary tokens."""
    batch = forest.episodes
    config = ctx.config or TwiceConfig()
    a_traj = episode_advantages([ep.utility for ep in batch], [ep.group for ep in batch])
    base = [np.full(len(ep.turns), a_traj[i] if config.trajectory_term else 0.0) for i, ep in enumerate(batch)]
    res = add_twin_terms(base, batch, ctx)
    roots = len(batch) - growth["expansions"]
    res.aux_tokens += growth["aux_generated"]
    res.stats.update({"grown_episodes": growth["expansions"], "grown_tokens": growth["aux_generated"],
                      "grown_target": growth["aux_target"], "grown_rounds": growth["tree_rounds"],
                      "mean_prefix": float(np.mean([ep.prefix for ep in batch[roots:]])) if roots < len(batch)
                      else float("nan")})
    res.episodes = batch
    return res


def _budget(roots: Sequence[EpisodeRecord], method: str) -> float:
    require_forkable(roots, method)
    return expansion_budget(roots, get_method(method).roots)


@register_credit("twice-tree", display="Twice + tree sampling", needs=("branches", "twins"), config=TwiceConfig,
                 benches=("learn",), roots=ROOT_SHARE, description="Twice on a batch drawn by tree sampling within "
                 "GRPO's factual tokens (fewer roots, Tree-GRPO's expansions)")
def twice_tree_step(roots: Sequence[EpisodeRecord], rollouts: Sequence[Rollout], ctx: CreditContext) -> CreditResult:
    """Tree-GRPO's sampling within GRPO's tokens (in rounds, through ``ctx.run``), then Twice's credit on every
    leaf (its twins run once the batch is grown)."""
    forest, growth = grow_trees(roots, ctx, TreeConfig(), _budget(roots, "twice-tree"), "twice-tree")
    return grown_step(forest, growth, ctx)


@register_credit("twice-alloc", display="Twice + prefix allocation", needs=("branches", "twins"),
                 config=TwiceConfig, benches=("learn",), roots=ROOT_SHARE,
                 description="Twice on a batch whose factual rollouts beyond the roots go to the prompts and prefixes "
                 "with mixed predicted outcomes, within GRPO's tokens")
def twice_alloc_step(roots: Sequence[EpisodeRecord], rollouts: Sequence[Rollout], ctx: CreditContext,
                     config: AllocationConfig = AllocationConfig()) -> CreditResult:
    """New episodes at the boundaries with mixed predicted success, within GRPO's tokens (in rounds, through
    ``ctx.run``); Twice's credit on all (the run's Twice settings; ``config``: the allocation's floor)."""
    budget = _budget(roots, "twice-alloc")
    state = ctx.predictor_state or predictor.PredictorState()
    index = [(i, t) for i, ep in enumerate(roots) for t in range(len(ep.turns))]
    p_hat = predictor.predict_success(state, predictor.success_features(roots, index))
    forest, growth = grow_in_rounds(roots, ctx, AllocationDraws(roots, p_hat, config.floor),
                                    lambda n: max(1, roots[n[0]].remaining_tokens(n[1])), budget)
    res = grown_step(forest, growth, ctx)
    # the success model learns from this batch's outcomes (the discordance model learnt from its twins)
    res.predictor_state = predictor.fit_success(res.predictor_state or state, res.episodes, ctx.rng)
    grown = forest.source[len(roots):]
    res.stats["prompt_share"] = float(np.mean([t == 0 for _, t in grown])) if grown else float("nan")
    res.stats["mean_p_hat"] = float(np.mean(p_hat)) if len(p_hat) else float("nan")
    return res
