"""ALFWorld-v0 under threads: one env per thread gives the same episodes as one thread.

The engine's parsers (tatsu parsers held in module globals of TextWorld) and its PDDL
translator (fast downward's, which rewrites ``sys.argv``, module options and
``sys.stdout``) are shared by every engine of a process. Unguarded, threads that reset at
the same time corrupt each other's parse (``IndexError: pop from empty list`` from
``tatsu/contexts.py``, wrong trees, even a crash). These tests run threads in a fresh
interpreter, so that the parse caches are cold, with a tiny switch interval, so that the
threads interleave inside the parsers, and compare every episode with the same seed
played by one thread.
"""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import twice_envs

pytest.importorskip("alfworld")
pytest.importorskip("fast_downward")

THREADS = 4

#: Arguments: output file, threads, episodes, steps, ``plain`` or ``cached``. Runs the
#: threads, each with its own env, each playing its episodes (a reset and ``steps``
#: admissible commands), and writes the digests and errors as JSON.
_SCRIPT = textwrap.dedent(
    """
    import json, sys, threading
    import twice_envs
    from twice_envs.envs.alfworld import engine

    out = sys.argv[1]
    threads, episodes, steps = (int(a) for a in sys.argv[2:5])
    plain = sys.argv[5] == "plain"
    if plain:
        engine.plain_engine()  # no parse caches: every reset parses and translates
    sys.setswitchinterval(1e-5)
    digests, errors = {}, []
    start = threading.Barrier(threads)

    def work(k):
        env = twice_envs.make("ALFWorld-v0")
        start.wait()
        for i in range(episodes):
            seed = 1000 * k + i
            try:
                _, info = env.reset(seed=seed)
                for s in range(steps):
                    acts = info["admissible_actions"]
                    _, _, term, trunc, info = env.step(acts[(i + s) % len(acts)])
                    if term or trunc:
                        break
                digests[str(seed)] = env.trajectory.digest
            except BaseException as exc:
                errors.append(f"thread {k} seed {seed}: {type(exc).__name__}: {exc}"[:400])
        env.close()

    workers = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    with open(out, "w") as fh:
        json.dump({"digests": digests, "errors": errors}, fh)
    """
)


def _serial_digests(seeds: list[int], steps: int) -> dict[str, str]:
    env = twice_envs.make("ALFWorld-v0")
    got = {}
    for seed in seeds:
        _, info = env.reset(seed=seed)
        i = seed % 1000
        for s in range(steps):
            acts = info["admissible_actions"]
            _, _, term, trunc, info = env.step(acts[(i + s) % len(acts)])
            if term or trunc:
                break
        got[str(seed)] = env.trajectory.digest
    env.close()
    return got


def _threads_in_fresh_process(tmp_path, episodes: int, steps: int, plain: bool) -> dict:
    out = tmp_path / "threads.json"
    mode = "plain" if plain else "cached"
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(out), str(THREADS), str(episodes), str(steps), mode],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    # The translator prints its progress; a thread that swapped sys.stdout under another
    # one can swallow or spill it, so only the exit status and the JSON file are read.
    assert proc.returncode == 0, f"the threaded run exited with {proc.returncode}: {proc.stderr[-2000:]}"
    return json.loads(out.read_text())


def _check_against_one_thread(result: dict, episodes: int, steps: int) -> None:
    failed = result["errors"]
    assert failed == [], f"{len(failed)} of {THREADS * episodes} episodes failed: {failed[:5]}"
    seeds = [1000 * k + i for k in range(THREADS) for i in range(episodes)]
    expected = _serial_digests(seeds, steps)
    wrong = [s for s in expected if result["digests"].get(s) != expected[s]]
    assert wrong == [], f"episodes played in threads differ from one thread for seeds {wrong[:10]}"


def test_threads_reset_and_step_with_cold_caches(tmp_path):
    """4 threads x 50 episodes, each thread its own env, in a fresh process (cold caches)."""
    episodes, steps = 50, 1
    result = _threads_in_fresh_process(tmp_path, episodes, steps, plain=False)
    _check_against_one_thread(result, episodes, steps)


def test_threads_with_the_plain_engine(tmp_path):
    """Without the parse and translation caches every reset parses and translates: the hardest case."""
    episodes, steps = 4, 1
    result = _threads_in_fresh_process(tmp_path, episodes, steps, plain=True)
    _check_against_one_thread(result, episodes, steps)


def test_the_engines_parsers_are_safe_under_threads():
    """The parsers the engine uses, called directly from threads with texts never parsed before."""
    twice_envs.make("ALFWorld-v0")  # sets the engine up in this process
    from textworld.envs.pddl import textgen
    from textworld.logic import Proposition, Rule

    def jobs(k: int):
        for i in range(60):
            name = f"t{k}x{i}"
            fact = f"at{name}(p: P, r{name}: r)"
            query = f"in{name}(o: o, c: c) & open{name}(c: c)"
            text = f"the {name} is #here#"
            yield (lambda fact=fact: str(Proposition.parse(fact))), fact
            yield (lambda query=query: str(Rule.parse_conjunctive_query(query))), None
            yield (lambda text=text: "".join(map(str, textgen._parse_and_convert(text, rule_name="symbols")))), None

    results: dict[int, list] = {}
    errors: list[str] = []

    def work(k: int) -> None:
        out = []
        for job, expect in jobs(k):
            try:
                text = job()
            except BaseException as exc:  # noqa: BLE001 -- reported below
                errors.append(f"thread {k}: {type(exc).__name__}: {exc}"[:300])
                continue
            if expect is not None and text != expect:
                errors.append(f"thread {k}: parsed {expect!r} as {text!r}")
            out.append(text)
        results[k] = out

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        workers = [threading.Thread(target=work, args=(k,)) for k in range(THREADS)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        sys.setswitchinterval(old)
    assert errors == [], errors[:5]
    # the same texts parsed by one thread
    for k in range(THREADS):
        assert results[k] == [job() for job, _ in jobs(k)]


def test_check_layout_threads_and_asyncio_with_four_workers():
    report = twice_envs.check_layout(
        "ALFWorld-v0", layouts=("thread", "asyncio"), workers=THREADS, episodes=12, num_steps=4, noise=True
    )
    assert report.layouts == ["serial", "thread", "asyncio"]


def _reset_in_child(queue) -> None:
    env = twice_envs.make("ALFWorld-v0")
    env.reset(seed=1)
    queue.put(env.trajectory.digest)


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork on this platform")
def test_a_fork_waits_for_a_thread_inside_the_engine():
    """A child forked while another thread holds the engine's lock would wait for it forever."""
    from twice_envs.envs.alfworld import engine

    expected = twice_envs.make("ALFWorld-v0")
    expected.reset(seed=1)
    held = threading.Event()

    def hold() -> None:
        with engine.LOCK:
            held.set()
            time.sleep(0.5)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_reset_in_child, args=(queue,))
    child.start()
    holder.join()
    try:
        assert queue.get(timeout=60) == expected.trajectory.digest
    finally:
        child.join(timeout=10)
        if child.is_alive():
            child.kill()
