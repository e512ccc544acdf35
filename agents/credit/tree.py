"""Tree-GRPO (Ji et al. 2026): the tree is the training batch, grown within GRPO's tokens.

Tree-GRPO samples ``M`` chains per task (the *roots*), each the first path of its own tree, and
expands the trees: an expansion picks a node of a tree uniformly at random among its non-leaf
nodes and rolls a new path out from it, taking that turn afresh. Every leaf (every root-to-leaf
path) is a training episode, trained on its whole trajectory, shared prefix included, with

    A = (U - mean_tree) / (std_tree + eps) + (U - mean_task) / (std_task + eps)

the intra-tree and inter-tree group-normalised outcomes of the reference implementation (its
``tree`` advantage estimator: GRPO's normalisation once over the leaves of the tree, once over
all leaves of the task), broadcast to every turn of the leaf.

Here:

* **roots**: the method is registered with a root share of :data:`ROOT_SHARE` (0.4): callers
  sample ``round(0.4 G)`` chains per task (:func:`~.registry.factual_group_size`; 2 for GRPO's
  ``G = 5``), and the step grows the rest of GRPO's tokens as expansions;
* **nodes**: the non-leaf nodes of a tree are its root chain's turn boundaries ``0 .. T - 1``
  (boundary 0, the prompt: a new chain; boundary ``t``: a new turn ``t`` after the chain's first
  ``t`` turns), the reference implementation's candidates with one expansion iteration (``l = 1``,
  its default). It draws them with replacement; here a tree expands each node at most once, so
  that a coupled sibling never repeats another's branch;
* **widths, so that the generated tokens per update match GRPO's**: the expansion budget is GRPO's
  tokens less the roots', ``(1 / share - 1)`` x the roots' tokens (each root stands for
  ``1 / share`` of GRPO's chains). The trees are expanded in rounds, one expansion per tree in a
  random order, each at a boundary drawn uniformly among those the tree has not expanded yet, and
  rounds continue while the tokens truly generated stay below the budget. Within a round a node
  counts at its planned cost, the tokens its chain generated from that boundary on, times the
  tokens generated per planned token in the earlier rounds; the expansion whose count crosses what
  is left is kept by a coin of probability ``left / count`` and ends the round (the growth too,
  when the round added nothing). (Planned costs alone miss: a uniform boundary of a short chain is
  drawn more often than one of a long chain, so they run short of what new paths generate, by
  about a fifth on SearchToy.) ``TreeConfig.width`` fixes the leaves per tree instead, and a width
  whose expected planned tokens exceed the budget is refused, naming the largest that fits;
* **coupled siblings** (``tree-grpo-coupled``): an expansion takes its turn on a fresh branch
  ``k`` and then continues on its chain's downstream noise (a coupled twin), so sibling
  differences are twin differences, at no extra tokens: a sibling whose turn repeats the
  chain's is the chain itself (its leaf is a copy, costing only its turn), and the plan counts
  each expansion at its expected cost net of that chance (:func:`~.predictor.self_twin_probability`,
  as Twice's budget does).

The new paths' generated tokens are the step's auxiliary tokens; the batch as sampled is the
roots. Where the reference differs: its standard deviation is the unbiased one and a group of one
leaf gets mean 0 and std 1; here the normalisation is GRPO's of this project (population std, a
group whose outcomes tie gets 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional, Sequence

import numpy as np

from twice_envs.agents.credit.grpo import broadcast, episode_advantages
from twice_envs.agents.credit.predictor import self_twin_probability
from twice_envs.agents.credit.registry import (
    CreditContext,
    CreditResult,
    Request,
    Rollout,
    get_method,
    register_credit,
)
from twice_envs.agents.credit.twice import TwiceConfig, policy_tokens
from twice_envs.agents.types import EpisodeRecord

#: Tree-GRPO's roots per task as a share of GRPO's group size (2 trees for G = 5).
ROOT_SHARE = 0.4


@dataclass(frozen=True)
class TreeConfig:
    """Tree-GRPO's settings (the registered methods use the defaults)."""

    width: Optional[int] = None
    """Leaves per tree: its root chain and ``width - 1`` expansions (None: as many as GRPO's tokens pay for)."""
    depth: Optional[int] = None
    """The deepest boundary an expansion starts from (0: new chains from the prompt only; None: any
    non-leaf node, boundaries ``0 .. T - 1``)."""

    def __post_init__(self) -> None:
        for name, low in (("width", 1), ("depth", 0)):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low):
                raise ValueError(f"tree {name} must be None or an integer >= {low}, got {v!r}")


