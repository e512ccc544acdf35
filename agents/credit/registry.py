"""One registry of credit methods: each method registers once, everything else looks it up.

A credit method is a complete plug-in: its name, its settings class (``config``: a dataclass
whose fields carry their help text; ``twice train`` builds its flags from it, and a run saves
it in ``config.json``), what it needs besides the factual episodes (:data:`NEEDS`, one
vocabulary for registration, :class:`Request` and error messages) and two phases:

1. ``plan(batch, ctx) -> list of Request``: the auxiliary rollouts the method asks for on a
   batch (twins, independent counterfactuals, value rollouts, further factual branches, the
   gold answer's probabilities, exact advantages);
2. ``credit(batch, rollouts, ctx) -> CreditResult``: per-turn advantages from them
   (``rollouts``: one :class:`Rollout` per request, in order).

The caller runs the requests with its own engine, :class:`Runners` (an LLM policy in
:mod:`twice_envs.agents.rollout.twins`, the credit lab's exact-value policies in
:mod:`twice_envs.agents.lab`, verl's rollout server), bound once per run; :func:`run_credit`
is the whole step. A method whose later rollouts depend on earlier outcomes (the tree methods
grow in rounds) plans nothing and asks for each round in its ``credit`` phase through
:meth:`CreditContext.run`. The method itself never touches a model or an env.

Registering::

    @register_credit("grpo", display="GRPO", description="group-normalised return")
    def grpo_credit_phase(episodes, rollouts, ctx):
        return CreditResult(grpo_credit(episodes))

    def vine_plan(episodes, ctx):
        return [Request("values", {"k": ctx.config.per_state})]

    @register_credit("vineppo", needs=("values",), config=VineConfig, plan=vine_plan)
    def vine_credit_phase(episodes, rollouts, ctx):
        return CreditResult(vine_credit(episodes, rollouts[0].result.records))

The CLI (``twice train --method``), the trainer, the lab audit, ``twice bench learn``,
``twice bench games`` and the verl and TRL integrations all read :func:`methods` and
:func:`get_method`; adding a method is one module and one registration.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np

from twice_envs.agents.types import EpisodeRecord

#: What a method may need besides the factual episodes: one vocabulary for ``needs=`` at registration,
#: :attr:`Request.need` and :meth:`CreditContext.need`.
NEEDS: dict[str, str] = {
    "twins": "coupled twins of branched decisions (a fork that reads the factual episode's noise)",
    "counterfactuals": "independent counterfactuals of branched decisions (a fork on fresh noise)",
    "values": "independent rollouts from turn boundaries (Monte Carlo state values)",
    "branches": "further factual episodes grown from the batch's turn boundaries on fresh noise, trained on "
                "as factual episodes (the method returns the batch the loss trains on)",
    "answer_probs": "the policy's probability of the task's gold answer before the first turn and after each "
                    "turn's observation (envs whose tasks have a gold answer)",
    "exact_advantages": "the exact advantage A*(s_t, y_t) of every turn (the credit lab's policies, whose values "
                        "are exact; envs whose has_exact_values is True)",
    "critic": "a learned state-value function carried across updates (the caller's critic: values and fit)",
    "anchor_groups": "per-turn observations, to group the steps that share a state (read from the episodes)",
}

#: The needs that fork the factual episodes (an env that cannot fork cannot serve them).
FORK_NEEDS = frozenset({"twins", "counterfactuals", "values", "branches"})

#: The needs a caller's :class:`Runners` serve (one runner each; ``counterfactuals`` share the twins runner).
RUNNER_NEEDS = ("twins", "counterfactuals", "values", "branches", "answer_probs", "exact_advantages")

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
class Request:
    """One set of auxiliary rollouts a method asks for (its ``plan`` phase).

    Attributes:
        need: what is asked for, a key of :data:`RUNNER_NEEDS`.
        args: the runner's arguments: ``decisions`` and ``config`` (a
            :class:`~twice_envs.agents.credit.twice.TwiceConfig`) for ``twins`` and ``counterfactuals``; ``k``
            and optionally ``states`` for ``values``; ``nodes`` for ``branches``; optionally ``noise_seed``
            (default: the batch's) for any of the rollouts.
        episodes: the episodes they start from (None: the batch).
        memo: the method's own working state from its plan (branch plan, predictions), handed back with
            the result in the credit phase; never read by the engine.
    """

    need: str
    args: dict = field(default_factory=dict)
    episodes: Optional[list] = None
    memo: Any = None

    def __post_init__(self) -> None:
        if self.need not in RUNNER_NEEDS:
            raise ValueError(f"a request's need must be one of {', '.join(RUNNER_NEEDS)}, got {self.need!r}")


@dataclass
class Rollout:
    """A request and what the caller's engine returned for it (the credit phase's input)."""

    request: Request
    result: Any


# how each need's runner is called: (runner, episodes, args, ctx) -> result
_CALLS: dict[str, Callable] = {
    "twins": lambda fn, eps, a, ctx: fn(ctx.policy, eps, a["decisions"], a["config"], ctx.sampling, ctx.rng,
                                        noise_seed=a.get("noise_seed", ctx.noise_seed)),
    "values": lambda fn, eps, a, ctx: fn(ctx.policy, eps, ctx.sampling, k=a["k"], states=a.get("states"),
                                         noise_seed=a.get("noise_seed", ctx.noise_seed)),
    "branches": lambda fn, eps, a, ctx: fn(ctx.policy, eps, list(a["nodes"]), ctx.sampling,
                                           noise_seed=a.get("noise_seed", ctx.noise_seed)),
    "answer_probs": lambda fn, eps, a, ctx: fn(ctx.policy, eps),
    "exact_advantages": lambda fn, eps, a, ctx: fn(ctx.policy, eps),
}
_CALLS["counterfactuals"] = _CALLS["twins"]  # independent twins: the same runner, a config with coupled False


@dataclass(frozen=True)
class Runners:
    """A caller's engine: how it runs each need's rollouts (bound once per run; None: not served).

    Attributes:
        twins: ``(policy, factual, decisions, config, sampling, rng, *, noise_seed) -> Twins`` (needs
            ``twins`` and ``counterfactuals``).
        values: ``(policy, factual, sampling, *, k, noise_seed, states=None) -> Twins``: ``k`` independent
            rollouts from each turn boundary ``(episode, turn)`` of ``states`` (None: every turn boundary).
        branches: ``(policy, factual, nodes, sampling, *, noise_seed) -> list of EpisodeRecord``: for each
            ``(episode, turn)`` of ``nodes``, a new factual episode that copies the episode's turns before
            ``turn`` (its ``prefix``) and plays on from there on fresh noise, taking turn ``turn`` afresh.
        answer_probs: ``(policy, episodes) -> list of arrays``: per episode, ``T + 1`` probabilities of the
            task's gold answer, before the first turn and after each turn's observation.
        exact_advantages: ``(policy, episodes) -> list of arrays``: per episode, the exact ``A*(s_t, y_t)``
            of each turn (the credit lab's dynamic programme).
    """

    twins: Optional[Callable] = None
    values: Optional[Callable] = None
    branches: Optional[Callable] = None
    answer_probs: Optional[Callable] = None
    exact_advantages: Optional[Callable] = None

    def runner(self, need: str) -> Callable:
        """The runner serving ``need``, or an error naming what is missing."""
        fn = getattr(self, "twins" if need == "counterfactuals" else need, None)
        if fn is None:
            what = {"answer_probs": "the gold answer's probabilities",
                    "exact_advantages": "exact advantages (only the credit lab's policies have them)"}.get(
                need, f"{need} rollouts")
            raise ValueError(f"this credit method needs {what} (need {need!r}), but the caller's engine runs none")
        return fn

    def run(self, request: Request, batch: Sequence[EpisodeRecord], ctx: "CreditContext") -> Any:
        """Run one request on ``request.episodes`` (default ``batch``) with the context's policy and coins."""
        episodes = batch if request.episodes is None else request.episodes
        out = _CALLS[request.need](self.runner(request.need), episodes, request.args, ctx)
        if ctx.records is not None and request.need in ("twins", "counterfactuals"):
            for rec, kept in zip(out.records, out.kept):  # saved with their evidence coin (none for a self-twin)
                if rec.evidence_coin is None and not rec.self_twin:
                    rec.evidence_coin = bool(kept)
            ctx.records.extend(out.records)
        return out


@dataclass
class CreditContext:
    """Everything a credit method may use besides the factual episodes.

    Attributes:
        policy: the policy that sampled the episodes (handed to the runners, never called here).
        sampling: its sampling settings (handed to the runners).
        rng: the generator of every coin the method draws (and the twins' evidence coins).
        update: the index of this update (warm-up schedules read it).
        noise_seed: the batch's noise seed (auxiliary rollouts derive their seeds from it).
        config: the method's settings (an instance of its registered ``config`` class; None: its defaults).
        predictor_state: the discordance predictor carried across updates (Twice).
        critic: the caller's state-value function, carried across updates (need ``critic``): an object
            with ``values(episodes) -> list of arrays`` (``V(s_t)`` before each turn ``t``) and
            ``fit(episodes, targets) -> dict`` (one update toward per-turn targets; its statistics).
        runners: the caller's engine (:class:`Runners`).
        records: a list that receives every twin record run (each with its evidence coin), or None.
    """

    policy: Any = None
    sampling: Any = None
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    update: int = 0
    noise_seed: int = 0
    config: Any = None
    predictor_state: Optional[Any] = None
    critic: Any = None
    runners: Runners = field(default_factory=Runners)
    records: Optional[list] = None

    def run(self, request: Request, batch: Sequence[EpisodeRecord]) -> Any:
        """Run ``request`` now through the caller's engine (a method that grows its batch in rounds)."""
        return self.runners.run(request, batch, self)

    def need(self, name: str) -> Any:
        """The caller's ``critic``, or an error naming it (the other needs come through :class:`Request`)."""
        if name != "critic":
            raise ValueError(f"need {name!r} is asked for with a Request in the plan phase, not ctx.need")
        if self.critic is None:
            raise ValueError("this credit method needs a critic (need 'critic'), but the caller gave none")
        return self.critic


Plan = Callable[[Sequence[EpisodeRecord], CreditContext], list]
Credit = Callable[[Sequence[EpisodeRecord], Sequence[Rollout], CreditContext], CreditResult]


def no_requests(episodes: Sequence[EpisodeRecord], ctx: CreditContext) -> list:
    """The plan of a method that asks for nothing up front."""
    return []


@dataclass(frozen=True)
class CreditMethod:
    """A registered credit method.

    Attributes:
        name: the name every command and config uses (``twice train --method NAME``).
        credit: ``(episodes, rollouts, context) -> CreditResult`` (phase 2).
        display: the name tables and plots show.
        description: one line for ``--help`` and the docs.
        needs: keys of :data:`NEEDS`.
        config: the method's settings, a dataclass (None: no settings); ``twice train`` builds a flag from
            each field (:mod:`.settings`), and a run stores an instance in its ``config.json``.
        benches: keys of :data:`BENCHES` that run the method when no method list is given.
        rollouts: factual rollouts per task, as a multiple of the run's group size (an integer
            >= 1): every caller that samples the factual batch samples ``group_size * rollouts``
            episodes per task and hands the method all of them (``grpo-2x``: 2).
        roots: a tree method's share of the group size sampled as roots (in (0, 1); None: all of it):
            callers sample :func:`factual_group_size` episodes per task, and the method grows its batch
            from them to the tokens of ``group_size`` episodes (need ``branches`` or ``twins``).
        plan: ``(episodes, context) -> list of Request`` (phase 1).
    """

    name: str
    credit: Credit
    display: str
    description: str = ""
    needs: frozenset = frozenset()
    config: Optional[type] = None
    benches: tuple = ()
    rollouts: int = 1
    roots: Optional[float] = None
    plan: Plan = no_requests

    def settings(self, base: Any = None, **values: Any) -> Any:
        """The method's settings: ``base`` where it is an instance of the method's config (else the config's
        defaults), with ``values`` for the fields it has (others are not its settings and are left out);
        None for a method without settings."""
        if self.config is None:
            return None
        names = {f.name for f in fields(self.config)}
        start = base if isinstance(base, self.config) else self.config()
        return dataclasses.replace(start, **{k: v for k, v in values.items() if k in names})

    def __call__(self, episodes: Sequence[EpisodeRecord], context: CreditContext) -> CreditResult:
        return run_credit(self, episodes, context)


def run_credit(method: CreditMethod, episodes: Sequence[EpisodeRecord], ctx: CreditContext) -> CreditResult:
    """One credit step: ``method.plan``, each request through ``ctx.runners``, then ``method.credit``
    (:func:`run_phases`, less the rollouts)."""
    return run_phases(method, episodes, ctx)[0]


def run_phases(method: CreditMethod, episodes: Sequence[EpisodeRecord],
               ctx: CreditContext) -> tuple[CreditResult, list[Rollout]]:
    """Both phases of ``method`` on ``episodes``, and the rollouts its plan asked for (each request with its
    result). The advantages are checked against the batch (one array per episode, one entry per turn), and
    ``ctx.config`` against the method's config class."""
    if ctx.config is not None and not isinstance(ctx.config, method.config or ()):
        want = method.config.__name__ if method.config else "no settings"
        raise ValueError(f"credit method {method.name!r} takes {want}, but the context's config is a "
                         f"{type(ctx.config).__name__}")
    requests = list(method.plan(episodes, ctx))
    rollouts = [Rollout(r, ctx.run(r, episodes)) for r in requests]
    res = method.credit(episodes, rollouts, ctx)
    batch = episodes if res.episodes is None else res.episodes
    if [len(a) for a in res.advantages] != [len(ep.turns) for ep in batch]:
        raise ValueError(f"credit method {method.name!r} returned advantages that do not match its batch: one array "
                         "per episode (of CreditResult.episodes when it grew the batch), one entry per turn")
    return res, rollouts


_REGISTRY: dict[str, CreditMethod] = {}


def register_credit(name: str, *, display: Optional[str] = None, description: str = "", needs: Sequence[str] = (),
                    config: Optional[type] = None, benches: Sequence[str] = (), rollouts: int = 1,
                    roots: Optional[float] = None, plan: Optional[Plan] = None,
                    override: bool = False) -> Callable[[Credit], Credit]:
    """Decorator: register ``credit`` (phase 2) and ``plan`` (phase 1; default: no requests) as the credit
    method ``name`` (see :class:`CreditMethod`).

    A name registered twice raises unless ``override``; unknown needs or benches raise, and so do a
    ``config`` that is not a dataclass and ``rollouts`` other than an integer >= 1.
    """
    unknown = sorted(set(needs) - set(NEEDS)) + sorted(set(benches) - set(BENCHES))
    if unknown:
        raise ValueError(f"credit method {name!r}: unknown needs or benches {unknown} "
                         f"(needs: {', '.join(NEEDS)}; benches: {', '.join(BENCHES)})")
    if not name or name != name.strip() or "," in name or " " in name:
        raise ValueError(f"credit method name {name!r}: non-empty, no spaces, no commas")
    if config is not None and not (isinstance(config, type) and is_dataclass(config)):
        raise ValueError(f"credit method {name!r}: config must be a dataclass type (its fields are the settings), "
                         f"got {config!r}")
    if isinstance(rollouts, bool) or not isinstance(rollouts, (int, np.integer)) or rollouts < 1:
        raise ValueError(f"credit method {name!r}: rollouts must be an integer >= 1 (a multiple of the group size), "
                         f"got {rollouts!r}")
    if roots is not None and not (isinstance(roots, (float, int)) and 0 < roots < 1 and rollouts == 1):
        raise ValueError(f"credit method {name!r}: roots must be a share of the group size in (0, 1), with rollouts 1, "
                         f"got {roots!r}")

    def deco(credit: Credit) -> Credit:
        if name in _REGISTRY and not override:
            raise ValueError(f"credit method {name!r} is already registered (pass override=True to replace it)")
        _REGISTRY[name] = CreditMethod(name, credit, display or name, description, frozenset(needs), config,
                                       tuple(benches), int(rollouts), None if roots is None else float(roots),
                                       plan or no_requests)
        return credit

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
    makes a fresh env of the registered kind); ``answer_probs`` needs an env class whose tasks have a gold
    answer (its ``has_gold_answer`` attribute, :class:`~twice_envs.core.TextEnv`); ``exact_advantages`` needs
    an env class whose ``has_exact_values`` is True (a credit-lab env)."""
    from twice_envs.registry import entry_point, registry, resolve_id, spec

    env_id = resolve_id(env_id)
    m = get_method(method)
    if m.needs & FORK_NEEDS and env_id not in registry:
        raise ValueError(f"credit method {method!r} forks episodes, but env {env_id!r} cannot fork (not a registered "
                         "env id: create envs with twice_envs.make or register them)")
    if "answer_probs" in m.needs:
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
