"""The discordance predictor: how likely is a twin of this decision to change the outcome?

A logistic regression on nine features of a decision predicts ``eta_t = P(D_t != 0)``,
the input of the square-root branching rule. It is fitted online on the realised twins
of each update by weighted SGD (learning rate 0.05, weight decay 1e-4); a twin that was
run with probability ``q_t q_same^{e_t}`` gets weight ``1 / (q_t q_same^{e_t})`` so that
the fit targets the whole population of decisions, not just the ones we chose to
branch. The weights are divided by their batch mean (self-normalised) so that a
weight of 80 cannot throw one SGD step across the parameter space.

Features (scaled to order one by fixed constants, so no running statistics need
checkpointing): group success rate ``p``, ``p^2``, factual utility ``U``, ``U p``, the
turn's mean token entropy, whether the turn is a search, the turn index / 5, the
remaining turns / 5 and ``log(1 + remaining tokens) / 6``.

A second logistic regression, the *success model*, predicts ``p_hat_t``: the chance that
the episode succeeds given its prefix up to decision ``t``, for mixed-outcome targeting
(``q_t`` proportional to ``2 p_hat_t (1 - p_hat_t)``). It sees only what the prefix
shows (:data:`SUCCESS_FEATURE_NAMES`; the episode's own outcome, remaining turns and
remaining tokens are left out) and is fitted on every factual decision with the
episode's utility, clipped to [0, 1], as the label.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional, Sequence

import numpy as np

from twice_envs.agents.types import EpisodeRecord

FEATURE_NAMES = (
    "p",
    "p2",
    "utility",
    "utility_x_p",
    "entropy",
    "is_search",
    "turn",
    "remaining_turns",
    "log_remaining_tokens",
)
NUM_FEATURES = len(FEATURE_NAMES)
SUCCESS_FEATURE_NAMES = (
    "p_others",
    "p_others2",
    "entropy",
    "is_search",
    "turn",
    "log_prefix_tokens",
)
"""Success-model features: the success rate of the *other* episodes of the group (0.5
when alone), its square, the turn's entropy, whether it is a search, the turn index / 5
and ``log(1 + tokens generated up to and including the turn) / 6``."""
NUM_SUCCESS_FEATURES = len(SUCCESS_FEATURE_NAMES)
#: Published fit settings.
LEARNING_RATE = 0.05
WEIGHT_DECAY = 1e-4


@dataclass
class PredictorState:
    """What Twice carries across updates: the discordance predictor, the success model,
    the cost calibration and the running twin scale (plain arrays: checkpoint with
    :meth:`to_json`)."""

    weights: np.ndarray = field(default_factory=lambda: np.zeros(NUM_FEATURES))
    bias: float = 0.0
    updates: int = 0
    cost_realised: float = 0.0
    """Decayed sum of realised auxiliary tokens (for the cost calibration)."""
    cost_expected: float = 0.0
    """Decayed sum of ``sum_t q_t c_t`` of the same updates."""
    success_weights: np.ndarray = field(default_factory=lambda: np.zeros(NUM_SUCCESS_FEATURES))
    """Weights of the success model (mixed-outcome targeting)."""
    success_bias: float = 0.0
    """Bias of the success model."""
    twin_m2: float = 0.0
    """Decayed sum of squared twin credits ``A_hat_t`` of branched decisions (running scale)."""
    twin_n: float = 0.0
    """Decayed count of the same decisions."""

    @property
    def cost_scale(self) -> float:
        """Realised twin tokens per predicted token ``c_t`` (1 until twins have run).

        Tracked every update; used only by the ``cost-calibration`` ablation
        (:attr:`~twice_envs.agents.credit.twice.TwiceConfig.cost_calibration`), which solves
        the budget with ``cost_scale x c_t`` so that the *generated* twin tokens meet
        ``beta`` x policy tokens. As published, the budget is solved with ``c_t`` itself.
        """
        return self.cost_realised / self.cost_expected if self.cost_expected > 0 else 1.0

    @property
    def twin_rms(self) -> float:
        """Running root-mean-square of the twin credits of earlier updates (NaN before any)."""
        return float(np.sqrt(self.twin_m2 / self.twin_n)) if self.twin_n > 0 else float("nan")

    def to_json(self) -> dict:
        return {"weights": [float(w) for w in self.weights], "bias": float(self.bias), "updates": int(self.updates),
                "cost_realised": float(self.cost_realised), "cost_expected": float(self.cost_expected),
                "success_weights": [float(w) for w in self.success_weights],
                "success_bias": float(self.success_bias), "twin_m2": float(self.twin_m2), "twin_n": float(self.twin_n)}

    @classmethod
    def from_json(cls, d: dict) -> "PredictorState":
        sw = d.get("success_weights")
        return cls(np.asarray(d["weights"], dtype=np.float64), float(d["bias"]), int(d["updates"]),
                   float(d.get("cost_realised", 0.0)), float(d.get("cost_expected", 0.0)),
                   np.zeros(NUM_SUCCESS_FEATURES) if sw is None else np.asarray(sw, dtype=np.float64),
                   float(d.get("success_bias", 0.0)), float(d.get("twin_m2", 0.0)), float(d.get("twin_n", 0.0)))


def group_success(episodes: Sequence[EpisodeRecord]) -> np.ndarray:
    """Per-episode success rate of its group (mean utility clipped to [0, 1])."""
    u = np.clip(np.array([ep.utility for ep in episodes], dtype=np.float64), 0.0, 1.0)
    g = np.array([ep.group for ep in episodes])
    p = np.zeros_like(u)
    for key in np.unique(g):
        p[g == key] = u[g == key].mean()
    return p


def is_search_turn(text: str) -> bool:
    """A SearchQA-style search action (other envs: never)."""
    return "<search>" in text


def decision_index(episodes: Sequence[EpisodeRecord]) -> list[tuple[int, int]]:
    """Every decision ``(episode, turn)`` of a batch, in order: each episode's own turns, from its
    ``prefix`` on (turns copied from another episode of the batch are that episode's decisions)."""
    return [(i, t) for i, ep in enumerate(episodes) for t in range(ep.prefix, len(ep.turns))]


def decision_features(episodes: Sequence[EpisodeRecord], index: Optional[Sequence[tuple[int, int]]] = None) -> np.ndarray:
    """The ``(N, 9)`` feature matrix of the decisions in ``index`` (default: all)."""
    index = decision_index(episodes) if index is None else index
    p = group_success(episodes)
    X = np.zeros((len(index), NUM_FEATURES))
    for row, (i, t) in enumerate(index):
        ep = episodes[i]
        turn = ep.turns[t]
        n = len(ep.turns)
        X[row] = (
            p[i],
            p[i] ** 2,
            ep.utility,
            ep.utility * p[i],
            turn.entropy,
            float(is_search_turn(turn.text)),
            t / 5.0,
            (n - t - 1) / 5.0,
            np.log1p(ep.remaining_tokens(t)) / 6.0,
        )
    return X


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def predict(state: PredictorState, X: np.ndarray) -> np.ndarray:
    """Predicted discordance probabilities ``eta``."""
    return _sigmoid(np.asarray(X) @ state.weights + state.bias)


def _sgd_pass(weights, bias, X, y, w, rng, lr, weight_decay):
    """One pass of weighted logistic SGD in a random order; weights self-normalised."""
    weights, bias = np.array(weights, dtype=np.float64), float(bias)
    if len(y):
        w = w / w.mean()
        for j in rng.permutation(len(y)):
            err = float(_sigmoid(X[j] @ weights + bias)) - y[j]
            weights -= lr * (w[j] * err * X[j] + weight_decay * weights)
            bias -= lr * w[j] * err
    return weights, bias


def sgd_update(
    state: PredictorState,
    X: np.ndarray,
    y: np.ndarray,
    sample_weight: np.ndarray,
    rng: np.random.Generator,
    *,
    lr: float = LEARNING_RATE,
    weight_decay: float = WEIGHT_DECAY,
) -> PredictorState:
    """One pass of weighted SGD over the realised twins (in a random order); returns the new state."""
    weights, bias = _sgd_pass(state.weights, state.bias, np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64),
                              np.asarray(sample_weight, dtype=np.float64), rng, lr, weight_decay)
    return replace(state, weights=weights, bias=bias, updates=state.updates + 1)


