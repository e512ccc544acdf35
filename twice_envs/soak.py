"""``twice bench soak``: memory, open files and threads of one env over a long run.

One env takes ``--steps`` actions; an episode that ends is followed by a reset (no seed:
the env's own generator continues, so the run is reproducible from ``--seed``), and
every ``--fork-every`` steps a fork at a random turn of the current episode takes up to
``--fork-steps`` actions and is closed. The actions are a deterministic mix drawn from
``--seed``: an admissible action where the env lists them (a ``<placeholder>`` in one,
as WebShop's ``search[<query>]``, is filled with words of the observation), otherwise
the env's own tags (``<search> words </search>`` for an env whose turns end at
``</search>``) and its final-answer action, plus a share of malformed turns.

The process is sampled at the start, at the end of the warm-up and at ``--samples``
evenly spaced points after it (each after a ``gc.collect()``): resident memory
(``/proc/self/status``, else psutil, else the peak from ``resource``), open file
descriptors (``/proc/self/fd``) and threads (``threading.active_count()`` and the
kernel's count), and the accounted size of the tool journals' memory layers. The
verdict compares the end with the end of the warm-up: RSS growth in % (target: at most
``--max-growth``, 5%) and MB per 1,000 steps (a least-squares slope over the samples
after the warm-up), file descriptors and threads flat. The journals' growth is also
reported, and the RSS growth beside it: a journal's memory layer is a cache that grows
until its byte cap, so a run shorter than that sees it grow; the verdict counts it.
The exit status is 0 when the verdict holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import sys
import threading
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np

import twice_envs
from twice_envs import progress
from twice_envs.tools import shared_journals
from twice_envs.trajectory import atomic_write_text

_WORD = re.compile(r"[A-Za-z][A-Za-z'-]{2,}")
_PLACEHOLDER = re.compile(r"<[^<>]*>")
_TAG = re.compile(r"^</([A-Za-z_][\w-]*)>$")
#: Malformed turns the driver writes now and then (bad actions never raise).
_MALFORMED = ("", "hello?", "<search>", "click[", "]]] [[[ nothing", "x" * 300)
MB = 1e6


# ---------------------------------------------------------------------- process probes
def rss_bytes() -> tuple[Optional[int], str]:
    """Resident memory of this process and where it was read (``/proc``, ``psutil`` or the
    peak from ``resource``, which cannot show memory given back)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024, "/proc/self/status"
    except OSError:
        pass
    try:
        import psutil  # optional: the bench extra installs it

        return int(psutil.Process().memory_info().rss), "psutil"
    except ImportError:
        pass
    try:
        import resource  # optional: a Unix-only module

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024), "resource (peak)"
    except ImportError:
        return None, "unavailable"


def open_fds() -> Optional[int]:
    """Open file descriptors of this process (``None`` where the system does not list them)."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(folder)) - 1  # the listing's own descriptor
        except OSError:
            continue
    return None


def os_threads() -> Optional[int]:
    """The kernel's thread count of this process (native threads included), where it is readable."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def sample(step: int, t0: float) -> dict:
    """One sample of the process: step, seconds, RSS bytes, open fds, Python and OS threads,
    and the accounted bytes of the process-wide tool journals' memory layers."""
    gc.collect()
    rss, _ = rss_bytes()
    return {
        "step": step, "seconds": round(time.perf_counter() - t0, 3), "rss_bytes": rss,
        "fds": open_fds(), "threads": threading.active_count(), "os_threads": os_threads(),
        "journal_bytes": sum(j.memory_bytes_used for j in shared_journals()),
    }


