"""The text-environment contract: seeded, replayable and forkable gymnasium envs.

Subclass :class:`TextEnv` and implement three methods::

    class MyEnv(TextEnv):
        version = "1"
        def protocol(self) -> Protocol: ...
        def _reset(self, options: dict) -> tuple[str, dict]: ...   # first obs, info
        def _step(self, action: str) -> tuple[str, float, bool, dict]:  # obs, reward, terminated, info

The base class does everything the contract needs around them:

* **Seeding in one place.** ``reset(seed=...)`` seeds ``self.np_random``; ``_reset``
  and ``_step`` must draw all env-side randomness from it (never from ``random``,
  ``hash()`` or the clock), so the same ``(seed, options)`` gives the same episode
  in any process. Seeds are ints in ``0..2**64-1``. ``reset()`` without a seed
  continues the env's own ``np_random`` as gymnasium specifies (the episode's seed is
  drawn from it and recorded); only an env that was never seeded draws OS entropy.
* **Validation before state changes.** ``reset`` checks the seed, the options (a
  dict of JSON data; the keys in :attr:`TextEnv.reset_options` when the env declares
  them) and ``options["noise_seed"]`` before it touches anything. If ``_reset`` still
  raises, the env refuses to ``step`` until a reset succeeds.
* **Bad actions never raise.** An exception inside ``_step`` is a bug; a malformed
  action must come back from ``_step`` as an observation with ``info["invalid"] = True``.
  If ``_step`` raises anyway (a failing tool), an env with snapshots is rolled back to
  the state before the step, exactly; one without refuses to ``step`` until ``reset``.
* **The record.** ``env.trajectory`` holds the episode with its digest chain.
* **Forks.** ``env.fork(turn)`` returns an independent env in the state after
  ``turn`` actions, by snapshot when the subclass implements ``_snapshot`` /
  ``_restore`` (plain data, never mutated afterwards), otherwise by replay. Both are
  verified: a replay against the digest chain, a restore against the state as it was
  when the snapshot was taken (:func:`state_digest`); a mismatch raises
  :class:`ReplayDivergence`.
* **Noise.** The env carries a :class:`NoiseSchedule` and reports the key base of
  the agent's next turn in ``info["noise_key"]``; the factual schedule's seed is
  derived from the reset seed (or ``options["noise_seed"]``).
* **Closing.** After ``close()`` the env is done for good: ``step``, ``fork``,
  ``reset`` and ``set_noise_schedule`` raise :class:`EnvClosedError`; the record stays
  readable; a second ``close()`` does nothing. A subclass that holds resources
  overrides ``close`` to release them; the base class marks the env closed whether or
  not that override calls ``super().close()``.

Every ``info`` holds ``turn`` (actions taken so far), ``noise_key``, ``invalid`` and
``digest``; envs with a finite action set add ``admissible_actions``.

:class:`Protocol` and :class:`TextSpace` live in :mod:`twice_envs.protocol`; :func:`state_digest`,
:func:`check_turn` and :func:`twin_step` in :mod:`twice_envs.forks`. All stay importable from here.
"""

from __future__ import annotations

import copy
import functools
from typing import Any, Optional, SupportsFloat

import gymnasium

from twice_envs.errors import EnvClosedError, ReplayDivergence, TwiceError

# Re-exported: envs, wrappers and integrations import these from here (twin_step is not used here).
from twice_envs.forks import check_turn, state_digest, twin_step  # noqa: F401
from twice_envs.keys import NoiseKey, NoiseSchedule, check_seed, derive_episode_seed, draw_seed
from twice_envs.protocol import Protocol, TextSpace
from twice_envs.registry import make
from twice_envs.trajectory import Trajectory, canonical_json, reset_digest, step_digest

#: Reset options the base class consumes itself (not passed to ``_reset``).
BASE_OPTIONS = ("noise_seed",)

EPISODE_OVER = "The episode is over. Call reset() to start a new one."


