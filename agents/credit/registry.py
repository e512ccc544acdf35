"""One registry of credit methods: each method registers once, everything else looks it up.

A credit method is a *step*: a function from the factual episodes of one batch and a
:class:`CreditContext` to a :class:`CreditResult` (per-turn advantages, the auxiliary
tokens it spent, diagnostics). The step may ask the context for the auxiliary rollouts
it needs (twins, independent counterfactuals, value rollouts); the caller supplies how
they are run (an LLM policy in :mod:`twice_envs.agents.rollout.twins`, an exact-value
lab policy in :mod:`twice_envs.agents.lab.runner`), so the step itself never touches a
model or an env.

Registering::

    @register_credit("grpo", display="GRPO", description="group-normalised return")
    def grpo_step(episodes, ctx):
        return CreditResult(grpo_credit(episodes))

The CLI (``twice train --method``), the trainer, the lab audit, ``twice bench learn``,
``twice bench games`` and the verl and TRL integrations all read :func:`methods` and
:func:`get_method`; adding a method is one module and one registration.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

from twice_envs.agents.types import EpisodeRecord

#: What a method may need besides the factual episodes, and what each need means.
NEEDS: dict[str, str] = {
    "twins": "coupled twins of branched decisions (a fork that reads the factual episode's noise)",
    "counterfactuals": "independent counterfactuals of branched decisions (a fork on fresh noise)",
    "value_rollouts": "independent rollouts from every turn boundary (Monte Carlo state values)",
    "anchor_groups": "per-turn observations, to group the steps that share a state",
    "critic": "a learned state-value function carried across updates (the caller's critic: values and fit)",
    "gold_answer": "the policy's probability of the task's gold answer before the first turn and after each "
                   "turn's observation (envs whose tasks have a gold answer)",
    "branches": "further factual episodes grown from the batch's turn boundaries on fresh noise, trained on "
                "as factual episodes (the step returns the batch the loss trains on)",
    "exact_advantages": "the exact advantage A*(s_t, y_t) of every turn (the credit lab's policies, whose values "
                        "are exact; envs whose has_exact_values is True)",
}

#: The needs that fork the factual episodes (an env that cannot fork cannot serve them).
FORK_NEEDS = frozenset({"twins", "counterfactuals", "value_rollouts", "branches"})

#: The comparisons a method can join by default (when no method list is given).
BENCHES: dict[str, str] = {
    "learn": "twice bench learn (the labs: SearchToy and TextLab, exact values)",
    "games": "twice bench games (held-out text games)",
}


@dataclass
class CreditResult:
    """What a credit step produced.

    Attributes:
        advantages: one array of per-turn advantages per factual episode.
        aux_tokens: auxiliary tokens generated.
        stats: diagnostics for the metrics file.
        predictor_state: the updated discordance predictor (Twice), None when unchanged.
        episodes: the factual batch the loss trains on when the step drew further factual
            episodes (need ``branches``): the given episodes first, in order, then the new ones;
            ``advantages`` then has one array per episode of it. None: the given episodes.
    """

    advantages: list[np.ndarray]
    aux_tokens: int = 0
    stats: dict = field(default_factory=dict)
    predictor_state: Optional[Any] = None
    episodes: Optional[list] = None


@dataclass
class CreditContext:
    """Everything a credit step may use besides the factual episodes.

    Attributes:
        policy: the policy that sampled the episodes (handed to the runners, never called here).
        sampling: its sampling settings (handed to the runners).
        rng: the generator of every coin the step draws.
        update: the index of this update (warm-up schedules read it).
        noise_seed: the batch's noise seed (auxiliary rollouts derive their seeds from it).
        twice: the twin-credit settings (:class:`~twice_envs.agents.credit.twice.TwiceConfig`),
            also the budget of CRR.
        vine_k: value rollouts per state (VinePPO).
        predictor_state: the discordance predictor carried across updates (Twice).
        run_twins: ``(policy, factual, decisions, config, sampling, rng, *, noise_seed) -> Twins``.
        run_values: ``(policy, factual, sampling, *, k, noise_seed, states=None) -> Twins``: ``k`` independent
            rollouts from each turn boundary ``(episode, turn)`` of ``states`` (None: every turn boundary).
        critic: the caller's state-value function, carried across updates (need ``critic``): an object
            with ``values(episodes) -> list of arrays`` (``V(s_t)`` before each turn ``t``) and
            ``fit(episodes, targets) -> dict`` (one update toward per-turn targets; its statistics).
        answer_probs: ``(policy, episodes) -> list of arrays`` (need ``gold_answer``): per episode,
            ``T + 1`` probabilities of the task's gold answer under ``policy``, before the first turn and
            after each turn's observation.
        run_branches: ``(policy, factual, nodes, sampling, *, noise_seed) -> list of EpisodeRecord`` (need
            ``branches``): for each ``(episode, turn)`` of ``nodes``, a new factual episode that copies the
            episode's turns before ``turn`` (its ``prefix``) and plays on from there on fresh noise, taking
            turn ``turn`` afresh; in ``nodes`` order.
        exact_advantages: ``(policy, episodes) -> list of arrays`` (need ``exact_advantages``): per episode, the
            exact ``A*(s_t, y_t)`` of each turn under ``policy`` (the credit lab's dynamic programme).
    """

    policy: Any = None
    sampling: Any = None
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    update: int = 0
    noise_seed: int = 0
    twice: Any = None
    vine_k: int = 2
    predictor_state: Optional[Any] = None
    run_twins: Optional[Callable] = None
    run_values: Optional[Callable] = None
    critic: Any = None
    answer_probs: Optional[Callable] = None
    run_branches: Optional[Callable] = None
    exact_advantages: Optional[Callable] = None

    def need(self, name: str) -> Any:
        """The runner of auxiliary or further factual rollouts (``twins``, ``values``, ``branches``), the
        ``critic``, the ``answer_probs`` or the ``exact_advantages`` function, or an error naming what is missing."""
        fn = {"twins": self.run_twins, "values": self.run_values, "branches": self.run_branches,
              "critic": self.critic, "answer_probs": self.answer_probs,
              "exact_advantages": self.exact_advantages}[name]
        if fn is None:
            what = {"critic": "a critic", "answer_probs": "an answer probs function",
                    "exact_advantages": "exact advantages (only the credit lab's policies have them)"}.get(
                name, f"{name} rollouts")
            raise ValueError(f"this credit method needs {what}, but the caller gave none")
        return fn


Step = Callable[[Sequence[EpisodeRecord], CreditContext], CreditResult]


@dataclass(frozen=True)
class CreditMethod:
    """A registered credit method.

    Attributes:
        name: the name every command and config uses (``twice train --method NAME``).
        step: ``(episodes, context) -> CreditResult``.
        display: the name tables and plots show.
        description: one line for ``--help`` and the docs.
        needs: keys of :data:`NEEDS`.
        config: the settings class the step reads (None: no settings).
        benches: keys of :data:`BENCHES` that run the method when no method list is given.
        verl: ``"module:function"`` of its verl advantage estimator, when it needs auxiliary
            rollouts that only the twice_envs agent loop runs (None: a method without them is
            wrapped generically; one with them is not offered to verl).
        rollouts: factual rollouts per task, as a multiple of the run's group size (an integer
            >= 1): every caller that samples the factual batch samples ``group_size * rollouts``
            episodes per task and hands the method all of them (``grpo-2x``: 2).
        roots: a tree method's share of the group size sampled as roots (in (0, 1); None: all of it):
            callers sample :func:`factual_group_size` episodes per task, and the method grows its batch
            from them to the tokens of ``group_size`` episodes (need ``branches`` or ``twins``).
    """

    name: str
    step: Step
    display: str
    description: str = ""
    needs: frozenset = frozenset()
    config: Optional[type] = None
    benches: tuple = ()
    verl: Optional[str] = None
    rollouts: int = 1
    roots: Optional[float] = None

    def __call__(self, episodes: Sequence[EpisodeRecord], context: CreditContext) -> CreditResult:
        return self.step(episodes, context)


_REGISTRY: dict[str, CreditMethod] = {}


def register_credit(name: str, *, display: Optional[str] = None, description: str = "", needs: Sequence[str] = (),
                    config: Optional[type] = None, benches: Sequence[str] = (), verl: Optional[str] = None,
                    rollouts: int = 1, roots: Optional[float] = None,
                    override: bool = False) -> Callable[[Step], Step]:
    """Decorator: register ``step`` as the credit method ``name`` (see :class:`CreditMethod`).

    A name registered twice raises unless ``override``; unknown needs or benches raise, and so
    does ``rollouts`` other than an integer >= 1.
    """
    unknown = sorted(set(needs) - set(NEEDS)) + sorted(set(benches) - set(BENCHES))
    if unknown:
        raise ValueError(f"credit method {name!r}: unknown needs or benches {unknown} "
                         f"(needs: {', '.join(NEEDS)}; benches: {', '.join(BENCHES)})")
    if not name or name != name.strip() or "," in name:
        raise ValueError(f"credit method name {name!r}: non-empty, no spaces at its ends, no commas")
    if isinstance(rollouts, bool) or not isinstance(rollouts, (int, np.integer)) or rollouts < 1:
        raise ValueError(f"credit method {name!r}: rollouts must be an integer >= 1 (a multiple of the group size), "
                         f"got {rollouts!r}")
    if roots is not None and not (isinstance(roots, (float, int)) and 0 < roots < 1 and rollouts == 1):
        raise ValueError(f"credit method {name!r}: roots must be a share of the group size in (0, 1), with rollouts 1, "
                         f"got {roots!r}")

    def deco(step: Step) -> Step:
        if name in _REGISTRY and not override:
            raise ValueError(f"credit method {name!r} is already registered (pass override=True to replace it)")
        _REGISTRY[name] = CreditMethod(name, step, display or name, description, frozenset(needs), config,
                                       tuple(benches), verl, int(rollouts), None if roots is None else float(roots))
        return step

    return deco


def unregister_credit(name: str) -> None:
    """Remove a method (tests that register a temporary one clean up with this)."""
    _REGISTRY.pop(name, None)


def get_method(name: str) -> CreditMethod:
    """The method registered as ``name``; an unknown name raises with the closest known one."""
    try:
        return _REGISTRY[name]
    except KeyError:
        close = difflib.get_close_matches(str(name), list(_REGISTRY), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown credit method {name!r}.{hint} Known: {', '.join(_REGISTRY)}") from None


def factual_group_size(method: str, group_size: int) -> int:
    """Factual episodes per task a caller samples for ``method`` at the run's group size: ``group_size x
    rollouts``, or for a tree method (``roots``) ``max(1, round(roots x group_size))`` roots, which it grows
    to ``group_size`` episodes' tokens."""
    m = get_method(method)
    if m.roots is None:
        return int(group_size) * m.rollouts
    return max(1, int(round(m.roots * int(group_size))))


