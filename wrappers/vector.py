"""Gymnasium vector envs of text envs: ``twice_envs.make_vec``.

::

    vec = twice_envs.make_vec("ALFWorld-v0", 4, vectorization_mode="async", seeds=[7, 7, 7, 7])
    obs, infos = vec.reset()                         # obs: a tuple of 4 strings
    obs, rewards, terminated, truncated, infos = vec.step(("look", "look", "look", "look"))
    record = vec.trajectory(2)                       # sub-env 2's episode so far (a copy)
    branch = vec.fork(2, turn=1)                     # a live env at turn 1 of sub-env 2

**Spaces.** Observations and actions are tuples of strings, one per sub-env
(gymnasium batches a ``Text`` space as a ``Tuple``). Rewards, ``terminated`` and
``truncated`` are numpy arrays; infos are batched the gymnasium way
(``infos["turn"][i]``, with a ``_turn`` mask).

**Seeds.** Sub-env ``i`` has a seed stream: episode ``k`` is reset with
``seeds[i] + k * num_envs``. ``seeds`` comes from ``make_vec(seeds=...)`` (an int
``s`` means ``[s, s+1, ..., s+n-1]``) or from ``vec.reset(seed=...)``, which restarts
the streams. So ``seeds=range(n)`` walks through seeds ``0, 1, 2, ...`` once each,
and ``seeds=[7] * n`` (a GRPO group of task 7) keeps the ``n`` worlds on the same
task in every later episode too; add ``distinct_noise=True`` so that the members of
such a group also read different sampling noise (otherwise sub-envs with one seed
report identical noise keys). Without any seed the envs draw fresh seeds, which
each trajectory records. ``options`` (one dict, or one per sub-env) is used by every
reset that passes none, autoresets included.

**Autoreset.** The default is gymnasium's ``"next_step"`` mode: the step that ends
an episode returns its last observation; the *next* ``step`` call on that sub-env
ignores its action and returns the first observation of a new episode (reward 0).
Until then the sub-env still holds the finished episode, so ``vec.trajectory(i)`` and
``vec.fork(i, t)`` reach it. ``"same_step"`` resets inside the ending step (the
finished observation is in ``infos["final_obs"]``); ``"disabled"`` leaves resets to
you (``vec.reset(options={"reset_mask": mask})``); until then a finished sub-env
answers every action with the env's "episode is over" observation, flagged invalid. In every mode the step that ends an episode adds ``info["trajectory"]``, a
copy of the finished record (under ``infos["final_info"]`` in ``"same_step"`` mode).

**Forks and records.** ``vec.trajectory(i)`` / ``vec.trajectories()`` return copies
of the records (:class:`~twice_envs.trajectory.Trajectory`). ``vec.fork(i, turn)``
returns a live env in this process in the state after ``turn`` actions of sub-env
``i``'s episode: the sub-env's own (snapshot) fork in ``"sync"`` mode; in
``"async"`` mode the record comes back from the worker and
:func:`twice_envs.replay` rebuilds it here (digest-checked, so it is never a silent
wrong copy). ``vec.fork_record(i, turn)`` gives only the record, cheap to ship to
another process. ``vec.call("fork", t)`` works in ``"sync"`` mode only (it would try to
pickle live envs out of the workers).

**Processes.** ``"async"`` runs one worker process per sub-env. ``close()`` stops
them within ``close_timeout`` seconds (terminating a stuck one); closing twice is a
no-op, and using a closed vector env raises ``ClosedEnvironmentError``. A script that makes
a ``"spawn"`` or ``"forkserver"`` vector env needs the ``if __name__ == "__main__":`` guard
(each worker imports the main script again); without it the workers die at start, and the
:class:`~twice_envs.errors.TwiceError` raised names the script and says so.
"""

from __future__ import annotations

import importlib
import multiprocessing
import time
from typing import Any, Callable, Optional, Sequence

import gymnasium
import numpy as np
from gymnasium.error import ClosedEnvironmentError
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv
from gymnasium.vector.async_vector_env import AsyncState

