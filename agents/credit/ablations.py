"""Ablations of Twice: each flag changes exactly one setting of :class:`TwiceConfig`.

``apply_ablations(config, ["independent-twins", ...])`` returns the changed config;
the names are the ``--ablation`` values of ``twice train``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterable

from twice_envs.agents.credit.twice import TwiceConfig

#: name -> (what it changes, the change)
ABLATIONS: dict[str, tuple[str, Callable[[TwiceConfig], TwiceConfig]]] = {
    "independent-twins": ("fresh noise after the branch", lambda c: replace(c, coupled=False)),
    "per-episode-keys": ("key by a global token counter of the episode", lambda c: replace(c, key_mode="counter")),
    "no-line-resync": ("key (episode, turn, pos): no re-sync at newlines", lambda c: replace(c, key_mode="flat")),
    "ngram-keys": ("key by the last four tokens (inexact)", lambda c: replace(c, key_mode="ngram")),
    "uniform-branching": ("the same q for every decision", lambda c: replace(c, branching="uniform")),
    "mixed-outcome": ("q proportional to 2 p (1 - p)", lambda c: replace(c, branching="mixed")),
    "skip-same-evidence": ("same-evidence twins count as D = 0 (biased)", lambda c: replace(c, skip_same_evidence=True)),
    "no-inverse-weights": ("A_hat = B S D without 1/(q q_same^e)", lambda c: replace(c, inverse_weights=False)),
    "no-self-twin-shortcut": ("self-twins pay their continuation", lambda c: replace(c, self_twin_shortcut=False)),
    "twin-credit-only": ("no GRPO term A_traj", lambda c: replace(c, trajectory_term=False)),
    "running-scale": ("sigma_hat = running RMS of earlier twin credits", lambda c: replace(c, twin_scale="running")),
    "star": ("K = 2 alternatives share the factual noise", lambda c: replace(c, star=2)),
    "cost-calibration": ("c_t scaled by realised / planned tokens of earlier updates",
                         lambda c: replace(c, cost_calibration=True)),
    "published-cost-proxy": ("a twin planned at c_t, not at the twin cost ratio x c_t",
                             lambda c: replace(c, cost_ratio=False)),
}


def apply_ablations(config: TwiceConfig, names: Iterable[str]) -> TwiceConfig:
    """``config`` with each named ablation applied (unknown names raise with the list)."""
    for name in names:
        if name not in ABLATIONS:
            raise ValueError(f"unknown ablation {name!r}; choose from {', '.join(ABLATIONS)}")
        config = ABLATIONS[name][1](config)
    return config
