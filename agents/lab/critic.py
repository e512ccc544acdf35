"""The lab's critic: a table of state values over the lab policy's own state.

The critic sees what the actor sees: the state a lab policy conditions on before each
turn (SearchToy's ``(turn, found, prev)``, TextLab's ``(turn, found, memory, prev)``,
CreditToy's ``(turn, history)``), derived from an episode's turn texts by the policy's
``episode_states``. Every value starts at 0. A fit moves each state visited in the batch
a step ``alpha`` towards the mean target of its visits:

    V(s) <- V(s) + alpha (mean of the batch's targets at s - V(s))

so for a fixed policy and Monte Carlo targets each value is an exponentially weighted
mean of batch means, centred on the exact ``V(s)`` once the start-up from 0 has decayed.
The default ``alpha`` is :attr:`~twice_envs.agents.credit.ppo.PPOConfig.critic_alpha`
(its docstring gives the principle).

It serves the credit step's critic interface (``values``, ``fit``;
:class:`~twice_envs.agents.credit.registry.CreditContext`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence

import numpy as np

from twice_envs.agents.credit.ppo import PPOConfig
from twice_envs.agents.types import EpisodeRecord


class LabCritic:
    """A tabular critic for a lab policy (``policy`` only supplies ``action_of`` and
    ``episode_states``, which do not depend on its logits, so one critic serves a policy
    throughout its training)."""

    def __init__(self, policy, alpha: float | None = None):
        self.policy = policy
        self.alpha = PPOConfig.critic_alpha if alpha is None else float(alpha)
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError(f"critic step size alpha must be in (0, 1], got {self.alpha}")
        self.table: dict[Hashable, float] = {}

    def states(self, episode: EpisodeRecord) -> list:
        """The policy's state before each turn of ``episode``."""
        return self.policy.episode_states([self.policy.action_of(t.text) for t in episode.turns])

    def values(self, episodes: Sequence[EpisodeRecord]) -> list[np.ndarray]:
        """``V(s_t)`` before each turn of each episode (0 for a state never fitted)."""
        return [np.array([self.table.get(s, 0.0) for s in self.states(ep)], dtype=np.float64) for ep in episodes]

    def fit(self, episodes: Sequence[EpisodeRecord], targets: Sequence[np.ndarray]) -> dict:
        """One step towards the per-turn ``targets``; returns the value loss ``0.5 mean (V - target)^2``
        over the batch's turns before the step, and the number of states visited."""
        sums: dict = defaultdict(float)
        counts: dict = defaultdict(int)
        sq, n = 0.0, 0
        for ep, tgt in zip(episodes, targets):
            states = self.states(ep)
            if len(tgt) != len(states):
                raise ValueError(f"{len(tgt)} targets for an episode with {len(states)} turns")
            for s, g in zip(states, tgt):
                sums[s] += float(g)
                counts[s] += 1
                sq += (self.table.get(s, 0.0) - float(g)) ** 2
                n += 1
        for s, total in sums.items():
            v = self.table.get(s, 0.0)
            self.table[s] = v + self.alpha * (total / counts[s] - v)
        return {"value_loss": 0.5 * sq / max(n, 1), "critic_states": len(sums)}