# --------------------------------------------------------------------------- the forest a batch grows into


@dataclass
class Forest:
    """A batch grown from its roots.

    Attributes:
        episodes: the roots, then every grown path, in the order grown.
        source: per episode, the node ``(episode, turn)`` it was grown from (None for a root): it copies
            that episode's turns before ``turn`` and takes turn ``turn`` afresh.
        tree: per episode, the index of the root chain whose tree it belongs to.
    """

    episodes: list = field(default_factory=list)
    source: list = field(default_factory=list)
    tree: list = field(default_factory=list)

    @classmethod
    def of_roots(cls, roots: Sequence[EpisodeRecord]) -> "Forest":
        return cls(list(roots), [None] * len(roots), list(range(len(roots))))

    def add(self, grown: Sequence[EpisodeRecord], nodes: Sequence[tuple[int, int]]) -> None:
        """Append the paths grown from ``nodes`` (one each, in order)."""
        if len(grown) != len(nodes):
            raise ValueError(f"{len(nodes)} nodes were expanded, but {len(grown)} paths came back")
        for ep, (i, t) in zip(grown, nodes):
            self.episodes.append(ep)
            self.source.append((int(i), int(t)))
            self.tree.append(self.tree[int(i)])


def require_forkable(episodes: Sequence[EpisodeRecord], method: str) -> None:
    """Raise, naming ``method``, when an episode's env cannot fork (its id is not registered: a fork
    makes a fresh env of the registered kind, :meth:`~twice_envs.core.TextEnv.fork`)."""
    from twice_envs.registry import registry as env_registry  # the env registry imports the agents' lazily

    bad = sorted({ep.env_id for ep in episodes if ep.env_id not in env_registry})
    if bad:
        raise ValueError(f"{method} forks every episode at its expanded turn boundaries, but {', '.join(bad)} "
                         "cannot fork (not a registered env id: create envs with twice_envs.make or register them)")


def expansion_budget(roots: Sequence[EpisodeRecord], share: float) -> float:
    """GRPO's tokens less the roots': the roots' generated tokens x ``(1 / share - 1)`` (each root stands for
    ``1 / share`` of GRPO's chains)."""
    return policy_tokens(roots) * (1.0 / share - 1.0)


def expansion_costs(ep: EpisodeRecord, bounds: Sequence[int], p_self: Optional[np.ndarray] = None) -> np.ndarray:
    """The planned cost of an expansion at each boundary of ``bounds``: the tokens ``ep`` generated from it on
    (at least 1), net of a self-sibling's saving ``p (c - len)`` where ``p_self`` gives its chance."""
    c = np.array([max(1, ep.remaining_tokens(t)) for t in bounds], dtype=np.float64)
    if p_self is None:
        return c
    lens = np.array([ep.turns[t].num_tokens for t in bounds], dtype=np.float64)
    return c - np.asarray(p_self, dtype=np.float64) * (c - lens)


# --------------------------------------------------------------------------- growing the trees


def sibling_config(base: Optional[TwiceConfig], width: int) -> TwiceConfig:
    """The twin settings that make coupled siblings: ``width`` alternatives per node (branches
    ``1..width``) sharing the chain's downstream noise, one pair, no evidence coin, self-twins shortcut."""
    return replace(base or TwiceConfig(), pairs=1, star=width, coupled=True, q_same=1.0, skip_same_evidence=False,
                   self_twin_shortcut=True)


def sibling_leaf(chain: EpisodeRecord, rec: EpisodeRecord) -> EpisodeRecord:
    """The leaf a coupled sibling ``rec`` of ``chain`` makes: the chain grown with the sibling's path or, for
    a self-sibling (its turn repeats the chain's, the chain itself), a copy of the chain whose turn ``t`` is
    the sibling's."""
    leaf = chain.grow(rec)
    if rec.self_twin:
        t = int(rec.twin_of[1])
        leaf.turns = list(chain.turns[:t]) + list(rec.turns[:1]) + list(chain.turns[t + 1:])
        leaf.utility, leaf.trajectory, leaf.info = chain.utility, chain.trajectory, dict(chain.info)
        leaf.terminated, leaf.truncated = chain.terminated, chain.truncated
    return leaf


