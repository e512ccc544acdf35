"""``twice bench searchqa``: retrieval speed, env overhead, fork cost, journal latency, index memory.

Every figure is measured in one run on one generated corpus, with ratios against a
baseline measured in the same run (``rank_bm25`` on the same passages, tokens and
queries; one retrieval for the fork cost).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Callable, Optional, Sequence

WIKI18_PASSAGES = 21_015_324


def _per_call(fn: Callable[[], object], reps: int) -> float:
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="twice bench searchqa", description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=100_000, help="size of the generated corpus (default 100000)")
    parser.add_argument("--queries", type=int, default=500, help="queries for our BM25 timings")
    parser.add_argument("--baseline-queries", type=int, default=30, help="queries for the rank_bm25 timing (it is slow)")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--reps", type=int, default=300, help="repetitions of the env, fork and journal timings")
    parser.add_argument("--skip-baseline", action="store_true", help="do not time rank_bm25 (for large corpora)")
    parser.add_argument("--json", type=str, default=None, help="also write the figures to this file")
    args = parser.parse_args(list(argv or []))

    import numpy as np

    import twice_envs
    from twice_envs.envs.searchqa.bm25 import BM25Index, BM25Params, Tokenizer, build_index
    from twice_envs.envs.searchqa.corpus import open_corpus
    from twice_envs.envs.searchqa.corpus_gen import config_for_passages
    from twice_envs.tools import Journal

    fig: dict = {"passages_requested": args.passages}
    n_q = max(args.queries, args.baseline_queries)
    gen = config_for_passages(args.passages, num_train=max(200, n_q), num_dev=50, num_test=50)
    gen_kwargs = {"seed": gen.seed, "num_entities": gen.num_entities, "num_train": gen.num_train, "num_dev": gen.num_dev, "num_test": gen.num_test}

    t0 = time.perf_counter()
    env = twice_envs.make("SearchQA-v0", generator=gen_kwargs, max_searches=10**6, max_turns=10**7)
    fig["setup_s"] = time.perf_counter() - t0
    res = env.resources
    corpus = res.corpus
    n = len(corpus)
    fig["passages"] = n
    print(f"corpus: {n} generated passages (setup incl. generation and index: {fig['setup_s']:.1f} s)")

    # ------------------------------------------------------------- index build and memory
    texts = list(corpus.iter_contents())
    with tempfile.TemporaryDirectory() as tmp:
        tracemalloc.start()
        t0 = time.perf_counter()
        build_index(iter(texts), Path(tmp) / "idx", BM25Params())
        fig["index_build_s"] = time.perf_counter() - t0
        fig["index_build_peak_bytes"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        index = BM25Index(Path(tmp) / "idx")
        index_bytes = index.nbytes
        vocab_bytes = (Path(tmp) / "idx" / "vocab.json").stat().st_size
        fig.update(index_bytes=index_bytes, index_nnz=int(index.meta["nnz"]), vocab_terms=int(index.meta["vocab"]), vocab_file_bytes=vocab_bytes)
    store_bytes = sum(f.stat().st_size for f in corpus.directory.iterdir())
    try:
        import resource

        fig["peak_rss_bytes_before_baseline"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    except ImportError:  # not on this platform
        pass
    fig["store_bytes"] = store_bytes

    # ------------------------------------------------------------- BM25 throughput
    queries = [h["query"] for q in res.questions["train"] for h in q.metadata["hops"]]
    queries = (queries * (1 + n_q // max(1, len(queries))))[:n_q]
    ix = res.retriever.index
    t0 = time.perf_counter()
    single = [ix.search(q, args.k) for q in queries[: args.queries]]
    fig["bm25_single_qps"] = args.queries / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    batched = ix.search_batch(queries[: args.queries], args.k)
    fig["bm25_batched_qps"] = args.queries / (time.perf_counter() - t0)
    if batched != single:
        raise SystemExit("batched and single-query BM25 results differ")

    if not args.skip_baseline:
        from twice_envs._deps import require

        rank_bm25 = require("rank_bm25", "bench", "the rank_bm25 baseline")
        tok = Tokenizer()
        t0 = time.perf_counter()
        baseline = rank_bm25.BM25Okapi([tok(t) for t in texts], k1=0.9, b=0.4)
        fig["rank_bm25_build_s"] = time.perf_counter() - t0
        bq = queries[: args.baseline_queries]
        t0 = time.perf_counter()
        for q in bq:
            s = baseline.get_scores(tok(q))
            np.argsort(-s, kind="stable")[: args.k]
        fig["rank_bm25_qps"] = len(bq) / (time.perf_counter() - t0)
        fig["speedup_single"] = fig["bm25_single_qps"] / fig["rank_bm25_qps"]
        fig["speedup_batched"] = fig["bm25_batched_qps"] / fig["rank_bm25_qps"]
        del baseline

    # ------------------------------------------------------------- env, fork, journal
    obs, _ = env.reset(seed=0)
    q0 = queries[0]
    search = f"<think> x </think>\n<search> {q0} </search>"
    env.step(search)  # now journaled
    fig["env_step_cached_search_us"] = _per_call(lambda: env.step(search), args.reps) * 1e6
    fig["env_step_invalid_us"] = _per_call(lambda: env.step("no tags here"), args.reps) * 1e6
    uncached = queries[1 : 1 + min(args.reps, len(queries) - 1)]
    fig["one_retrieval_us"] = float(np.mean([_per_call(lambda q=q: ix.search(q, args.k), 1) for q in uncached])) * 1e6
    fig["env_step_overhead_excl_retrieval_us"] = fig["env_step_cached_search_us"]
    del texts

    env.reset(seed=1)
    for q in queries[:4]:
        env.step(f"<search> {q} </search>")
    fig["fork4_us"] = _per_call(lambda: env.fork(4), args.reps) * 1e6
    fig["fork4_over_retrieval"] = fig["fork4_us"] / fig["one_retrieval_us"]

    args_j = {"query": q0, "k": args.k}
    mem = res.journal
    fig["journal_memory_hit_us"] = _per_call(lambda: mem.call(res.tool, args_j), args.reps) * 1e6
    with tempfile.TemporaryDirectory() as tmp:
        disk = Journal(Path(tmp) / "j.sqlite", memory_items=0)
        disk.call(res.tool, args_j)
        fig["journal_sqlite_hit_us"] = _per_call(lambda: disk.call(res.tool, args_j), args.reps) * 1e6
        disk.close()

    per_passage = index_bytes / n
    fig["index_bytes_per_passage"] = per_passage
    fig["wiki18_index_gb_at_this_density"] = per_passage * WIKI18_PASSAGES / 1e9

    print(f"\nBM25 (k={args.k}) on {n} passages, {args.queries} queries ({args.baseline_queries} for rank_bm25)")
    if args.skip_baseline:
        print(f"  ours, single query      {fig['bm25_single_qps']:10.0f} q/s")
        print(f"  ours, batched           {fig['bm25_batched_qps']:10.0f} q/s   (rank_bm25 baseline skipped)")
    else:
        print(f"  ours, single query      {fig['bm25_single_qps']:10.0f} q/s   {fig['speedup_single']:7.1f}x rank_bm25")
        print(f"  ours, batched           {fig['bm25_batched_qps']:10.0f} q/s   {fig['speedup_batched']:7.1f}x rank_bm25")
        print(f"  rank_bm25 (BM25Okapi)   {fig['rank_bm25_qps']:10.1f} q/s   (build {fig['rank_bm25_build_s']:.1f} s)")
    print("env and forks")
    print(f"  step, cached search     {fig['env_step_cached_search_us']:10.1f} us  (env overhead; retrieval read from the journal)")
    print(f"  step, invalid action    {fig['env_step_invalid_us']:10.1f} us")
    print(f"  one retrieval (BM25)    {fig['one_retrieval_us']:10.1f} us")
    print(f"  fork(4)                 {fig['fork4_us']:10.1f} us  = {fig['fork4_over_retrieval']:.2f}x one retrieval")
    print("journal hit latency")
    print(f"  memory layer            {fig['journal_memory_hit_us']:10.1f} us")
    print(f"  SQLite (WAL) file       {fig['journal_sqlite_hit_us']:10.1f} us")
    print("index memory")
    print(f"  build {fig['index_build_s']:.1f} s, peak traced memory during build {fig['index_build_peak_bytes'] / 1e6:.1f} MB")
    print(f"  score arrays {index_bytes / 1e6:.1f} MB ({fig['index_nnz']} postings, {per_passage:.0f} B/passage), "
          f"vocabulary {fig['vocab_terms']} terms ({vocab_bytes / 1e6:.1f} MB file); passage store {store_bytes / 1e6:.1f} MB on disk")
    if "peak_rss_bytes_before_baseline" in fig:
        print(f"  process peak RSS (generation, env, index build, before the baseline) {fig['peak_rss_bytes_before_baseline'] / 1e6:.0f} MB")
    print(f"  at this density, {WIKI18_PASSAGES:,} passages (wiki-18) -> {fig['wiki18_index_gb_at_this_density']:.1f} GB of score arrays "
          "(8 B per posting; wiki-18 passages are longer, see the README)")
    if args.json:
        from twice_envs.trajectory import atomic_write_text

        atomic_write_text(args.json, json.dumps(fig, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
