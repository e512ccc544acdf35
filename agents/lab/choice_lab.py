"""ChoiceLab: a lab policy over features, shared by many tasks, with exact values.

Contract. :func:`choice_lab_policy` gives a lab policy (:mod:`twice_envs.agents.lab.toy`) for
``ChoiceLab-v0`` (:mod:`twice_envs.envs.choicelab.env`) built so that, at every method's best step
size, learning is limited by the quality of credit:

* **one set of weights for every task.** The policy is a linear softmax over the offered items'
  attribute vectors ``phi`` (the world's ``features``): ``pi(option | task, t) = softmax(theta .
  phi[task, t] / temperature)``, with ``theta`` (one weight per attribute word) the trainable part, so
  what is learnt on one task moves every other, and no state has a table entry of its own;
* **long episodes of many choices**: an episode's utility sums ``horizon`` decisions, so the return a
  group baseline credits to one decision is mostly the luck of the others.

**Coupling knob.** A turn is one keyed draw among the offers (the sampler core's choice rule,
``argmax_i [log pi_i + g_i]`` with ``g`` read at the turn's key and candidate index ``i``). The order in
which the policy lays the offers out as candidates, and so which noise each item reads, depends on its
**memory** ``m``, the sum of ``option + 1`` over its choices so far modulo ``memory_size``: in a
``shuffle`` share of the ``(memory, choice)`` cells (seeded coins) the candidates are a seeded permutation
of the offers, elsewhere the offers' own order. Any order gives an exact sample of the same ``pi``, so
the knob leaves the policy, its values and every factual episode's law unchanged; it only decides how
much of the luck a coupled twin (another choice, then the factual noise) shares. With ``shuffle = 0``
every later draw of a twin reads the factual noise for the same items, so it makes the factual choices
and its outcome difference is the decision's own; the larger ``shuffle``, the more often a twin, whose
memory differs after its alternative choice, reads the noise in another order and draws its later
choices afresh. :func:`coupling_rho` measures rho-bar.

The turn's text names the chosen item's number, which names its task and step, so the episode's own
actions (``action_of(text)``: item numbers) are all the oracle needs.

Exact oracle. Nothing the agent does changes the offers and ``pi`` depends on ``(task, t)`` only, so
backward induction over ``t`` for every task at once gives the values to go ``V[task, t]`` and
``Q[task, t, option]``; the value of a state adds the share of the choices so far that were right. The
lab's value is the mean of ``V[task, 0]`` over the tasks (the uniform task distribution), with no
evaluation noise. A setting whose oracle would hold more than ``max_oracle`` table entries is refused when
it is made, before anything is sampled (``ValueError`` naming the size and the cap).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from typing import NamedTuple, Sequence

import numpy as np
import torch

from twice_envs.agents import stats as cs
from twice_envs.agents.lab import toy
from twice_envs.agents.lab.coupling import coupling_summary
from twice_envs.envs.choicelab.env import INVALID, ChoiceLabConfig, parse_choice, world
from twice_envs.noise import KeyState, keyed_choice, state_rows

ENV_ID = "ChoiceLab-v0"
#: Default cap on the exact oracle's table entries.
MAX_ORACLE = 4_000_000


@dataclass(frozen=True)
class ChoiceLabSetting:
    """A ChoiceLab setting: the world (the env's own config, not a copy of its fields) and the policy in it."""

    world: ChoiceLabConfig = field(default_factory=ChoiceLabConfig)
    """The env's world: tasks, horizon, items per choice, attribute words (``ChoiceLab-v0``'s kwargs)."""
    shuffle: float = 0.5
    """Coupling knob: the share of ``(memory, choice)`` cells whose candidates are a seeded permutation of the
    offers (0: never, a coupled twin's later choices are the factual ones; see the module). The policy and its
    values do not depend on it."""
    memory_size: int = 256
    """The memory that picks a choice's cell is a residue modulo this (1: one memory, every twin reads the
    factual noise in the factual order; the larger, the rarer a twin's memory meets the factual one again)."""
    temperature: float = 1.0
    """Divides the logits."""
    seed: int = 0
    """Seed of the cells' coins and permutations."""
    max_oracle: int = MAX_ORACLE
    """Refuse a setting whose exact oracle has more table entries than this."""

    def __post_init__(self) -> None:
        if not isinstance(self.world, ChoiceLabConfig):
            raise ValueError(f"ChoiceLabSetting.world must be a ChoiceLabConfig, got {type(self.world).__name__}")
        if not 0 <= self.shuffle <= 1 or not self.temperature > 0:
            raise ValueError(f"ChoiceLab needs 0 <= shuffle <= 1 and temperature > 0, got shuffle={self.shuffle}, "
                             f"temperature={self.temperature}")
        if isinstance(self.memory_size, bool) or not isinstance(self.memory_size, int) or self.memory_size < 1:
            raise ValueError(f"ChoiceLab memory_size must be an int >= 1, got {self.memory_size!r}")
        if self.oracle_size > self.max_oracle:
            raise ValueError(
                f"ChoiceLab setting too large for its exact oracle: {self.oracle_size:,} table entries (the world's "
                f"features over task x choice x option x attribute, the policy and Q over task x choice x option, "
                f"V) > cap {self.max_oracle:,}; lower tasks, horizon, options or attributes")

    @property
    def env_kwargs(self) -> dict:
        return asdict(self.world)

    @property
    def oracle_size(self) -> int:
        """Entries of the oracle's tables: the world's features ``(task, choice, option, attribute)``, the policy
        and ``Q`` over ``(task, choice, option)`` and ``V`` over ``(task, choice)``."""
        w = self.world
        return w.world_size + 2 * w.tasks * w.horizon * w.options + w.tasks * (w.horizon + 1)


class ChoiceLabState(NamedTuple):
    """What the policy reads before a choice: its distribution depends on ``(task, turn)``, the order in which
    it reads the noise on ``(memory, turn)``."""

    task: int
    turn: int
    memory: int


@dataclass(frozen=True)
class ChoiceLabPolicy:
    """The ChoiceLab policy (see the module); ``weights`` (one per attribute word) is its trainable part."""

    setting: ChoiceLabSetting
    weights: np.ndarray = field(hash=False, compare=False)
    env_id = ENV_ID

    @property
    def config(self) -> ChoiceLabConfig:
        return self.setting.world

    @property
    def env_kwargs(self) -> dict:
        return self.setting.env_kwargs

    @property
    def logits(self) -> np.ndarray:
        """The trainable array (the attribute weights ``theta``), named as every lab policy's for the learning bench."""
        return self.weights

    def with_logits(self, weights: np.ndarray) -> ChoiceLabPolicy:
        return replace(self, weights=np.asarray(weights, dtype=np.float64))

    @cached_property
    def order(self) -> np.ndarray:
        """``(memory_size, horizon, options)``: the offers' places in candidate order for every ``(memory, choice)``
        cell (the identity, or in a ``shuffle`` share of the cells a seeded permutation)."""
        s, c = self.setting, self.config
        rng = np.random.default_rng([s.seed, 0x5F1E])
        coins = rng.random((s.memory_size, c.horizon))
        perms = np.argsort(rng.random((s.memory_size, c.horizon, c.options)), axis=-1)
        return np.where((coins < s.shuffle)[..., None], perms, np.arange(c.options))

    @cached_property
    def table(self) -> np.ndarray:
        """``pi[task, t, option]`` for every state."""
        z = world(self.config).features @ self.weights / self.setting.temperature  # (tasks, horizon, options)
        p = np.exp(z - z.max(axis=-1, keepdims=True))
        return p / p.sum(axis=-1, keepdims=True)

    def group_options(self, noise_seed: int, group: int) -> dict:
        """The reset options of group ``group`` of a batch sampled with ``noise_seed``: its task, drawn uniformly
        (the same for every method given the same seeds, so runs are paired)."""
        return {"task": int(np.random.default_rng([int(noise_seed), int(group), 0x7A5C]).integers(self.config.tasks))}

    # ------------------------------------------------------------- the lab-policy interface
    def state(self, env) -> ChoiceLabState:
        """``(task, turn, memory)`` of a live ChoiceLab env (a wasted choice leaves the memory as it was)."""
        u = env.unwrapped
        m = sum(a + 1 for a in u.choices if a != INVALID) % self.setting.memory_size
        return ChoiceLabState(u.task, env.turn, m)

    def action_probs(self, state) -> np.ndarray:
        """The distribution over the offered items (by their place among the offers)."""
        return self.table[state[0], state[1]]

    def action_text(self, item: int) -> str:
        return self.config.action_text(item)

    def action_of(self, text: str) -> int:
        """The item number a turn chose."""
        return parse_choice(self.config, text)

    def sample_turns(self, states: Sequence[ChoiceLabState], keys) -> list[toy.LabTurn]:
        """One keyed draw per state among its offers, laid out in the state's cell order
        (:func:`~twice_envs.noise.keyed_choice`, candidate index = place in that order); the turn's text names
        the chosen item's number, its one token is the item's place among the offers. Torch runs on one
        thread meanwhile (the tensors are tiny; more threads only add synchronisation)."""
        if not keys:
            return []
        orders = [self.order[s.memory, s.turn] for s in states]
        with np.errstate(divide="ignore"):  # an impossible option has log-probability -inf
            logits = np.stack([np.log(self.action_probs(s))[o] for s, o in zip(states, orders)])
        old = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            picks = keyed_choice(torch.from_numpy(logits), torch.from_numpy(state_rows([KeyState(k) for k in keys])))
        finally:
            torch.set_num_threads(old)
        out = []
        for s, o, i in zip(states, orders, picks.tokens.tolist()):
            a = int(o[i])
            p = self.action_probs(s)
            nz = p[p > 0]
            out.append(toy.LabTurn(self.action_text(self.config.item(s.task, s.turn, a)), [a], [float(np.log(p[a]))],
                                   float(-(nz * np.log(nz)).sum())))
        return out

    def _walk(self, actions: Sequence) -> list[tuple[int, int, int, int]]:
        """``(task, t, option, right)`` of each choice of an episode, from its item numbers (or turn texts):
        ``right`` counts the choices before ``t`` that were right."""
        out, right = [], 0
        for t, x in enumerate(actions):
            item = self.action_of(x) if isinstance(x, str) else int(x)
            if item == INVALID:
                raise ValueError("lab episodes hold no invalid actions")
            task, step, option = self.config.locate(item)
            if step != t or (out and task != out[0][0]):
                raise ValueError(f"item {item} is choice {step} of task {task}, not choice {t} of this episode")
            out.append((task, t, option, right))
            right += int(option == world(self.config).right[task, t])
        return out

    def episode_states(self, actions: Sequence) -> list[tuple[int, int, int]]:
        """The state ``(task, t, right so far)`` that the value depends on before each choice (a critic's table
        keys; the policy's distribution depends on ``(task, t)`` alone)."""
        return [(k, t, r) for k, t, _, r in self._walk(actions)]

    def episode_values(self, actions: Sequence) -> np.ndarray:
        """Exact ``V(s_t)`` along an episode: the expected utility given the choices so far, the share already
        right plus the value to go."""
        V, _ = self.values
        return np.array([r / self.config.horizon + V[k, t] for k, t, _, r in self._walk(actions)])

    def episode_advantages(self, actions: Sequence) -> np.ndarray:
        """Exact ``A(s_t, a_t) = Q(s_t, a_t) - V(s_t)`` along an episode."""
        V, Q = self.values
        return np.array([Q[k, t, a] - V[k, t] for k, t, a, _ in self._walk(actions)])

    def policy_gradient(self, episodes, advantages) -> np.ndarray:
        """Mean over episodes of ``sum_t A_t grad_theta log pi(a_t | s_t)``; for the linear softmax the score is
        ``(phi[a_t] - E_pi phi) / temperature``."""
        rows = np.array([w[:3] for ep in episodes for w in self._walk([t.text for t in ep.turns])],
                        dtype=np.int64).reshape(-1, 3)
        adv = np.concatenate([np.asarray(a, dtype=np.float64) for a in advantages]) if len(rows) else np.zeros(0)
        if len(adv) != len(rows):
            raise ValueError(f"{len(adv)} advantages for {len(rows)} turns")
        k, t, a = rows.T
        phi = world(self.config).features[k, t]  # (turns, options, attributes)
        score = phi[np.arange(len(a)), a] - np.einsum("no,noi->ni", self.table[k, t], phi)
        return (adv[:, None] * score).sum(axis=0) / self.setting.temperature / max(1, len(episodes))

    # ------------------------------------------------------------- exact values
    @cached_property
    def values(self) -> tuple[np.ndarray, np.ndarray]:
        """``(V[task, t], Q[task, t, option])`` by backward induction over the choices, every task at once: the
        values to go (the share of the choices from ``t`` on that will be right; the choices before ``t`` add
        what they got right, :meth:`episode_values`)."""
        pi, right = self.table, world(self.config).right
        n, H, A = pi.shape
        reward = (np.arange(A)[None, None, :] == right[:, :, None]) / H  # (tasks, horizon, options)
        V = np.zeros((n, H + 1))
        Q = np.zeros((n, H, A))
        for t in range(H - 1, -1, -1):
            Q[:, t] = reward[:, t] + V[:, t + 1, None]
            V[:, t] = (pi[:, t] * Q[:, t]).sum(axis=-1)
        return V, Q

    @property
    def value(self) -> float:
        """``V(s_0)`` averaged over the tasks: the policy's exact expected utility on the task distribution."""
        return float(self.values[0][:, 0].mean())


def choice_lab_policy(setting: ChoiceLabSetting = ChoiceLabSetting()) -> ChoiceLabPolicy:
    """The setting's initial policy: every attribute weight 0 (uniform over the offers)."""
    return ChoiceLabPolicy(setting, np.zeros(setting.world.attributes))


# --------------------------------------------------------------------------- command-line settings

#: The world's fields set by flags: ChoiceLab's own (``--per-option`` sets ``per_option``) and the labs' shared
#: ``--horizon``.
WORLD_ARGS = ("tasks", "options", "attributes", "per_option", "horizon")
#: The policy's fields set by flags: ChoiceLab's own ``--shuffle`` and the labs' shared ``--memory-size`` and
#: ``--temperature``.
POLICY_ARGS = ("shuffle", "memory_size", "temperature")


def add_choice_args(p) -> None:
    """ChoiceLab's own flags on an argument parser (the shared ``--horizon``, ``--memory-size`` and
    ``--temperature`` are the other labs' flags, read by :func:`choice_setting_from_args` too)."""
    w, s = ChoiceLabConfig, ChoiceLabSetting
    p.add_argument("--tasks", type=int, default=None, help=f"ChoiceLab: tasks (default {w.tasks})")
    p.add_argument("--options", type=int, default=None,
                   help=f"ChoiceLab: items offered per choice (default {w.options})")
    p.add_argument("--attributes", type=int, default=None,
                   help=f"ChoiceLab: attribute words, the policy's weights (default {w.attributes})")
    p.add_argument("--per-option", type=int, default=None,
                   help=f"ChoiceLab: attribute words per item (default {w.per_option})")
    p.add_argument("--shuffle", type=float, default=None,
                   help=f"ChoiceLab: coupling knob, the share of shuffled noise orders (default {s.shuffle}; "
                        "--horizon, --memory-size and --temperature apply too)")


def choice_setting_from_args(a) -> ChoiceLabSetting:
    """The ChoiceLab setting of parsed flags (those not given keep their defaults); raises ``ValueError`` for a
    bad or too large setting, before anything is sampled."""
    def given(names):
        return {k: getattr(a, k) for k in names if getattr(a, k, None) is not None}

    return ChoiceLabSetting(world=ChoiceLabConfig(**given(WORLD_ARGS)), **given(POLICY_ARGS))


# --------------------------------------------------------------------------- measurement


def coupling_rho(setting: ChoiceLabSetting = ChoiceLabSetting(), groups: int = 60, *, group_size: int = 5,
                 seed: int = 0, n_boot: int = 1000, policy: ChoiceLabPolicy | None = None) -> dict:
    """The coupling of the setting's twins: one coupled twin and one independent counterfactual at every
    decision of ``groups x group_size`` factual episodes of ``policy`` (default: the setting's initial one),
    summarised by :func:`~twice_envs.agents.lab.coupling.coupling_summary` with exact values (rho-bar, the
    oracle-free lower bound, tie and self-twin shares, each with a 95% bootstrap CI over groups)."""
    policy = policy if policy is not None else choice_lab_policy(setting)
    eps, envs = toy.toy_rollouts(policy, groups, group_size, noise_seed=seed)
    index = [(i, t) for i, e in enumerate(eps) for t in range(len(e.turns))]
    coupled = toy.toy_twins(policy, eps, envs, index, coupled=True, branch=1)
    independent = toy.toy_twins(policy, eps, envs, index, coupled=False, branch=1, fresh_salt=7)
    v = np.concatenate([policy.episode_values([t.text for t in e.turns]) for e in eps])
    adv = np.concatenate(toy.exact_advantages(policy, eps))
    u = np.array([eps[i].utility for i, _ in index])
    idx = list(cs.resample_indices(len(u), n_boot, groups=[eps[i].group for i, _ in index], seed=seed))
    return coupling_summary(u, [w.utility for w in coupled], [w.utility for w in independent], v + adv, v,
                            [w.self_twin for w in coupled], idx, oracle="exact")