def methods(bench: Optional[str] = None) -> tuple[str, ...]:
    """Registered method names in registration order (only those a bench runs by default, if given)."""
    return tuple(n for n, m in _REGISTRY.items() if bench is None or bench in m.benches)


def check_env(method: str, env_id: str) -> None:
    """Raise before any rollout when the env ``env_id`` lacks what ``method`` needs, naming both.

    Methods whose needs fork episodes (:data:`FORK_NEEDS`) need an env id that is registered (a fork
    makes a fresh env of the registered kind); ``gold_answer`` needs an env class whose tasks have a gold
    answer (its ``has_gold_answer`` attribute, :class:`~twice_envs.core.TextEnv`); ``exact_advantages`` needs
    an env class whose ``has_exact_values`` is True (a credit-lab env)."""
    from twice_envs.registry import entry_point, registry, resolve_id, spec

    env_id = resolve_id(env_id)
    m = get_method(method)
    if m.needs & FORK_NEEDS and env_id not in registry:
        raise ValueError(f"credit method {method!r} forks episodes, but env {env_id!r} cannot fork (not a registered "
                         "env id: create envs with twice_envs.make or register them)")
    if "gold_answer" in m.needs:
        cls = entry_point(spec(env_id)) if env_id in registry else None
        if not getattr(cls, "has_gold_answer", False):
            raise ValueError(f"credit method {method!r} needs each task's gold answer, and env {env_id!r} has none "
                             "(IGPO's information gain is the change in the policy's probability of the gold answer)")
    if "exact_advantages" in m.needs:
        cls = entry_point(spec(env_id)) if env_id in registry else None
        if not getattr(cls, "has_exact_values", False):
            raise ValueError(f"credit method {method!r} uses exact advantages, and env {env_id!r} has none (only "
                             "the credit lab's envs with exact values do, e.g. SearchToy-v0 and ChoiceLab-v0)")


def describe() -> str:
    """``name: description`` of every method, one per line (for ``--help``)."""
    return "; ".join(f"{m.name} ({m.description})" if m.description else m.name for m in _REGISTRY.values())
