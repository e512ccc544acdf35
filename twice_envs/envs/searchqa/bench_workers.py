"""The worker-memory figure of ``twice bench searchqa``: W worker processes, each making SearchQA-v0
over the cached index and answering the bench's queries, measured together (RSS, PSS, USS).

Workers start by spawn, or fork from one forkserver that has imported their modules
(:data:`FORKSERVER_PRELOAD`) and, optionally, made the env once and frozen its heap
(:func:`twice_envs.workers.preload_forkserver`); the server's own PSS is then counted too.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from multiprocessing import forkserver

from twice_envs._procmem import memory
from twice_envs.workers import ENV_VAR, forkserver_pid, preload_forkserver, stop_forkserver

#: The modules a worker imports (its own, the env's and what making the env imports), which
#: ``--start-method forkserver`` has the forkserver import once; a missing optional one
#: (the forkserver skips a module that fails to import) is then imported by each worker.
FORKSERVER_PRELOAD = ("numpy", "Stemmer", "bm25s.stopwords", "twice_envs.envs.searchqa.env",
                      "twice_envs.envs.searchqa.bench_workers")


def _worker(conn, env_kwargs: dict, queries: list, k: int, load: bool) -> None:
    """A worker process (see :func:`run_workers`): make the env, answer the queries, report, wait for the parent."""
    try:
        modules_at_start = len(sys.modules)
        # imported here, not at the top: what a worker imports itself is part of what is measured
        import twice_envs
        import twice_envs.envs.searchqa.env  # noqa: F401  (the imports count in every worker)
        from twice_envs.envs.searchqa import resources

        out: dict = {"resources_cached": len(resources._CACHE)}  # found loaded (a preloading forkserver's)
        if load:
            t0 = time.perf_counter()
            env = twice_envs.make("SearchQA-v0", **env_kwargs)
            env.reset(seed=0)
            env.step(f"<search> {queries[0]} </search>")  # the env's own search path once
            out["make_s"] = time.perf_counter() - t0
            retriever = env.resources.retriever
            t0 = time.perf_counter()
            out["hits"] = sum(len(retriever.search(q, k)[0]) for q in queries)
            out["queries_s"] = time.perf_counter() - t0
        out["modules_imported"] = len(sys.modules) - modules_at_start  # by the worker itself, not found loaded
        conn.send(out)
    except BaseException as exc:  # the parent reports it
        conn.send({"error": f"{type(exc).__name__}: {exc}"})
        raise
    conn.recv()  # stay alive (and mapped) until the parent has measured every worker


def parent_pid(pid: int) -> int | None:
    """The parent's pid of a process (``/proc/PID/stat``), or None where it is not readable."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def run_workers(w: int, env_kwargs: dict, queries: list, k: int, load: bool = True,
                 start_method: str = "spawn") -> dict:
    """Start ``w`` worker processes (spawn, or forked by the forkserver) at once; when all have
    made the env and answered the queries, read their memory together (RSS, PSS, USS) and,
    with the forkserver, the server's at the same time, then let them exit."""
    ctx = multiprocessing.get_context(start_method)
    procs, conns = [], []
    server = None
    try:
        for _ in range(w):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(child, env_kwargs, queries, k, load), daemon=True)
            p.start()
            child.close()
            procs.append(p)
            conns.append(parent)
        reports = []
        for p, c in zip(procs, conns):
            try:
                r = c.recv()
            except EOFError:
                r = {"error": f"exited with {p.exitcode}"}
            if "error" in r:
                raise SystemExit(f"a bench worker failed: {r['error']}")
            reports.append(r)
        for p, r in zip(procs, reports):  # every worker is alive, loaded and has searched
            r.update(memory(p.pid))
        if start_method == "forkserver":  # the server, while its children are alive (it shares pages with them)
            pid = forkserver_pid()
            parents = {parent_pid(p.pid) for p in procs}
            if pid is None or parents - {None} - {pid}:
                raise SystemExit(f"the forkserver's pid is unknown (the workers' parents: {sorted(parents - {None})})")
            server = {"pid": pid, **memory(pid)}
    finally:
        for c in conns:
            try:
                c.send(None)
            except OSError:
                pass
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
                p.join()
    out: dict = {"workers": w, "reports": reports, "rss_sum_bytes": sum(r["rss_bytes"] for r in reports)}
    if all("pss_bytes" in r for r in reports):
        out["pss_sum_bytes"] = sum(r["pss_bytes"] for r in reports)
        out["uss_sum_bytes"] = sum(r["uss_bytes"] for r in reports)
    else:
        out["note"] = next(r["note"] for r in reports if "note" in r)
    if server is not None:
        out["server"] = server
        out["rss_total_bytes"] = server["rss_bytes"] + out["rss_sum_bytes"]
        if "pss_sum_bytes" in out and "pss_bytes" in server:
            out["pss_total_bytes"] = server["pss_bytes"] + out["pss_sum_bytes"]
    return out


