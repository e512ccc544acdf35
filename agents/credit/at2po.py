"""AT2PO credit (Zong et al. 2026, arXiv 2601.04767): entropy-guided tree expansion, turn values from the tree.

AT2PO grows a turn-level tree per task (its nodes are agent turns, its root the prompt),
chooses where to branch by the policy's uncertainty, and credits every turn with the
value of its subtree. Here the trees grow from the factual batch, with tree.py's nodes,
forks and runners:

* a **node** ``(i, t)`` is turn ``t`` of factual episode ``i``, ``1 <= t <= T_i - 2``: the
  non-leaf turns (the last turn ``T_i - 1`` is the leaf; turn 0 hangs off the root, whose other
  children are the group's other factual episodes);
* **expanding** a node gives it ``width`` siblings: each takes another turn ``t`` from the
  boundary ``s_t`` and continues to the end of its episode (tree.py's independent siblings,
  the context's ``values`` runner, fresh noise), with utility ``U'``;
* **entropy-guided expansion**: the node's score is

      score(i, t) = H(i, t) - alpha m(i, t),      H(i, t) = -(1 / |y_t|) sum_{tokens of turn t} log pi(token)

  (the paper's Monte Carlo estimate of the turn's entropy from ``TurnRecord.logprobs``; ``m`` is the
  number of times the node has been expanded so far). Each iteration takes the ``k`` highest
  scores of every tree (a task group), in score order across trees, and iterations continue until
  the planned sibling tokens reach the budget ``beta`` x the batch's policy tokens; the expansion
  that crosses the budget is kept by a coin of probability ``(budget - planned) / cost`` and ends
  the plan, so the expected planned tokens equal the budget (as tree.py's partial level). A
  fixed number of ``iterations`` instead runs exactly that many and refuses a ``k`` whose plan
  exceeds the budget, naming the largest ``k`` that fits.

**Turn-wise credit.** The leaves of tree ``g`` are its factual utilities ``U_i`` and its
siblings' ``U'``; each is normalised by the tree's leaves,

    U~ = (U - mean_g) / (std_g + 1e-6),

and the value of a node is bootstrapped from its children, bottom up:

    V(i, T_i - 1) = U~_i
    V(i, t)       = agg( V(i, t + 1), U~'_1 .. U~'_n )     (n siblings at s_{t + 1}; agg = mean by default)

(a sibling is a chain to its own leaf, so its node's value is its ``U~'``). The advantage of factual
turn ``t`` is its value, ``A_t = V(i, t)`` (``advantage="value"``), or its value against its
parent's, ``A_t = V(i, t) - V(i, t - 1)`` with ``V(root_g)`` the mean of the tree's turn-0 values
before turn 0 (``advantage="diff_parent"``). Unexpanded episodes get ``A_t = U~_i`` on every turn.

What the published method says that we follow: top-K highest-entropy non-leaf nodes per
iteration, the mean negative log-prob estimator, a penalty ``alpha`` on nodes already expanded,
values by Monte Carlo bootstrapping over descendants, and each turn's value used as its advantage
(the variant the paper reports best; its released training script sets the same, with leaf
rewards normalised within each tree, ``alpha = 0.05``, one branch per chosen node).

Where the paper is silent or our framework differs, our reading:

* **only factual nodes are expanded.** In the paper a sibling becomes a node that later
  iterations may expand; our runners fork a factual episode's boundary (the lab's runner holds
  the factual episodes' envs, the LLM runner replays factual turns), not a sibling, so later
  iterations re-expand factual nodes (the penalty ``alpha m`` spreads them) and siblings stay
  chains. Their entropies are the factual turns', computed once.
* **siblings are auxiliary rollouts**: they enter the values of the factual turns above them
  and are not trained on themselves (as tree.py's siblings and Twice's twins), whereas the
  paper trains on every leaf of its tree.
* **the budget** is ``beta`` x the batch's policy tokens (tree.py's, ``beta`` from the context's
  twin settings), a node's cost is ``width`` x its factual tokens from turn ``t`` on (at least 1);
  the paper fixes the iterations and K instead (our ``iterations`` option).
* **the aggregate** is the children's mean (an unbiased Monte Carlo value of the boundary under
  the sampling policy); the released script weights children by a softmax of their turn entropies
  (``aggregate="entropy_softmax"``, offered, not the default: it tilts a value toward uncertain
  children).
* **the scale** is each tree's own (mean and standard deviation of its leaves, siblings
  included), as the released code normalises; no GRPO group term is added (the normalised value
  already plays its part).
* **ties** among equal scores go to the earlier episode and turn.
* **the ATPO objective** (a per-turn importance ratio ``exp(mean over the turn's tokens of the
  log-ratio)``, clipped per turn) is a change of the loss, not of the credit, and is not part of
  this method: :mod:`twice_envs.agents.training.loss` clips per token.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence

import numpy as np

from twice_envs.agents.credit.registry import CreditContext, CreditResult, register_credit
from twice_envs.agents.credit.tree import require_forkable, run_siblings, sibling_outcomes
from twice_envs.agents.credit.twice import TwiceConfig, policy_tokens
from twice_envs.agents.types import EpisodeRecord, TurnRecord

AGGREGATES = ("mean", "entropy_softmax")
ADVANTAGES = ("value", "diff_parent")


def _positive_int(name: str, v, optional: bool = False) -> None:
    if optional and v is None:
        return
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"at2po {name} must be {'None or ' if optional else ''}an integer >= 1, got {v!r}")


@dataclass(frozen=True)
class AT2POConfig:
    """AT2PO's settings (the registered method uses the defaults and the context's ``beta``)."""

    k: int = 2
    """Nodes expanded per tree (task group) per iteration: the top-K scores."""
    width: int = 1
    """Siblings per expansion (the released code branches once per chosen node)."""
    alpha: float = 0.05
    """Branching penalty: a node's score drops by ``alpha`` per time it was expanded."""
    iterations: Optional[int] = None
    """Expansion iterations (None: as many as the budget pays for, the last one in part). A fixed
    count whose siblings exceed the budget is refused."""
    beta: Optional[float] = None
    """Budget: planned sibling tokens = beta x the batch's policy tokens (None: the context's twin
    budget, ``TwiceConfig.beta``)."""
    aggregate: str = "mean"
    """How a node's value combines its children's: ``mean`` or ``entropy_softmax``."""
    advantage: str = "value"
    """``value`` (``A_t = V(i, t)``) or ``diff_parent`` (``A_t = V(i, t) - V(i, t - 1)``)."""

    def __post_init__(self) -> None:
        _positive_int("k", self.k)
        _positive_int("width", self.width)
        _positive_int("iterations", self.iterations, optional=True)
        if not np.isfinite(self.alpha) or self.alpha < 0:
            raise ValueError(f"at2po alpha must be a finite number >= 0, got {self.alpha!r}")
        if self.aggregate not in AGGREGATES:
            raise ValueError(f"at2po aggregate must be one of {AGGREGATES}, got {self.aggregate!r}")
        if self.advantage not in ADVANTAGES:
            raise ValueError(f"at2po advantage must be one of {ADVANTAGES}, got {self.advantage!r}")