def success_features(episodes: Sequence[EpisodeRecord], index: Optional[Sequence[tuple[int, int]]] = None) -> np.ndarray:
    """The ``(N, 6)`` success-model features of the decisions in ``index`` (default: all)."""
    index = decision_index(episodes) if index is None else index
    u = np.clip(np.array([ep.utility for ep in episodes], dtype=np.float64), 0.0, 1.0)
    g = np.array([ep.group for ep in episodes])
    X = np.zeros((len(index), NUM_SUCCESS_FEATURES))
    for row, (i, t) in enumerate(index):
        others = (g == g[i]) & (np.arange(len(g)) != i)
        p = float(u[others].mean()) if others.any() else 0.5
        turn = episodes[i].turns[t]
        prefix = sum(x.num_tokens for x in episodes[i].turns[: t + 1])
        X[row] = (p, p * p, turn.entropy, float(is_search_turn(turn.text)), t / 5.0, np.log1p(prefix) / 6.0)
    return X


def predict_success(state: PredictorState, X: np.ndarray) -> np.ndarray:
    """``p_hat``: predicted success of each decision's prefix."""
    return _sigmoid(np.asarray(X) @ state.success_weights + state.success_bias)


def fit_success(state: PredictorState, episodes: Sequence[EpisodeRecord], rng: np.random.Generator, *,
                lr: float = LEARNING_RATE, weight_decay: float = WEIGHT_DECAY) -> PredictorState:
    """One SGD pass of the success model over every decision of a factual batch."""
    index = decision_index(episodes)
    X = success_features(episodes, index)
    y = np.array([min(max(episodes[i].utility, 0.0), 1.0) for i, _ in index])
    weights, bias = _sgd_pass(state.success_weights, state.success_bias, X, y, np.ones(len(y)), rng, lr, weight_decay)
    return replace(state, success_weights=weights, success_bias=bias)


