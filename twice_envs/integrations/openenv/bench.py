"""``twice bench serve``: load and faults of ``twice serve`` on the loopback, bounded in count and time.

    twice bench serve                                   # SearchQA-v0 and WebShop-v0, 64 sessions each
    twice bench serve --env SearchToy-v0 --sessions 8 --steps 4 --idle-timeout 1

For each env id, one run measures:

* **load** -- ``--sessions`` concurrent ``/ws`` sessions on one server, each stepping a scripted
  episode (``--steps`` steps, a new seed after each ended episode), against the same episodes stepped
  in this process one env after another: steps/s and the step latency p50/p99 of each, the served
  latency of one session alone (the step's own cost, no queue), and the ratio of the served p99 (one
  session; all sessions) to the in-process p99 plus the loopback round trip (a ``state`` message's
  p50); every served episode must give the in-process digests;
* **killed clients** -- ``--kill`` sessions dropped mid-episode without a close; after the idle
  timeout every slot must be free again: the leaked slots are the sessions a fresh client is refused;
* **restart** -- ``--kill`` sessions mid-episode export their records, the server stops, a new one
  starts, each record is restored on a new session: the digests must equal the ones before the
  restart, and one more step must give the in-process digest;
* **errors** -- any failure outside the bad requests the run sends on purpose (text that is not JSON,
  an unknown message type), which must each come back as an error frame with the session going on.

The server binds 127.0.0.1 only. Progress goes to stderr (``--no-progress`` hides it); the table to stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from contextlib import ExitStack
from typing import Optional, Sequence

import numpy as np

import twice_envs
from twice_envs import progress
from twice_envs._deps import require
from twice_envs.errors import TwiceError
from twice_envs.integrations.openenv.server import ServeConfig, ServerThread

_ws = require("websockets.sync.client", "openenv", "twice bench serve")

#: The scripted actions of each env's sessions, cycled through an episode.
SCRIPTS: dict[str, tuple[str, ...]] = {
    "SearchQA-v0": ("<search> who founded the bank </search>", "<search> headquarters town </search>",
                    "<answer> Kreman </answer>"),
    "WebShop-v0": ("search[red cotton shirt]", "click[next >]", "click[< prev]", "search[pillow covers]"),
    "SearchToy-v0": ("search q1", "search q5", "search q2", "answer"),
}


class BenchError(TwiceError, ValueError):
    """A setting the run cannot use, or a reply it cannot read (named in the message)."""


class Session:
    """One raw ``/ws`` session: send a message, read the reply; every reply's latency is kept."""

    def __init__(self, url: str) -> None:
        self._stack = ExitStack()
        self.ws = self._stack.enter_context(_ws.connect(url.replace("http://", "ws://", 1) + "/ws", open_timeout=30,
                                                        max_size=None))

    def ask(self, message: dict | str) -> dict:
        self.ws.send(message if isinstance(message, str) else json.dumps(message))
        return json.loads(self.ws.recv(timeout=60))

    def call(self, kind: str, data: Optional[dict] = None) -> dict:
        reply = self.ask({"type": kind, **({"data": data} if data is not None else {})})
        if reply.get("type") == "error":
            raise BenchError(f"{kind} failed: {reply['data']}")
        return reply["data"]

    def drop(self) -> None:
        """Vanish as a killed client does: the TCP connection ends without a close frame."""
        self.ws.socket.close()


def _play(env_id: str, seed: int, steps: int):
    """In-process: ``(latencies, digests after each step)`` of the scripted episode(s) of ``seed``."""
    script, env = SCRIPTS[env_id], twice_envs.make(env_id)
    env.reset(seed=seed)
    lat, digests, turn = [], [], 0
    for i in range(steps):
        if env.done:
            seed, turn = seed + 1000, 0
            env.reset(seed=seed)
        start = time.perf_counter()
        info = env.step(script[turn % len(script)])[4]
        lat.append(time.perf_counter() - start)
        digests.append(info["digest"])
        turn += 1
    env.close()
    return lat, digests