def _marking_closed(close: Any) -> Any:
    """``close`` (a TextEnv subclass's own) that runs once and leaves the env marked closed."""

    @functools.wraps(close)
    def wrapper(self: TextEnv, *args: Any, **kwargs: Any) -> None:
        if self._closed:
            return None
        try:
            return close(self, *args, **kwargs)
        finally:
            self._closed = True

    wrapper._marks_env_closed = True
    return wrapper


class TextEnv(gymnasium.Env[str, str]):
    """Base class of every twice_envs environment (see the module docstring)."""

    metadata = {"render_modes": ["ansi"]}
    #: Implementation version, stored in trajectories; bump it when dynamics change.
    version: str = "1"
    #: Turns before truncation when ``max_turns`` is not given.
    default_max_turns: int = 50
    #: The reset option keys ``_reset`` accepts (``noise_seed`` is always accepted);
    #: ``None`` leaves the check to ``_reset``. Declared keys are checked before any
    #: state changes, and views that must drop foreign keys (the PettingZoo group)
    #: know which ones to keep.
    reset_options: Optional[tuple[str, ...]] = None
    #: Constructor kwargs that name files or folders (besides the names
    #: :func:`twice_envs.replay.path_kwargs` recognises by themselves); ``replay`` of an
    #: untrusted record refuses to pass them on.
    path_kwargs: tuple[str, ...] = ()
    #: Whether each task has a gold answer (:meth:`gold_answers`); credit methods that score the
    #: policy's probability of it (IGPO) refuse envs without one before any rollout.
    has_gold_answer: bool = False
    #: Set by :meth:`close` (a class default, so even an env whose ``__init__`` failed has it).
    _closed: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # A subclass's own close() releases its resources; wrapping it here marks the env
        # closed (and makes a second close() a no-op) even if it never calls super().close().
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("close")
        if callable(own) and not getattr(own, "_marks_env_closed", False):
            cls.close = _marking_closed(own)

    def __init__(self, *, max_turns: Optional[int] = None, render_mode: Optional[str] = None) -> None:
        if max_turns is not None and (not isinstance(max_turns, int) or max_turns < 1):
            raise ValueError(f"max_turns must be a positive int, got {max_turns!r}")
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.max_turns = max_turns if max_turns is not None else self.default_max_turns
        self.render_mode = render_mode
        self.observation_space = TextSpace()
        self.action_space = TextSpace()
        self._traj: Optional[Trajectory] = None
        self._schedule: Optional[NoiseSchedule] = None
        self._snapshots: list[Any] = []
        self._done = False
        self._last_info: dict = {}
        #: Why ``step`` is refused until the next successful ``reset`` (``None``: it is not).
        self._needs_reset: Optional[str] = None

    # ----------------------------------------------------------------- subclass API
    def protocol(self) -> Protocol:
        """The env's action protocol (instructions, stop strings)."""
        raise NotImplementedError

    def gold_answers(self) -> tuple[str, ...]:
        """The current task's accepted answers, as text (envs whose ``has_gold_answer`` is True; call it
        after ``reset``). An env without gold answers raises ``NotImplementedError``."""
        raise NotImplementedError(f"{type(self).__name__} has no gold answers (has_gold_answer is False)")

    def measures(self, info: dict, total_reward: float) -> dict[str, float]:
        """The env's own measures of a finished episode, from its last ``info`` and its total reward,
        headline first (what training progress and evaluations report: EM for SearchQA, success and
        score for WebShop, success for ALFWorld). Default: ``{"return": total_reward}``."""
        return {"return": float(total_reward)}

    def answer_action(self, answer: str) -> str:
        """The action that gives ``answer`` as the final answer, as a policy writes it (default: the
        answer itself; an env whose answers are wrapped in markup formats them)."""
        return answer

    def _reset(self, options: dict) -> tuple[str, dict]:
        """Start an episode from ``self.np_random``; return the first observation and info."""
        raise NotImplementedError

    def _step(self, action: str) -> tuple[str, float, bool, dict]:
        """Apply one action; return ``(obs, reward, terminated, info)``. Never raise on bad input."""
        raise NotImplementedError

    def _snapshot(self) -> Any:
        """Plain data describing the whole state (optional; enables fast forks)."""
        raise NotImplementedError

    def _restore(self, state: Any) -> None:
        """Set the state from a value :meth:`_snapshot` returned (copy what you mutate)."""
        raise NotImplementedError

    @property
    def supports_snapshot(self) -> bool:
        return type(self)._snapshot is not TextEnv._snapshot

    # ----------------------------------------------------------------- identity
    @property
    def env_id(self) -> str:
        """The registered id (``"<unregistered>"`` for an env built by hand)."""
        return self.spec.id if self.spec is not None else f"<unregistered {type(self).__name__}>"

    @property
    def make_kwargs(self) -> dict:
        """The kwargs this env was made with (JSON data)."""
        return dict(self.spec.kwargs) if self.spec is not None else {}

    # ----------------------------------------------------------------- gymnasium API
    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None) -> tuple[str, dict]:
        """Start an episode; the same ``(seed, options)`` always gives the same episode.

        ``seed=None`` continues ``self.np_random`` (entropy only if the env was never
        seeded); the seed used is recorded in ``env.trajectory.seed``.
        """
        self._refuse_if_closed("reset")
        options = self._check_options(options)
        noise_seed = options.get("noise_seed")
        if noise_seed is not None:
            noise_seed = check_seed(noise_seed, "options['noise_seed']")
        seed = draw_seed(self._np_random) if seed is None else check_seed(seed)
        env_options = {k: v for k, v in options.items() if k not in BASE_OPTIONS}
        # From here on the env's state changes: until _reset returns, the env is unusable.
        self._needs_reset = f"reset(seed={seed}, options={options!r}) did not finish"
        try:
            super().reset(seed=seed)
            obs, info = self._reset(env_options)
        except BaseException as exc:
            self._needs_reset = (
                f"the last reset(seed={seed}, options={options!r}) raised {type(exc).__name__}: {exc}"
            )
            raise
        self._schedule = NoiseSchedule(noise_seed if noise_seed is not None else derive_episode_seed(seed))
        d0 = reset_digest(self.env_id, self.version, self.make_kwargs, seed, options, obs)
        self._traj = Trajectory(
            self.env_id, str(self.version), self.make_kwargs, seed, options, self._schedule.to_json(), [], [obs], [], [d0]
        )
        self._done = False
        info = self._finish_info(info, invalid=bool(info.get("invalid", False)))
        self._snapshots = [self._take_snapshot(info)] if self.supports_snapshot else []
        self._needs_reset = None
        return obs, info

    def _check_options(self, options: Any) -> dict:
        """Reset options as a plain dict of JSON data with known keys, or a clear ``ValueError``."""
        if options is None:
            return {}
        if not isinstance(options, dict):
            raise ValueError(
                f"reset options must be a dict (or None), got {type(options).__name__} {options!r:.80}; "
                'e.g. env.reset(seed=0, options={"noise_seed": 7})'
            )
        options = dict(options)
        if not all(isinstance(k, str) for k in options):
            raise ValueError(f"reset option names must be strings, got {sorted(map(repr, options))}")
        try:
            canonical_json(options)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"reset options must be JSON data (str, int, float, lists, dicts): {exc}") from None
        if self.reset_options is not None:
            unknown = sorted(set(options) - set(self.reset_options) - set(BASE_OPTIONS))
            if unknown:
                accepted = ", ".join([*self.reset_options, *BASE_OPTIONS])
                name = self.spec.name if self.spec is not None else type(self).__name__
                raise ValueError(f"unknown {name} reset options {unknown}; accepted: {accepted}")
        return options

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict]:
        """Take the agent's raw turn text (or a plain action); bad actions never raise."""
        self._refuse_if_closed("step")
        if self._needs_reset is not None:
            raise TwiceError(f"{self._needs_reset}; step() is refused until a reset() succeeds")
        if self._traj is None:
            raise TwiceError("step() called before reset(); call env.reset(seed=...) first")
        if self._done:
            info = self._finish_info({"episode_over": True}, invalid=True)
            return EPISODE_OVER, 0.0, self._traj.terminated, self._traj.truncated, info
        if not isinstance(action, str):
            action = "" if action is None else str(action)
        try:
            obs, reward, terminated, info = self._step(action)
            reward = float(reward)
            snapshot = self._take_snapshot(info) if self.supports_snapshot else None
        except BaseException as exc:
            self._undo_failed_step(exc)
            raise
        traj = self._traj
        traj.actions.append(action)
        traj.observations.append(obs)
        traj.rewards.append(reward)
        traj.digests.append(step_digest(traj.digests[-1], action, obs, reward))
        truncated = (not terminated) and traj.num_turns >= self.max_turns
        traj.terminated, traj.truncated = bool(terminated), bool(truncated)
        self._done = bool(terminated or truncated)
        info = self._finish_info(info, invalid=bool(info.get("invalid", False)))
        if snapshot is not None:
            self._snapshots.append(snapshot)
        return obs, reward, bool(terminated), bool(truncated), info

    def _undo_failed_step(self, exc: BaseException) -> None:
        """After ``_step`` raised: restore the state before the step, or refuse to step on."""
        why = f"step() raised {type(exc).__name__}: {exc}"
        if self.supports_snapshot and len(self._snapshots) == self.turn + 1:
            try:
                self._apply_snapshot(self._snapshots[-1], self.turn)
                return
            except Exception:  # noqa: BLE001 -- fall through to refusing further steps
                pass
        self._needs_reset = f"{why}, and the env cannot be rolled back to turn {self.turn}"

    def render(self) -> Optional[str]:
        if self.render_mode == "ansi" and self._traj is not None:
            return self._traj.observations[-1]
        return None

    def close(self) -> None:
        """Release what the env holds; the env cannot be used again.

        After ``close()``, ``step``, ``fork``, ``reset`` and ``set_noise_schedule`` raise
        :class:`~twice_envs.errors.EnvClosedError`: a closed env is never reopened, not
        even by ``reset`` (make a new one with ``twice_envs.make``, or rebuild an episode
        with ``twice_envs.replay(record)``). What it recorded stays readable
        (``trajectory``, ``last_info``, ``render``). Forks made before are independent envs
        and stay usable. Calling ``close()`` again does nothing.
        """
        self._closed = True
        super().close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def _refuse_if_closed(self, call: str) -> None:
        if self._closed:
            raise EnvClosedError(self.env_id, call)

    # ----------------------------------------------------------------- records, noise
    @property
    def trajectory(self) -> Trajectory:
        """The episode so far (a live object; copy it with ``Trajectory.from_json(t.to_json())``)."""
        if self._traj is None:
            raise TwiceError("no episode yet: call env.reset(seed=...) first")
        return self._traj

    @property
    def turn(self) -> int:
        """Number of actions taken in this episode."""
        return self.trajectory.num_turns

    @property
    def done(self) -> bool:
        return self._done

    @property
    def noise_schedule(self) -> NoiseSchedule:
        if self._schedule is None:
            raise TwiceError("no episode yet: call env.reset(seed=...) first")
        return self._schedule

    def set_noise_schedule(self, schedule: NoiseSchedule | int | dict) -> None:
        """Bind the noise schedule later turns report (used by twins)."""
        self._refuse_if_closed("set_noise_schedule")
        self._schedule = NoiseSchedule.coerce(schedule)
        self.trajectory.noise = self._schedule.to_json()

    def noise_key(self) -> NoiseKey:
        """The key base of the agent's next turn."""
        return self.noise_schedule.key(self.turn)

    @property
    def last_info(self) -> dict:
        """The info dict of the last reset or step."""
        return self._last_info

    def _finish_info(self, info: dict, invalid: bool) -> dict:
        info = dict(info)
        info["invalid"] = invalid
        info["turn"] = self.turn
        info["noise_key"] = self.noise_key()
        info["digest"] = self.trajectory.digest
        self._last_info = info
        return info

    # ----------------------------------------------------------------- forks
    def _take_snapshot(self, info: dict) -> tuple:
        # bit_generator.state returns a fresh dict, so the snapshot owns it. The state
        # digest is taken now: a later restore is checked against the state as it was,
        # not as the (possibly aliased and since mutated) snapshot value is.
        info = {k: v for k, v in info.items() if k not in ("turn", "noise_key", "digest")}
        info["invalid"] = bool(info.get("invalid", False))
        state = self._snapshot()
        return (state, self.np_random.bit_generator.state, info, state_digest(state))

    def _apply_snapshot(self, snapshot: tuple, turn: int) -> None:
        """Restore a snapshot's state and generator, and verify the restored state."""
        state, rng_state, _, digest = snapshot
        self._restore(state)
        self.np_random.bit_generator.state = copy.deepcopy(rng_state)
        restored = self._snapshot()
        ok = restored == state if digest is None else state_digest(restored) == digest
        if not ok:
            raise ReplayDivergence(
                turn,
                digest or repr(state)[:40],
                state_digest(restored) or repr(restored)[:40],
                f"snapshot restore: after _restore, {type(self).__name__}._snapshot() differs from the state "
                "recorded at that turn (a _restore that misses a field, or a snapshot mutated after it was "
                "taken: copy what you mutate)",
            )

    def _spawn(self) -> "TextEnv":
        """A fresh env of the same kind and kwargs (heavy resources come from caches)."""
        if self.spec is None:
            raise TwiceError(
                f"cannot fork an unregistered {type(self).__name__}: create it with twice_envs.make(...) "
                "or register it with twice_envs.register(...)"
            )
        return make(self.spec.id, **self.spec.kwargs)

    def fork(self, turn: Optional[int] = None) -> "TextEnv":
        """An independent env in exactly the state after ``turn`` actions (default: now).

        Uses a snapshot where the env supports it, replay otherwise; a replay is
        verified against the digest chain, a restore against the state as it was when
        the snapshot was taken (:class:`ReplayDivergence` on mismatch).
        """
        self._refuse_if_closed("fork")
        traj = self.trajectory
        turn = check_turn(traj.num_turns if turn is None else turn, traj.num_turns)
        child = self._spawn()
        if self.supports_snapshot and len(self._snapshots) == traj.num_turns + 1:
            child._restore_from(self, turn)
        else:
            child._replay_into(traj, turn)
        child._schedule = self._schedule
        child._traj.noise = self._schedule.to_json()
        return child

    def _restore_from(self, parent: "TextEnv", turn: int) -> None:
        snapshot = parent._snapshots[turn]
        super().reset(seed=parent.trajectory.seed)
        self._apply_snapshot(snapshot, turn)
        self._traj = parent.trajectory.prefix(turn)
        self._traj.terminated = turn == parent.trajectory.num_turns and parent.trajectory.terminated
        self._traj.truncated = turn == parent.trajectory.num_turns and parent.trajectory.truncated
        self._done = self._traj.terminated or self._traj.truncated
        self._snapshots = parent._snapshots[: turn + 1]
        self._schedule = parent._schedule
        self._needs_reset = None
        info = snapshot[2]
        self._finish_info(info, invalid=bool(info.get("invalid", False)))

    def _replay_into(self, record: Trajectory, turn: int) -> None:
        if record.env_version != str(self.version):
            raise ReplayDivergence(
                0,
                record.digests[0],
                "",
                f"the record is from {record.env_id} version {record.env_version}, "
                f"the installed env is version {self.version}",
            )
        obs, info = self.reset(seed=record.seed, options=record.options)
        if self._traj.digests[0] != record.digests[0]:
            raise ReplayDivergence(0, record.digests[0], self._traj.digests[0], "reset observation differs")
        for t in range(turn):
            self.step(record.actions[t])
            if self._traj.digests[t + 1] != record.digests[t + 1]:
                raise ReplayDivergence(
                    t + 1,
                    record.digests[t + 1],
                    self._traj.digests[t + 1],
                    f"after action {record.actions[t]!r}",
                )
        self._schedule = NoiseSchedule.from_json(record.noise)
        self._traj.noise = dict(record.noise)
