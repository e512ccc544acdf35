"""``twice bench alfworld``: step overhead against the raw engine, fork cost against loading, throughput.

All figures come from one run on one game (bundled by default, ``--data-dir`` for real
data), with baselines measured in the same run:

* **raw engine**: ALFWorld's text env as its own trainers build it
  (``textworld.start(game.tw-pddl, wrappers=[AlfredDemangler, AlfredInfos])``),
  measured twice: *plain* in a child process where nothing is cached (what ALFWorld
  costs out of the box), and *same engine* in this process, stepped in lockstep with
  ``ALFWorld-v0`` on the same actions (the engine shares our caches, so the
  difference is the wrapper: action parsing, records, digests). On a busy machine the
  per-action best of several runs is the stable figure; the wrapper's own cost is also
  timed directly with the engine's answer stored.
* **fork(t)** of an episode at turn t (reset a pooled engine, replay t actions,
  verify digests) against loading the game fresh in the plain engine.
* **steps/s** of random admissible episodes in 1 and 2 worker processes.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional, Sequence

from twice_envs import progress

#: The bundled game timed by default.
DEFAULT_GAME = "pick_two_obj_and_place-kitchen_a-train-0"

_RAW_SCRIPT = r"""
import json, sys, time
args = json.loads(sys.stdin.read())
from twice_envs.envs.alfworld import engine
if args["plain"]:
    engine.plain_engine()
engine._modules()
import textworld
from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
loads = []
for _ in range(args["loads"]):
    t = time.perf_counter()
    env = textworld.start(args["path"], infos, wrappers=[AlfredDemangler, AlfredInfos])
    env.reset()
    loads.append(time.perf_counter() - t)
steps = []
for _ in range(args["reps"]):
    env.reset()
    t = time.perf_counter()
    for a in args["actions"]:
        env.step(a)
    steps.append((time.perf_counter() - t) / len(args["actions"]))
