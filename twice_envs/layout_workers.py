"""Episodes played in workers for :func:`~twice_envs.layout.check_layout`, and the pools that run them.

A :class:`_Job` is one worker's share of the episodes: make the env once by id, play the
episodes in order, and return one :class:`_Outcome` per episode (its record, the keyed
noise drawn at each turn with a :class:`NoiseProbe`, or the error with its traceback).
The same job runs in a process pool (``fork`` or ``spawn``; a ``spawn`` pool is kept
between calls until :func:`close_pools`), in a thread pool whose threads start together,
or on an event loop that moves each env call to a thread.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures as cf
import hashlib
import multiprocessing
import pickle
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np

from twice_envs.keys import NoiseKey
from twice_envs.noise import gumbel_np, key_rows, keyed_sample_np, philox_words_np
from twice_envs.registry import make, register, registry



@dataclass(frozen=True)
class NoiseProbe:
    """The grid of noise keys drawn per turn, and the draws made at each key.

    For the key base ``(episode_seed, turn, 0)`` the env reports before each action, the
    keys are ``(episode_seed, turn, b, l, p)`` for ``b < branches``, ``l < lines``,
    ``p < positions``; at each key the Philox words and Gumbel noise of token ids
    ``0 .. vocab_size - 1`` and the keyed argmax over fixed logits (``temperature``,
    ``top_p``) are drawn.
    """

    branches: int = 2
    lines: int = 2
    positions: int = 4
    vocab_size: int = 64
    temperature: float = 0.8
    top_p: float = 0.9

    def __post_init__(self) -> None:
        for name in ("branches", "lines", "positions", "vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"NoiseProbe.{name} must be a positive int, got {value!r}")

    @property
    def keys_per_turn(self) -> int:
        return self.branches * self.lines * self.positions



# --------------------------------------------------------------------------- episodes (run in workers)


@dataclass(frozen=True)
class _Episode:
    index: int
    seed: int
    options: Optional[dict]
    actions: tuple[str, ...]


@dataclass(frozen=True)
class _Job:
    """One worker's share: make the env once, play the episodes in order (picklable)."""

    env_id: str
    kwargs: dict
    episodes: tuple[_Episode, ...]
    noise: Optional[NoiseProbe]
    #: ``(entry_point, kwargs, max_episode_steps)`` of the id's spec, to register it in a
    #: worker that does not know it (a spawned one, for an id registered at run time).
    spec: Optional[tuple] = None


@dataclass
class _Outcome:
    index: int
    record: Optional[dict] = None
    noise: Optional[list] = None
    error: Optional[str] = None


def _new_env(job: _Job) -> Any:
    if job.env_id not in registry and job.spec is not None:
        entry_point, spec_kwargs, max_episode_steps = job.spec
        register(job.env_id, entry_point, kwargs=spec_kwargs, max_episode_steps=max_episode_steps, override=True)
    return make(job.env_id, **job.kwargs)


def _shippable_spec(env_id: str) -> Optional[tuple]:
    """The spec of ``env_id`` as :class:`_Job` carries it, or ``None`` if its entry point cannot be pickled."""
    spec = registry.get(env_id)
    if spec is None:
        return None
    shipped = (spec.entry_point, dict(spec.kwargs), spec.max_episode_steps)
    try:
        pickle.dumps(shipped)
    except Exception:  # noqa: BLE001 -- a class defined inside a function: workers must know the id
        return None
    return shipped


def _noise_draws(keys: Sequence[NoiseKey], probe: NoiseProbe) -> list:
    """Per turn: ``[key base, sha256 of the words, Gumbel noise and keyed argmax drawn over the probe grid]``."""
    logits = np.cos(np.arange(probe.vocab_size, dtype=np.float64) * 0.7) * 3.0
    out = []
    for base in keys:
        grid = [
            NoiseKey(base.episode_seed, base.turn, b, line, pos)
            for b in range(probe.branches)
            for line in range(probe.lines)
            for pos in range(probe.positions)
        ]
        rows = key_rows(grid)
        words = philox_words_np(rows, probe.vocab_size)
        gumbel = gumbel_np(rows, probe.vocab_size)
        block = np.broadcast_to(logits, (len(grid), probe.vocab_size))
        tokens = keyed_sample_np(block, rows, probe.temperature, probe.top_p)
        h = hashlib.sha256()
        for part in (words.astype("<u4"), gumbel.astype("<f8"), tokens.astype("<i8")):
            h.update(np.ascontiguousarray(part).tobytes())
        out.append([base.to_json(), h.hexdigest()])
    return out


def _outcome(env: Any, ep: _Episode, keys: list, probe: Optional[NoiseProbe]) -> _Outcome:
    base = getattr(env, "unwrapped", env)
    return _Outcome(ep.index, base.trajectory.to_json(), _noise_draws(keys, probe) if probe else None)


def _failure(ep: _Episode, exc: BaseException) -> _Outcome:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return _Outcome(ep.index, error=f"{type(exc).__name__}: {exc}\n{tb[-3000:]}")