def at2po_config(ctx: CreditContext, base: Optional[AT2POConfig] = None) -> AT2POConfig:
    """``base`` (default :class:`AT2POConfig`) with ``beta`` filled from the context's twin settings."""
    base = base or AT2POConfig()
    return base if base.beta is not None else replace(base, beta=(ctx.twice or TwiceConfig()).beta)


# --------------------------------------------------------------------------- entropy-guided expansion


def turn_entropy(turn: TurnRecord) -> float:
    """``-mean(log-probs)`` of the turn's tokens (0 for a turn without tokens)."""
    return float(-np.mean(turn.logprobs)) if len(turn.logprobs) else 0.0


def candidate_nodes(episodes: Sequence[EpisodeRecord]) -> list[tuple[int, int]]:
    """Every non-leaf node ``(i, t)``, ``1 <= t <= T_i - 2``, in episode then turn order."""
    return [(i, t) for i, ep in enumerate(episodes) for t in range(1, len(ep.turns) - 1)]


def plan_expansions(episodes: Sequence[EpisodeRecord], k: int, width: int, alpha: float, budget: float,
                    rng: np.random.Generator, iterations: Optional[int] = None) -> tuple[dict, dict]:
    """``(counts, figures)``: how many times each node ``(i, t)`` is expanded, and the plan's figures.

    Each iteration scores every candidate by ``H - alpha m`` (``m``: its expansions so far), takes the
    top ``k`` of every group and expands them in score order across groups. Without ``iterations``
    the plan stops at the budget (the crossing expansion kept by a coin, see the module docstring);
    with it, exactly that many iterations run whatever they cost."""
    cands = candidate_nodes(episodes)
    entropy = {(i, t): turn_entropy(episodes[i].turns[t]) for i, t in cands}
    cost = {(i, t): width * max(1, episodes[i].remaining_tokens(t)) for i, t in cands}
    groups: dict = {}
    for n in cands:
        groups.setdefault(episodes[n[0]].group, []).append(n)
    counts: dict[tuple[int, int], int] = {}
    planned, rounds, done = 0.0, 0, not cands
    while not done and (iterations is None or rounds < iterations):
        if iterations is None and planned >= budget:
            break
        score = {n: entropy[n] - alpha * counts.get(n, 0) for n in cands}
        picks = []
        for members in groups.values():
            picks += sorted(members, key=lambda n: (-score[n], n))[:k]
        picks.sort(key=lambda n: (-score[n], n))
        rounds += 1
        for n in picks:
            if iterations is None and planned + cost[n] > budget:
                if rng.random() < (budget - planned) / cost[n]:
                    counts[n] = counts.get(n, 0) + 1
                    planned += cost[n]
                done = True
                break
            counts[n] = counts.get(n, 0) + 1
            planned += cost[n]
    return counts, {"at2po_iterations": rounds, "expanded_nodes": len(counts),
                    "expansions": int(sum(counts.values())), "aux_target": float(budget),
                    "aux_accounted": float(planned),
                    "mean_entropy_expanded": float(np.mean([entropy[n] for n in counts])) if counts else float("nan"),
                    "mean_entropy_candidates": float(np.mean(list(entropy.values()))) if cands else float("nan")}