# ---------------------------------------------------------------------- the driver
class Driver:
    """Deterministic actions for any text env, from its contract only (see the module docstring).

    Args:
        rng: the generator every choice is drawn from.
        malformed: share of malformed turns.
        answer: share of final answers where the env has no admissible actions.
    """

    def __init__(self, rng: np.random.Generator, malformed: float = 0.05, answer: float = 0.2) -> None:
        self.rng, self.malformed, self.answer = rng, float(malformed), float(answer)

    def _words(self, text: str, lo: int = 1, hi: int = 4) -> str:
        words = _WORD.findall(text[-1000:]) or ["thing"]
        n = int(self.rng.integers(lo, hi + 1))
        return " ".join(words[int(i)].lower() for i in self.rng.integers(len(words), size=n))

    def __call__(self, env: Any, obs: str, info: dict) -> str:
        rng = self.rng
        if rng.random() < self.malformed:
            return _MALFORMED[int(rng.integers(len(_MALFORMED)))]
        actions = info.get("admissible_actions")
        if actions:
            action = str(actions[int(rng.integers(len(actions)))])
            return _PLACEHOLDER.sub(lambda _: self._words(obs), action)
        base = getattr(env, "unwrapped", env)
        if rng.random() < self.answer:
            return base.answer_action(self._words(obs, 1, 3))
        answer = base.answer_action("x")  # its tag ends the episode: answers are drawn above
        stops = [s.strip() for s in base.protocol().stop]
        tags = [m.group(1) for s in stops if (m := _TAG.match(s)) and s not in answer]
        if not tags:
            return self._words(obs)
        tag = tags[int(rng.integers(len(tags)))]
        return f"<think> {self._words(obs)} </think>\n<{tag}> {self._words(obs)} </{tag}>"


