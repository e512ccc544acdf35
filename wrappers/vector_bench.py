"""``twice bench vec``: the speed-up of async vector envs over sync ones.

For each env it steps ``make_vec(id, 2, "sync")`` and ``make_vec(id, 2, "async")``
(two worker processes) with the same scripted actions and the same seeds, and
prints the vector steps per second of each and their ratio, measured in the same
run. Async pays off when a step costs more than the pipe round trip (ALFWorld, tens
of ms a step); for a cheap env the pipes cost more than they save, which the
``Echo`` row (a step that does nothing) shows as pure overhead.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from typing import Optional, Sequence

from twice_envs.core import Protocol, TextEnv

ECHO_ID = "TwiceBenchEcho-v0"
#: Free-text actions for envs without an action list (searches, then malformed text).
FREE_TEXT = ("<search> history of the old city </search>", "<search> who wrote the novel </search>", "look")


class EchoEnv(TextEnv):
    """A step that does nothing: the pipe and batching overhead alone."""

    version = "1"
    default_max_turns = 1000

    def protocol(self) -> Protocol:
        return Protocol("Say anything.")

    def _reset(self, options: dict) -> tuple[str, dict]:
        return "ready", {}

    def _step(self, action: str) -> tuple[str, float, bool, dict]:
        return action[:64], 0.0, False, {}


def _register_echo() -> None:
    import twice_envs

    if ECHO_ID not in twice_envs.registry:
        twice_envs.register(ECHO_ID, "twice_envs.wrappers.vector_bench:EchoEnv", description="bench: no-op env")


def _actions(infos: dict, n: int, rng: random.Random) -> tuple[str, ...]:
    out = []
    for i in range(n):
        listed = infos["admissible_actions"][i] if "admissible_actions" in infos and infos["_admissible_actions"][i] else None
        out.append(rng.choice(list(listed)) if listed else rng.choice(FREE_TEXT))
    return tuple(out)


def _time_mode(env_id: str, mode: str, num_envs: int, steps: Optional[int], budget: float, seed: int):
    """(vector steps run, their seconds, seconds to build and reset).

    With ``steps=None`` it steps until ``budget`` seconds have passed (calibration).
    """
    import twice_envs

    t0 = time.perf_counter()
    vec = twice_envs.make_vec(env_id, num_envs, mode, seeds=seed)
    try:
        _, infos = vec.reset()
        setup = time.perf_counter() - t0
        rng = random.Random(seed)
        _, _, _, _, infos = vec.step(_actions(infos, num_envs, rng))  # warm-up: first-step caches
        n = 0
        t1 = time.perf_counter()
        while (n < steps) if steps is not None else (time.perf_counter() - t1 < budget or n < 3):
            _, _, _, _, infos = vec.step(_actions(infos, num_envs, rng))
            n += 1
        return n, time.perf_counter() - t1, setup
    finally:
        vec.close()


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="twice bench vec", description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", default=["ALFWorld-v0", "SearchQA-v0", "Echo"],
                        help="env ids to measure ('Echo' = a step that does nothing)")
    parser.add_argument("--num-envs", type=int, default=2, help="sub-envs (= async workers)")
    parser.add_argument("--steps", type=int, default=None,
                        help="vector steps per measurement (default: as many as fit in the time budget)")
    parser.add_argument("--budget", type=float, default=None, help="seconds per measurement when --steps is not given")
    parser.add_argument("--repeats", type=int, default=None, help="measurements per mode (best is kept)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="few steps (a smoke run, noisier figures)")
    args = parser.parse_args(list(argv or []))
    repeats = args.repeats or (1 if args.quick else 3)
    budget = args.budget or (0.5 if args.quick else 4.0)
    import twice_envs

    _register_echo()
    print(f"twice bench vec: {args.num_envs} sub-envs, sync (1 process) vs async ({args.num_envs} workers), "
          f"{os.cpu_count()} CPUs, best of {repeats}")
    print(f"{'env':<16}{'steps':>7}{'sync steps/s':>15}{'async steps/s':>15}{'speed-up':>10}   setup sync/async (s)")
    status = 0
    for name in args.envs:
        env_id = ECHO_ID if name == "Echo" else name
        try:
            # Calibrate the step count on sync, then time both modes on exactly that many steps.
            steps = args.steps or _time_mode(env_id, "sync", args.num_envs, None, budget, args.seed)[0]
            timing = {}
            for mode in ("sync", "async"):
                runs = [_time_mode(env_id, mode, args.num_envs, steps, budget, args.seed) for _ in range(repeats)]
                timing[mode] = (min(r[1] for r in runs), min(r[2] for r in runs))
        except (twice_envs.MissingExtra, twice_envs.TwiceError) as exc:
            print(f"{name:<16}  skipped: {exc}")
            continue
        sync_rate = steps / timing["sync"][0]
        async_rate = steps / timing["async"][0]
        print(f"{name:<16}{steps:>7}{sync_rate:>15.1f}{async_rate:>15.1f}{async_rate / sync_rate:>9.2f}x"
              f"   {timing['sync'][1]:.2f} / {timing['async'][1]:.2f}")
    print("steps/s counts vector steps (each steps every sub-env once); speed-up = async / sync.")
    return status
