"""The measurements of ``twice bench searchqa`` on the project's side: the corpus and queries, the BM25
index's build (in a child process, so its peak memory is its own), size and opening, the query
throughput of the pruned and exhaustive paths (with the other engines timed in the same alternating
rounds), their top-k agreement, and the env's step, fork and journal costs.

Every function writes its figures into the bench's ``fig`` dict (the keys of ``--json``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import numpy as np

from twice_envs import progress
from twice_envs._cache import cache_dir, publish_dir
from twice_envs.envs.searchqa.bm25 import BM25Index, BM25Params, Tokenizer, index_dir
from twice_envs.envs.searchqa.corpus import CorpusStore, open_corpus
from twice_envs.envs.searchqa.corpus_gen import (
    GENERATOR_VERSION,
    WIKI18_GENERATOR_VERSION,
    config_for_passages,
    wiki18_hop_queries,
    write_generated,
    write_wiki18,
)
from twice_envs.progress import Progress
from twice_envs.registry import make
from twice_envs.tools import Journal

#: The index build runs in a child process so that its peak memory is its own.
_BUILD = r"""
import json, resource, sys, threading, time
from pathlib import Path
from twice_envs.envs.searchqa.bm25 import BM25Params, build_index
from twice_envs.envs.searchqa.corpus import CorpusStore
from twice_envs.progress import Progress

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
t = time.perf_counter()
with Progress("BM25 index", len(store), unit="passages") as bar:
    build_index(store.iter_contents(), Path(sys.argv[2]), BM25Params(**json.loads(sys.argv[3])),
                meta={"corpus_version": store.version}, progress=lambda done: bar.update(done - bar.done))
print(json.dumps({"build_s": time.perf_counter() - t,
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "peak_private_bytes": peak_anon[0]}))
"""


def per_call(fn: Callable[[], object], reps: int) -> float:
    """Seconds per call of ``fn``, over ``reps`` calls."""
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


def rss() -> dict:
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
        import resource  # POSIX only: imported where /proc is missing

        out["rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return out


def qps(fn: Callable[[], object], n: int) -> float:
    """``n`` over the seconds one call of ``fn`` takes (``fn`` answers ``n`` queries)."""
    t = time.perf_counter()
    fn()
    return n / (time.perf_counter() - t)


def build_timed(store, params, target: Path) -> dict:
    """Build the index of ``store`` fresh in a child process, then publish it at ``target`` unless one is there."""
    scratch = target.with_name(f".{target.name}.bench-{os.getpid()}")
    quiet = {} if progress.enabled() else {"TWICE_PROGRESS": "0"}  # --no-progress reaches the child
    cmd = [sys.executable, "-c", _BUILD, str(store.directory), str(scratch), json.dumps(asdict(params))]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONHASHSEED": "0", **quiet})
    if proc.returncode != 0:
        raise SystemExit(f"the index build failed (exit {proc.returncode})")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    publish_dir(scratch, target, "meta.json")  # if the cache has this index already, that copy stays (the same bytes)
    return result

def corpus_and_queries(passages: int, wiki: bool, n_queries: int, env_kwargs: dict,
                       fig: dict) -> tuple[CorpusStore, list[str]]:
    """The bench's corpus (generated, or streamed in the wiki-18 file format; cached) and ``n_queries``
    queries; ``env_kwargs`` gets what makes SearchQA-v0 over the same corpus."""
    t0 = time.perf_counter()
    if wiki:
        folder = cache_dir("searchqa", "wiki18") / f"w{WIKI18_GENERATOR_VERSION}-s0-{passages}"
        with Progress("wiki-18 corpus", passages, unit="passages") as bar:
            paths = write_wiki18(folder, passages, 0, progress=lambda done: bar.update(done - bar.done))
        queries = [q for q, _ in wiki18_hop_queries(passages, n_queries)]
        env_kwargs.update(corpus=str(paths["corpus"]), questions={"dev": str(paths["dev"])}, split="dev")
    else:
        gen = config_for_passages(passages, num_train=max(200, n_queries), num_dev=50, num_test=50)
        try:
            folder = cache_dir("searchqa", "generated") / f"g{GENERATOR_VERSION}-{gen.digest()[:16]}"
            paths = write_generated(gen, folder)
        except RuntimeError as exc:  # the generated corpus's names run out in the millions of passages
            raise SystemExit(f"--passages {passages:,}: {exc}. `--scale wiki18 --passages {passages}` streams a "
                             "corpus of that size in the wiki-18 format") from None
        env_kwargs["generator"] = {"seed": gen.seed, "num_entities": gen.num_entities, "num_train": gen.num_train,
                                   "num_dev": gen.num_dev, "num_test": gen.num_test}
        queries = []
        with open(paths["train"], encoding="utf-8") as fh:
            for line in fh:
                queries += [h["query"] for h in json.loads(line)["metadata"]["hops"]]
        queries = (queries * (1 + n_queries // max(1, len(queries))))[:n_queries]
    fig["generate_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    corpus = open_corpus(paths["corpus"])
    fig["store_s"] = time.perf_counter() - t0
    fig["passages"] = len(corpus)
    return corpus, queries


def build_and_open_index(corpus: CorpusStore, params: BM25Params, fig: dict) -> tuple[BM25Index, Tokenizer, dict]:
    """Build the corpus's index fresh (timed, in a child process; the cache keeps one copy), then open it.

    Returns the index, a tokenizer and this process's memory before the index was opened (:func:`rss`)."""
    target = index_dir(corpus.version, params)
    built = build_timed(corpus, params, target)
    fig["index_build_s"], fig["index_build_peak_rss_bytes"] = built["build_s"], built["peak_rss_bytes"]
    if built["peak_private_bytes"]:
        fig["index_build_peak_private_bytes"] = built["peak_private_bytes"]
    tok = Tokenizer()  # its imports are not part of opening an index
    rss_before = rss()
    t0 = time.perf_counter()
    ix = BM25Index(target)
    fig["index_open_s"] = time.perf_counter() - t0
    fig.update(index_disk_bytes=ix.disk_bytes(), index_nnz=int(ix.meta["nnz"]), vocab_terms=int(ix.meta["vocab"]))
    fig["store_bytes"] = sum(f.stat().st_size for f in corpus.directory.iterdir())
    return ix, tok, rss_before


