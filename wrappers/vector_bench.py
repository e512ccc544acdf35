"""``twice bench vec``: the speed-up of async vector envs over sync ones.

For each env it steps ``make_vec(id, 2, "sync")`` and ``make_vec(id, 2, "async")``
(two worker processes) with the same scripted actions and the same seeds, and
prints the vector steps per second of each and their ratio, measured in the same
run. Async pays off when a step costs much more than the pipe round trip and the
CPUs are free to run the workers side by side: the ``Busy`` row (a step of fixed CPU
work, about 20 ms on an idle core) shows what the machine allows at the moment, the
``Echo`` row (a step that does nothing) the pure overhead of the pipes. The first
line and the last give the load average, since other processes take the same cores.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import time
from typing import Optional, Sequence

from twice_envs import progress
from twice_envs.core import Protocol, TextEnv

ECHO_ID = "TwiceBenchEcho-v0"
BUSY_ID = "TwiceBenchBusy-v0"
#: Short names of the synthetic envs on the command line.
SYNTHETIC = {"Echo": ECHO_ID, "Busy": BUSY_ID}
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


class BusyEnv(EchoEnv):
    """A step that does a fixed amount of CPU work (``rounds`` chained SHA-256 hashes).

    Fixed work, not a timed wait, so a crowded CPU slows it down as it would a real env.
    """

    def __init__(self, *, rounds: int = 40000, max_turns: Optional[int] = None) -> None:
        super().__init__(max_turns=max_turns)
        self.rounds = rounds

    def _step(self, action: str) -> tuple[str, float, bool, dict]:
        h = action.encode("utf-8")[:64]
        for _ in range(self.rounds):
            h = hashlib.sha256(h).digest()
        return h.hex()[:16], 0.0, False, {}


def _register_bench_envs() -> None:
    import twice_envs

    if ECHO_ID not in twice_envs.registry:
        twice_envs.register(ECHO_ID, "twice_envs.wrappers.vector_bench:EchoEnv", description="bench: no-op env")
    if BUSY_ID not in twice_envs.registry:
        twice_envs.register(BUSY_ID, "twice_envs.wrappers.vector_bench:BusyEnv", description="bench: fixed CPU work")


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
        # Warm-up, so both modes are timed in steady state (per-process game and index caches).
        for _ in range(max(1, (steps or 0) // 2)):
            _, _, _, _, infos = vec.step(_actions(infos, num_envs, rng))
        n = 0
        t1 = time.perf_counter()
        while (n < steps) if steps is not None else (time.perf_counter() - t1 < budget or n < 3):
            _, _, _, _, infos = vec.step(_actions(infos, num_envs, rng))
            n += 1
        return n, time.perf_counter() - t1, setup
    finally:
        vec.close()


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="twice bench vec", description="Steps per second of async vector envs against sync ones, and the speed-up."
    )
    parser.add_argument("--envs", nargs="+", default=["ALFWorld-v0", "SearchQA-v0", "Echo", "Busy"],
                        help="env ids to measure; 'Echo': a step that does nothing, "
                             "'Busy': a step of fixed CPU work (about 20 ms on an idle core)")
    parser.add_argument("--num-envs", type=int, default=2, help="sub-envs (= async workers)")
    parser.add_argument("--steps", type=int, default=None,
                        help="vector steps per measurement (default: as many as fit in the time budget)")
    parser.add_argument("--budget", type=float, default=None, help="seconds per measurement when --steps is not given")
    parser.add_argument("--repeats", type=int, default=None, help="measurements per mode (best is kept)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="few steps (a smoke run, noisier figures)")
    progress.add_argument(parser)
    args = parser.parse_args(list(argv or []))
    progress.apply(args)
    repeats = args.repeats or (1 if args.quick else 3)
    budget = args.budget or (0.5 if args.quick else 4.0)
    import twice_envs

    _register_bench_envs()
    print(f"twice bench vec: {args.num_envs} sub-envs, sync (1 process) vs async ({args.num_envs} workers), "
          f"{os.cpu_count()} CPUs, best of {repeats} interleaved runs, load average {os.getloadavg()[0]:.1f}")
    print(f"{'env':<16}{'steps':>7}{'sync steps/s':>15}{'async steps/s':>15}{'speed-up':>10}   setup sync/async (s)")
    status = 0
    for name in args.envs:
        env_id = SYNTHETIC.get(name, name)
        try:
            # Calibrate the step count on sync, then time both modes on exactly that many steps.
            steps = args.steps or _time_mode(env_id, "sync", args.num_envs, None, budget, args.seed)[0]
            runs: dict[str, list] = {"sync": [], "async": []}
            for _ in range(repeats):  # interleaved, so both modes see the same machine load
                for mode in runs:
                    runs[mode].append(_time_mode(env_id, mode, args.num_envs, steps, budget, args.seed))
            timing = {m: (min(r[1] for r in rs), min(r[2] for r in rs)) for m, rs in runs.items()}
        except (twice_envs.MissingExtra, twice_envs.TwiceError) as exc:
            print(f"{name:<16}  skipped: {exc}")
            continue
        sync_rate = steps / timing["sync"][0]
        async_rate = steps / timing["async"][0]
        print(f"{name:<16}{steps:>7}{sync_rate:>15.1f}{async_rate:>15.1f}{async_rate / sync_rate:>9.2f}x"
              f"   {timing['sync'][1]:.2f} / {timing['async'][1]:.2f}")
    print("steps/s counts vector steps (each steps every sub-env once, autoresets included); "
          f"speed-up = async / sync. Load average at the end: {os.getloadavg()[0]:.1f}")
    return status