def _served_session(url: str, env_id: str, first: int, steps: int, out: dict, errors: list) -> None:
    script, lat, digests, turn, seed = SCRIPTS[env_id], [], [], 0, first
    try:
        s = Session(url)
        done = s.call("reset", {"seed": seed})["done"]
        for i in range(steps):
            if done:
                seed, turn = seed + 1000, 0
                s.call("reset", {"seed": seed})
            start = time.perf_counter()
            data = s.call("step", {"text": script[turn % len(script)]})
            lat.append(time.perf_counter() - start)
            digests.append(data["metadata"]["digest"])
            done, turn = data["done"], turn + 1
        s.ws.close()
    except Exception as exc:  # noqa: BLE001 -- counted and reported, never hidden
        errors.append(f"session {first}: {type(exc).__name__}: {exc}")
    out[first] = (lat, digests)


def _pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1e3 if len(values) else float("nan")


def _bad_requests(url: str) -> int:
    """Send the deliberate bad requests; return how many did NOT come back as a clear error frame."""
    s = Session(url)
    unclear = int(s.ask("{not json").get("type") != "error")
    s.call("reset", {"seed": 1})
    unclear += int(s.ask({"type": "nonsense"}).get("type") != "error")
    unclear += int(s.call("state")["turn"] != 0)  # the session survived both
    s.ws.close()
    return unclear


def _free_slots(url: str, n: int) -> int:
    """How many of ``n`` fresh sessions the server accepts (each opened and held, then closed)."""
    held, accepted = [], 0
    for i in range(n):
        s = Session(url)
        reply = s.ask({"type": "reset", "data": {"seed": i}})
        held.append(s)
        accepted += int(reply.get("type") == "observation")
    for s in held:
        s.ws.close()
    return accepted