def time_queries(ix: BM25Index, queries: list[str], k: int, rounds: int, fig: dict, tantivy=None,
                 lucene=None) -> dict:
    """Queries per second of the pruned and exhaustive paths, single and batched, best of ``rounds``
    alternating rounds, with tantivy (single queries only: its binding has no batch search) and Lucene
    (both modes, timed by its server) in the same rounds. Returns each engine's top-k per query.

    Raises SystemExit where an engine's batched and single-query results differ, or where the pruned
    path's top-k differs from the exhaustive one on any query."""
    nb, results = len(queries), {}
    for method in ("pruned", "exhaustive"):
        for q in queries[:20]:  # warm the page cache and the tokenizer
            ix.search(q, k, method)
    if tantivy is not None:
        for q in queries[:20]:
            tantivy.search(q)
    with Progress("BM25 timing", rounds, unit="rounds") as bar:
        for _ in range(rounds):  # the methods alternate; each keeps its best round (less exposed to a busy machine)
            if tantivy is not None:
                tv_out: list = []
                rate = qps(lambda out=tv_out: out.extend(tantivy.search(q) for q in queries), nb)
                fig["tantivy_single_qps"] = max(rate, fig.get("tantivy_single_qps", 0.0))
                results["tantivy"] = tv_out
            if lucene is not None:  # the server times its rounds itself (the transport is not counted)
                lu = lucene.search_round()
                for m in ("single", "batched"):
                    fig[f"lucene_{m}_qps"] = max(nb / lu[m]["seconds"], fig.get(f"lucene_{m}_qps", 0.0))
                hits = lu["single"]["hits"]
                if lu["batched"]["hits"] != hits or results.setdefault("lucene", hits) != hits:
                    raise SystemExit("Lucene: batched and single-query results differ")
            for method in ("pruned", "exhaustive"):
                single: list = []
                rate = qps(lambda m=method, out=single: out.extend(ix.search(q, k, m) for q in queries), nb)
                fig[f"{method}_single_qps"] = max(rate, fig.get(f"{method}_single_qps", 0.0))
                batched: list = []
                rate = qps(lambda m=method, out=batched: out.extend(ix.search_batch(queries, k, m)), nb)
                fig[f"{method}_batched_qps"] = max(rate, fig.get(f"{method}_batched_qps", 0.0))
                if single != batched or results.setdefault(method, single) != single:
                    raise SystemExit(f"{method} BM25: batched and single-query results differ")
            bar.update()
    fig["pruned_over_exhaustive_single"] = fig["pruned_single_qps"] / fig["exhaustive_single_qps"]
    fig["pruned_over_exhaustive_batched"] = fig["pruned_batched_qps"] / fig["exhaustive_batched_qps"]
    fig["queries"] = nb
    fig["topk_identical"] = sum(a == b for a, b in zip(results["pruned"], results["exhaustive"]))
    if fig["topk_identical"] != nb:
        raise SystemExit(f"pruned and exhaustive BM25 differ on {nb - fig['topk_identical']} of {nb} queries")
    return results