# ---------------------------------------------------------------------- the run
def run_soak(
    env_id: str,
    steps: int,
    *,
    warmup: Optional[int] = None,
    samples: int = 20,
    fork_every: int = 25,
    fork_steps: int = 3,
    seed: int = 0,
    env_kwargs: Optional[dict] = None,
    journal_memory_bytes: Optional[int] = None,
    progress: Optional[Callable[[str], None]] = None,
) -> dict:
    """Run the soak (see the module docstring) and return its samples and figures.

    ``warmup`` defaults to a fifth of ``steps``. The env is made and closed inside.
    ``journal_memory_bytes`` sets the byte cap of the process-wide tool journals (those
    of :func:`twice_envs.tools.shared_journal`) once the env is made.
    """
    if steps < 1 or samples < 1 or fork_every < 0 or fork_steps < 0:
        raise ValueError("steps and samples must be >= 1, fork_every and fork_steps >= 0")
    warmup = steps // 5 if warmup is None else int(warmup)
    if not 0 <= warmup < steps:
        raise ValueError(f"warmup must be in 0..{steps - 1}, got {warmup}")
    # the start is sampled before the loop (it is the warm-up's end when warmup is 0)
    marks = sorted({warmup, *(warmup + round((steps - warmup) * (i + 1) / samples) for i in range(samples))} - {0})
    t0 = time.perf_counter()
    points = [sample(0, t0)]
    env = twice_envs.make(env_id, **(env_kwargs or {}))
    if journal_memory_bytes is not None:
        for journal in shared_journals():
            journal.set_memory_limits(memory_bytes=journal_memory_bytes)
    rng = np.random.default_rng(seed)
    drive = Driver(rng)
    obs, info = env.reset(seed=seed)
    counts = {"episodes": 1, "forks": 0, "fork_actions": 0, "invalid": 0}
    next_mark = 0
    report_every = max(1, steps // 10)
    try:
        for step in range(1, steps + 1):
            obs, _, terminated, truncated, info = env.step(drive(env, obs, info))
            counts["invalid"] += bool(info.get("invalid"))
            if terminated or truncated:
                obs, info = env.reset()
                counts["episodes"] += 1
            if fork_every and step % fork_every == 0:
                child = env.fork(int(rng.integers(env.turn + 1)))
                c_obs, c_info = child.trajectory.observations[-1], child.last_info
                for _ in range(fork_steps):
                    if child.done:
                        break
                    c_obs, _, _, _, c_info = child.step(drive(child, c_obs, c_info))
                    counts["fork_actions"] += 1
                child.close()
                counts["forks"] += 1
            if next_mark < len(marks) and step == marks[next_mark]:
                points.append(sample(step, t0))
                next_mark += 1
            if progress is not None and step % report_every == 0:
                p = points[-1]
                rss = "-" if p["rss_bytes"] is None else f"{p['rss_bytes'] / MB:.1f}"
                progress(f"{env_id}: {step}/{steps} steps, RSS {rss} MB at step {p['step']}")
    finally:
        env.close()
    result = {
        "env": env_id, "env_kwargs": env_kwargs or {}, "steps": steps, "warmup": warmup, "seed": seed,
        "fork_every": fork_every, "fork_steps": fork_steps, "rss_source": rss_bytes()[1],
        "wall_s": round(time.perf_counter() - t0, 3), **counts, "samples": points,
    }
    result.update(figures(points, warmup))
    result["seconds_per_1000_steps"] = round(result["wall_s"] / steps * 1000, 3)
    result["journals"] = _journal_memory()
    return result


def _journal_memory() -> list[dict]:
    return [
        {"path": None if j.path is None else str(j.path), "entries": j.memory_entries,
         "bytes": j.memory_bytes_used, "cap": j.memory_bytes}
        for j in shared_journals()
    ]


def figures(points: list[dict], warmup: int) -> dict:
    """Growth after the warm-up, from samples as :func:`sample` returns them."""
    after = [p for p in points if p["step"] >= warmup]
    first, last = after[0], after[-1]
    out: dict[str, Any] = {}
    if first["rss_bytes"] and last["rss_bytes"]:
        growth = last["rss_bytes"] - first["rss_bytes"]
        span = max(1, last["step"] - first["step"])
        out.update(
            rss_start_mb=round(points[0]["rss_bytes"] / MB, 2),
            rss_warm_mb=round(first["rss_bytes"] / MB, 2),
            rss_end_mb=round(last["rss_bytes"] / MB, 2),
            rss_growth_mb=round(growth / MB, 3),
            rss_growth_pct=round(100.0 * growth / first["rss_bytes"], 3),
            rss_mb_per_1000_steps=round(growth / MB / span * 1000, 4),
        )
        if "journal_bytes" in first and "journal_bytes" in last:
            # the journals' memory layers are caches bounded by their caps: what grew beside them
            journal = last["journal_bytes"] - first["journal_bytes"]
            out.update(journal_growth_mb=round(journal / MB, 3),
                       rss_growth_beside_journals_mb=round((growth - journal) / MB, 3),
                       rss_growth_beside_journals_pct=round(100.0 * (growth - journal) / first["rss_bytes"], 3))
        if len(after) >= 3:
            x = np.array([p["step"] for p in after], float)
            y = np.array([p["rss_bytes"] for p in after], float) / MB
            out["rss_slope_mb_per_1000_steps"] = round(float(np.polyfit(x, y, 1)[0]) * 1000, 4)
    for name in ("fds", "threads", "os_threads"):
        values = [p[name] for p in after if p[name] is not None]
        if values:
            out[f"{name}_warm"], out[f"{name}_end"] = values[0], values[-1]
            out[f"{name}_flat"] = min(values) == max(values)
    return out


def verdict(result: dict, max_growth_pct: float = 5.0) -> dict[str, bool]:
    """Which targets hold: RSS growth after the warm-up, fds and threads flat."""
    checks = {"rss": result.get("rss_growth_pct", 0.0) <= max_growth_pct}
    for name in ("fds", "threads", "os_threads"):
        if f"{name}_flat" in result:
            checks[name] = bool(result[f"{name}_flat"])
    return checks


def table(result: dict) -> str:
    """The samples as a text table."""
    def show(v: Any) -> str:
        return "-" if v is None else str(v)

    rows = [f"{'step':>8} {'seconds':>9} {'RSS MB':>9} {'fds':>5} {'threads':>8} {'OS threads':>11}"]
    for p in result["samples"]:
        mark = "  <- end of warm-up" if p["step"] == result["warmup"] else ""
        rss = "-" if p["rss_bytes"] is None else f"{p['rss_bytes'] / MB:.1f}"
        rows.append(f"{p['step']:>8} {p['seconds']:>9.1f} {rss:>9} {show(p['fds']):>5} {p['threads']:>8} "
                    f"{show(p['os_threads']):>11}{mark}")
    return "\n".join(rows)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="twice bench soak", description=__doc__.splitlines()[0])
    parser.add_argument("--env", required=True, help="registered env id, e.g. SearchQA-v0")
    parser.add_argument("--steps", type=int, default=20_000, help="actions on the main env (default 20000)")
    parser.add_argument("--warmup", type=int, default=None, help="steps before growth is counted (default: a fifth)")
    parser.add_argument("--samples", type=int, default=20, help="samples after the warm-up (default 20)")
    parser.add_argument("--fork-every", type=int, default=25, help="fork every N steps (0: never; default 25)")
    parser.add_argument("--fork-steps", type=int, default=3, help="actions of a fork before it is closed (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kwargs", type=str, default=None, help='env kwargs as JSON, e.g. \'{"max_searches": 2}\'')
    parser.add_argument("--journal-memory-mb", type=float, default=None,
                        help="byte cap of the tool journals' memory layer, in MB (default: theirs, 32 MiB)")
    parser.add_argument("--max-growth", type=float, default=5.0,
                        help="RSS growth target after the warm-up, in %% (default 5)")
    parser.add_argument("--json", type=str, default=None, help="also write the samples and figures to this file")
    progress.add_argument(parser)
    args = parser.parse_args(list(argv or []))
    show = progress.apply(args)

    t_start = time.time()

    def log(message: str) -> None:
        if show:
            print(f"[bench soak {time.time() - t_start:5.0f}s] {message}", file=sys.stderr, flush=True)

    kwargs = json.loads(args.kwargs) if args.kwargs else None
    result = run_soak(
        args.env, args.steps, warmup=args.warmup, samples=args.samples, fork_every=args.fork_every,
        fork_steps=args.fork_steps, seed=args.seed, env_kwargs=kwargs, progress=log,
        journal_memory_bytes=None if args.journal_memory_mb is None else int(args.journal_memory_mb * MB),
    )
    checks = verdict(result, args.max_growth)
    result["verdict"] = checks
    result["max_growth_pct"] = args.max_growth

    r = result
    per_1000 = r["seconds_per_1000_steps"]
    print(f"{args.env}: {r['steps']} steps ({r['episodes']} episodes, {r['invalid']} invalid actions), "
          f"{r['forks']} forks with {r['fork_actions']} steps; warm-up {r['warmup']} steps; {r['wall_s']:.1f} s "
          f"({per_1000:.2f} s per 1,000 steps: 100,000 steps in about {per_1000 * 100 / 60:.1f} min); "
          f"RSS from {r['rss_source']}")
    print(table(r))
    if "rss_growth_pct" in r:
        slope = r.get("rss_slope_mb_per_1000_steps")
        print(f"RSS: {r['rss_start_mb']:.1f} MB at the start, {r['rss_warm_mb']:.1f} MB after the warm-up, "
              f"{r['rss_end_mb']:.1f} MB at the end: {r['rss_growth_mb']:+.2f} MB ({r['rss_growth_pct']:+.2f}%), "
              f"{r['rss_mb_per_1000_steps']:+.3f} MB per 1,000 steps"
              + (f" (fitted slope {slope:+.3f})" if slope is not None else ""))
    for j in r["journals"]:
        print(f"journal {j['path'] or '(memory)'}: {j['entries']} results in memory, "
              f"{j['bytes'] / MB:.2f} MB of its {j['cap'] / MB:.1f} MB cap")
    if r.get("journals") and "journal_growth_mb" in r:
        print(f"after the warm-up the journals' memory layers grew by {r['journal_growth_mb']:+.2f} MB (accounted; "
              f"they stop at their caps); the rest of the process by {r['rss_growth_beside_journals_mb']:+.2f} MB "
              f"({r['rss_growth_beside_journals_pct']:+.2f}%)")
    words = {True: "ok", False: "NOT MET"}
    parts = [f"RSS growth <= {args.max_growth:g}%: {words[checks['rss']]}"]
    for name, ok in checks.items():
        if name != "rss":
            parts.append(f"{name} flat ({r[name + '_warm']} -> {r[name + '_end']}): {words[ok]}")
    print("verdict: " + ", ".join(parts))
    if args.json:
        atomic_write_text(args.json, json.dumps(result, indent=1) + "\n")
        print(f"written: {args.json}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
