"""``twice bench searchqa``: BM25 build, size, memory and speed (pruned vs exhaustive), env overhead, fork cost, journal latency, worker memory.

Every figure is measured in one run on one generated corpus, with ratios against
baselines measured in the same run: the exhaustive BM25 path (the reference the
pruned one must match exactly, checked on every bench query), ``bm25s`` and
``rank_bm25`` on the same passages, tokens and queries, and one retrieval for the
fork cost.

Where the ``tantivy`` package is importable (an optional baseline, not a dependency),
the same passages are indexed with it, tokenised by the project's tokenizer and split on
whitespace by tantivy, so both engines see the same terms and lengths; its single-query
speed is timed in the same alternating rounds as the pruned and exhaustive paths, and
its top-k is compared with the exhaustive one. Tantivy's BM25 has k1 = 1.2 and b = 0.75
fixed and quantises passage lengths to one byte, so the agreement is partial by design.

Lucene (pyserini 1.6, Lucene 9.9) is the other optional same-run baseline. pyserini needs an
environment of its own (``bash tests/sidecar/pyserini.sh --setup-only`` builds one), so the
bench runs it in a subprocess (:mod:`.lucene_server`) with that environment's python, given
by ``--lucene-python PATH`` or the ``TWICE_LUCENE_PYTHON`` variable (else Lucene is skipped
with a note). The passages go to it as pretokenised JSONL (the project's tokens joined by
spaces, indexed with Lucene's whitespace analyzer, one indexing thread), so both engines
see the same terms and lengths; BM25 is set to the project's k1 and b. Each round sends
the queries (pretokenised too) once one by one and once as one ``batch_search`` with one
thread; the server times the round itself, so the transport is not counted, and neither is
the JVM's start (reported beside). Docids are zero-padded positions, so Lucene's tie order
(score, then docid string) is the project's (score, then position). Lucene stores passage
lengths in one byte (exact up to 40 tokens) and sums scores in float32, so its top-k
agreement is reported, not asserted.

``--workers W`` (default 8; 0 skips) starts W worker processes (spawn) at once, each
making SearchQA-v0 over the cached index and answering the bench's queries, and reads
their RSS, PSS and USS (``/proc/PID/smaps_rollup``) while all are alive; one worker
alone and an idle interpreter with the imports are measured the same way. The figure
compared is the PSS sum of the W workers over the PSS of one worker alone (PSS divides
each shared page among the processes that map it, so the sum is what they use together).
``--start-method forkserver`` forks the workers instead from one forkserver that has
imported the workers' modules once (:data:`FORKSERVER_PRELOAD`) and, with
``--forkserver-preload env`` (the default), made the env once and frozen its heap
(:func:`twice_envs.workers.preload_forkserver`), so that every worker finds the index,
passage store and questions loaded; ``--forkserver-preload imports`` only imports. The same server serves
the idle, one-worker and W-worker measurements, its PSS is read at each of them while the
workers are alive, and the totals compared are the server's PSS plus the workers' PSS.

``--scale wiki18`` streams a corpus in the wiki-18 file format (21,015,324 passages
of about 80-100 words unless ``--passages`` says otherwise) to the cache, builds its
store and index by streaming (bounded memory), and skips the in-memory baselines.
At full size it wrote a corpus file of 11.2 GB, a passage store of 10.9 GB and an index
of 8.2 GB (plus the build's temporary runs until they are merged), in 55 minutes on a
two-core machine shared with other jobs (docs/scaling.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from twice_envs.envs.searchqa.corpus_gen import WIKI18_PASSAGES
from twice_envs.workers import ENV_VAR, forkserver_pid, preload_forkserver, stop_forkserver

#: The index build runs in a child process so that its peak memory is its own.
_BUILD = r"""
import json, resource, sys, threading, time
from pathlib import Path
from twice_envs.envs.searchqa.bm25 import BM25Params, build_index
from twice_envs.envs.searchqa.corpus import CorpusStore

peak_anon = [0]
def watch():  # private (anonymous) memory, sampled: RSS also counts the mapped corpus and index files
    while True:
        try:
            with open("/proc/self/status") as fh:
                for line in fh:
                    if line.startswith("RssAnon:"):
                        peak_anon[0] = max(peak_anon[0], int(line.split()[1]) * 1024)
        except OSError:
            return
        time.sleep(0.02)
threading.Thread(target=watch, daemon=True).start()