def grow(ctx: CreditContext, roots: Sequence[EpisodeRecord], nodes: Sequence[tuple[int, int]], rnd: int,
         coupled: bool) -> tuple[list[EpisodeRecord], int, list[bool]]:
    """One round's new paths, one per node of ``nodes`` (distinct nodes), in order: independent (the
    ``branches`` runner, the round's own seeds) or coupled siblings (the ``twins`` runner, branch 1 of a
    node never expanded before). Returns ``(paths, tokens generated, self-sibling flags)``."""
    if not coupled:
        paths = ctx.run(Request("branches", {"nodes": list(nodes), "noise_seed": ctx.noise_seed + 7919 * rnd}), roots)
        return list(paths), sum(ep.num_generated_tokens for ep in paths), [False] * len(paths)
    out = ctx.run(Request("twins", {"decisions": list(nodes), "config": sibling_config(None, 1)}), roots)
    by_node = {tuple(int(v) for v in rec.twin_of): rec for rec in out.records}
    recs = [by_node[(int(i), int(t))] for i, t in nodes]
    return [sibling_leaf(roots[i], r) for (i, _), r in zip(nodes, recs)], int(out.aux_tokens), \
        [bool(r.self_twin) for r in recs]


class TreeDraws:
    """Tree-GRPO's draws: each tree (root chain) proposes a boundary drawn uniformly among those it has not
    expanded yet (``0 .. T - 1``, at most ``depth``), each node at most once per tree."""

    def __init__(self, roots: Sequence[EpisodeRecord], depth: Optional[int] = None):
        self.left = {i: list(range(len(ep.turns) if depth is None else min(len(ep.turns), depth + 1)))
                     for i, ep in enumerate(roots) if len(ep.turns)}

    def propose(self, rng: np.random.Generator) -> list[tuple[int, int]]:
        """One node per tree with boundaries left, the trees in a random order."""
        return [(int(i), self.left[i][int(rng.integers(0, len(self.left[i])))])
                for i in rng.permutation(sorted(i for i in self.left if self.left[i]))]

    def take(self, node: tuple[int, int]) -> None:
        self.left[node[0]].remove(node[1])


def grow_in_rounds(roots: Sequence[EpisodeRecord], ctx: CreditContext, draws, cost, budget: float, *,
                   rounds: Optional[int] = None, coupled: bool = False) -> tuple[Forest, dict]:
    """Grow paths from ``roots`` in rounds; returns the forest and the figures (``aux_target``: ``budget``,
    ``aux_accounted``: the planned tokens, ``aux_generated``: those truly generated).

    Each round takes the nodes ``draws.propose(rng)`` proposes, in order (``draws.take(node)`` for each taken),
    and grows them (:func:`grow`). Budget-driven (``rounds`` None): rounds continue while the tokens truly
    generated stay below ``budget``; within a round, each node counts at its planned cost ``cost(node)`` times
    the tokens generated per planned token in the earlier rounds (1 in the first), and the node whose count
    crosses what is left is taken by a coin of probability ``left / count`` and ends the round (the growth too,
    when the round took nothing). A fixed ``rounds`` takes every proposal of that many rounds."""
    forest, rng = Forest.of_roots(roots), ctx.rng
    planned, spent, n, selves, done = 0.0, 0, 0, [], budget <= 0 and rounds is None
    while not done and (rounds is None or n < rounds):
        nodes, round_planned, round_est = [], 0.0, 0.0
        scale = spent / planned if planned > 0 else 1.0  # generated per planned token in the earlier rounds
        for node in draws.propose(rng):
            c = float(cost(node))
            if rounds is None and spent + round_est + scale * c > budget:
                if rng.random() < (budget - spent - round_est) / (scale * c):
                    nodes.append(node)
                    round_planned, round_est = round_planned + c, round_est + scale * c
                    draws.take(node)
                done = not nodes
                break
            nodes.append(node)
            round_planned, round_est = round_planned + c, round_est + scale * c
            draws.take(node)
        if not nodes:
            break
        paths, tokens, flags = grow(ctx, roots, nodes, n, coupled)
        forest.add(paths, nodes)
        planned, spent, n, selves = planned + round_planned, spent + tokens, n + 1, selves + flags
        done = done or (rounds is None and spent >= budget)
    bounds = [s[1] for s in forest.source[len(roots):]]
    stats = {"roots": len(roots), "expansions": len(bounds), "tree_rounds": n, "aux_target": float(budget),
             "aux_accounted": planned, "aux_generated": int(spent),
             "mean_boundary": float(np.mean(bounds)) if bounds else float("nan")}
    if coupled:
        stats["self_sibling_share"] = float(np.mean(selves)) if selves else float("nan")
    return forest, stats


