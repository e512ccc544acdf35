"""``twice bench searchqa``: BM25 build, size, memory and speed (pruned vs exhaustive), env overhead, fork cost, journal latency.

Every figure is measured in one run on one generated corpus, with ratios against
baselines measured in the same run: the exhaustive BM25 path (the reference the
pruned one must match exactly, checked on every bench query), ``bm25s`` and
``rank_bm25`` on the same passages, tokens and queries, and one retrieval for the
fork cost.

``--scale wiki18`` streams a corpus in the wiki-18 file format (21,015,324 passages
of about 80-100 words unless ``--passages`` says otherwise) to the cache, builds its
store and index by streaming (bounded memory), and skips the in-memory baselines.
At full size that needs about 45 GB of disk (corpus file 14, passage store 13, index
9 and its temporary runs 8) and one to two hours of one core.
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


#: Timing rounds of the BM25 query paths (alternating; the best of each is reported).
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


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="twice bench searchqa", description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=None,
                        help="size of the generated corpus (default 100000; with --scale wiki18, 21015324)")
    parser.add_argument("--scale", choices=("wiki18",), default=None,
                        help="wiki18: a streamed corpus in the wiki-18 file format (bounded memory; no in-memory baselines)")
    parser.add_argument("--queries", type=int, default=500, help="queries for the BM25 timings")
    parser.add_argument("--baseline-queries", type=int, default=30, help="queries for the rank_bm25 timing (it is slow)")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--reps", type=int, default=300, help="repetitions of the env, fork and journal timings")
    parser.add_argument("--skip-baseline", action="store_true", help="do not time rank_bm25 (for large corpora)")
    parser.add_argument("--skip-bm25s", action="store_true", help="do not time bm25s (it holds the tokenised corpus in memory)")
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
    fig: dict = {"passages_requested": passages, "scale": args.scale or "generated", "k": args.k}
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
        paths = write_generated(gen, cache_dir("searchqa", "generated") / f"g{GENERATOR_VERSION}-{gen.digest()[:16]}")
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

    # ------------------------------------------------------------- BM25 throughput
    k, nb = args.k, args.queries
    qs = queries[:nb]
    results: dict = {}
    for method in ("pruned", "exhaustive"):
        for q in qs[:20]:  # warm the page cache and the tokenizer
            ix.search(q, k, method)
    for _ in range(ROUNDS):  # the methods alternate; each keeps its best round (less exposed to a busy machine)
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
    print(f"\nBM25 (k={k}), {nb} queries, q/s     single    batched   (best of {ROUNDS} alternating rounds)")
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
    print("env and forks")
    print(f"  step, cached search     {fig['env_step_cached_search_us']:10.1f} us  (env overhead; retrieval read from the journal)")
    print(f"  step, invalid action    {fig['env_step_invalid_us']:10.1f} us")
    print(f"  one retrieval (BM25)    {fig['one_retrieval_us']:10.1f} us")
    print(f"  fork(4)                 {fig['fork4_us']:10.1f} us  = {fig['fork4_over_retrieval']:.2f}x one retrieval")
    print("journal hit latency")
    print(f"  memory layer            {fig['journal_memory_hit_us']:10.1f} us")
    print(f"  SQLite (WAL) file       {fig['journal_sqlite_hit_us']:10.1f} us")
    print(f"at this density, {WIKI18_PASSAGES:,} passages (wiki-18) -> "
          f"{fig['wiki18_index_gb_at_this_density']:.1f} GB of index on disk")
    if args.json:
        from twice_envs.trajectory import atomic_write_text

        atomic_write_text(args.json, json.dumps(fig, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