store = CorpusStore(sys.argv[1])
every = max(1, len(store) // 20)
def progress(done, t0=time.perf_counter()):
    if done % every < 50_000 or done == len(store):
        print(f"  indexing: {done:,} / {len(store):,} passages, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
t = time.perf_counter()
build_index(store.iter_contents(), Path(sys.argv[2]), BM25Params(**json.loads(sys.argv[3])),
            meta={"corpus_version": store.version}, progress=progress if len(store) >= 1_000_000 else None)
print(json.dumps({"build_s": time.perf_counter() - t, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "peak_private_bytes": peak_anon[0]}))
"""


#: Timing rounds of the BM25 query paths (alternating; the best of each is reported); ``--rounds``.
ROUNDS = 2


def _per_call(fn: Callable[[], object], reps: int) -> float:
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


def _rss() -> dict:
    """Resident memory of this process: total, anonymous and file-backed (mapped files such as the index), in bytes."""
    out = {}
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile"):
                    name = {"VmRSS": "rss_bytes", "RssAnon": "rss_anon_bytes", "RssFile": "rss_file_bytes"}[key]
                    out[name] = int(value.split()[0]) * 1024
    except OSError:  # not Linux: the peak is what there is
        import resource

        out["rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return out


def _qps(fn: Callable[[], object], n: int) -> float:
    t = time.perf_counter()
    fn()
    return n / (time.perf_counter() - t)


def _build_timed(store, params, target: Path) -> dict:
    """Build the index of ``store`` fresh in a child process, then publish it at ``target`` unless one is there."""
    from dataclasses import asdict

    from twice_envs._cache import publish_dir

    scratch = target.with_name(f".{target.name}.bench-{os.getpid()}")
    proc = subprocess.run([sys.executable, "-c", _BUILD, str(store.directory), str(scratch), json.dumps(asdict(params))],
                          stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
    if proc.returncode != 0:
        raise SystemExit(f"the index build failed (exit {proc.returncode})")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    publish_dir(scratch, target, "meta.json")  # if the cache has this index already, that copy stays (the same bytes)
    return result


#: The modules a worker imports (its own, the env's and what making the env imports), which
#: ``--start-method forkserver`` has the forkserver import once; a missing optional one
#: (the forkserver skips a module that fails to import) is then imported by each worker.
FORKSERVER_PRELOAD = ("numpy", "Stemmer", "bm25s.stopwords", "twice_envs.envs.searchqa.env",
                      "twice_envs.envs.searchqa.bench")


def _worker(conn, env_kwargs: dict, queries: list, k: int, load: bool) -> None:
    """A worker process (see :func:`_run_workers`): make the env, answer the queries, report, wait for the parent."""
    try:
        modules_at_start = len(sys.modules)
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


def _ppid(pid: int) -> int | None:
    """The parent's pid of a process (``/proc/PID/stat``), or None where it is not readable."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _run_workers(w: int, env_kwargs: dict, queries: list, k: int, load: bool = True,
                 start_method: str = "spawn") -> dict:
    """Start ``w`` worker processes (spawn, or forked by the forkserver) at once; when all have
    made the env and answered the queries, read their memory together (RSS, PSS, USS) and,
    with the forkserver, the server's at the same time, then let them exit."""
    import multiprocessing

    from twice_envs._procmem import memory

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
            parents = {_ppid(p.pid) for p in procs}
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


def _worker_memory(w: int, env_kwargs: dict, queries: list, k: int, start_method: str = "spawn",
                   preload_env: bool = True) -> dict:
    """Memory of an idle interpreter with the imports, of one worker alone, and of ``w`` workers at once.

    With ``start_method="forkserver"``, one forkserver (started here, with the workers' modules
    preloaded and, with ``preload_env``, the env made once; stopped at the end) forks the
    workers of all three measurements; each total is the server's PSS read at that
    measurement plus its workers' PSS."""
    if start_method != "forkserver":
        bare = _run_workers(1, env_kwargs, queries, k, load=False)
        one = _run_workers(1, env_kwargs, queries, k)
        many = _run_workers(w, env_kwargs, queries, k)
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

    import multiprocessing
    from multiprocessing import forkserver

    from twice_envs._procmem import memory

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
        bare = _run_workers(1, env_kwargs, queries, k, load=False, start_method="forkserver")
        server_alone = {"pid": pid, **memory(pid)}
        one = _run_workers(1, env_kwargs, queries, k, start_method="forkserver")
        many = _run_workers(w, env_kwargs, queries, k, start_method="forkserver")
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


def _tantivy_build(texts, tok, directory: Path) -> tuple:
    """A tantivy index of ``texts`` (tokenised by ``tok``, split on whitespace by tantivy), one writer thread."""
    import tantivy

    sb = tantivy.SchemaBuilder()
    sb.add_text_field("body", stored=False, tokenizer_name="whitespace", index_option="freq")
    sb.add_integer_field("pid", stored=False, indexed=False, fast=True)
    schema = sb.build()
    index = tantivy.Index(schema, path=str(directory))
    writer = index.writer(heap_size=256_000_000, num_threads=1)
    for i, text in enumerate(texts):
        writer.add_document(tantivy.Document(body=" ".join(tok(text)), pid=i))
    writer.commit()
    writer.wait_merging_threads()
    index.reload()
    return index, schema


#: The server file, run by path with the Lucene environment's python (``-I``: nothing of this
#: checkout or of the caller's ``PYTHON*`` variables on its path).
LUCENE_SERVER = Path(__file__).with_name("lucene_server.py")


class LuceneServer:
    """The bench's side of :mod:`.lucene_server`: start it, wait for its hello, send requests, read replies.

    ``cmd`` starts the server; its stderr (Java's and pyserini's logging included) goes to
    ``log``, whose last lines are quoted when the server fails.
    """

    def __init__(self, cmd: Sequence[str], log: Path, env: dict | None = None) -> None:
        from twice_envs.envs.searchqa import lucene_server as proto

        self._proto = proto
        self._log_path = Path(log)
        self._log = open(self._log_path, "w", encoding="utf-8")
        t0 = time.perf_counter()
        try:
            self.proc = subprocess.Popen(list(cmd), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                         text=True, encoding="utf-8", env=env)
        except OSError as exc:
            self._log.close()
            raise SystemExit(f"the Lucene server could not be started with {cmd[0]!r} ({exc}); give the python of a "
                             "pyserini environment (bash tests/sidecar/pyserini.sh --setup-only builds one)") from None
        try:
            self.hello = self._read()
        except SystemExit:
            self.close()
            raise
        self.startup_wall_s = time.perf_counter() - t0

    def _fail(self, what: str) -> SystemExit:
        try:
            tail = self._log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-15:]
        except OSError:
            tail = []
        lines = "".join(f"\n    {t}" for t in tail)
        return SystemExit(f"the Lucene server {what}" + (f"; the end of its log ({self._log_path}):{lines}" if tail else ""))

    def _read(self) -> dict:
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                self.proc.wait()
                raise self._fail(f"exited (status {self.proc.returncode}) without a reply")
            try:
                reply = self._proto.decode(line)
            except self._proto.ProtocolError as exc:
                raise self._fail(str(exc)) from None
            if reply is None:  # not a reply line
                continue
            if not reply["ok"]:
                raise self._fail(f"failed: {reply.get('error', 'no reason given')}")
            return reply

    def request(self, op: str, **fields) -> dict:
        """Send one request and return its (successful) reply."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise self._fail("closed its input") from None
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.request("quit")
            except SystemExit:
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()
        self._log.close()


def _lucene_export(texts, tok, path: Path) -> int:
    """Write the passages as pretokenised JSONL for the Lucene server: zero-padded docids, tokens joined by spaces."""
    from twice_envs.envs.searchqa.lucene_server import docid

    n = 0
    with open(path, "w", encoding="utf-8") as fh:
        for i, text in enumerate(texts):
            fh.write(json.dumps({"id": docid(i), "contents": " ".join(tok(text))}) + "\n")
            n += 1
    return n


def _lucene_start(python: str, corpus, tok, params, work: Path, fig: dict) -> LuceneServer:
    """Export the passages, start the server, build and open its index; the figures go into ``fig``."""
    docs = work / "docs"
    docs.mkdir()
    t0 = time.perf_counter()
    _lucene_export(corpus.iter_contents(), tok, docs / "passages.jsonl")
    fig["lucene_export_s"] = time.perf_counter() - t0
    server = LuceneServer([python, "-I", str(LUCENE_SERVER)], work / "server.log")
    try:
        versions = server.hello.get("versions", {})
        fig["lucene_version"] = versions.get("lucene", "")
        fig["lucene_pyserini_version"] = versions.get("pyserini", "")
        fig["lucene_java_version"] = versions.get("java", "")
        fig["lucene_startup_s"] = server.startup_wall_s
        built = server.request("build", input=str(docs), index=str(work / "index"))
        fig["lucene_build_s"], fig["lucene_disk_bytes"] = built["build_s"], built["index_bytes"]
        fig["lucene_segments"], fig["lucene_docs"] = built["segments"], built["docs"]
        (docs / "passages.jsonl").unlink()
        opened = server.request("open", index=str(work / "index"), k1=params.k1, b=params.b)
        fig["lucene_open_s"] = opened["open_s"]
    except BaseException:
        server.close()
        raise
    return server


def _print_forkserver_memory(wm: dict) -> None:
    """The worker-memory lines of ``--start-method forkserver``."""
    mb = 1e6
    w, one, many, bare, alone = wm["workers"], wm["one"], wm["many"], wm["bare"], wm["server_alone"]
    print(f"worker memory ({w} processes at once forked from one forkserver, each makes SearchQA-v0 and answers the "
          f"{wm['queries']} queries; the server preloads {', '.join(wm['preload'])}; the same server for every line)")
    if wm["measure"] == "pss":
        one_s, many_s = wm["one_server"], many["server"]
        print(f"  forkserver alone        RSS {alone['rss_bytes'] / mb:6.0f} MB, PSS {alone['pss_bytes'] / mb:6.0f} MB, "
              f"USS {alone['uss_bytes'] / mb:6.0f} MB   (with one idle forked worker: server PSS "
              f"{wm['bare_server']['pss_bytes'] / mb:.0f} MB + worker PSS {bare['pss_bytes'] / mb:.0f} MB, "
              f"USS {bare['uss_bytes'] / mb:.0f} MB)")
        print(f"  1 worker                RSS {one['rss_bytes'] / mb:6.0f} MB, PSS {one['pss_bytes'] / mb:6.0f} MB, "
              f"USS {one['uss_bytes'] / mb:6.0f} MB;  + server PSS {one_s['pss_bytes'] / mb:.0f} MB "
              f"= total PSS {wm['one_total_pss_bytes'] / mb:.0f} MB")
        print(f"  {w} workers, sums        RSS {many['rss_sum_bytes'] / mb:6.0f} MB, PSS {many['pss_sum_bytes'] / mb:6.0f} MB, "
              f"USS {many['uss_sum_bytes'] / mb:6.0f} MB;  + server PSS {many_s['pss_bytes'] / mb:.0f} MB "
              f"= total PSS {wm['many_total_pss_bytes'] / mb:.0f} MB")
        print(f"  total PSS with {w} / total PSS with 1 = {wm['total_pss_over_one']:.2f}x; each extra worker adds "
              f"{wm['added_pss_per_worker_bytes'] / mb:.1f} MB PSS")
    else:
        print(f"  1 worker + server RSS {wm['one_server']['rss_bytes'] / mb + one['rss_bytes'] / mb:.0f} MB; {w} workers + "
              f"server RSS {many['rss_total_bytes'] / mb:.0f} MB = {wm['rss_total_over_one']:.2f}x "
              f"(RSS counts shared pages in every process; {wm['note']})")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="twice bench searchqa", description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=None,
                        help="size of the generated corpus (default 100000; with --scale wiki18, 21015324)")
    parser.add_argument("--scale", choices=("wiki18",), default=None,
                        help="wiki18: a streamed corpus in the wiki-18 file format (bounded memory; no in-memory baselines)")
    parser.add_argument("--queries", type=int, default=500, help="queries for the BM25 timings")
    parser.add_argument("--baseline-queries", type=int, default=30, help="queries for the rank_bm25 timing (it is slow)")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help=f"alternating timing rounds of the BM25 paths and baselines; each keeps its best (default {ROUNDS})")
    parser.add_argument("--reps", type=int, default=300, help="repetitions of the env, fork and journal timings")
    parser.add_argument("--skip-baseline", action="store_true", help="do not time rank_bm25 (for large corpora)")
    parser.add_argument("--skip-bm25s", action="store_true", help="do not time bm25s (it holds the tokenised corpus in memory)")
    parser.add_argument("--skip-tantivy", action="store_true", help="do not time tantivy even where it is importable")
    parser.add_argument("--lucene-python", type=str, default=None,
                        help="python of a pyserini environment for the Lucene baseline (default: $TWICE_LUCENE_PYTHON; "
                             "none: skipped; `bash tests/sidecar/pyserini.sh --setup-only` builds one)")
    parser.add_argument("--skip-lucene", action="store_true", help="do not time Lucene even where its python is given")
    parser.add_argument("--workers", type=int, default=8,
                        help="worker processes for the memory figure (each makes the env and answers the queries; 0 skips)")
    parser.add_argument("--start-method", choices=("spawn", "forkserver"), default="spawn",
                        help="how the worker processes start: spawn (a fresh interpreter each) or forkserver "
                             "(forked from one server that has imported the workers' modules; its PSS is counted)")
    parser.add_argument("--forkserver-preload", choices=("env", "imports"), default="env",
                        help="with --start-method forkserver: what the server loads before it forks the workers: env "
                             "(imports, makes the env once and freezes its heap: twice_envs.workers.preload_forkserver) "
                             "or imports (the modules only)")
    parser.add_argument("--json", type=str, default=None, help="also write the figures to this file")
    args = parser.parse_args(list(argv or []))

    import numpy as np

    import twice_envs
    from twice_envs._cache import cache_dir
    from twice_envs.envs.searchqa.bm25 import BM25Index, BM25Params, Tokenizer, index_dir
    from twice_envs.envs.searchqa.corpus import open_corpus
    from twice_envs.tools import Journal

    wiki = args.scale == "wiki18"
    passages = args.passages if args.passages is not None else (WIKI18_PASSAGES if wiki else 100_000)
    fig: dict = {"passages_requested": passages, "scale": args.scale or "generated", "k": args.k, "rounds": max(1, args.rounds)}
    n_q = max(args.queries, args.baseline_queries)
    env_kwargs = {"max_searches": 10**6, "max_turns": 10**7}

    # ------------------------------------------------------------- data
    t0 = time.perf_counter()
    if wiki:
        from twice_envs.envs.searchqa.corpus_gen import WIKI18_GENERATOR_VERSION, wiki18_hop_queries, write_wiki18

        started = time.perf_counter()

        def progress(done: int) -> None:
            if done % 1_000_000 < 20_000:
                print(f"  generating: {done:,} / {passages:,} passages, {time.perf_counter() - started:.0f} s",
                      file=sys.stderr, flush=True)

        folder = cache_dir("searchqa", "wiki18") / f"w{WIKI18_GENERATOR_VERSION}-s0-{passages}"
        paths = write_wiki18(folder, passages, 0, progress=progress)
        queries = [q for q, _ in wiki18_hop_queries(passages, n_q)]
        env_kwargs.update(corpus=str(paths["corpus"]), questions={"dev": str(paths["dev"])}, split="dev")
    else:
        from twice_envs.envs.searchqa.corpus_gen import GENERATOR_VERSION, config_for_passages, write_generated

        gen = config_for_passages(passages, num_train=max(200, n_q), num_dev=50, num_test=50)
        try:
            paths = write_generated(gen, cache_dir("searchqa", "generated") / f"g{GENERATOR_VERSION}-{gen.digest()[:16]}")
        except RuntimeError as exc:  # the generated corpus's names run out in the millions of passages
            raise SystemExit(f"--passages {passages:,}: {exc}. `--scale wiki18 --passages {passages}` streams a "
                             "corpus of that size in the wiki-18 format") from None
        env_kwargs["generator"] = {"seed": gen.seed, "num_entities": gen.num_entities, "num_train": gen.num_train,
                                   "num_dev": gen.num_dev, "num_test": gen.num_test}
        queries = []
        with open(paths["train"], encoding="utf-8") as fh:
            for line in fh:
                queries += [h["query"] for h in json.loads(line)["metadata"]["hops"]]
        queries = (queries * (1 + n_q // max(1, len(queries))))[:n_q]
    fig["generate_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    corpus = open_corpus(paths["corpus"])
    fig["store_s"] = time.perf_counter() - t0
    n = len(corpus)
    fig["passages"] = n
    print(f"corpus: {n} generated passages{' (wiki-18 format)' if wiki else ''}; generation {fig['generate_s']:.1f} s, "
          f"passage store {fig['store_s']:.1f} s")

    # ------------------------------------------------------------- index: build, size, open
    params = BM25Params()
    target = index_dir(corpus.version, params)
    built = _build_timed(corpus, params, target)
    fig["index_build_s"], fig["index_build_peak_rss_bytes"] = built["build_s"], built["peak_rss_bytes"]
    if built["peak_private_bytes"]:
        fig["index_build_peak_private_bytes"] = built["peak_private_bytes"]
    tok = Tokenizer()  # its imports are not part of opening an index
    rss_before = _rss()
    t0 = time.perf_counter()
    ix = BM25Index(target)
    fig["index_open_s"] = time.perf_counter() - t0
    fig.update(index_disk_bytes=ix.disk_bytes(), index_nnz=int(ix.meta["nnz"]), vocab_terms=int(ix.meta["vocab"]))
    fig["store_bytes"] = sum(f.stat().st_size for f in corpus.directory.iterdir())

    # ------------------------------------------------------------- tantivy (optional baseline)
    k, nb = args.k, args.queries
    qs = queries[:nb]
    tantivy_run = None
    tantivy_tmp = None
    if not args.skip_tantivy:
        from twice_envs._deps import available

        if available("tantivy"):
            import tantivy

            tantivy_tmp = tempfile.TemporaryDirectory(prefix="tantivy-", dir=str(target.parent))
            t0 = time.perf_counter()
            tv_index, tv_schema = _tantivy_build(corpus.iter_contents(), tok, Path(tantivy_tmp.name))
            fig["tantivy_build_s"] = time.perf_counter() - t0
            fig["tantivy_version"] = str(getattr(tantivy, "__version__", "")).split(",")[0]
            fig["tantivy_disk_bytes"] = sum(f.stat().st_size for f in Path(tantivy_tmp.name).rglob("*") if f.is_file())
            tv_searcher = tv_index.searcher()
            fig["tantivy_segments"] = tv_searcher.num_segments
            should = tantivy.Occur.Should

            def tantivy_search(q: str) -> list:
                query = tantivy.Query.boolean_query(
                    [(should, tantivy.Query.term_query(tv_schema, "body", t, index_option="freq")) for t in tok(q)])
                hits = tv_searcher.search(query, k, count=False).hits
                return tv_searcher.fast_field_values("pid", [a for _, a in hits]) if hits else []

            tantivy_run = tantivy_search

    # ------------------------------------------------------------- Lucene (optional baseline, another environment)
    lucene = None
    lucene_note = ""
    lucene_python = args.lucene_python or os.environ.get("TWICE_LUCENE_PYTHON", "")
    if args.skip_lucene:
        lucene_note = "Lucene: skipped (--skip-lucene)"
    elif not lucene_python:
        lucene_note = ("Lucene: skipped (no pyserini environment: pass --lucene-python PATH or set TWICE_LUCENE_PYTHON; "
                       "`bash tests/sidecar/pyserini.sh --setup-only` builds one)")
    else:
        lucene_tmp = tempfile.TemporaryDirectory(prefix="lucene-", dir=str(target.parent))
        lucene = _lucene_start(lucene_python, corpus, tok, params, Path(lucene_tmp.name), fig)
        lqs = [" ".join(tok(q)) for q in qs]
        # the JVM compiles the hot paths while it runs: one untimed pass of each mode first (its time is reported)
        fig["lucene_warmup_s"] = sum(lucene.request("search", mode=m, k=k, queries=lqs)["seconds"] for m in ("single", "batched"))

    # ------------------------------------------------------------- BM25 throughput
    results: dict = {}
    for method in ("pruned", "exhaustive"):
        for q in qs[:20]:  # warm the page cache and the tokenizer
            ix.search(q, k, method)
    if tantivy_run is not None:
        for q in qs[:20]:
            tantivy_run(q)
    for _ in range(max(1, args.rounds)):  # the methods alternate; each keeps its best round (less exposed to a busy machine)
        if tantivy_run is not None:  # single queries only: its Python binding has no batch search
            tv_out: list = []
            qps = _qps(lambda out=tv_out: out.extend(tantivy_run(q) for q in qs), nb)
            fig["tantivy_single_qps"] = max(qps, fig.get("tantivy_single_qps", 0.0))
            results["tantivy"] = tv_out
        if lucene is not None:  # the server times its rounds itself (the transport is not counted)
            lu = {m: lucene.request("search", mode=m, k=k, queries=lqs) for m in ("single", "batched")}
            for m in ("single", "batched"):
                fig[f"lucene_{m}_qps"] = max(nb / lu[m]["seconds"], fig.get(f"lucene_{m}_qps", 0.0))
            if lu["single"]["hits"] != lu["batched"]["hits"] or results.setdefault("lucene", lu["single"]["hits"]) != lu["single"]["hits"]:
                raise SystemExit("Lucene: batched and single-query results differ")
        for method in ("pruned", "exhaustive"):
            single: list = []
            qps = _qps(lambda m=method, out=single: out.extend(ix.search(q, k, m) for q in qs), nb)
            fig[f"{method}_single_qps"] = max(qps, fig.get(f"{method}_single_qps", 0.0))
            batched: list = []
            qps = _qps(lambda m=method, out=batched: out.extend(ix.search_batch(qs, k, m)), nb)
            fig[f"{method}_batched_qps"] = max(qps, fig.get(f"{method}_batched_qps", 0.0))
            if single != batched or results.setdefault(method, single) != single:
                raise SystemExit(f"{method} BM25: batched and single-query results differ")
    fig["pruned_over_exhaustive_single"] = fig["pruned_single_qps"] / fig["exhaustive_single_qps"]
    fig["pruned_over_exhaustive_batched"] = fig["pruned_batched_qps"] / fig["exhaustive_batched_qps"]
    fig["queries"] = nb
    fig["topk_identical"] = sum(a == b for a, b in zip(results["pruned"], results["exhaustive"]))
    if fig["topk_identical"] != nb:
        raise SystemExit(f"pruned and exhaustive BM25 differ on {nb - fig['topk_identical']} of {nb} queries")
    if tantivy_run is not None:
        ref_top = [list(ids) for ids, _ in results["exhaustive"]]
        fig["tantivy_topk_identical"] = sum(list(t) == r for t, r in zip(results["tantivy"], ref_top))
        fig["tantivy_topk_overlap"] = (sum(len(set(t) & set(r)) for t, r in zip(results["tantivy"], ref_top))
                                       / max(1, sum(len(r) for r in ref_top)))
        fig["pruned_over_tantivy_single"] = fig["pruned_single_qps"] / fig["tantivy_single_qps"]
        fig["exhaustive_over_tantivy_single"] = fig["exhaustive_single_qps"] / fig["tantivy_single_qps"]
        del tantivy_run, tv_searcher, tv_index
        tantivy_tmp.cleanup()
    if lucene is not None:
        ref_top = [list(ids) for ids, _ in results["exhaustive"]]
        fig["lucene_topk_identical"] = sum(list(t) == r for t, r in zip(results["lucene"], ref_top))
        fig["lucene_topk_overlap"] = (sum(len(set(t) & set(r)) for t, r in zip(results["lucene"], ref_top))
                                      / max(1, sum(len(r) for r in ref_top)))
        for mode in ("single", "batched"):
            fig[f"pruned_over_lucene_{mode}"] = fig[f"pruned_{mode}_qps"] / fig[f"lucene_{mode}_qps"]
            fig[f"exhaustive_over_lucene_{mode}"] = fig[f"exhaustive_{mode}_qps"] / fig[f"lucene_{mode}_qps"]
        lucene.close()
        lucene_tmp.cleanup()
        lucene = None
    fig.update({f"{key}_after_queries": v for key, v in _rss().items()})
    fig.update({f"{key}_before_index": v for key, v in rss_before.items()})

    if not wiki and not args.skip_bm25s:
        from twice_envs._deps import available

        if available("bm25s"):
            import bm25s

            tokens = [tok(t) for t in corpus.iter_contents()]
            ref = bm25s.BM25(k1=params.k1, b=params.b, method="lucene")
            t0 = time.perf_counter()
            ref.index(tokens, show_progress=False)
            fig["bm25s_build_s"] = time.perf_counter() - t0
            del tokens
            qtok = [[t for t in tok(q) if t in ref.vocab_dict] for q in qs]

            def bm25s_run():
                for toks in qtok:
                    if toks:
                        s = ref.get_scores(toks)
                        np.argpartition(-s, min(k, len(s)) - 1)[:k]

            fig["bm25s_qps"] = _qps(bm25s_run, nb)
            fig["pruned_over_bm25s"] = fig["pruned_single_qps"] / fig["bm25s_qps"]
            del ref
    if not wiki and not args.skip_baseline:
        from twice_envs._deps import require

        rank_bm25 = require("rank_bm25", "bench", "the rank_bm25 baseline")
        texts = [tok(t) for t in corpus.iter_contents()]
        t0 = time.perf_counter()
        baseline = rank_bm25.BM25Okapi(texts, k1=params.k1, b=params.b)
        fig["rank_bm25_build_s"] = time.perf_counter() - t0
        del texts
        bq = queries[: args.baseline_queries]
        t0 = time.perf_counter()
        for q in bq:
            s = baseline.get_scores(tok(q))
            np.argsort(-s, kind="stable")[:k]
        fig["rank_bm25_qps"] = len(bq) / (time.perf_counter() - t0)
        fig["pruned_over_rank_bm25"] = fig["pruned_single_qps"] / fig["rank_bm25_qps"]
        del baseline

    # ------------------------------------------------------------- env, fork, journal
    t0 = time.perf_counter()
    env = twice_envs.make("SearchQA-v0", **env_kwargs)
    fig["env_setup_s"] = time.perf_counter() - t0
    res = env.resources
    env.reset(seed=0)
    q0 = queries[0]
    search = f"<think> x </think>\n<search> {q0} </search>"
    env.step(search)  # now journaled
    fig["env_step_cached_search_us"] = _per_call(lambda: env.step(search), args.reps) * 1e6
    fig["env_step_invalid_us"] = _per_call(lambda: env.step("no tags here"), args.reps) * 1e6
    rix = res.retriever.index
    uncached = queries[1 : 1 + min(args.reps, len(queries) - 1)]
    fig["one_retrieval_us"] = float(np.mean([_per_call(lambda q=q: rix.search(q, k), 1) for q in uncached])) * 1e6
    fig["env_step_overhead_excl_retrieval_us"] = fig["env_step_cached_search_us"]

    env.reset(seed=1)
    for q in queries[:4]:
        env.step(f"<search> {q} </search>")
    fig["fork4_us"] = _per_call(lambda: env.fork(4), args.reps) * 1e6
    fig["fork4_over_retrieval"] = fig["fork4_us"] / fig["one_retrieval_us"]

    args_j = {"query": q0, "k": k}
    mem = res.journal
    fig["journal_memory_hit_us"] = _per_call(lambda: mem.call(res.tool, args_j), args.reps) * 1e6
    with tempfile.TemporaryDirectory() as tmp:
        disk = Journal(Path(tmp) / "j.sqlite", memory_items=0)
        disk.call(res.tool, args_j)
        fig["journal_sqlite_hit_us"] = _per_call(lambda: disk.call(res.tool, args_j), args.reps) * 1e6
        disk.close()

    # ------------------------------------------------------------- worker memory
    if args.workers > 0:
        import gc

        from twice_envs.envs.searchqa import resources

        # this process lets go of the index and corpus first, so the workers share their pages only with each other
        del env, res, rix, mem, ix, corpus
        resources.clear()
        gc.collect()
        fig["worker_memory"] = _worker_memory(args.workers, env_kwargs, qs, k, args.start_method,
                                              preload_env=args.forkserver_preload == "env")

    per_passage = fig["index_disk_bytes"] / n
    fig["index_bytes_per_passage"] = per_passage
    fig["wiki18_index_gb_at_this_density"] = per_passage * WIKI18_PASSAGES / 1e9

    mb = 1e6
    print(f"\nBM25 index on {n} passages")
    private = (f", of which private at most {fig['index_build_peak_private_bytes'] / mb:.0f} MB"
               if "index_build_peak_private_bytes" in fig else "")
    print(f"  build {fig['index_build_s']:.1f} s (peak RSS of the build process {fig['index_build_peak_rss_bytes'] / mb:.0f} MB"
          f"{private}; the rest is mapped files: libraries, corpus, index), opened in {fig['index_open_s'] * 1e3:.1f} ms")
    print(f"  {fig['index_disk_bytes'] / mb:.1f} MB on disk ({fig['index_nnz']} postings, {per_passage:.0f} B/passage, "
          f"vocabulary {fig['vocab_terms']} terms); passage store {fig['store_bytes'] / mb:.1f} MB")
    if "rss_anon_bytes_after_queries" in fig:
        print(f"  this process after the queries: RSS {fig['rss_bytes_after_queries'] / mb:.0f} MB = "
              f"{fig['rss_anon_bytes_after_queries'] / mb:.0f} MB private + {fig['rss_file_bytes_after_queries'] / mb:.0f} MB "
              f"mapped files (shared page cache; {fig['rss_file_bytes_before_index'] / mb:.0f} MB before opening the index)")
    print(f"\nBM25 (k={k}), {nb} queries, q/s     single    batched   (best of {max(1, args.rounds)} alternating rounds)")
    print(f"  pruned                   {fig['pruned_single_qps']:10.0f} {fig['pruned_batched_qps']:10.0f}")
    print(f"  exhaustive               {fig['exhaustive_single_qps']:10.0f} {fig['exhaustive_batched_qps']:10.0f}")
    print(f"  pruned / exhaustive      {fig['pruned_over_exhaustive_single']:9.1f}x {fig['pruned_over_exhaustive_batched']:9.1f}x   "
          f"(top-{k} identical on {fig['topk_identical']}/{nb} queries)")
    if "bm25s_qps" in fig:
        print(f"  bm25s (numpy backend)    {fig['bm25s_qps']:10.0f}              pruned = {fig['pruned_over_bm25s']:.1f}x "
              f"(its build {fig['bm25s_build_s']:.1f} s, from tokens)")
    if "rank_bm25_qps" in fig:
        print(f"  rank_bm25 (BM25Okapi)    {fig['rank_bm25_qps']:10.1f}              pruned = {fig['pruned_over_rank_bm25']:.1f}x "
              f"({args.baseline_queries} queries; its build {fig['rank_bm25_build_s']:.1f} s)")
    if "tantivy_single_qps" in fig:
        print(f"  tantivy                  {fig['tantivy_single_qps']:10.0f}          -   pruned = "
              f"{fig['pruned_over_tantivy_single']:.2f}x, exhaustive = {fig['exhaustive_over_tantivy_single']:.2f}x "
              f"({fig['tantivy_version']}, k1 1.2, b 0.75; its build {fig['tantivy_build_s']:.1f} s incl. tokenising, one writer thread; "
              f"{fig['tantivy_disk_bytes'] / mb:.1f} MB)")
        print(f"  tantivy top-{k} vs exhaustive: identical on {fig['tantivy_topk_identical']}/{nb} queries, "
              f"{100 * fig['tantivy_topk_overlap']:.1f}% of passages shared (other k1, b and byte-quantised lengths)")
    if "lucene_single_qps" in fig:
        print(f"  Lucene (pyserini)        {fig['lucene_single_qps']:10.0f} {fig['lucene_batched_qps']:10.0f}   pruned = "
              f"{fig['pruned_over_lucene_single']:.2f}x / {fig['pruned_over_lucene_batched']:.2f}x, exhaustive = "
              f"{fig['exhaustive_over_lucene_single']:.2f}x / {fig['exhaustive_over_lucene_batched']:.2f}x")
        print(f"  Lucene {fig['lucene_version']} (pyserini {fig['lucene_pyserini_version']}, Java {fig['lucene_java_version']}, "
              f"k1 {params.k1}, b {params.b}): start {fig['lucene_startup_s']:.1f} s (JVM and imports; not in q/s), "
              f"build {fig['lucene_build_s']:.1f} s from pretokenised JSONL (writing it: {fig['lucene_export_s']:.1f} s), "
              f"one indexing thread, {fig['lucene_segments']} segment(s), {fig['lucene_disk_bytes'] / mb:.1f} MB; "
              f"opened in {fig['lucene_open_s']:.2f} s; warm-up pass {fig['lucene_warmup_s']:.1f} s")
        print(f"  Lucene top-{k} vs exhaustive: identical on {fig['lucene_topk_identical']}/{nb} queries, "
              f"{100 * fig['lucene_topk_overlap']:.1f}% of passages shared (one-byte passage lengths, float32 scores)")
    elif lucene_note:
        print(f"  {lucene_note}")
    print("env and forks")
    print(f"  step, cached search     {fig['env_step_cached_search_us']:10.1f} us  (env overhead; retrieval read from the journal)")
    print(f"  step, invalid action    {fig['env_step_invalid_us']:10.1f} us")
    print(f"  one retrieval (BM25)    {fig['one_retrieval_us']:10.1f} us")
    print(f"  fork(4)                 {fig['fork4_us']:10.1f} us  = {fig['fork4_over_retrieval']:.2f}x one retrieval")
    print("journal hit latency")
    print(f"  memory layer            {fig['journal_memory_hit_us']:10.1f} us")
    print(f"  SQLite (WAL) file       {fig['journal_sqlite_hit_us']:10.1f} us")
    if "worker_memory" in fig:
        wm = fig["worker_memory"]
        w, one, many, bare = wm["workers"], wm["one"], wm["many"], wm["bare"]
        if wm["start_method"] == "forkserver":
            _print_forkserver_memory(wm)
        else:
            print(f"worker memory ({w} spawned processes at once, each makes SearchQA-v0 and answers the {wm['queries']} queries)")
            if wm["measure"] == "pss":
                print(f"  1 worker alone          RSS {one['rss_bytes'] / mb:6.0f} MB, PSS {one['pss_bytes'] / mb:6.0f} MB, "
                      f"USS {one['uss_bytes'] / mb:6.0f} MB   (idle interpreter with the imports: PSS {bare['pss_bytes'] / mb:.0f} MB, "
                      f"USS {bare['uss_bytes'] / mb:.0f} MB)")
                print(f"  {w} workers, sums        RSS {many['rss_sum_bytes'] / mb:6.0f} MB, PSS {many['pss_sum_bytes'] / mb:6.0f} MB, "
                      f"USS {many['uss_sum_bytes'] / mb:6.0f} MB")
                print(f"  PSS sum of {w} / PSS of 1 = {wm['pss_sum_over_one']:.2f}x; each extra worker adds "
                      f"{wm['added_pss_per_worker_bytes'] / mb:.1f} MB PSS")
            else:
                print(f"  1 worker RSS {one['rss_bytes'] / mb:.0f} MB; {w} workers RSS sum {many['rss_sum_bytes'] / mb:.0f} MB = "
                      f"{wm['rss_sum_over_one']:.2f}x (RSS counts shared pages in every process; {wm['note']})")
    print(f"at this density, {WIKI18_PASSAGES:,} passages (wiki-18) -> "
          f"{fig['wiki18_index_gb_at_this_density']:.1f} GB of index on disk")
    if args.json:
        from twice_envs.trajectory import atomic_write_text

        atomic_write_text(args.json, json.dumps(fig, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