def _load(url: str, env_id: str, sessions: int, steps: int, errors: list) -> dict:
    """The loopback round trip, one session alone, then ``sessions`` at once (one thread each)."""
    probe, rtt = Session(url), []
    probe.call("reset", {"seed": 0})
    for _ in range(50):
        start = time.perf_counter()
        probe.call("state")
        rtt.append(time.perf_counter() - start)
    probe.ws.close()
    alone: dict = {}
    _served_session(url, env_id, 0, steps, alone, errors)  # the step's own cost, no queue
    out: dict = {}
    threads = [threading.Thread(target=_served_session, args=(url, env_id, seed, steps, out, errors))
               for seed in range(sessions)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    return {"rtt": rtt, "alone": alone.get(0, ([], []))[0], "out": out, "wall": time.perf_counter() - start}


def _leaked_after_kills(url: str, env_id: str, sessions: int, kill: int, idle: float) -> int:
    """Drop ``kill`` clients mid-episode, wait out the idle timeout, count the slots still held."""
    for i in range(kill):
        s = Session(url)
        s.call("reset", {"seed": i})
        s.call("step", {"text": SCRIPTS[env_id][0]})
        s.drop()
    time.sleep(idle + 1.5)
    return sessions - _free_slots(url, sessions)


def _restored_after_restart(config: ServeConfig, states: list, errors: list) -> int:
    """Restore each exported state on a new server; count those with the same digests, then and a step on."""
    restored = 0
    with ServerThread(config) as url:
        for i, state in enumerate(states):
            try:
                s = Session(url)
                data = s.call("reset", {"restore": state["record"]})
                after = s.call("step", {"text": SCRIPTS[config.env_id][1]})["metadata"]["digest"]
                s.ws.close()
            except Exception as exc:  # noqa: BLE001 -- counted and reported, never hidden
                errors.append(f"restore {i}: {type(exc).__name__}: {exc}")
                continue
            expected = _play_from(config.env_id, 100 + i)
            restored += int(data["metadata"]["digest"] == state["digest"] and after == expected)
    return restored


def bench_env(env_id: str, *, sessions: int, steps: int, kill: int, idle: float, bar) -> dict:
    """One env id's row: load, killed clients, restart, errors (see the module docstring)."""
    errors: list[str] = []
    inproc = [_play(env_id, seed, steps) for seed in range(sessions)]
    in_lat = [x for lat, _ in inproc for x in lat]
    bar.update()
    config = ServeConfig(env_id, host="127.0.0.1", port=0, max_sessions=sessions, session_timeout=idle)
    with ServerThread(config) as url:
        load = _load(url, env_id, sessions, steps, errors)
        bar.update()
        same = all(load["out"].get(seed, (None, None))[1] == inproc[seed][1] for seed in range(sessions))
        unclear = _bad_requests(url)
        leaked = _leaked_after_kills(url, env_id, sessions, kill, idle)
        bar.update()
        states = []
        for i in range(kill):  # sessions mid-episode when the server goes down
            s = Session(url)
            s.call("reset", {"seed": 100 + i})
            s.call("step", {"text": SCRIPTS[env_id][0]})
            states.append(s.call("state"))
            s.drop()
    restored = _restored_after_restart(config, states, errors)
    bar.update()
    lat = [x for lat, _ in load["out"].values() for x in lat]
    return {"env": env_id, "sessions": sessions, "steps": len(lat),
            "in_sps": len(in_lat) / sum(in_lat), "sps": len(lat) / load["wall"],
            "in_p50": _pct(in_lat, 50), "in_p99": _pct(in_lat, 99), "p50": _pct(lat, 50), "p99": _pct(lat, 99),
            "p50_1": _pct(load["alone"], 50), "p99_1": _pct(load["alone"], 99),
            "rtt": statistics.median(load["rtt"]) * 1e3, "same": same, "leaked": leaked,
            "restored": f"{restored}/{kill}", "errors": len(errors) + unclear, "error_lines": errors[:5]}


def _play_from(env_id: str, seed: int) -> str:
    env = twice_envs.make(env_id)
    env.reset(seed=seed)
    env.step(SCRIPTS[env_id][0])
    return env.step(SCRIPTS[env_id][1])[4]["digest"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="twice bench serve", description="Load and faults of twice serve on the "
                                "loopback: concurrent sessions against in-process stepping, killed clients, a "
                                "restart restored by replay, errors.")
    p.add_argument("--env", action="append", metavar="ID", help=f"env id, repeatable (one of {sorted(SCRIPTS)}; "
                   "default: SearchQA-v0 and WebShop-v0)")
    p.add_argument("--sessions", type=int, default=64, help="concurrent sessions (default 64)")
    p.add_argument("--steps", type=int, default=20, help="steps per session (default 20)")
    p.add_argument("--kill", type=int, default=8, help="sessions killed, and sessions restored (default 8)")
    p.add_argument("--idle-timeout", type=float, default=2.0, metavar="S", help="the server's idle timeout")
    progress.add_argument(p)
    return p


def main(argv: Sequence[str] = ()) -> int:
    """``twice bench serve``: print one row per env id."""
    args = parser().parse_args(argv)
    progress.apply(args)
    envs = args.env or ["SearchQA-v0", "WebShop-v0"]
    for env_id in envs:
        if env_id not in SCRIPTS:
            raise BenchError(f"--env {env_id!r} has no scripted episode; choose from {sorted(SCRIPTS)}")
    for name, low, high in (("sessions", 1, 256), ("steps", 1, 1000), ("kill", 1, args.sessions)):
        value = getattr(args, name)
        if not low <= value <= high:
            raise BenchError(f"--{name} must be in {low}..{high}, got {value}")
    if not 0.2 <= args.idle_timeout <= 60:
        raise BenchError(f"--idle-timeout must be in 0.2..60 s, got {args.idle_timeout}")
    rows = []
    with progress.Progress("bench serve", total=4 * len(envs), unit="phases") as bar:
        for env_id in envs:
            rows.append(bench_env(env_id, sessions=args.sessions, steps=args.steps, kill=args.kill,
                                  idle=args.idle_timeout, bar=bar))
    head = ("env", "sessions", "steps", "steps/s served", "steps/s in-proc", "p50/p99 ms served",
            "p50/p99 ms served, 1 session", "p50/p99 ms in-proc", "rtt ms", "p99 / (in-proc p99 + rtt): 1 session",
            "the same, all sessions", "same digests", "leaked slots", "restored", "errors")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        base = r["in_p99"] + r["rtt"]
        print(f"| {r['env']} | {r['sessions']} | {r['steps']} | {r['sps']:.0f} | {r['in_sps']:.0f} | "
              f"{r['p50']:.2f} / {r['p99']:.2f} | {r['p50_1']:.2f} / {r['p99_1']:.2f} | "
              f"{r['in_p50']:.2f} / {r['in_p99']:.2f} | {r['rtt']:.2f} | {r['p99_1'] / base:.1f}x | "
              f"{r['p99'] / base:.1f}x | "
              f"{'yes' if r['same'] else 'NO'} | {r['leaked']} | {r['restored']} | {r['errors']} |")
        for line in r["error_lines"]:
            print(f"  error: {line}")
    return 0 if all(r["same"] and r["leaked"] == 0 and not r["errors"] for r in rows) else 1