def grow_trees(roots: Sequence[EpisodeRecord], ctx: CreditContext, config: TreeConfig, budget: float, method: str,
               coupled: bool = False) -> tuple[Forest, dict]:
    """Tree-GRPO's growth (module docstring): rounds of one expansion per tree (:class:`TreeDraws`), each node
    planned at its chain's tokens from its boundary on (net of its self-sibling chance when ``coupled``), until
    the tokens generated reach ``budget`` (:func:`grow_in_rounds`). A fixed ``width`` runs ``width - 1`` rounds
    and is refused, naming the largest width that fits, when their expected planned tokens exceed the budget."""
    draws = TreeDraws(roots, config.depth)
    costs = {}
    for i, bounds in draws.left.items():
        p = self_twin_probability(roots, [(i, t) for t in bounds]) if coupled else None
        costs[i] = expansion_costs(roots[i], bounds, p)
    if config.width is not None:
        expected = float(sum(c.mean() for c in costs.values()))
        if (config.width - 1) * expected > budget:
            fit = 1 + int(budget // expected) if expected > 0 else 1
            raise ValueError(f"{method}: width {config.width} (leaves per tree) plans about "
                             f"{(config.width - 1) * expected:.0f} expansion tokens, over GRPO's budget of "
                             f"{budget:.0f} left after the roots; the largest width that fits is {fit}")
    return grow_in_rounds(roots, ctx, draws, lambda n: costs[n[0]][n[1]], budget,
                          rounds=None if config.width is None else config.width - 1, coupled=coupled)


def tree_advantages(episodes: Sequence[EpisodeRecord], trees: Sequence[int], eps: float = 1e-6) -> list[np.ndarray]:
    """Per leaf, its outcome normalised over its tree's leaves plus over its task's leaves (GRPO's
    normalisation twice), on every turn."""
    u = [ep.utility for ep in episodes]
    a = episode_advantages(u, trees, eps=eps) + episode_advantages(u, [ep.group for ep in episodes], eps=eps)
    return broadcast(a, episodes)


def tree_step(roots: Sequence[EpisodeRecord], ctx: CreditContext, *, method: str, coupled: bool,
              config: Optional[TreeConfig] = None, share: Optional[float] = None) -> CreditResult:
    """Check forks, grow the trees within GRPO's tokens, credit every leaf (module docstring); ``share``: the
    roots' share of GRPO's group (default: the method's registered one)."""
    require_forkable(roots, method)
    share = get_method(method).roots if share is None else share
    forest, stats = grow_trees(roots, ctx, config or TreeConfig(), expansion_budget(roots, share), method, coupled)
    stats.update({"leaves": len(forest.episodes), "leaves_per_tree": len(forest.episodes) / max(1, len(roots))})
    return CreditResult(tree_advantages(forest.episodes, forest.tree), stats["aux_generated"], stats,
                        episodes=forest.episodes)


@register_credit("tree-grpo", display="Tree-GRPO", config=TreeConfig, needs=("branches",), benches=("learn",),
                 roots=ROOT_SHARE, description="trees grown within GRPO's tokens from fewer roots, every leaf "
                 "trained with its intra-tree plus inter-tree normalised outcome")
def tree_grpo_step(roots: Sequence[EpisodeRecord], rollouts: Sequence[Rollout], ctx: CreditContext) -> CreditResult:
    """Independent expansions (fresh noise from the node on), grown in rounds through ``ctx.run``."""
    return tree_step(roots, ctx, method="tree-grpo", coupled=False, config=ctx.config)


@register_credit("tree-grpo-coupled", display="Tree-GRPO + coupled siblings", config=TreeConfig, needs=("twins",),
                 benches=("learn",), roots=ROOT_SHARE, description="Tree-GRPO whose expansions continue on their "
                 "chain's downstream noise (coupled siblings, at no extra tokens)")
def tree_grpo_coupled_step(roots: Sequence[EpisodeRecord], rollouts: Sequence[Rollout],
                           ctx: CreditContext) -> CreditResult:
    """Coupled expansions (a fresh turn on branch k, then the chain's downstream noise), grown in rounds."""
    return tree_step(roots, ctx, method="tree-grpo-coupled", coupled=True, config=ctx.config)
