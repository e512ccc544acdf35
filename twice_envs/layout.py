"""The same episodes in any worker layout: ``twice_envs.check_layout(env_id)``.

An env that replays exactly in one process may still break when it is scaled out: a
cache that a forked child inherits half-built, a module global that two threads share,
a set whose order depends on ``PYTHONHASHSEED`` in a spawned interpreter, an event loop
that moves an env between threads. :func:`check_layout` plays the same episodes (the
same seeds, reset options and actions) in each layout and requires identical records::

    import twice_envs
    report = twice_envs.check_layout("ALFWorld-v0")            # 2 workers, 4 episodes
    print(report)

The layouts (:data:`LAYOUTS`):

* ``serial``: one process, one env plays every episode in order. This is the reference:
  it also chooses the actions (below), which every other layout replays.
* ``fork``: a process pool started with ``fork`` (made for the call, so its workers
  inherit this process as it is now: loaded resources, warm caches, pooled engines).
* ``spawn``: a process pool started with ``spawn`` (fresh interpreters, each with its
  own ``PYTHONHASHSEED``). Starting one is slow, so the pool is kept for later calls
  with the same number of workers; :func:`close_pools` ends it (it also ends at exit).
* ``thread``: a thread pool; each thread makes its own env, and the threads start
  their episodes together.
* ``asyncio``: an event loop that drives one env per worker, each env call through
  ``asyncio.to_thread``, so one env's reset and steps run on whichever executor thread
  is free.

Episodes are dealt to the workers in turn (episode ``i`` to worker ``i % workers``), and
each worker plays its share on one env, so the layouts also differ in which episodes
follow which on one env.

**Actions.** Episode ``i`` resets with ``seed + i`` (and ``options``, or ``options[i]``
for a list). In the reference run a policy ``policy(env, info, rng) -> str`` chooses
each action, with ``rng`` seeded by ``(seed, i)``; the default, :func:`drawn_action`,
draws from ``info["admissible_actions"]`` where the env lists them, else from the
alternatives of the env's ``protocol().action_format``, filling a placeholder
(``<search> query </search>``, ``search[<query>]``) with words of the last observation,
and now and then sends a malformed action, so that the invalid path runs too. Pass any
other policy (the env's scripted agent, say); it runs only in the calling process. The
other layouts replay the reference's actions.

**What is compared.** Per episode, the whole record: the digest chain (reset
observation, every action, observation and reward), the end flags and the noise block.
With ``noise=True`` each worker also draws keyed noise, as an agent would, for every
turn of every episode: for each key ``(episode_seed, turn, branch, line, pos)`` over a
small grid (:class:`NoiseProbe`), the Philox words, the Gumbel noise and the keyed
argmax over fixed logits (:mod:`twice_envs.noise`, no model needed), from the key base
the env reports; the draws must be bit-identical to the reference's.

A difference raises :class:`LayoutMismatch`, which names the env, the layout, the first
differing episode (its seed and options) and turn, and both observations there; an
exception in a worker raises it too, with the worker's traceback.

Process layouts start workers that make the env again by id. A worker that does not
know the id (a spawned one, for an id registered at run time) registers it from the
spec's entry point, which must then be importable by name (a ``"module:Class"`` string,
or a class defined at the top level of a module). A script that calls
:func:`check_layout` needs the usual ``if __name__ == "__main__":`` guard (``spawn``
imports the main module again); without it the spawned workers die at start, and the
:class:`LayoutMismatch` names the script and says so.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import multiprocessing
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from twice_envs._main_guard import missing_main_guard
from twice_envs.check import BAD_ACTIONS, CheckFailure
from twice_envs.errors import TwiceError
from twice_envs.keys import check_seed
from twice_envs.layout_workers import (
    NoiseProbe,
    _Episode,
    _Job,
    _Outcome,
    _outcome,
    _run_asyncio,
    _run_processes,
    _run_threads,
    _shippable_spec,
    close_pools,
)
from twice_envs.registry import make, resolve_id

__all__ = [
    "LAYOUTS",
    "LayoutMismatch",
    "LayoutReport",
    "NoiseProbe",
    "check_layout",
    "close_pools",
    "drawn_action",
]

#: Every layout, in the order :func:`check_layout` runs them.
LAYOUTS: tuple[str, ...] = ("serial", "fork", "spawn", "thread", "asyncio")
#: Share of drawn actions that are malformed (one of the short bad actions of the checker).
BAD_SHARE = 0.1
#: Entropy word that keeps the action generators apart from every other use of a seed.
_ACTION_SALT = 0x4C41594F  # "LAYO"

Policy = Callable[[Any, dict, np.random.Generator], str]


class LayoutMismatch(CheckFailure):
    """An env gave other episodes (or raised) in one worker layout than in one process.

    Attributes:
        env_id: the env.
        layout: the layout that differs.
        episode: index of the first differing episode (``None`` when no episode is to blame,
            e.g. a pool that could not start).
        seed: that episode's reset seed.
        turn: the first differing turn (0 = the reset), when the records differ.
    """

    def __init__(
        self,
        message: str,
        *,
        env_id: str,
        layout: str,
        episode: Optional[int] = None,
        seed: Optional[int] = None,
        turn: Optional[int] = None,
    ) -> None:
        super().__init__(message)
        self.env_id, self.layout, self.episode, self.seed, self.turn = env_id, layout, episode, seed, turn

    def __reduce__(self):
        return (_layout_mismatch, (str(self), self.env_id, self.layout, self.episode, self.seed, self.turn))


def _layout_mismatch(message, env_id, layout, episode, seed, turn) -> LayoutMismatch:
    return LayoutMismatch(message, env_id=env_id, layout=layout, episode=episode, seed=seed, turn=turn)


@dataclass
class LayoutReport:
    """What :func:`check_layout` verified.

    Attributes:
        env_id: the env.
        workers: workers per layout.
        episodes: episodes played in each layout.
        turns: actions played in each layout (all episodes).
        seconds: wall time of each layout that ran (the reference included).
        skipped: layouts not run, with the reason (a start method this platform lacks).
        noise_keys: noise keys drawn per layout (0 without ``noise=True``).
    """

    env_id: str
    workers: int
    episodes: int
    turns: int
    seconds: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    noise_keys: int = 0

    @property
    def layouts(self) -> list[str]:
        """The layouts that ran and agreed with the reference."""
        return list(self.seconds)

    def __str__(self) -> str:
        noise = f", {self.noise_keys} noise keys" if self.noise_keys else ""
        head = (
            f"check_layout({self.env_id}): {self.episodes} episodes, {self.turns} turns{noise}, "
            f"identical in {len(self.seconds)} layouts ({self.workers} workers)"
        )
        lines = [head]
        lines += [f"  ok    {name:8s} {secs:6.2f} s" for name, secs in self.seconds.items()]
        lines += [f"  skip  {name:8s} {why}" for name, why in self.skipped.items()]
        return "\n".join(lines)


# --------------------------------------------------------------------------- actions

_WORDS = re.compile(r"[A-Za-z][A-Za-z'-]*")
#: ``<tag> placeholder </tag>``: the text between a tag and its closing tag is the slot.
_TAGGED = re.compile(r"^(\s*<(\w+)>)(.*?)(</\2>\s*)$", re.DOTALL)
#: ``search[<query>]``: a lone ``<name>`` is the slot.
_SLOT = re.compile(r"<(\w+)>")


def _fill(template: str, words: str) -> str:
    """``template`` with its placeholder replaced by ``words`` (unchanged without one)."""
    m = _TAGGED.match(template)
    if m and m.group(3).strip():
        return f"{m.group(1)} {words} {m.group(4).strip()}"
    m = _SLOT.search(template)
    if m and f"</{m.group(1)}>" not in template:
        return template[: m.start()] + words + template[m.end() :]
    return template


def drawn_action(env: Any, info: dict, rng: np.random.Generator, extra_actions: Sequence[str] = ()) -> str:
    """An action drawn with ``rng``: the default policy of :func:`check_layout`.

    The pool is ``info["admissible_actions"]`` when the env lists them, else the
    alternatives of ``env.protocol().action_format`` (split on ``" | "``), plus
    ``extra_actions``. A placeholder in the drawn action (``<search> query </search>``,
    ``search[<query>]``, ``<action>COMMAND</action>``) is filled with one to three words
    of the end of the last observation (its last 600 characters: a SearchQA question,
    say). With probability :data:`BAD_SHARE` the action is one of the
    short malformed actions of the checker instead.
    """
    base = getattr(env, "unwrapped", env)
    if rng.random() < BAD_SHARE:
        return BAD_ACTIONS[int(rng.integers(5))]
    pool = list(info.get("admissible_actions") or [])
    if not pool:
        fmt = base.protocol().action_format
        pool = [alt.strip() for alt in fmt.split(" | ") if alt.strip()]
    pool += list(extra_actions)
    if not pool:
        return BAD_ACTIONS[int(rng.integers(5))]
    action = pool[int(rng.integers(len(pool)))]
    try:
        obs = base.trajectory.observations[-1]
    except TwiceError:
        obs = ""
    words = _WORDS.findall(obs[-600:]) or ["test"]
    picked = [words[int(rng.integers(len(words)))] for _ in range(int(rng.integers(1, 4)))]
    return _fill(action, " ".join(picked).lower())


def _action_rng(seed: int, episode: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, episode, _ACTION_SALT]))


# --------------------------------------------------------------------------- layouts


def _run_layout(layout: str, jobs: list[_Job], workers: int, timeout_s: float) -> list[_Outcome]:
    if layout in ("fork", "spawn"):
        return _run_processes(layout, jobs, workers, timeout_s)
    if layout == "thread":
        return _run_threads(jobs, workers, timeout_s)
    if layout == "asyncio":
        return _run_asyncio(jobs, timeout_s)
    raise ValueError(f"unknown layout {layout!r}; the layouts are {', '.join(LAYOUTS)}")


# --------------------------------------------------------------------------- comparison


def _first_turn_differing(ref: dict, got: dict) -> int:
    a, b = ref["digests"], got["digests"]
    for t in range(min(len(a), len(b))):
        if a[t] != b[t]:
            return t
    return min(len(a), len(b))


def _describe(record: dict, turn: int) -> str:
    obs = record["observations"]
    if turn >= len(obs):
        return f"(the episode has only {len(obs) - 1} turns)"
    action = "the reset" if turn == 0 else f"action {record['actions'][turn - 1][:80]!r}"
    return f"after {action}: {obs[turn][:160]!r}"


def _compare(
    env_id: str,
    layout: str,
    workers: int,
    reference: list[_Outcome],
    outcomes: list[_Outcome],
    episodes: list[_Episode],
) -> None:
    """Raise :class:`LayoutMismatch` at the first episode whose outcome differs from the reference."""
    where = f"layout {layout!r} ({workers} workers)"
    by_index = {o.index: o for o in outcomes}
    for ep, ref in zip(episodes, reference, strict=True):
        got = by_index.get(ep.index)
        what = f"episode {ep.index} (seed {ep.seed}, options {ep.options})"
        common = {"env_id": env_id, "layout": layout, "episode": ep.index, "seed": ep.seed}
        if got is None:
            raise LayoutMismatch(f"check_layout({env_id}): {where} returned no result for {what}", **common)
        if got.error is not None:
            raise LayoutMismatch(f"check_layout({env_id}): {where} raised in {what}: {got.error}", **common)
        r, g = ref.record, got.record
        if r["digests"] != g["digests"]:
            t = _first_turn_differing(r, g)
            raise LayoutMismatch(
                f"check_layout({env_id}): {where} gave a different {what} from one process, first at turn {t}: "
                f"one process {_describe(r, t)}; {layout} {_describe(g, t)}",
                turn=t,
                **common,
            )
        for name in ("terminated", "truncated", "noise"):
            if r.get(name) != g.get(name):
                raise LayoutMismatch(
                    f"check_layout({env_id}): {where} gave {what} the same turns but another {name!r}: "
                    f"one process {r.get(name)!r}, {layout} {g.get(name)!r}",
                    **common,
                )
        if ref.noise != got.noise:
            t = next(
                (i for i, (a, b) in enumerate(zip(ref.noise or [], got.noise or [], strict=False)) if a != b),
                min(len(ref.noise or []), len(got.noise or [])),
            )
            key = (ref.noise or [[None]])[min(t, len(ref.noise or [[None]]) - 1)][0]
            raise LayoutMismatch(
                f"check_layout({env_id}): {where} drew different keyed noise in {what} at turn {t} "
                f"(key base {key}): the noise keys or the generator differ between layouts",
                turn=t,
                **common,
            )


# --------------------------------------------------------------------------- the check


def check_layout(
    env_id: str,
    *,
    kwargs: Optional[dict] = None,
    workers: int = 2,
    episodes: int = 4,
    num_steps: int = 6,
    seed: int = 0,
    options: Union[None, dict, Sequence[Optional[dict]]] = None,
    layouts: Sequence[str] = LAYOUTS,
    policy: Optional[Policy] = None,
    extra_actions: Sequence[str] = (),
    noise: Union[bool, NoiseProbe] = False,
    timeout_s: float = 600.0,
) -> LayoutReport:
    """Play the same episodes of ``env_id`` in each worker layout; raise unless all records are identical.

    Args:
        env_id: a registered id (``make`` form: ``"twice_envs/X"`` and ``"module:X"`` work).
        kwargs: keyword arguments for ``make`` (JSON data).
        workers: processes or threads per layout.
        episodes: episodes per layout; episode ``i`` resets with ``seed + i``.
        num_steps: most actions per episode (fewer when it ends).
        seed: the first reset seed, and the seed of the action generators.
        options: reset options for every episode, or a list with one entry per episode.
        layouts: which of :data:`LAYOUTS` to run (the reference, ``serial``, always runs).
        policy: ``policy(env, info, rng) -> action`` for the reference run (default
            :func:`drawn_action` with ``extra_actions``).
        extra_actions: actions the default policy may also draw.
        noise: also draw keyed noise at every turn in every layout and compare the
            draws (``True`` for the default :class:`NoiseProbe`, or a probe).
        timeout_s: longest wait for one layout.

    Returns:
        A :class:`LayoutReport` (layouts run, their times, layouts this platform lacks).

    Raises:
        LayoutMismatch: a layout gave a different record (or noise) for some episode, or
            raised; the message names the env, the layout, the episode and the turn.
    """
    env_id = resolve_id(env_id)
    kwargs = dict(kwargs or {})
    seed = check_seed(seed)
    if not timeout_s > 0:
        raise ValueError(f"check_layout: timeout_s must be positive, got {timeout_s!r}")
    for name, value in (("workers", workers), ("episodes", episodes), ("num_steps", num_steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "num_steps" else 1):
            least = "a non-negative" if name == "num_steps" else "a positive"
            raise ValueError(f"check_layout: {name} must be {least} int, got {value!r}")
    unknown = [name for name in layouts if name not in LAYOUTS]
    if unknown:
        raise ValueError(f"check_layout: unknown layouts {unknown}; the layouts are {', '.join(LAYOUTS)}")
    if isinstance(options, (list, tuple)):
        if len(options) != episodes:
            raise ValueError(f"check_layout: options has {len(options)} entries for {episodes} episodes")
        per_episode = [dict(o) if o is not None else None for o in options]
    else:
        per_episode = [dict(options) if options is not None else None for _ in range(episodes)]
    probe = NoiseProbe() if noise is True else (noise or None)
    if probe is not None and not isinstance(probe, NoiseProbe):
        raise ValueError(f"check_layout: noise must be True, False or a NoiseProbe, got {noise!r}")
    choose = policy or (lambda env, info, rng: drawn_action(env, info, rng, extra_actions))

    # The reference: one process, one env; the policy chooses the actions.
    start = time.perf_counter()
    env = make(env_id, **kwargs)
    reference: list[_Outcome] = []
    plan: list[_Episode] = []
    try:
        for i in range(episodes):
            rng = _action_rng(seed, i)
            try:
                _, info = env.reset(seed=seed + i, options=per_episode[i])
                base = getattr(env, "unwrapped", env)
                keys, actions = [], []
                for _ in range(num_steps):
                    action = choose(env, info, rng)
                    keys.append(base.noise_key())
                    _, _, term, trunc, info = env.step(action)
                    actions.append(action)
                    if term or trunc:
                        break
            except Exception as exc:
                raise LayoutMismatch(
                    f"check_layout({env_id}): the reference run (one process) raised in episode {i} "
                    f"(seed {seed + i}, options {per_episode[i]}): {type(exc).__name__}: {exc}",
                    env_id=env_id,
                    layout="serial",
                    episode=i,
                    seed=seed + i,
                ) from exc
            ep = _Episode(i, seed + i, per_episode[i], tuple(actions))
            plan.append(ep)
            reference.append(_outcome(env, ep, keys, probe))
    finally:
        env.close()
    report = LayoutReport(env_id, workers, episodes, sum(len(e.actions) for e in plan))
    report.seconds["serial"] = time.perf_counter() - start
    report.noise_keys = report.turns * probe.keys_per_turn if probe else 0

    shipped = _shippable_spec(env_id)
    jobs = [_Job(env_id, kwargs, tuple(plan[w::workers]), probe, shipped) for w in range(min(workers, episodes))]
    for layout in LAYOUTS:
        if layout == "serial" or layout not in layouts:
            continue
        if layout in ("fork", "spawn") and layout not in multiprocessing.get_all_start_methods():
            report.skipped[layout] = f"the {layout!r} start method is not available on this platform"
            continue
        start = time.perf_counter()
        try:
            outcomes = _run_layout(layout, jobs, workers, timeout_s)
        except LayoutMismatch:
            raise
        except (cf.TimeoutError, asyncio.TimeoutError) as exc:
            raise LayoutMismatch(
                f"check_layout({env_id}): layout {layout!r} ({workers} workers) did not finish within {timeout_s:g} s",
                env_id=env_id,
                layout=layout,
            ) from exc
        except Exception as exc:  # a pool that broke (a worker died) or could not start
            hint = missing_main_guard(layout) if isinstance(exc, cf.process.BrokenProcessPool) else None
            raise LayoutMismatch(
                f"check_layout({env_id}): layout {layout!r} ({workers} workers) failed: {type(exc).__name__}: "
                + (f"{str(exc).rstrip('.')}; {hint}" if hint else str(exc)),
                env_id=env_id,
                layout=layout,
            ) from exc
        _compare(env_id, layout, workers, reference, outcomes, plan)
        report.seconds[layout] = time.perf_counter() - start
    return report