#: Per-update decay of the cost-calibration sums (recent updates weigh more).
COST_DECAY = 0.7


def calibrate_cost(state: PredictorState, realised: float, expected: float) -> PredictorState:
    """Fold one update's realised and expected twin tokens into the cost calibration."""
    return replace(state, cost_realised=COST_DECAY * state.cost_realised + float(realised),
                   cost_expected=COST_DECAY * state.cost_expected + float(expected))


#: Per-update decay of the running twin scale.
SCALE_DECAY = 0.9


def track_twin_scale(state: PredictorState, a_hat: Sequence[float]) -> PredictorState:
    """Fold one update's twin credits (of its branched decisions) into the running scale."""
    a = np.asarray(a_hat, dtype=np.float64)
    return replace(state, twin_m2=SCALE_DECAY * state.twin_m2 + float(np.sum(a * a)),
                   twin_n=SCALE_DECAY * state.twin_n + float(a.size))


def auc(scores: Sequence[float], labels: Sequence[float]) -> float:
    """Area under the ROC curve (ties count one half); NaN when one class is missing."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels).astype(bool)
    pos, neg = s[y], s[~y]
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    order = np.argsort(np.concatenate([pos, neg]), kind="mergesort")
    allv = np.concatenate([pos, neg])[order]
    ranks = np.empty(len(allv))
    # average ranks over ties
    i = 0
    while i < len(allv):
        j = i
        while j + 1 < len(allv) and allv[j + 1] == allv[i]:
            j += 1
        ranks[i : j + 1] = 0.5 * (i + j) + 1.0
        i = j + 1
    r = np.empty(len(allv))
    r[order] = ranks
    return float((r[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2.0) / (len(pos) * len(neg)))