from twice_envs._main_guard import missing_main_guard
from twice_envs.core import Protocol, TextEnv, check_turn
from twice_envs.errors import TwiceError
from twice_envs.keys import check_seed, derive_episode_seed, draw_seed
from twice_envs.trajectory import Trajectory
from twice_envs.wrappers.base import ForkableWrapper

__all__ = ["TextAsyncVectorEnv", "TextSyncVectorEnv", "make_vec"]

_AUTORESET = {
    "next_step": AutoresetMode.NEXT_STEP,
    "same_step": AutoresetMode.SAME_STEP,
    "disabled": AutoresetMode.DISABLED,
}


def _copy_record(record: Trajectory) -> Trajectory:
    copy = Trajectory.from_json(record.to_json())
    copy.meta = dict(record.meta)
    return copy


def _check_seed(seed: Any, what: str) -> Optional[int]:
    return None if seed is None else check_seed(seed, what)


def _seed_list(seeds: Any, num_envs: int, what: str) -> list[Optional[int]]:
    """``None`` / an int / a sequence of ``num_envs`` seeds -> one seed (or None) per sub-env."""
    if seeds is None:
        return [None] * num_envs
    if isinstance(seeds, (int, np.integer)) and not isinstance(seeds, bool):
        base = _check_seed(seeds, what)
        return [base + i for i in range(num_envs)]
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence) and not hasattr(seeds, "__len__"):
        raise TypeError(f"{what} must be None, an int or a list of {num_envs} ints, got {type(seeds).__name__}")
    seeds = list(seeds)
    if len(seeds) != num_envs:
        raise ValueError(
            f"{what} has {len(seeds)} entries but there are {num_envs} sub-envs: give one seed per sub-env "
            f"(or one int s for seeds s, s+1, ..., s+{num_envs - 1})"
        )
    return [_check_seed(s, f"{what}[{i}]") for i, s in enumerate(seeds)]


class SeededSubEnv(ForkableWrapper, gymnasium.utils.RecordConstructorArgs):
    """A sub-env of a text vector env: seed stream, default options, finished records.

    Attributes:
        next_seed: the seed of the next reset that passes none (``None``: draw one).
        stride: added to the last seed to get the next one (the number of sub-envs).
        default_options: options of every reset that passes none.
        noise_salt: when not 0, each reset adds ``options["noise_seed"] =
            derive_episode_seed(seed, noise_salt)`` (unless the options name one).
    """

    def __init__(
        self,
        env: Any,
        next_seed: Optional[int],
        stride: int,
        default_options: Optional[dict],
        noise_salt: int = 0,
    ) -> None:
        gymnasium.utils.RecordConstructorArgs.__init__(
            self, next_seed=next_seed, stride=stride, default_options=default_options, noise_salt=noise_salt
        )
        ForkableWrapper.__init__(self, env)
        self.next_seed = next_seed
        self.stride = stride
        self.default_options = dict(default_options) if default_options else None
        self.noise_salt = noise_salt

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None) -> tuple[str, dict]:
        streamed = seed is not None or self.next_seed is not None
        if seed is None:
            seed = self.next_seed
        if options is None:
            options = self.default_options
        if self.noise_salt and "noise_seed" not in (options or {}):
            if seed is None:  # as the env itself would: continue its generator, entropy if never seeded
                seed = draw_seed(self.env.unwrapped._np_random)
            options = {**(options or {}), "noise_seed": derive_episode_seed(seed, self.noise_salt)}
        obs, info = self.env.reset(seed=seed, options=options)
        self.next_seed = self.env.trajectory.seed + self.stride if streamed else None
        return obs, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        if terminated or truncated:
            info = dict(info)
            info["trajectory"] = _copy_record(self.env.trajectory)
        return obs, reward, terminated, truncated, info

    def _rewrap(self, env: Any) -> Any:
        # A fork is a plain env: it has no place in the vector env's seed streams.
        return env

    # Methods the vector env calls on one sub-env (also through a worker's pipe).
    def trajectory_copy(self) -> Trajectory:
        """A copy of the current record."""
        return _copy_record(self.env.trajectory)

    def fork_record(self, turn: Optional[int] = None) -> Trajectory:
        """The record of the first ``turn`` actions (default: all), noise schedule included."""
        record = self.env.trajectory
        n = check_turn(record.num_turns if turn is None else turn, record.num_turns)
        if n == record.num_turns:
            return _copy_record(record)
        return record.prefix(n)

    def safe_call(self, name: str, *args: Any) -> tuple[bool, Any]:
        """``(True, value)`` or ``(False, (error type name, message))``; never raises.

        A worker whose call raises would shut down, so calls from the parent go
        through here and the parent re-raises.
        """
        try:
            return True, getattr(self, name)(*args)
        except Exception as exc:  # noqa: BLE001 -- reported to the parent, which re-raises
            return False, (type(exc).__name__, str(exc))


