"""The env registry: ``make``, ``register`` and ``registry``, on gymnasium ``EnvSpec``.

twice_envs keeps its own registry (a dict of gymnasium ``EnvSpec``) so that ``make``
returns the :class:`~twice_envs.core.TextEnv` itself, with no checker or
order-enforcing wrappers in between: forks and trajectories live on the env. Each
spec is also registered with gymnasium under the ``twice_envs/`` namespace, so
``gymnasium.make("twice_envs/SearchQA-v0")`` works too.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from typing import Any, Callable, Optional

import gymnasium
from gymnasium.envs.registration import EnvSpec, load_env_creator

from twice_envs.errors import MissingExtra, TwiceError
from twice_envs.trajectory import canonical_json

#: All registered specs by id.
registry: dict[str, EnvSpec] = {}
#: One-line descriptions shown by ``twice envs``.
descriptions: dict[str, str] = {}


def register(
    id: str,
    entry_point: str | Callable[..., Any],
    *,
    kwargs: Optional[dict] = None,
    description: str = "",
    max_episode_steps: Optional[int] = None,
    override: bool = False,
) -> EnvSpec:
    """Register an env class (or factory) under ``id``.

    Args:
        id: ``Name-vN``.
        entry_point: ``"module.path:ClassName"`` or a callable returning a TextEnv.
        kwargs: default keyword arguments (JSON data; overridable in ``make``).
        description: one line for ``twice envs``.
        max_episode_steps: recorded on the spec for gymnasium tools; the env's own
            ``max_turns`` does the truncation.
        override: replace an existing registration instead of raising.
    """
    if id in registry and not override:
        raise TwiceError(f"env id {id!r} is already registered; pass override=True to replace it")
    kwargs = dict(kwargs or {})
    canonical_json(kwargs)
    spec = EnvSpec(
        id=id,
        entry_point=entry_point,
        kwargs=kwargs,
        max_episode_steps=max_episode_steps,
        disable_env_checker=True,
        order_enforce=False,
    )
    registry[id] = spec
    descriptions[id] = description
    gym_id = f"twice_envs/{id}"
    if gym_id in gymnasium.registry:
        del gymnasium.registry[gym_id]
    gymnasium.register(
        id=gym_id,
        entry_point=_gym_entry(id),
        vector_entry_point=_gym_vector_entry(id),
        kwargs={},
        disable_env_checker=True,
        order_enforce=False,
    )
    return spec


def _gym_entry(env_id: str) -> Callable[..., Any]:
    def _make(**kwargs: Any) -> Any:
        return make(env_id, **kwargs)

    return _make


#: Where the text vector envs live, named the way gymnasium names entry points: the
#: vector envs belong to the wrappers layer, which core never imports; gymnasium's
#: loader resolves the name on first use.
VECTOR_ENTRY_POINT = "twice_envs.wrappers.vector:make_vec"


def make_vec(id: str, num_envs: int, vectorization_mode: str = "sync", **kwargs: Any) -> Any:
    """A gymnasium vector env of ``num_envs`` text envs: see :func:`twice_envs.wrappers.vector.make_vec`.

    ``twice_envs.make_vec(id, n, ...)`` and ``gymnasium.make_vec("twice_envs/<id>", n)``
    both land there (tuple-of-string batches, seed streams, per-sub-env forks).
    """
    return load_env_creator(VECTOR_ENTRY_POINT)(id, num_envs, vectorization_mode, **kwargs)


def _gym_vector_entry(env_id: str) -> Callable[..., Any]:
    # gymnasium.make_vec("twice_envs/<id>", n) lands in twice_envs.make_vec instead of
    # gymnasium's generic vector envs (which cannot batch text spaces).
    def _make_vec(num_envs: int = 1, **kwargs: Any) -> Any:
        return load_env_creator(VECTOR_ENTRY_POINT)(env_id, num_envs, **kwargs)

    return _make_vec


def entry_point(spec: EnvSpec) -> Callable[..., Any]:
    """The class or factory a spec names (its module imported on first use)."""
    ep = spec.entry_point
    if callable(ep):
        return ep
    module_name, _, attr = str(ep).partition(":")
    try:
        module = importlib.import_module(module_name)
    except MissingExtra:
        raise
    except ImportError as exc:
        raise TwiceError(f"cannot import {module_name!r} for env {spec.id!r}: {exc}") from exc
    return getattr(module, attr)


def resolve_id(id: str) -> str:
    """The registry key an id names: ``"twice_envs/X"`` is ``"X"``, and gymnasium's ``"module:Env-v0"``
    form imports ``module`` (which registers the id) first and names ``"Env-v0"``."""
    if not isinstance(id, str):
        raise TypeError(f"env id must be a string, got {type(id).__name__}")
    if id.startswith("twice_envs/"):
        id = id[len("twice_envs/") :]
    if ":" in id:
        module_name, _, id = id.rpartition(":")
        try:
            importlib.import_module(module_name)
        except ImportError as exc:
            raise TwiceError(f"cannot import {module_name!r} to register {id!r}: {exc}") from exc
    return id


def make(id: str, **kwargs: Any) -> Any:
    """Create a registered env: ``make("SearchQA-v0", k=5)``.

    ``make("my_pkg.envs:MyEnv-v0")`` imports ``my_pkg.envs`` (which registers the id)
    first, as in gymnasium.

    Unknown ids raise with the close matches; unknown kwargs raise with the accepted
    names; a missing optional dependency raises with the pip command that installs it.
    """
    id = resolve_id(id)
    spec = registry.get(id)
    if spec is None:
        close = difflib.get_close_matches(id, list(registry), n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise TwiceError(f"unknown env id {id!r}.{hint} Run `twice envs` to list all ids.")
    merged = {**spec.kwargs, **kwargs}
    try:
        canonical_json(merged)
    except (TypeError, ValueError) as exc:
        raise TwiceError(f"kwargs for {id!r} must be JSON data (so episodes can be replayed): {exc}") from None
    factory = entry_point(spec)
    ctor_kwargs = dict(merged)
    render_mode = ctor_kwargs.pop("render_mode", None) if not _accepts(factory, "render_mode") else None
    _check_kwargs(id, factory, ctor_kwargs)
    env = factory(**ctor_kwargs)
    if render_mode is not None:
        env.render_mode = render_mode
    env.spec = EnvSpec(
        id=spec.id,
        entry_point=spec.entry_point,
        kwargs=merged,
        max_episode_steps=spec.max_episode_steps,
        disable_env_checker=True,
        order_enforce=False,
    )
    return env


def _accepts(factory: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return True
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _check_kwargs(env_id: str, factory: Callable[..., Any], kwargs: dict) -> None:
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return
    params = sig.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    accepted = [n for n, p in params.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
    unknown = [k for k in kwargs if k not in accepted]
    if unknown:
        hints = []
        for k in unknown:
            close = difflib.get_close_matches(k, accepted, n=1)
            hints.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise TwiceError(
            f"{env_id} got unknown kwargs {', '.join(hints)}. Accepted: {', '.join(sorted(accepted))}"
        )


def spec(id: str) -> EnvSpec:
    """The spec registered under ``id``."""
    if id not in registry:
        make(id)  # raises the helpful unknown-id error
    return registry[id]