def choose_expansions(episodes: Sequence[EpisodeRecord], config: AT2POConfig, rng: np.random.Generator,
                      method: str) -> tuple[dict, dict]:
    """:func:`plan_expansions` under ``config`` (``beta`` must be set, :func:`at2po_config`); a fixed
    ``iterations`` whose plan exceeds the budget raises with the largest ``k`` that fits."""
    if config.beta is None:
        raise ValueError("the at2po budget needs beta (fill it from the context with at2po_config)")
    budget = config.beta * policy_tokens(episodes)
    counts, figs = plan_expansions(episodes, config.k, config.width, config.alpha, budget, rng, config.iterations)
    if config.iterations is not None and figs["aux_accounted"] > budget:
        fits = [k for k in range(1, config.k) if plan_expansions(
            episodes, k, config.width, config.alpha, budget, rng, config.iterations)[1]["aux_accounted"] <= budget]
        fit = max(fits, default=0)
        raise ValueError(f"{method}: k {config.k} x width {config.width} over {config.iterations} iterations plans "
                         f"{figs['aux_accounted']:.0f} sibling tokens, over the budget of {budget:.0f} (beta "
                         f"{config.beta} x policy tokens); the largest k that fits is {fit}"
                         + (" (none: lower the iterations or the width)" if fit == 0 else ""))
    return counts, figs


# --------------------------------------------------------------------------- turn-wise credit


def normalised_leaves(episodes: Sequence[EpisodeRecord], siblings: dict[tuple[int, int], Sequence[float]],
                      eps: float = 1e-6) -> tuple[np.ndarray, dict[tuple[int, int], np.ndarray]]:
    """Factual and sibling utilities normalised by the mean and (population) std of their tree's leaves."""
    leaves: dict = {}
    for ep in episodes:
        leaves.setdefault(ep.group, []).append(ep.utility)
    for (i, _), us in siblings.items():
        leaves[episodes[i].group] += list(us)
    stat = {g: (float(np.mean(v)), float(np.std(v))) for g, v in leaves.items()}

    def norm(u, g):
        m, s = stat[g]
        return (np.asarray(u, dtype=np.float64) - m) / (s + eps)

    return (np.array([float(norm(ep.utility, ep.group)) for ep in episodes]),
            {n: norm(us, episodes[n[0]].group) for n, us in siblings.items()})


def _softmax(x: Sequence[float]) -> np.ndarray:
    z = np.exp(np.asarray(x, dtype=np.float64) - np.max(x))
    return z / z.sum()