_RERAISED = {"ValueError": ValueError, "TypeError": TypeError, "IndexError": IndexError}


class _SubEnvFactory:
    """Picklable ``() -> SeededSubEnv`` that also registers the id inside a worker process."""

    def __init__(
        self, env_id: str, entry_point: Any, spec_kwargs: dict, kwargs: dict, seed, stride, options, noise_salt
    ) -> None:
        self.env_id, self.entry_point, self.spec_kwargs = env_id, entry_point, spec_kwargs
        self.kwargs, self.seed, self.stride, self.options = kwargs, seed, stride, options
        self.noise_salt = noise_salt

    def __call__(self) -> SeededSubEnv:
        import twice_envs

        if self.env_id not in twice_envs.registry:
            # A spawned worker has only the built-in ids; re-register this one.
            twice_envs.register(self.env_id, self.entry_point, kwargs=self.spec_kwargs, override=True)
        env = twice_envs.make(self.env_id, **self.kwargs)
        return SeededSubEnv(env, self.seed, self.stride, self.options, self.noise_salt)


class _TextVectorMixin:
    """Record and fork access shared by the sync and async text vector envs."""

    num_envs: int
    closed: bool
    env_id: str

    def _call_one(self, index: int, name: str, *args: Any) -> Any:
        raise NotImplementedError

    def _index(self, index: int) -> int:
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"sub-env index must be an int, got {type(index).__name__}")
        if not 0 <= index < self.num_envs:
            raise IndexError(f"sub-env index {index} out of range: this vector env has {self.num_envs} sub-envs")
        return int(index)

    def _assert_open(self) -> None:
        if self.closed:
            raise ClosedEnvironmentError(
                f"this {type(self).__name__} of {self.env_id} is closed; make a new one with twice_envs.make_vec(...)"
            )

    def _unpack(self, index: int, result: tuple[bool, Any]) -> Any:
        ok, value = result
        if ok:
            return value
        name, message = value
        raise _RERAISED.get(name, TwiceError)(f"sub-env {index}: {message}")

    def trajectory(self, index: int) -> Trajectory:
        """A copy of sub-env ``index``'s record."""
        return self._call_one(self._index(index), "trajectory_copy")

    def trajectories(self) -> tuple[Trajectory, ...]:
        """Copies of every sub-env's record."""
        return tuple(self.trajectory(i) for i in range(self.num_envs))

    def fork_record(self, index: int, turn: Optional[int] = None) -> Trajectory:
        """The record of sub-env ``index`` up to ``turn`` (rebuild it with :func:`twice_envs.replay`)."""
        return self._call_one(self._index(index), "fork_record", turn)

    def fork(self, index: int, turn: Optional[int] = None) -> TextEnv:
        """A live, independent env (in this process) at ``turn`` of sub-env ``index``'s episode."""
        from twice_envs.replay import replay

        return replay(self.fork_record(index, turn), trusted=True)  # a record of our own sub-env

    def _check_reset_seed(self, seed: Any) -> Any:
        if seed is None or isinstance(seed, (int, np.integer)):
            _check_seed(seed, "seed")
            return None if seed is None else int(seed)
        return _seed_list(seed, self.num_envs, "seed")


