"""AT2PO (Zong et al. 2026, arXiv 2601.04767): entropy-guided tree expansion, every turn credited with its node's value.

AT2PO grows one turn-level tree per task: ``M`` chains from the prompt, then ``L`` iterations of
expansions, each leaf a training path. A node is a turn of a path (its state and the turn taken
there); the leaf of a path is its last turn. Its rules, as published (Algorithm 1 and Eq. 2-3) and
in the released code (``sample_expansion_nodes`` with ``expansion_mode=entropy``, its training
script's ``node_value_mode`` and ``node_adv_mode``):

* **candidates**: every non-leaf node of the tree, including the nodes of earlier expansions;
* **score**: ``H(n) - alpha (b(n) - 1)``, ``H(n) = -(1 / |y|) sum log pi(token)`` the turn's
  Monte Carlo entropy (from ``TurnRecord.logprobs``) and ``b(n)`` the branches at the state the
  turn was taken from (the children of the node's parent, itself included), ``alpha = 0.05``;
* **expansion**: each iteration takes the top ``K`` scores of every tree and rolls a new path out
  from each chosen node's state, taking its turn afresh (a new sibling of the node; the paper's
  "fork the state ``s_{i,j}`` and regenerate the remainder");
* **values**: a leaf's value is its outcome normalised by GRPO's mean and standard deviation over
  the tree's leaves; a node's value is ``sum_c w_c V_c`` over its children with ``w_c = H(c) /
  sum_c' H(c')`` (Eq. 3, the paper's best; ``aggregate="entropy_softmax"``: the released script's
  softmax of the children's entropies; ``"mean"``: their mean);
* **advantage**: ``A_n = V_n`` on every token of the node's turn (the paper's main setting), in
  every path through the node.

Here the tree is the training batch, within GRPO's tokens: the method is registered with a root
share of :data:`ROOT_SHARE` (0.6, the published 10 initial chains of a budget of 16; 3 of GRPO's 5),
and the expansion budget is GRPO's tokens less the roots', ``(1 / share - 1)`` x the roots' tokens.
Iterations of top-``K`` expansions (``K = 2`` per tree) continue while the tokens truly generated
stay below the budget; within an iteration, picks are counted at their planned cost, their path's
tokens from that turn on, and the pick whose cost crosses what is left is kept by a coin of
probability ``left / cost`` and ends the iteration (and the growth, when the iteration added
nothing). A fixed ``iterations`` runs exactly that many and is refused, naming the largest ``K``
that fits, when its expected planned tokens exceed the budget. Expansions are independent (fresh
noise from the node, the ``branches`` runner); the new paths' tokens are the step's auxiliary
tokens.

Where the paper is silent, our reading: a turn with no log-probs has entropy 0; the root (the
prompt) is not a candidate of its own, its children (every path's first turn) are, so a new chain
from the prompt is an expansion of a first turn; ties go to the earlier path and turn. The ATPO
objective (a per-turn importance ratio, clipped per turn) changes the loss, not the credit, and is
not part of this method (:mod:`twice_envs.agents.training.loss` clips per token).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from twice_envs.agents.credit.grpo import episode_advantages
from twice_envs.agents.credit.registry import (
    CreditContext,
    CreditResult,
    Request,
    Rollout,
    get_method,
    register_credit,
)
from twice_envs.agents.credit.tree import Forest, expansion_budget, require_forkable
from twice_envs.agents.types import EpisodeRecord, TurnRecord

#: AT2PO's initial chains per task as a share of GRPO's group size (published: 10 of a budget of 16).
ROOT_SHARE = 0.6
AGGREGATES = ("entropy", "entropy_softmax", "mean")


@dataclass(frozen=True)
class AT2POConfig:
    """AT2PO's settings (the registered method uses the defaults)."""

    k: int = 2
    """Nodes expanded per tree per iteration: the top-K scores (published: 6 with 10 initial chains)."""
    alpha: float = 0.05
    """Branching penalty per branch already at the node's state."""
    iterations: Optional[int] = None
    """Expansion iterations (None: as many as GRPO's tokens pay for, the last one in part); a fixed count
    whose expected tokens exceed the budget is refused."""
    aggregate: str = "entropy"
    """How a node's value combines its children's: ``entropy`` (Eq. 3), ``entropy_softmax`` or ``mean``."""

    def __post_init__(self) -> None:
        for name, optional in (("k", False), ("iterations", True)):
            v = getattr(self, name)
            if (optional and v is None) or (not isinstance(v, bool) and isinstance(v, (int, np.integer)) and v >= 1):
                continue
            raise ValueError(f"at2po {name} must be {'None or ' if optional else ''}an integer >= 1, got {v!r}")
        if not np.isfinite(self.alpha) or self.alpha < 0:
            raise ValueError(f"at2po alpha must be a finite number >= 0, got {self.alpha!r}")
        if self.aggregate not in AGGREGATES:
            raise ValueError(f"at2po aggregate must be one of {AGGREGATES}, got {self.aggregate!r}")