def _play(env: Any, ep: _Episode, probe: Optional[NoiseProbe]) -> _Outcome:
    try:
        env.reset(seed=ep.seed, options=ep.options)
        base = getattr(env, "unwrapped", env)
        keys = []
        for action in ep.actions:
            keys.append(base.noise_key())
            env.step(action)
        return _outcome(env, ep, keys, probe)
    except Exception as exc:  # noqa: BLE001 -- reported by the caller with the episode
        return _failure(ep, exc)


def _play_job(job: _Job, start: Optional[Callable[[], Any]] = None) -> list[_Outcome]:
    """Make the env, play the job's episodes on it, close it (a worker's whole task)."""
    try:
        env = _new_env(job)
    except Exception as exc:  # noqa: BLE001
        return [_failure(ep, exc) for ep in job.episodes]
    try:
        if start is not None:
            start()
        return [_play(env, ep, job.noise) for ep in job.episodes]
    finally:
        env.close()


async def _play_job_async(job: _Job) -> list[_Outcome]:
    """:func:`_play_job` with every env call in ``asyncio.to_thread`` (the env hops between threads)."""
    try:
        env = await asyncio.to_thread(_new_env, job)
    except Exception as exc:  # noqa: BLE001
        return [_failure(ep, exc) for ep in job.episodes]
    out = []
    try:
        for ep in job.episodes:
            try:
                await asyncio.to_thread(env.reset, seed=ep.seed, options=ep.options)
                base = getattr(env, "unwrapped", env)
                keys = []
                for action in ep.actions:
                    keys.append(base.noise_key())
                    await asyncio.to_thread(env.step, action)
                out.append(await asyncio.to_thread(_outcome, env, ep, keys, job.noise))
            except Exception as exc:  # noqa: BLE001
                out.append(_failure(ep, exc))
    finally:
        await asyncio.to_thread(env.close)
    return out


# --------------------------------------------------------------------------- pools (run here)

_POOLS: dict[tuple[str, int], cf.ProcessPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def close_pools() -> None:
    """End the process pools :func:`check_layout` keeps between calls (the ``spawn`` layout's)."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool in pools:
        pool.shutdown(wait=True, cancel_futures=True)


atexit.register(close_pools)


def _drop_pool(pool: cf.ProcessPoolExecutor) -> None:
    """Forget a pool that failed and stop its workers (one may hang in native code)."""
    with _POOLS_LOCK:
        for key in [k for k, p in _POOLS.items() if p is pool]:
            del _POOLS[key]
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in processes:
        if proc.is_alive():
            proc.terminate()


def _process_pool(method: str, workers: int) -> tuple[cf.ProcessPoolExecutor, bool]:
    """A pool of ``workers`` processes started with ``method``; whether it is kept for later calls."""
    context = multiprocessing.get_context(method)  # ValueError where the platform lacks it
    if method != "spawn":
        return cf.ProcessPoolExecutor(max_workers=workers, mp_context=context), False
    with _POOLS_LOCK:
        pool = _POOLS.get((method, workers))
        if pool is None:
            pool = _POOLS[(method, workers)] = cf.ProcessPoolExecutor(max_workers=workers, mp_context=context)
    return pool, True


def _results(futures: list[cf.Future], timeout_s: float) -> list[_Outcome]:
    """The outcomes of every future, in order, all within ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    return [o for f in futures for o in f.result(timeout=max(0.1, deadline - time.monotonic()))]


def _run_processes(method: str, jobs: list[_Job], workers: int, timeout_s: float) -> list[_Outcome]:
    pool, kept = _process_pool(method, workers)
    ok = False
    try:
        outcomes = _results([pool.submit(_play_job, job) for job in jobs], timeout_s)
        ok = True
        return outcomes
    finally:
        if not ok:
            _drop_pool(pool)
        elif not kept:
            pool.shutdown(wait=True)


def _run_threads(jobs: list[_Job], workers: int, timeout_s: float) -> list[_Outcome]:
    barrier = threading.Barrier(len(jobs))

    def start() -> None:
        try:
            barrier.wait(timeout=timeout_s)
        except threading.BrokenBarrierError:
            pass  # a worker that failed to make its env: the rest go on

    pool = cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="check_layout")
    try:
        outcomes = _results([pool.submit(_play_job, job, start) for job in jobs], timeout_s)
    except BaseException:
        barrier.abort()
        pool.shutdown(wait=False, cancel_futures=True)  # a thread stuck in an env cannot be stopped
        raise
    pool.shutdown(wait=True)
    return outcomes


def _run_asyncio(jobs: list[_Job], timeout_s: float) -> list[_Outcome]:
    async def main() -> list[_Outcome]:
        results = await asyncio.wait_for(asyncio.gather(*(_play_job_async(job) for job in jobs)), timeout_s)
        return [o for r in results for o in r]

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    # Called from inside a running event loop (a notebook): run a loop of our own in a thread.
    with cf.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, main()).result()