class TextSyncVectorEnv(_TextVectorMixin, SyncVectorEnv):
    """Sub-envs stepped one after the other in this process (see the module docstring)."""

    def __init__(self, env_fns: Sequence[Callable[[], Any]], env_id: str, autoreset_mode: AutoresetMode) -> None:
        self.env_id = env_id
        super().__init__(env_fns, copy=True, autoreset_mode=autoreset_mode)

    def reset(self, *, seed: Any = None, options: Optional[dict] = None):
        self._assert_open()
        return super().reset(seed=self._check_reset_seed(seed), options=options)

    def step(self, actions: Any):
        self._assert_open()
        if self.autoreset_mode == AutoresetMode.DISABLED:
            # As in the async workers: a finished sub-env answers with the env's
            # "episode is over" observation (flagged invalid) until you reset it.
            self._autoreset_envs[:] = False
        return super().step(actions)

    def _call_one(self, index: int, name: str, *args: Any) -> Any:
        self._assert_open()
        return getattr(self.envs[index], name)(*args)

    def fork(self, index: int, turn: Optional[int] = None) -> TextEnv:
        """The sub-env's own fork (snapshot fast path where the env has one)."""
        self._assert_open()
        return self.envs[self._index(index)].fork(turn)

    def protocol(self) -> Protocol:
        """The sub-envs' action protocol."""
        return self.envs[0].protocol()

    def __repr__(self) -> str:
        return f"TextSyncVectorEnv({self.env_id}, num_envs={self.num_envs})"


class TextAsyncVectorEnv(_TextVectorMixin, AsyncVectorEnv):
    """One worker process per sub-env (see the module docstring).

    Attributes:
        close_timeout: seconds ``close`` waits for the workers before terminating them.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        env_id: str,
        autoreset_mode: AutoresetMode,
        context: Optional[str] = None,
        close_timeout: float = 10.0,
    ) -> None:
        self.env_id = env_id
        self.close_timeout = float(close_timeout)
        self._protocol: Optional[Protocol] = None
        # Text observations cannot live in shared memory; they travel through the pipes.
        try:
            super().__init__(env_fns, shared_memory=False, copy=True, context=context, autoreset_mode=autoreset_mode)
        except (EOFError, ConnectionError) as exc:  # a worker died before it answered
            hint = missing_main_guard(context)
            if hint is None:
                raise
            self._stop_after_failed_start()
            raise TwiceError(f"the async vector env of {env_id} could not start its workers "
                             f"({type(exc).__name__}: {exc}); {hint}") from exc

    def _stop_after_failed_start(self) -> None:
        try:
            self.close_extras(terminate=True)
        except Exception:  # noqa: BLE001,S110 - half-started: whatever is left is terminated, or already gone
            pass
        self.closed = True

    def reset(self, *, seed: Any = None, options: Optional[dict] = None):
        self._assert_open()
        return super().reset(seed=self._check_reset_seed(seed), options=options)

    def step(self, actions: Any):
        self._assert_open()
        return super().step(actions)

    def _call_one(self, index: int, name: str, *args: Any) -> Any:
        self._assert_open()
        if self._state != AsyncState.DEFAULT:
            raise TwiceError(f"cannot reach sub-env {index} while a {self._state.value} call is pending; wait for it first")
        pipe = self.parent_pipes[index]
        if pipe is None:
            raise TwiceError(f"the worker of sub-env {index} has shut down after an error; close this vector env")
        pipe.send(("_call", ("safe_call", (name, *args), {})))
        result, success = pipe.recv()
        if not success:
            self._raise_if_errors([i != index for i in range(self.num_envs)])
        return self._unpack(index, result)

    def protocol(self) -> Protocol:
        """The sub-envs' action protocol."""
        if self._protocol is None:
            self._protocol = self._call_one(0, "protocol")
        return self._protocol

    def close_extras(self, timeout: Optional[float] = None, terminate: bool = False) -> None:
        """Stop every worker within ``close_timeout`` seconds, terminating any that hang or died."""
        deadline = time.monotonic() + (self.close_timeout if timeout is None else float(timeout))
        pipes = [p for p in self.parent_pipes if p is not None and not p.closed]
        if self._state != AsyncState.DEFAULT:
            # A pending step/reset: its answer is in the pipe before our "close" reply.
            for pipe in pipes:
                try:
                    if pipe.poll(max(0.0, deadline - time.monotonic())):
                        pipe.recv()
                    else:
                        terminate = True
                except (EOFError, OSError):
                    pass
            self._state = AsyncState.DEFAULT
        if not terminate:
            for pipe in pipes:
                try:
                    pipe.send(("close", None))
                except (BrokenPipeError, OSError):
                    pass
            for pipe in pipes:
                try:
                    if pipe.poll(max(0.0, deadline - time.monotonic())):
                        pipe.recv()
                except (EOFError, OSError):
                    pass
        for pipe in pipes:
            pipe.close()
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.terminate()
                process.join(2.0)
            if process.is_alive():
                process.kill()
                process.join()

    def __repr__(self) -> str:
        return f"TextAsyncVectorEnv({self.env_id}, num_envs={self.num_envs})"


