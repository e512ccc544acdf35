"""Twice on factual batches that grow from their own prefixes: tree sampling and prefix-level allocation.

Both methods start from the batch as sampled, ``G`` episodes per task (the *roots*), and draw
``G`` more factual episodes per task through the context's ``branches`` runner: a new episode
copies a root's turns before a boundary ``s_t`` (its ``prefix``), takes turn ``t`` afresh and
plays on, on fresh noise (:meth:`~twice_envs.agents.types.EpisodeRecord.grow`). The loss trains
on all ``2 G`` episodes of each task (the step returns them as ``CreditResult.episodes``), each
turn with

    A_t = A_traj + omega A_hat_t / sigma_hat

where ``A_traj`` is GRPO's group-normalised return over the task's ``2 G`` episodes (grown ones
included) and ``omega A_hat_t / sigma_hat`` Twice's twin term (:func:`~.twice.twin_terms`): the
branch plan covers the batch's own decisions (a grown episode's start at its prefix; the turns it
copied are its root's), at the budget ``beta`` x the tokens generated for the whole batch.

* ``twice-tree`` (Twice + tree sampling): every root grows one new episode, from a boundary
  drawn uniformly from ``1 .. T - 1`` (boundary 0, a new episode of the prompt, for a root of one
  turn): each root becomes a tree of two leaves that share its first turns, the sampling of
  Tree-GRPO, whose leaves are all factual episodes here.
* ``twice-alloc`` (Twice + prefix-level allocation): task ``g``'s ``G`` new episodes are drawn,
  with replacement, among the boundaries ``s_t`` (``t = 0 .. T - 1``; ``t = 0``: a new episode of
  the prompt) of its roots, with probability proportional to ``p_hat (1 - p_hat) + floor``,
  ``p_hat`` the predicted success of that prefix (the success model that mixed-outcome targeting
  fits, :func:`~.predictor.predict_success`, refitted on every batch here): factual rollouts go
  to the prompts and prefixes whose outcomes are predicted to be mixed, where an outcome-based
  baseline learns most.

Where the composition is not spelled out, our reading:

* the new episodes are factual: trained on and in their groups' baselines, unlike the auxiliary
  rollouts of Tree-GRPO as this project runs it (:mod:`.tree`), whose siblings only inform credit;
* a copied prefix is trained in every episode that holds it, with that episode's advantage (each
  root-to-leaf path is an episode, as tree-sampling implementations train their paths);
* the new episodes' generated tokens are reported as the step's auxiliary tokens, so the batch
  as sampled stays ``G`` episodes per task, as GRPO's, and equal-token readings see their cost;
  the twin budget is ``beta`` x every token generated for the batch (roots and new episodes);
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
from twice_envs.agents.credit.registry import CreditContext, CreditResult, register_credit
from twice_envs.agents.credit.twice import TwiceConfig, add_twin_terms
from twice_envs.agents.types import EpisodeRecord


@dataclass(frozen=True)
class AllocationConfig:
    """Settings of ``twice-alloc`` (``twice-tree`` has none besides the twin settings)."""

    floor: float = 0.05
    """Added to every boundary's ``p_hat (1 - p_hat)`` before normalising (every boundary stays possible)."""


def groups_of(episodes: Sequence[EpisodeRecord]) -> dict[int, list[int]]:
    """Episode indices by task group, in batch order."""
    out: dict[int, list[int]] = {}
    for i, ep in enumerate(episodes):
        out.setdefault(ep.group, []).append(i)
    return out


def tree_nodes(episodes: Sequence[EpisodeRecord], rng: np.random.Generator) -> list[tuple[int, int]]:
    """One boundary per root, uniform over ``1 .. T - 1`` (0 for a root of one turn)."""
    return [(i, int(rng.integers(1, len(ep.turns))) if len(ep.turns) > 1 else 0) for i, ep in enumerate(episodes)]


def allocation_weights(p_hat: np.ndarray, floor: float) -> np.ndarray:
    """``p_hat (1 - p_hat) + floor``: the weight of a boundary whose predicted success is ``p_hat``."""
    p = np.clip(np.asarray(p_hat, dtype=np.float64), 0.0, 1.0)
    return p * (1.0 - p) + floor