def worker_memory(w: int, env_kwargs: dict, queries: list, k: int, start_method: str = "spawn",
                   preload_env: bool = True) -> dict:
    """Memory of an idle interpreter with the imports, of one worker alone, and of ``w`` workers at once.

    With ``start_method="forkserver"``, one forkserver (started here, with the workers' modules
    preloaded and, with ``preload_env``, the env made once; stopped at the end) forks the
    workers of all three measurements; each total is the server's PSS read at that
    measurement plus its workers' PSS."""
    if start_method != "forkserver":
        bare = run_workers(1, env_kwargs, queries, k, load=False)
        one = run_workers(1, env_kwargs, queries, k)
        many = run_workers(w, env_kwargs, queries, k)
        mem: dict = {"workers": w, "queries": len(queries), "start_method": "spawn",
                     "bare": bare["reports"][0], "one": one["reports"][0], "many": many}
        if "pss_sum_bytes" in many and "pss_bytes" in mem["one"]:
            one_pss = mem["one"]["pss_bytes"]
            mem["measure"] = "pss"
            mem["pss_sum_over_one"] = many["pss_sum_bytes"] / one_pss
            mem["added_pss_per_worker_bytes"] = (many["pss_sum_bytes"] - one_pss) / max(1, w - 1)
        else:  # RSS counts every shared page in every process: an upper bound
            mem["measure"] = "rss"
            mem["note"] = many.get("note") or mem["one"].get("note")
            mem["rss_sum_over_one"] = many["rss_sum_bytes"] / mem["one"]["rss_bytes"]
            mem["added_rss_per_worker_bytes"] = (many["rss_sum_bytes"] - mem["one"]["rss_bytes"]) / max(1, w - 1)
        return mem

    ctx = multiprocessing.get_context("forkserver")
    fs = forkserver._forkserver
    saved = list(fs._preload_modules)
    saved_env = os.environ.get(ENV_VAR)
    if preload_env:  # restarts a running server, so the new one reads these specs
        preload_forkserver([("SearchQA-v0", env_kwargs)], modules=FORKSERVER_PRELOAD)
    else:
        stop_forkserver()  # a server already running may have other modules loaded: start a fresh one
        ctx.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    try:
        forkserver.ensure_running()
        pid = forkserver_pid()
        # the first fork waits until the server has imported its modules; once that worker has
        # exited, the server is measured idle, with no workers
        bare = run_workers(1, env_kwargs, queries, k, load=False, start_method="forkserver")
        server_alone = {"pid": pid, **memory(pid)}
        one = run_workers(1, env_kwargs, queries, k, start_method="forkserver")
        many = run_workers(w, env_kwargs, queries, k, start_method="forkserver")
    finally:
        stop_forkserver()
        ctx.set_forkserver_preload(saved)
        if saved_env is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = saved_env
    if not bare["server"]["pid"] == one["server"]["pid"] == many["server"]["pid"] == pid:
        raise SystemExit("the forkserver was restarted between the worker-memory measurements")
    mem = {"workers": w, "queries": len(queries), "start_method": "forkserver",
           "preload": list(FORKSERVER_PRELOAD) + (["SearchQA-v0 made once, heap frozen"] if preload_env else []),
           "server_alone": server_alone, "bare": bare["reports"][0], "bare_server": bare["server"],
           "one": one["reports"][0], "one_server": one["server"], "many": many}
    if "pss_total_bytes" in many and "pss_total_bytes" in one:
        mem["measure"] = "pss"
        mem["bare_total_pss_bytes"] = bare.get("pss_total_bytes")
        mem["one_total_pss_bytes"] = one_total = one["pss_total_bytes"]
        mem["many_total_pss_bytes"] = many["pss_total_bytes"]
        mem["total_pss_over_one"] = many["pss_total_bytes"] / one_total
        mem["added_pss_per_worker_bytes"] = (many["pss_total_bytes"] - one_total) / max(1, w - 1)
    else:  # RSS counts every shared page in every process: an upper bound
        mem["measure"] = "rss"
        mem["note"] = many.get("note") or one.get("note") or server_alone.get("note")
        mem["rss_total_over_one"] = many["rss_total_bytes"] / one["rss_total_bytes"]
        mem["added_rss_per_worker_bytes"] = (many["rss_total_bytes"] - one["rss_total_bytes"]) / max(1, w - 1)
    return mem