def turn_entropy(turn: TurnRecord) -> float:
    """``-mean(log-probs)`` of the turn's tokens (0 for a turn without them)."""
    return float(-np.mean(turn.logprobs)) if len(turn.logprobs) else 0.0


# --------------------------------------------------------------------------- the tree over a forest


def state_of(forest: Forest, e: int, t: int) -> tuple:
    """The state a turn ``t`` of path ``e`` is taken from: the task's prompt at ``t = 0``, else shared with the
    path's source up to the boundary it was grown from, else the path's own."""
    if t == 0:
        return ("prompt", forest.episodes[e].group)
    src = forest.source[e]
    if src is not None and t <= src[1]:
        return state_of(forest, src[0], t)
    return ("state", e, t)


def node_of(forest: Forest, e: int, t: int) -> tuple[int, int]:
    """The node turn ``t`` of path ``e`` is: its own from the boundary it was grown from on, else its source's."""
    src = forest.source[e]
    if src is not None and t < src[1]:
        return node_of(forest, src[0], t)
    return (e, t)


def own_nodes(forest: Forest) -> list[tuple[int, int]]:
    """Every node of the forest once: ``(path, turn)`` for the turns a path generated itself."""
    return [(e, t) for e, ep in enumerate(forest.episodes)
            for t in range(forest.source[e][1] if forest.source[e] else 0, len(ep.turns))]


def branches_at(forest: Forest) -> dict[tuple, int]:
    """The number of nodes (branches) taken from each state."""
    out: dict[tuple, int] = {}
    for e, t in own_nodes(forest):
        s = state_of(forest, e, t)
        out[s] = out.get(s, 0) + 1
    return out


def candidates(forest: Forest) -> list[tuple[int, int]]:
    """The non-leaf nodes (a path's turns but its last), in path then turn order."""
    return [(e, t) for e, t in own_nodes(forest) if t < len(forest.episodes[e].turns) - 1]


def scores(forest: Forest, nodes: Sequence[tuple[int, int]], alpha: float) -> dict[tuple[int, int], float]:
    """``H(n) - alpha (b(n) - 1)`` for every node of ``nodes``."""
    b = branches_at(forest)
    return {(e, t): turn_entropy(forest.episodes[e].turns[t]) - alpha * (b[state_of(forest, e, t)] - 1)
            for e, t in nodes}


def top_k(forest: Forest, k: int, alpha: float) -> list[tuple[int, int]]:
    """One iteration's picks: the top ``k`` candidates of every tree (task group), then in score order across
    trees (ties: the earlier path and turn)."""
    cands = candidates(forest)
    score = scores(forest, cands, alpha)
    groups: dict = {}
    for n in cands:
        groups.setdefault(forest.episodes[n[0]].group, []).append(n)
    picks = [n for members in groups.values() for n in sorted(members, key=lambda n: (-score[n], n))[:k]]
    return sorted(picks, key=lambda n: (-score[n], n))


def node_cost(forest: Forest, n: tuple[int, int]) -> float:
    """A new sibling's planned cost: the node's path's tokens from its turn on (at least 1)."""
    return float(max(1, forest.episodes[n[0]].remaining_tokens(n[1])))


# --------------------------------------------------------------------------- growing the tree