def allocated_nodes(episodes: Sequence[EpisodeRecord], p_hat: np.ndarray, floor: float,
                    rng: np.random.Generator) -> list[tuple[int, int]]:
    """Each group's size worth of boundaries, drawn with replacement among its episodes' boundaries
    ``(i, t)``, ``t = 0 .. T_i - 1`` (``p_hat`` in that order, one per boundary of the batch) with
    probability proportional to :func:`allocation_weights`; in group order."""
    index = [(i, t) for i, ep in enumerate(episodes) for t in range(len(ep.turns))]
    if len(p_hat) != len(index):
        raise ValueError(f"one p_hat per boundary: {len(index)} boundaries, {len(p_hat)} predictions")
    w = allocation_weights(p_hat, floor)
    nodes = []
    for members in groups_of(episodes).values():
        rows = [r for r, (i, _) in enumerate(index) if i in set(members)]
        pick = rng.choice(len(rows), size=len(members), replace=True, p=w[rows] / w[rows].sum())
        nodes += [index[rows[k]] for k in pick]
    return nodes


def grown_step(roots: Sequence[EpisodeRecord], nodes: Sequence[tuple[int, int]], ctx: CreditContext) -> CreditResult:
    """Grow one factual episode per node, then credit the whole batch with ``A_traj`` and Twice's twin terms."""
    grown = ctx.need("branches")(ctx.policy, roots, list(nodes), ctx.sampling, noise_seed=ctx.noise_seed)
    batch = list(roots) + list(grown)
    config = ctx.twice or TwiceConfig()
    a_traj = episode_advantages([ep.utility for ep in batch], [ep.group for ep in batch])
    base = [np.full(len(ep.turns), a_traj[i] if config.trajectory_term else 0.0) for i, ep in enumerate(batch)]
    res = add_twin_terms(base, batch, ctx)
    grown_tokens = sum(ep.num_generated_tokens for ep in grown)
    res.aux_tokens += grown_tokens
    res.stats.update({"grown_episodes": len(grown), "grown_tokens": grown_tokens,
                      "mean_prefix": float(np.mean([ep.prefix for ep in grown])) if grown else float("nan")})
    res.episodes = batch
    return res


@register_credit("twice-tree", display="Twice + tree sampling", needs=("branches", "twins"), config=TwiceConfig,
                 benches=("learn",), description="Twice on a batch grown by tree sampling (one more leaf per "
                 "episode, from a uniform turn boundary)")
def twice_tree_step(episodes: Sequence[EpisodeRecord], ctx: CreditContext) -> CreditResult:
    """Every root grows one leaf from a uniform boundary; Twice's credit on the ``2 G`` leaves per task."""
    return grown_step(episodes, tree_nodes(episodes, ctx.rng), ctx)


@register_credit("twice-alloc", display="Twice + prefix allocation", needs=("branches", "twins"),
                 config=AllocationConfig, benches=("learn",),
                 description="Twice on a batch whose extra rollouts go to prompts and prefixes with mixed "
                 "predicted outcomes")
def twice_alloc_step(episodes: Sequence[EpisodeRecord], ctx: CreditContext,
                     config: AllocationConfig = AllocationConfig()) -> CreditResult:
    """``G`` more episodes per task at the boundaries with mixed predicted success; Twice's credit on all."""
    state = ctx.predictor_state or predictor.PredictorState()
    index = [(i, t) for i, ep in enumerate(episodes) for t in range(len(ep.turns))]
    p_hat = predictor.predict_success(state, predictor.success_features(episodes, index))
    nodes = allocated_nodes(episodes, p_hat, config.floor, ctx.rng)
    res = grown_step(episodes, nodes, ctx)
    # the success model learns from this batch's outcomes (the discordance model learnt from its twins)
    res.predictor_state = predictor.fit_success(res.predictor_state or state, res.episodes, ctx.rng)
    res.stats["prompt_share"] = float(np.mean([t == 0 for _, t in nodes])) if nodes else float("nan")
    res.stats["mean_p_hat"] = float(np.mean(p_hat)) if len(p_hat) else float("nan")
    return res