def make_vec(
    id: str,
    num_envs: int,
    vectorization_mode: str = "sync",
    *,
    seeds: Any = None,
    options: Optional[dict | Sequence[dict]] = None,
    autoreset_mode: str | AutoresetMode = "next_step",
    distinct_noise: bool = False,
    context: Optional[str] = None,
    close_timeout: float = 10.0,
    **kwargs: Any,
) -> TextSyncVectorEnv | TextAsyncVectorEnv:
    """A gymnasium vector env of ``num_envs`` copies of env ``id`` (see the module docstring).

    Args:
        id: a registered env id.
        num_envs: number of sub-envs (``>= 1``).
        vectorization_mode: ``"sync"`` (one process) or ``"async"`` (a worker process per sub-env).
        seeds: ``None``, an int ``s`` (seeds ``s, s+1, ...``) or one seed per sub-env: the
            first reset without a seed uses them, later episodes continue each stream.
        options: reset options of every reset that passes none: one dict, or one per sub-env.
        autoreset_mode: ``"next_step"`` (default), ``"same_step"`` or ``"disabled"``.
        distinct_noise: give sub-env ``i >= 1`` the noise seed ``derive_episode_seed(seed, i)``
            in every episode (unless the options name one), so sub-envs that share a seed
            (a GRPO group) still sample different turns; sub-env 0 keeps the plain episode.
        context: multiprocessing start method of the workers (``"fork"``, ``"spawn"``,
            ``"forkserver"``; default: the platform's).
        close_timeout: seconds ``close`` waits for workers before terminating them.
        **kwargs: passed to ``twice_envs.make(id, ...)`` for every sub-env.
    """
    from twice_envs.registry import spec as get_spec

    if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
        raise ValueError(f"num_envs must be a positive int, got {num_envs!r}")
    num_envs = int(num_envs)
    if vectorization_mode not in ("sync", "async"):
        raise ValueError(f"vectorization_mode must be 'sync' or 'async', got {vectorization_mode!r}")
    if isinstance(autoreset_mode, str):
        if autoreset_mode not in _AUTORESET:
            raise ValueError(f"autoreset_mode must be one of {', '.join(_AUTORESET)}, got {autoreset_mode!r}")
        autoreset_mode = _AUTORESET[autoreset_mode]
    seed_list = _seed_list(seeds, num_envs, "seeds")
    if options is None or isinstance(options, dict):
        option_list = [options] * num_envs
    else:
        option_list = list(options)
        if len(option_list) != num_envs or not all(o is None or isinstance(o, dict) for o in option_list):
            raise ValueError(f"options must be one dict or a list of {num_envs} dicts (one per sub-env)")
    if context is not None and context not in multiprocessing.get_all_start_methods():
        raise ValueError(f"context must be one of {multiprocessing.get_all_start_methods()}, got {context!r}")
    env_id = id.removeprefix("twice_envs/")
    if ":" in env_id:
        # gymnasium's "module:Env-v0" form: the module registers the id.
        module_name, _, env_id = env_id.rpartition(":")
        importlib.import_module(module_name)
    spec = get_spec(env_id)  # unknown ids raise here, with close matches
    fns = [
        _SubEnvFactory(
            env_id, spec.entry_point, dict(spec.kwargs), dict(kwargs), seed_list[i], num_envs, option_list[i],
            i if distinct_noise else 0,
        )
        for i in range(num_envs)
    ]
    if vectorization_mode == "sync":
        return TextSyncVectorEnv(fns, env_id, autoreset_mode)
    return TextAsyncVectorEnv(fns, env_id, autoreset_mode, context=context, close_timeout=close_timeout)
