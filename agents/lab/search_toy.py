"""Lab policies on SearchToy-v0 with exact values by dynamic programming.

:class:`SearchToyPolicy` is a tabular softmax policy: its logits depend on the facts
found so far (a bitmask) and on the previous action, which stands in for an LLM's
dependence on the wording of its own earlier turns. It is a lab policy in the sense
of :mod:`twice_envs.agents.lab.toy` (sampled through keyed noise, forks and twins).

Exact values: the state that matters is ``(turn, found, prev)``, so ``V`` and ``Q``
are arrays filled backwards from the horizon with the env's own dynamics
(:func:`~twice_envs.envs.searchtoy.env.transition`, :func:`...outcome`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from typing import Sequence

import numpy as np

from twice_envs.envs.searchtoy.env import (
    INVALID,
    SearchToyConfig,
    outcome,
    parse_action,
    transition,
)

ENV_ID = "SearchToy-v0"


#: The setting's fields that the command line sets: the world's (the env's kwargs) and the policy's.
WORLD_ARGS = ("hops", "queries", "useful", "horizon", "reward")
POLICY_ARGS = ("wording", "temperature")


@dataclass(frozen=True)
class SearchToySetting:
    """A lab setting: the world (the env's own config, not a copy of its fields) and the initial policy in it."""

    world: SearchToyConfig = field(default_factory=SearchToyConfig)
    """The env's world: facts, queries, useful queries, horizon and reward (``SearchToy-v0``'s kwargs)."""
    wording: float = 1.0
    """Scale of the policy's dependence on its previous action (seeded normal logits per
    ``(previous action, action)``); 0 makes the policy depend on the facts found only."""
    temperature: float = 1.0
    """Sampling temperature (logits are divided by it)."""
    skill: float = 1.5
    """Initial logit bonus of a query that would find a fact not yet found (the policy
    depends on the facts found)."""
    answer_slope: float = 1.5
    """Initial logit of ``answer`` grows by this per fact found ..."""
    answer_bias: float = 3.0
    """... from ``answer_bias - answer_slope * hops`` with no fact found."""
    seed: int = 0
    """Seed of the wording logits."""

    def __post_init__(self) -> None:
        if not isinstance(self.world, SearchToyConfig):
            raise ValueError(f"SearchToySetting.world must be a SearchToyConfig, got {type(self.world).__name__}")


@dataclass(frozen=True)
class SearchToyPolicy:
    """Softmax policy ``pi(a | found, prev) = softmax(logits[found, prev] / temperature)``.

    ``logits`` has shape ``(2**hops, num_actions + 1, num_actions)``; ``prev = num_actions``
    means no previous action (or an invalid one).
    """

    config: SearchToyConfig
    logits: np.ndarray = field(hash=False, compare=False)
    temperature: float = 1.0
    env_id = ENV_ID

    @property
    def env_kwargs(self) -> dict:
        return asdict(self.config)

    @property
    def num_actions(self) -> int:
        return self.config.num_actions

    @cached_property
    def table(self) -> np.ndarray:
        """``pi[found, prev, a]`` for every policy state."""
        z = self.logits / self.temperature
        p = np.exp(z - z.max(axis=-1, keepdims=True))
        return p / p.sum(axis=-1, keepdims=True)

    def with_logits(self, logits: np.ndarray) -> "SearchToyPolicy":
        return replace(self, logits=np.asarray(logits, dtype=np.float64))

    # ------------------------------------------------------------- the lab-policy interface
    def state(self, env) -> tuple[int, int, int]:
        """``(turn, found, prev)`` of a live SearchToy env."""
        u = env.unwrapped
        return env.turn, u.found, self._prev(u.history)

    def _prev(self, history: Sequence[int]) -> int:
        return history[-1] if history and history[-1] != INVALID else self.num_actions

    def action_probs(self, state) -> np.ndarray:
        _, found, prev = state
        return self.table[found, prev]

    def action_text(self, a: int) -> str:
        return self.config.action_text(a)

    def action_of(self, text: str) -> int:
        return parse_action(self.config, text)

    def episode_advantages(self, actions: Sequence[int]) -> np.ndarray:
        """Exact ``A(s_t, a_t) = Q(s_t, a_t) - V(s_t)`` along an episode."""
        V, Q = self.values
        found, prev, out = 0, self.num_actions, []
        for t, a in enumerate(actions):
            if a == INVALID:
                raise ValueError("lab episodes hold no invalid actions")
            out.append(Q[t, found, a] - V[t, found, prev])
            found, prev = transition(self.config, found, a), a
        return np.array(out)

    def episode_states(self, actions: Sequence[int]) -> list[tuple[int, int, int]]:
        """The policy's state ``(turn, found, prev)`` before each turn of an episode."""
        found, prev, out = 0, self.num_actions, []
        for t, a in enumerate(actions):
            out.append((t, found, prev))
            found, prev = transition(self.config, found, a), a
        return out

    @property
    def answer_action(self) -> int:
        """The action index of ``answer`` (the env's gold answer)."""
        return self.config.queries

    def boundary_states(self, actions: Sequence[int]) -> list[tuple[int, int, int]]:
        """The policy's states ``(turn, found, prev)`` before the first turn and after each turn
        (``len(actions) + 1`` of them), as :meth:`state` reads them from a live env."""
        found, prev, out = 0, self.num_actions, [(0, 0, self.num_actions)]
        for t, a in enumerate(actions):
            found, prev = transition(self.config, found, a), (a if a != INVALID else self.num_actions)
            out.append((t + 1, found, prev))
        return out

    def episode_values(self, actions: Sequence[int]) -> np.ndarray:
        """Exact ``V(s_t)`` along an episode."""
        V, _ = self.values
        return np.array([V[s] for s in self.episode_states(actions)])

    def policy_gradient(self, episodes, advantages) -> np.ndarray:
        """Mean over episodes of ``sum_t A_t grad_logits log pi(a_t | s_t)`` for the tabular softmax."""
        grad = np.zeros_like(self.logits)
        for ep, adv in zip(episodes, advantages):
            found, prev = 0, self.num_actions
            for turn, a_t in zip(ep.turns, adv):
                a = self.action_of(turn.text)
                g = -self.table[found, prev].copy()
                g[a] += 1.0
                grad[found, prev] += a_t * g / self.temperature
                found, prev = transition(self.config, found, a), a
        return grad / max(1, len(episodes))

    # ------------------------------------------------------------- exact values
    @cached_property
    def values(self) -> tuple[np.ndarray, np.ndarray]:
        """``(V[t, found, prev], Q[t, found, a])`` by backward induction over the horizon."""
        c, n_act = self.config, self.num_actions
        F = 1 << c.hops
        nxt = np.array([[transition(c, f, a) for a in range(n_act)] for f in range(F)])
        final = np.array([outcome(c, f) for f in range(F)])
        V = np.zeros((c.horizon + 1, F, n_act + 1))
        Q = np.zeros((c.horizon, F, n_act))
        for t in range(c.horizon - 1, -1, -1):
            last = t + 1 >= c.horizon
            for a in range(n_act):
                f2 = nxt[:, a]
                Q[t, :, a] = final[f2] if (last or a == c.queries) else V[t + 1, f2, a]
            V[t] = np.einsum("fpa,fa->fp", self.table, Q[t])
        return V, Q

    @property
    def value(self) -> float:
        """``V(s_0)``: the policy's exact expected utility."""
        return float(self.values[0][0, 0, self.num_actions])

    def expected_turns(self) -> float:
        """Exact expected episode length in turns."""
        c, n_act = self.config, self.num_actions
        F = 1 << c.hops
        occ = np.zeros((F, n_act + 1))
        occ[0, n_act] = 1.0
        total = 0.0
        for t in range(c.horizon):
            total += occ.sum()
            flow = occ[:, :, None] * self.table  # (f, p, a)
            new = np.zeros_like(occ)
            for a in range(c.queries):  # answering ends the episode
                for f in range(F):
                    new[transition(c, f, a), a] += flow[f, :, a].sum()
            occ = new
        return float(total)


def initial_logits(setting: SearchToySetting) -> np.ndarray:
    """The setting's initial logits (see :class:`SearchToySetting`)."""
    c = setting.world
    F, n_act = 1 << c.hops, c.num_actions
    logits = np.zeros((F, n_act + 1, n_act))
    found = np.array([bin(f).count("1") for f in range(F)])
    logits[:, :, c.queries] = (setting.answer_bias - setting.answer_slope * (c.hops - found))[:, None]
    for f in range(F):
        for a in range(c.useful):
            if not f >> (a % c.hops) & 1:
                logits[f, :, a] += setting.skill
    z = np.random.default_rng(setting.seed).standard_normal((n_act + 1, n_act))
    return logits + setting.wording * z[None]


def search_toy_policy(setting: SearchToySetting = SearchToySetting()) -> SearchToyPolicy:
    """The setting's initial policy."""
    return SearchToyPolicy(setting.world, initial_logits(setting), setting.temperature)