def grow_tree(roots: Sequence[EpisodeRecord], ctx: CreditContext, config: AT2POConfig, budget: float,
              method: str) -> tuple[Forest, dict]:
    """Iterations of top-K expansions under ``budget`` (module docstring); returns the forest and the figures."""
    forest = Forest.of_roots(roots)
    trees = len({ep.group for ep in roots})
    if config.iterations is not None:
        per_tree: dict = {}
        for n in candidates(forest):
            per_tree.setdefault(forest.episodes[n[0]].group, []).append(node_cost(forest, n))
        expected = config.iterations * float(sum(np.mean(c) for c in per_tree.values()))
        if config.k * expected > budget:
            fit = int(budget // expected) if expected > 0 else 0
            raise ValueError(f"{method}: k {config.k} over {config.iterations} iterations plans about "
                             f"{config.k * expected:.0f} expansion tokens, over GRPO's budget of {budget:.0f} left "
                             f"after the roots; the largest k that fits is {fit}"
                             + (" (none: lower the iterations)" if fit == 0 else ""))
    planned, spent, rounds, done = 0.0, 0, 0, budget <= 0
    while not done and (config.iterations is None or rounds < config.iterations):
        picks, nodes = top_k(forest, config.k, config.alpha), []
        if not picks:
            break
        for n in picks:
            cost = node_cost(forest, n)
            if config.iterations is None and spent + cost > budget:
                if ctx.rng.random() < (budget - spent) / cost:
                    nodes.append(n)
                    planned += cost
                done = not nodes  # the iteration ends here; the growth too when it added nothing
                break
            nodes.append(n)
            planned, spent = planned + cost, spent + cost  # planned until the paths come back
        if nodes:
            grown = ctx.run(Request("branches", {"nodes": nodes, "noise_seed": ctx.noise_seed + 7919 * rounds}),
                            forest.episodes)
            forest.add(grown, nodes)
        spent = sum(ep.num_generated_tokens for ep in forest.episodes[len(roots):])
        rounds += 1
        done = done or (config.iterations is None and spent >= budget)
    expanded = forest.episodes[len(roots):]
    return forest, {"roots": len(roots), "trees": trees, "at2po_iterations": rounds, "expansions": len(expanded),
                    "aux_target": float(budget), "aux_accounted": planned, "aux_generated": int(spent),
                    "mean_entropy_expanded": float(np.mean([turn_entropy(ep.turns[s[1]]) for ep, s in
                                                            zip(expanded, forest.source[len(roots):])]))
                    if expanded else float("nan")}


# --------------------------------------------------------------------------- turn-wise credit


def _weights(h: np.ndarray, aggregate: str) -> np.ndarray:
    if aggregate == "entropy" and h.sum() > 0:
        return h / h.sum()
    if aggregate == "entropy_softmax":
        z = np.exp(h - h.max())
        return z / z.sum()
    if aggregate in AGGREGATES:
        return np.full(len(h), 1.0 / len(h))
    raise ValueError(f"at2po aggregate must be one of {AGGREGATES}, got {aggregate!r}")


def node_values(forest: Forest, aggregate: str = "entropy", eps: float = 1e-6) -> dict[tuple[int, int], float]:
    """``V`` of every node: a leaf's outcome normalised over its tree's leaves (GRPO's normalisation), an inner
    node's the weighted sum of its children's (the nodes taken from the state after it)."""
    eps_ = forest.episodes
    leaf = episode_advantages([ep.utility for ep in eps_], [ep.group for ep in eps_], eps=eps)
    children: dict[tuple, list[tuple[int, int]]] = {}
    for e, t in own_nodes(forest):
        children.setdefault(state_of(forest, e, t), []).append((e, t))
    values: dict[tuple[int, int], float] = {}
    for e, t in sorted(own_nodes(forest), key=lambda n: -n[1]):  # deeper turns first
        if t == len(eps_[e].turns) - 1:
            values[(e, t)] = float(leaf[e])
            continue
        kids = children[state_of(forest, e, t + 1)]
        h = np.array([turn_entropy(eps_[c].turns[u]) for c, u in kids])
        values[(e, t)] = float(_weights(h, aggregate) @ np.array([values[c] for c in kids]))
    return values


def at2po_step(roots: Sequence[EpisodeRecord], ctx: CreditContext, *, method: str = "at2po",
               config: Optional[AT2POConfig] = None, share: Optional[float] = None) -> CreditResult:
    """Check forks, grow the tree within GRPO's tokens, credit every turn of every path with its node's value;
    ``share``: the roots' share of GRPO's group (default: the method's registered one)."""
    cfg = config or AT2POConfig()
    require_forkable(roots, method)
    share = get_method(method).roots if share is None else share
    forest, stats = grow_tree(roots, ctx, cfg, expansion_budget(roots, share), method)
    values = node_values(forest, cfg.aggregate)
    adv = [np.array([values[node_of(forest, e, t)] for t in range(len(ep.turns))], dtype=np.float64)
           for e, ep in enumerate(forest.episodes)]
    stats["leaves"] = len(forest.episodes)
    return CreditResult(adv, stats["aux_generated"], stats, episodes=forest.episodes)


@register_credit("at2po", display="AT2PO", config=AT2POConfig, needs=("branches",), benches=("learn",),
                 roots=ROOT_SHARE, description="a tree grown within GRPO's tokens at its highest-entropy turns, "
                 "every turn credited with its node's value")
def at2po_registered_step(roots: Sequence[EpisodeRecord], rollouts: Sequence[Rollout],
                          ctx: CreditContext) -> CreditResult:
    """Entropy-guided expansions from fewer roots, grown in rounds through ``ctx.run``; each turn's advantage
    is its node's value."""
    return at2po_step(roots, ctx, method="at2po", config=ctx.config)
