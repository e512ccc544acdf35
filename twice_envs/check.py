"""The public contract checker: ``twice_envs.check_env(env)``.

Run it on any env you write (it is what the test suite runs on every registered id)::

    from twice_envs import check_env, make
    report = check_env(make("MyEnv-v0"))
    print(report)

It checks, on random action sequences drawn from a fixed seed:

* determinism: two resets with one seed give identical episodes; so does a second
  Python process with a different ``PYTHONHASHSEED``;
* fork == replay at every turn, by snapshot (when the env has one) and by replay: the
  restored state equals the replayed one (snapshot state and generator), and both go on
  exactly as the record; forking a turn again after its fork was stepped gives the
  same state (a restore that shares mutable data with its snapshot fails here);
* fork independence: stepping a fork never changes the original;
* twins: a self-twin (the factual action again) reproduces the factual episode and
  its noise keys; a coupled twin reports the factual keys after the branch, an
  independent one does not;
* bad actions (:func:`bad_actions`, in :mod:`twice_envs.bad_input`: empty, garbage, huge,
  control characters, lone surrogates, Latin-1, malformed protocol tags, repeated
  openers...) never raise, are flagged and explained, and their records save and load
  back exactly;
* a step's time grows linearly with the action's length (1 MiB vs 64 KiB);
* the trajectory survives a JSON-lines round trip and ``replay``.

A failure raises :class:`CheckFailure` saying which property broke and how to
reproduce it.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

# Re-exported: callers import the bad actions from the checker, which steps every env with them.
from twice_envs.bad_input import BAD_ACTIONS, LINEAR_SHAPES, bad_actions  # noqa: F401
from twice_envs.core import TextEnv, twin_step
from twice_envs.errors import ReplayDivergence, TwiceError
from twice_envs.registry import registry
from twice_envs.replay import replay
from twice_envs.trajectory import Trajectory, load_trajectories, save_trajectories

#: Largest allowed ratio of a step's time at 1 MiB to its time at 64 KiB (linear gives about 16).
MAX_TIME_RATIO = 32.0
#: A bad action's step must take less than this many seconds.
MAX_BAD_STEP_S = 10.0


class CheckFailure(AssertionError):
    """The env broke a contract property; the message says which and how to reproduce it."""


@dataclass
class CheckReport:
    """What :func:`check_env` verified."""

    env_id: str
    passed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"check_env({self.env_id}): {len(self.passed)} checks passed"]
        lines += [f"  ok    {p}" for p in self.passed]
        lines += [f"  skip  {s}" for s in self.skipped]
        return "\n".join(lines)


def _fail(msg: str) -> None:
    raise CheckFailure(msg)


def random_actions(
    env: Any, info: dict, rng: np.random.Generator, extra_actions: Sequence[str] = ()
) -> str:
    """One random action: admissible ones when the env lists them, else from ``extra_actions``/bad ones."""
    pool = list(info.get("admissible_actions") or []) + list(extra_actions)
    if not pool or rng.random() < 0.15:
        pool = pool + list(BAD_ACTIONS[:5])
    return pool[int(rng.integers(len(pool)))]


def rollout(
    env: Any,
    seed: int,
    options: Optional[dict],
    num_steps: int,
    rng: np.random.Generator,
    extra_actions: Sequence[str] = (),
    policy: Optional[Callable[[Any, dict, np.random.Generator], str]] = None,
) -> list[str]:
    """Reset and take up to ``num_steps`` random actions; returns the actions taken."""
    policy = policy or (lambda e, i, r: random_actions(e, i, r, extra_actions))
    _, info = env.reset(seed=seed, options=options)
    actions = []
    for _ in range(num_steps):
        a = policy(env, info, rng)
        _, _, term, trunc, info = safe_step(env, a)
        actions.append(a)
        if term or trunc:
            break
    return actions


def safe_step(env: Any, action: str) -> tuple:
    """``env.step(action)``, turning an exception into a :class:`CheckFailure`."""
    try:
        return env.step(action)
    except Exception as exc:  # noqa: BLE001 -- the contract says never raise
        raise CheckFailure(
            f"step({action[:40]!r}) raised {type(exc).__name__}: {exc}; bad actions must give an observation"
        ) from exc


def _episode_fingerprint(env: Any) -> list[str]:
    return list(env.trajectory.digests)


def _verified_fork(env: TextEnv, turn: int, record: Any) -> TextEnv:
    """``env.fork(turn)``, turning a detected divergence into a :class:`CheckFailure`."""
    try:
        return env.fork(turn)
    except ReplayDivergence as exc:
        raise CheckFailure(f"fork({turn}) of the episode with seed {record.seed} is wrong: {exc}") from exc


def _same_state(a: TextEnv, b: TextEnv, what_a: str, what_b: str) -> None:
    """Fail unless two envs hold the same snapshot state and the same generator state."""
    if a._snapshot() != b._snapshot():
        _fail(
            f"{what_a} restores a state that differs from {what_b}: _snapshot() gives "
            f"{a._snapshot()!r:.200} against {b._snapshot()!r:.200}"
        )
    if a.np_random.bit_generator.state != b.np_random.bit_generator.state:
        _fail(f"{what_a} restores a random generator state that differs from {what_b}")


def check_env(
    env: Any,
    *,
    seed: int = 0,
    options: Optional[dict] = None,
    num_episodes: int = 3,
    num_steps: int = 8,
    extra_actions: Sequence[str] = (),
    policy: Optional[Callable[[Any, dict, np.random.Generator], str]] = None,
    subprocess_check: bool = True,
    max_forks: int = 6,
) -> CheckReport:
    """Verify the twice_envs contract on ``env`` (an env made with ``make``).

    Args:
        env: the env to check (its own episodes are overwritten).
        seed: base seed; episode ``i`` uses ``seed + i``.
        options: reset options for every episode.
        num_episodes: random episodes to run.
        num_steps: maximum actions per episode.
        extra_actions: actions to mix in where the env lists no admissible actions
            (e.g. well-formed ``<search>`` turns).
        policy: ``policy(env, info, rng) -> action`` instead of the random one.
        subprocess_check: also replay one episode in a second Python process with a
            different ``PYTHONHASHSEED``.
        max_forks: turns per episode at which forks are checked.
    """
    base = getattr(env, "unwrapped", env)
    if not isinstance(base, TextEnv):
        _fail("check_env needs a twice_envs TextEnv")
    # The contract is the base env's; wrappers are checked through their own tests.
    env = base
    report = CheckReport(base.env_id)
    rng = np.random.default_rng(seed)

    # protocol
    proto = env.protocol()
    if not isinstance(proto.instructions, str) or not all(isinstance(s, str) for s in proto.stop):
        _fail("protocol() must give instructions (str) and stop strings (tuple of str)")
    report.passed.append("protocol")

    episodes: list[Trajectory] = []
    for i in range(num_episodes):
        ep_seed = seed + i
        actions = rollout(env, ep_seed, options, num_steps, rng, extra_actions, policy)
        record = Trajectory.from_json(env.trajectory.to_json())
        record.check_chain()
        for name, seq in (("observations", record.observations), ("actions", record.actions)):
            if not all(isinstance(x, str) for x in seq):
                _fail(f"all {name} must be str")
        if not all(np.isfinite(record.rewards)):
            _fail("rewards must be finite")
        episodes.append(record)

        # determinism across resets
        env.reset(seed=ep_seed, options=options)
        for a in actions:
            env.step(a)
        if _episode_fingerprint(env) != record.digests:
            _fail(
                f"same seed and actions gave a different episode (seed={ep_seed}, options={options}, "
                f"actions={actions!r}): the env uses randomness outside self.np_random or keeps state across resets"
            )
    report.passed.append(f"determinism across resets ({num_episodes} episodes)")

    # forks: snapshot and replay both equal the record, and are independent
    for record in episodes:
        n = record.num_turns
        env._replay_into(record, n)  # the original, positioned at the end
        turns = sorted(set(np.linspace(0, n, num=min(max_forks, n + 1)).astype(int).tolist()))
        for t in turns:
            f = _verified_fork(env, t, record)
            if f.trajectory.digests != record.digests[: t + 1]:
                _fail(f"fork({t}) does not hold the first {t} turns of the episode (seed={record.seed})")
            r = base._spawn()
            r._replay_into(record, t)
            if r.noise_key() != f.noise_key():
                _fail(f"fork({t}) reports noise key {f.noise_key()} but replay reports {r.noise_key()}")
            if base.supports_snapshot:
                _same_state(f, r, f"fork({t}) by snapshot", f"replaying the record to turn {t} (seed={record.seed})")
            # continue both with the recorded actions: identical
            for a in record.actions[t:]:
                f.step(a)
                r.step(a)
            if f.trajectory.digests != record.digests or r.trajectory.digests != record.digests:
                _fail(f"fork({t}) continued with the recorded actions differs from the episode (seed={record.seed})")
            # independence: a fork stepped with other actions leaves the original alone, and
            # forking the same turn again (after f and r were stepped) gives the same state
            g = _verified_fork(env, t, record)
            if base.supports_snapshot:
                r = base._spawn()
                r._replay_into(record, t)
                _same_state(g, r, f"a second fork({t}), made after the first was stepped,", f"replay to turn {t}")
            g_info = g.last_info
            for _ in range(3):
                if g.done:
                    break
                _, _, _, _, g_info = safe_step(g, random_actions(g, g_info, rng, extra_actions))
            if env.trajectory.digests != record.digests:
                _fail(f"stepping fork({t}) changed the original episode")
    report.passed.append("fork == replay at every checked turn" + (" (snapshot path)" if base.supports_snapshot else " (replay path)"))
    report.passed.append("fork independence")

    # twins
    for record in episodes:
        if record.num_turns == 0:
            continue
        env._replay_into(record, record.num_turns)
        factual_keys = [env.fork(u).noise_key() for u in range(record.num_turns + 1)]
        t = int(rng.integers(record.num_turns))
        schedule = env.noise_schedule
        tw = _verified_fork(env, t, record)
        alternative_key, _ = twin_step(tw, record.actions[t], schedule, branch=1)
        if alternative_key != (schedule.episode_seed, t, 1, 0, 0):
            _fail(f"the twin's alternative key is {alternative_key}, expected branch 1 of turn {t}")
        for a in record.actions[t + 1 :]:
            tw.step(a)
        if tw.trajectory.digests != record.digests:
            _fail(f"a self-twin at turn {t} (the factual action again) did not reproduce the factual episode")
        for u in range(t + 1, record.num_turns + 1):
            k = tw.fork(u).noise_key()
            if k != factual_keys[u]:
                _fail(f"coupled twin of turn {t} reports key {k} at turn {u}, factual episode reported {factual_keys[u]}")
        ind = _verified_fork(env, t, record)
        twin_step(ind, record.actions[t], schedule.episode_seed ^ 0x5A5A5A5A, branch=1)
        if t + 1 <= record.num_turns and not ind.done and ind.noise_key() == factual_keys[t + 1]:
            _fail("an independent twin (fresh seed) reports the factual noise key")
    report.passed.append("self-twin identity and coupled/independent noise keys")

    # bad actions: a clear observation each, quickly; their records save and load back exactly
    bad_records = probe_bad_actions(env, BAD_ACTIONS, seed=seed, options=options).records
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bad.jsonl")
        save_trajectories(path, bad_records)
        if [r.to_json() for r in load_trajectories(path)] != [r.to_json() for r in bad_records]:
            _fail("an episode of bad actions changed in a JSON lines round trip")
    # stepping after the end does not raise either
    last = episodes[-1]
    env._replay_into(last, last.num_turns)
    if env.done:
        env.step("anything")
    report.passed.append(f"bad actions handled ({len(BAD_ACTIONS)} kinds, saved and reloaded exactly)")
    ratios = check_linear_time(env, seed=seed, options=options)
    worst = max(ratios, key=ratios.get)
    report.passed.append(f"step time linear in the action's length (worst 1 MiB / 64 KiB ratio {ratios[worst]:.1f}, {worst!r})")

    # JSON round trip and replay
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "episodes.jsonl")
        save_trajectories(path, episodes)
        loaded = load_trajectories(path)
    if [r.to_json() for r in loaded] != [r.to_json() for r in episodes]:
        _fail("trajectories changed in a JSON lines round trip")
    if base.spec is not None:
        for r in loaded:
            if replay(r, trusted=True).trajectory.digests != r.digests:
                _fail("replay(record) did not reproduce the record")
        report.passed.append("trajectory JSON round trip and replay")

    if subprocess_check and base.spec is not None:
        rec = max(episodes, key=lambda r: r.num_turns)
        got = replay_in_subprocess(rec.to_json(), hashseed="12345")
        if got != rec.digests:
            _fail(
                f"a second process (PYTHONHASHSEED=12345) produced a different episode for seed {rec.seed}: "
                "the env depends on hash() order, set iteration order or global state"
            )
        report.passed.append("determinism across processes (different PYTHONHASHSEED)")
    else:
        report.skipped.append("determinism across processes (env not registered or disabled)")
    return report


@dataclass
class BadActionProbe:
    """What :func:`probe_bad_actions` saw.

    Attributes:
        steps: per action, ``(action, observation, reward, info["invalid"], seconds)``.
        records: the episodes played, each checked against its digest chain.
    """

    steps: list[tuple[str, str, float, bool, float]] = field(default_factory=list)
    records: list[Any] = field(default_factory=list)


def probe_bad_actions(
    env: Any,
    actions: Sequence[str] = BAD_ACTIONS,
    *,
    seed: int = 0,
    options: Optional[dict] = None,
    max_step_s: float = MAX_BAD_STEP_S,
) -> BadActionProbe:
    """Step ``env`` with each of ``actions`` in turn (resetting when an episode ends).

    Each step must not raise, must return a ``str`` observation, a finite reward and
    ``info["invalid"]`` (bool), an invalid one must say something (a non-empty
    observation), and each must take under ``max_step_s`` seconds.
    """
    probe = BadActionProbe()

    def keep() -> None:
        record = Trajectory.from_json(env.trajectory.to_json())
        record.check_chain()
        probe.records.append(record)

    env.reset(seed=seed, options=options)
    for bad in actions:
        if env.done:
            keep()
            env.reset(seed=seed, options=options)
        start = time.perf_counter()
        obs, reward, term, trunc, info = safe_step(env, bad)
        took = time.perf_counter() - start
        what = f"step({bad[:40]!r}{'...' if len(bad) > 40 else ''}) ({len(bad)} characters)"
        if not isinstance(obs, str) or not np.isfinite(float(reward)) or not isinstance(info.get("invalid"), bool):
            _fail(f"{what} must return a str observation, a finite reward and info['invalid'] (bool)")
        if info["invalid"] and not obs.strip():
            _fail(f"{what} is flagged invalid but the observation is empty: say what was wrong")
        if took > max_step_s:
            _fail(f"{what} took {took:.1f} s (limit {max_step_s:g} s): parsing must not hang on bad input")
        probe.steps.append((bad, obs, float(reward), info["invalid"], took))
    keep()
    return probe


def check_linear_time(
    env: Any,
    *,
    seed: int = 0,
    options: Optional[dict] = None,
    shapes: Sequence[str] = LINEAR_SHAPES,
    max_ratio: float = MAX_TIME_RATIO,
    repeats: int = 4,
    sizes: tuple[int, int] = (1 << 16, 1 << 20),
) -> dict[str, float]:
    """Fail unless a step on 1 MiB of a repeated opener takes under ``max_ratio`` times a step on 64 KiB.

    ``sizes`` are the small and the large length in characters.

    Times are the thread's CPU time, best of ``repeats`` (robust on a loaded machine); returns the
    ratio per shape.
    """
    def timed_step(text: str) -> float:
        env.reset(seed=seed, options=options)
        enabled = gc.isenabled()
        gc.disable()  # as timeit does: a collection triggered by others' garbage is not the parser's time
        try:
            # CPU time of this thread: on a loaded machine, time spent descheduled is not the parser's
            start = time.thread_time()
            safe_step(env, text)
            return time.thread_time() - start
        finally:
            if enabled:
                gc.enable()

    ratios = {}
    for shape in shapes:
        small, big = ((shape * (n // len(shape) + 1))[:n] for n in sizes)
        small_s, big_s = [], []
        for _ in range(repeats):  # interleaved, so a busy spell on the machine hits both sizes
            small_s.append(timed_step(small))
            big_s.append(timed_step(big))
        ratio = min(big_s) / max(min(small_s), 1e-6)
        if ratio >= max_ratio:
            _fail(
                f"a step on {sizes[1]} characters of {shape!r} repeated took {ratio:.0f}x a step on {sizes[0]} "
                f"(limit {max_ratio:g}x, linear is about {sizes[1] // sizes[0]}x): the action parser rescans "
                "the text (quadratic time)"
            )
        ratios[shape] = ratio
    return ratios


def replay_in_subprocess(record: dict, hashseed: str = "12345", imports: Sequence[str] = ()) -> list[str]:
    """Reset and step ``record``'s env in a fresh interpreter; return its digest chain.

    Modules that register the env (``imports``; by default the env's entry-point
    module) are imported first in the child.
    """
    spec = registry.get(record["env_id"])
    mods = list(imports)
    entry = None
    if spec is not None and isinstance(spec.entry_point, str):
        mods.append(spec.entry_point.split(":")[0])
        entry = spec.entry_point
    code = (
        "import json, sys, importlib\n"
        "import twice_envs\n"
        "data = json.loads(sys.stdin.read())\n"
        "for m in data['imports']: importlib.import_module(m)\n"
        "rec = data['record']\n"
        "if rec['env_id'] not in twice_envs.registry and data['entry']:\n"
        "    twice_envs.register(rec['env_id'], data['entry'])\n"
        "env = twice_envs.make(rec['env_id'], **rec['kwargs'])\n"
        "env.reset(seed=rec['seed'], options=rec['options'])\n"
        "for a in rec['actions']: env.step(a)\n"
        "print(json.dumps(env.trajectory.digests))\n"
    )
    child_env = dict(os.environ)
    child_env["PYTHONHASHSEED"] = hashseed
    child_env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [child_env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps({"record": record, "imports": mods, "entry": entry}),
        capture_output=True,
        text=True,
        env=child_env,
        timeout=600,
    )
    if proc.returncode != 0:
        raise TwiceError(f"the replay subprocess failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