def agreement(engine: str, modes: tuple[str, ...], results: dict, fig: dict) -> None:
    """``engine``'s top-k against the exhaustive path's (queries identical, share of passages shared) and
    the pruned and exhaustive paths' speed over its, per timing mode."""
    ref_top = [list(ids) for ids, _ in results["exhaustive"]]
    fig[f"{engine}_topk_identical"] = sum(list(t) == r for t, r in zip(results[engine], ref_top))
    fig[f"{engine}_topk_overlap"] = (sum(len(set(t) & set(r)) for t, r in zip(results[engine], ref_top))
                                     / max(1, sum(len(r) for r in ref_top)))
    for mode in modes:
        fig[f"pruned_over_{engine}_{mode}"] = fig[f"pruned_{mode}_qps"] / fig[f"{engine}_{mode}_qps"]
        fig[f"exhaustive_over_{engine}_{mode}"] = fig[f"exhaustive_{mode}_qps"] / fig[f"{engine}_{mode}_qps"]


def time_env(env_kwargs: dict, queries: list[str], k: int, reps: int, fig: dict) -> None:
    """SearchQA-v0's costs: making it, a step whose search the journal answers, an invalid step, one
    uncached retrieval, ``fork(4)``, and a journal hit in memory and in a SQLite file."""
    t0 = time.perf_counter()
    env = make("SearchQA-v0", **env_kwargs)
    fig["env_setup_s"] = time.perf_counter() - t0
    res = env.resources
    env.reset(seed=0)
    q0 = queries[0]
    search = f"<think> x </think>\n<search> {q0} </search>"
    env.step(search)  # now journaled
    fig["env_step_cached_search_us"] = per_call(lambda: env.step(search), reps) * 1e6
    fig["env_step_invalid_us"] = per_call(lambda: env.step("no tags here"), reps) * 1e6
    rix = res.retriever.index
    uncached = queries[1 : 1 + min(reps, len(queries) - 1)]
    fig["one_retrieval_us"] = float(np.mean([per_call(lambda q=q: rix.search(q, k), 1) for q in uncached])) * 1e6
    fig["env_step_overhead_excl_retrieval_us"] = fig["env_step_cached_search_us"]

    env.reset(seed=1)
    for q in queries[:4]:
        env.step(f"<search> {q} </search>")
    fig["fork4_us"] = per_call(lambda: env.fork(4), reps) * 1e6
    fig["fork4_over_retrieval"] = fig["fork4_us"] / fig["one_retrieval_us"]

    args_j = {"query": q0, "k": k}
    mem = res.journal
    fig["journal_memory_hit_us"] = per_call(lambda: mem.call(res.tool, args_j), reps) * 1e6
    with tempfile.TemporaryDirectory() as tmp:
        disk = Journal(Path(tmp) / "j.sqlite", memory_items=0)
        disk.call(res.tool, args_j)
        fig["journal_sqlite_hit_us"] = per_call(lambda: disk.call(res.tool, args_j), reps) * 1e6
        disk.close()