print(json.dumps({"load_s": loads, "step_s": steps}))
"""


def _raw_in_child(path: str, actions: list[str], plain: bool, reps: int, loads: int) -> dict:
    payload = json.dumps({"path": path, "actions": actions, "plain": plain, "reps": reps, "loads": loads})
    proc = subprocess.run([sys.executable, "-c", _RAW_SCRIPT], input=payload, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"raw engine child failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _raw_env(path: str):
    """ALFWorld's text env as its trainers build it (with this process's engine caches)."""
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

    infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
    return textworld.start(path, infos, wrappers=[AlfredDemangler, AlfredInfos])


def _episode_actions(env, game: str, length: int, seed: int) -> list[str]:
    """``length`` admissible commands that cannot win (a deterministic random walk without "move")."""
    import numpy as np

    rng = np.random.default_rng(seed)
    _, info = env.reset(seed=0, options={"game": game})
    actions = []
    while len(actions) < length:
        options = [a for a in info["admissible_actions"] if not a.startswith("move ")]
        a = options[int(rng.integers(len(options)))]
        _, _, terminated, _, info = env.step(a)
        if terminated:  # a game won without "move": start the walk again
            return _episode_actions(env, game, length, seed + 1)
        actions.append(a)
    return actions


def _worker(args: tuple[int, float, dict, "mp.synchronize.Barrier", "mp.Queue"]) -> None:
    seed, seconds, kwargs, barrier, queue = args
    import numpy as np

    import twice_envs

    env = twice_envs.make("ALFWorld-v0", max_turns=10**6, **kwargs)
    rng = np.random.default_rng(seed)
    _, info = env.reset(seed=seed)
    env.step("look")  # warm: engine loaded
    barrier.wait()
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        adm = info["admissible_actions"]
        _, _, term, trunc, info = env.step(adm[int(rng.integers(len(adm)))])
        steps += 1
        if term or trunc:
            _, info = env.reset(seed=int(rng.integers(1 << 30)))
    queue.put((steps, time.perf_counter() - t0))


def _throughput(workers: int, seconds: float, kwargs: dict) -> float:
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(workers), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=((i, seconds, kwargs, barrier, queue),)) for i in range(workers)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    return sum(s / dt for s, dt in results)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="twice bench alfworld", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (few repetitions)")
    parser.add_argument("--reps", type=int, default=None, help="repetitions of each timing (default 7, quick 2)")
    parser.add_argument("--seconds", type=float, default=None, help="duration of each throughput run (default 10, quick 2)")
    parser.add_argument("--data-dir", default=None, help="time a game of real ALFWorld data (e.g. '$ALFWORLD_DATA')")
    parser.add_argument("--split", default="train", help="split of --data-dir (default train)")
    parser.add_argument("--game", default=None, help=f"game name (default: {DEFAULT_GAME}, or the first game of --data-dir)")
    parser.add_argument("--json", type=str, default=None, help="also write the figures to this file")
    progress.add_argument(parser)
    args = parser.parse_args(list(argv or []))
    progress.apply(args)
    reps = args.reps or (2 if args.quick else 7)
    seconds = args.seconds or (2.0 if args.quick else 10.0)

    import twice_envs
    from twice_envs.envs.alfworld.engine import POOL

    env = twice_envs.make("ALFWorld-v0", max_turns=10**7, data_dir=args.data_dir, split=args.split)
    game = args.game or (DEFAULT_GAME if args.data_dir is None else env.games[0])
    fig: dict = {"game": game, "reps": reps}
    length = 12 if args.quick else 30
    actions = _episode_actions(env, game, length, seed=1)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "game.tw-pddl")
        with open(path, "w") as fh:
            json.dump(env.game.as_json(), fh)
        plain = _raw_in_child(path, actions, plain=True, reps=max(1, reps // 2), loads=max(2, reps // 2))
        raw = _raw_env(path)

        # Same process, same engine, in lockstep: each action is timed on the raw env and
        # then on ours, so both see the same machine load; the difference is the wrapper.
        # The garbage collector is paused while timing (as timeit does), so that one side's
        # garbage is not collected on the other side's clock.
        def lockstep() -> tuple[list[float], list[float]]:
            raw.reset()
            env.reset(seed=0, options={"game": game})
            gc.collect()
            gc.disable()
            r, o = [], []
            for i, a in enumerate(actions):
                # alternate who goes first, so neither always inherits the other's disturbance
                first, second = (raw.step, env.step) if i % 2 == 0 else (env.step, raw.step)
                t0 = time.perf_counter()
                first(a)
                t1 = time.perf_counter()
                second(a)
                t2 = time.perf_counter()
                r.append(t1 - t0 if i % 2 == 0 else t2 - t1)
                o.append(t2 - t1 if i % 2 == 0 else t1 - t0)
            gc.enable()
            return r, o

        lockstep()  # warm both
        runs = [lockstep() for _ in range(reps)]
    plain_steps = plain["step_s"]
    # Per action: the best of the runs (the least disturbed by other processes) and the median.
    per_raw = list(zip(*(r for r, _ in runs)))
    per_ours = list(zip(*(o for _, o in runs)))
    raw_same = sum(min(x) for x in per_raw) / len(actions)
    ours_step = sum(min(x) for x in per_ours) / len(actions)
    med_same = sum(statistics.median(x) for x in per_raw) / len(actions)
    med_ours = sum(statistics.median(x) for x in per_ours) / len(actions)
    raw_plain = min(plain_steps)
    ours_runs = min(sum(o) / len(o) for _, o in runs)  # like the plain figure: best run's average
    fig.update(
        step_ms_raw_plain=raw_plain * 1e3,
        step_ms_raw_same_engine=raw_same * 1e3,
        step_ms_ours=ours_step * 1e3,
        wrapper_overhead=ours_step / raw_same - 1,
        wrapper_overhead_median=med_ours / med_same - 1,
        step_ms_ours_run_average=ours_runs * 1e3,
        speedup_vs_plain=raw_plain / ours_runs,
    )
    print(f"game {game}, {len(actions)} admissible non-winning actions, {reps} runs")
    print(f"step, raw ALFWorld (same engine, lockstep, best per action)  {raw_same * 1e3:7.2f} ms")
    print(f"step, ALFWorld-v0  (same engine, lockstep, best per action)  {ours_step * 1e3:7.2f} ms   "
          f"wrapper overhead {fig['wrapper_overhead']:+.1%} (with medians {fig['wrapper_overhead_median']:+.1%})")
    print(f"step, raw ALFWorld (plain engine, best run average)          {raw_plain * 1e3:7.2f} ms")
    print(f"step, ALFWorld-v0  (best run average)                        {ours_runs * 1e3:7.2f} ms   "
          f"{fig['speedup_vs_plain']:.1f}x faster than plain ALFWorld")

    # The wrapper alone: the same steps with the engine's step replaced by a stored answer.
    env.reset(seed=0, options={"game": game})
    engine = env.engine
    answer = env.step(actions[0])[0]
    engine.step = lambda command: answer  # instance attribute: this engine only, removed below
    n = 50 * len(actions)
    t0 = time.perf_counter()
    for i in range(n):
        env.step(actions[i % len(actions)])
    wrapper_alone = (time.perf_counter() - t0) / n
    del engine.step
    fig["wrapper_alone_us"] = wrapper_alone * 1e6
    fig["wrapper_alone_share"] = wrapper_alone / raw_same
    print(f"step, the wrapper alone (engine answer stored)             {wrapper_alone * 1e6:7.1f} us = "
          f"{fig['wrapper_alone_share']:.1%} of a raw step")

    # fork(t) against loading the game fresh
    load_plain = statistics.median(plain["load_s"])
    fig["load_fresh_s_plain"] = load_plain
    print(f"load game fresh (plain engine: new env, parse, translate, reset): {load_plain * 1e3:7.1f} ms")
    for t in sorted({0, min(10, length), length}):
        env.reset(seed=0, options={"game": game})
        for a in actions[:t]:
            env.step(a)
        env.fork(t)  # warm the pool
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            child = env.fork(t)
            times.append(time.perf_counter() - t0)
            del child
        med = statistics.median(times)
        fig[f"fork_{t}_ms"] = med * 1e3
        print(f"fork({t:2d}) by replay on a pooled engine:                     {med * 1e3:7.1f} ms   "
              f"= {med / load_plain:.2f}x a fresh load")
    fig["engines_created"], fig["engines_reused"] = POOL.created, POOL.reused
    print(f"engine pool: {POOL.created} library copies created, {POOL.reused} reuses")

    # throughput
    for workers in (1, 2):
        sps = _throughput(workers, seconds, {"data_dir": args.data_dir, "split": args.split})
        fig[f"steps_per_s_{workers}_workers"] = sps
        print(f"throughput, {workers} worker process{'es' if workers > 1 else ''}: {sps:7.1f} steps/s")
    print(f"(machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f})")
    if args.json:
        from twice_envs.trajectory import atomic_write_text

        atomic_write_text(args.json, json.dumps(fig, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