def turn_values(episodes: Sequence[EpisodeRecord], leaf: Sequence[float],
                siblings: dict[tuple[int, int], Sequence[float]], aggregate: str = "mean",
                sibling_entropy: Optional[dict[tuple[int, int], Sequence[float]]] = None) -> list[np.ndarray]:
    """``V(i, t)`` of every factual turn: the leaf's value ``leaf[i]`` on the last turn, then bottom up the
    aggregate of the factual child ``V(i, t + 1)`` and the siblings at ``s_{t + 1}`` (``siblings[(i, t + 1)]``).
    ``entropy_softmax`` weights the children by ``softmax`` of their turns' entropies (factual:
    :func:`turn_entropy`; siblings: ``sibling_entropy``, in the order of ``siblings``)."""
    out = []
    for i, ep in enumerate(episodes):
        T = len(ep.turns)
        v = np.zeros(T)
        if T == 0:
            out.append(v)
            continue
        v[T - 1] = leaf[i]
        for t in range(T - 2, -1, -1):
            sib = list(siblings.get((i, t + 1), ()))
            children = np.array([v[t + 1]] + sib, dtype=np.float64)
            if aggregate == "mean":
                v[t] = children.mean()
            elif aggregate == "entropy_softmax":
                h = [turn_entropy(ep.turns[t + 1])] + list((sibling_entropy or {}).get((i, t + 1), [0.0] * len(sib)))
                v[t] = float(_softmax(h) @ children)
            else:
                raise ValueError(f"at2po aggregate must be one of {AGGREGATES}, got {aggregate!r}")
        out.append(v)
    return out


def turn_advantages(episodes: Sequence[EpisodeRecord], values: Sequence[np.ndarray],
                    advantage: str = "value") -> list[np.ndarray]:
    """``A_t = V(i, t)``, or with ``diff_parent`` ``V(i, t) - V(i, t - 1)`` (turn 0: minus the root's value,
    the mean of its tree's turn-0 values)."""
    if advantage == "value":
        return [np.array(v, dtype=np.float64) for v in values]
    if advantage != "diff_parent":
        raise ValueError(f"at2po advantage must be one of {ADVANTAGES}, got {advantage!r}")
    first: dict = {}
    for ep, v in zip(episodes, values):
        if len(v):
            first.setdefault(ep.group, []).append(float(v[0]))
    out = []
    for ep, v in zip(episodes, values):
        v = np.asarray(v, dtype=np.float64)
        parent = np.concatenate([[np.mean(first[ep.group])], v[:-1]]) if len(v) else v
        out.append(v - parent)
    return out


def at2po_step(episodes: Sequence[EpisodeRecord], ctx: CreditContext, *, method: str = "at2po",
               config: Optional[AT2POConfig] = None) -> CreditResult:
    """Check forks, plan the expansions, run the siblings, bootstrap the values (module docstring)."""
    cfg = at2po_config(ctx, config)
    require_forkable(episodes, method)
    counts, stats = choose_expansions(episodes, cfg, ctx.rng, method)
    by_total: dict[int, list[tuple[int, int]]] = {}
    for n, m in counts.items():
        by_total.setdefault(m * cfg.width, []).append(n)
    records, kept, aux = [], [], 0
    for total, nodes in sorted(by_total.items()):  # a rollout's seed depends on its node and index j <= total only
        r, k, a = run_siblings(ctx, episodes, sorted(nodes), total, coupled=False)
        records, kept, aux = records + list(r), kept + list(k), aux + a
    outcomes = sibling_outcomes(episodes, records, kept)
    sib_entropy: dict = {}
    for rec in records:
        sib_entropy.setdefault(tuple(int(x) for x in rec.twin_of), []).append(
            turn_entropy(rec.turns[0]) if rec.turns else 0.0)
    leaf, sib = normalised_leaves(episodes, outcomes)
    values = turn_values(episodes, leaf, sib, cfg.aggregate, sib_entropy)
    pairs = [(episodes[i].utility, u) for (i, _), us in outcomes.items() for u in us]
    stats.update({"siblings": len(records), "aux_generated": int(aux),
                  "expanded_share": len(counts) / max(1, sum(len(ep.turns) for ep in episodes)),
                  "tie_share": float(np.mean([u == v for u, v in pairs])) if pairs else float("nan")})
    return CreditResult(turn_advantages(episodes, values, cfg.advantage), aux, stats)


@register_credit("at2po", display="AT2PO (our reading)", config=AT2POConfig, needs=("value_rollouts",),
                 benches=("learn",), description="each turn's value bootstrapped from a tree grown at its "
                 "highest-entropy turns (independent siblings), tree-normalised")
def at2po_registered_step(episodes: Sequence[EpisodeRecord], ctx: CreditContext) -> CreditResult:
    """Entropy-guided independent siblings; each factual turn's advantage is its node's value."""
    return at2po_step(episodes, ctx, method="at2po")
