"""``twice bench searchqa``: BM25 build, size, memory and speed (pruned vs exhaustive), env overhead,
fork cost, journal latency, worker memory.

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
imported the workers' modules once (:data:`.bench_workers.FORKSERVER_PRELOAD`) and, with
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
import gc
import json
from typing import Optional, Sequence

from twice_envs import progress
from twice_envs.envs.searchqa import bench_measure as measure
from twice_envs.envs.searchqa import resources
from twice_envs.envs.searchqa.bench_engines import LuceneBaseline, TantivyBaseline, time_bm25s, time_rank_bm25
from twice_envs.envs.searchqa.bench_report import print_report
from twice_envs.envs.searchqa.bench_workers import worker_memory
from twice_envs.envs.searchqa.bm25 import BM25Params, index_dir
from twice_envs.envs.searchqa.corpus_gen import WIKI18_PASSAGES
from twice_envs.trajectory import atomic_write_text

#: Timing rounds of the BM25 query paths (alternating; the best of each is reported); ``--rounds``.
ROUNDS = 2


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``twice bench searchqa``."""
    description = " ".join(__doc__.split("\n\n")[0].split())
    parser = argparse.ArgumentParser(prog="twice bench searchqa", description=description)
    parser.add_argument("--passages", type=int, default=None,
                        help="size of the generated corpus (default 100000; with --scale wiki18, 21015324)")
    parser.add_argument("--scale", choices=("wiki18",), default=None,
                        help="wiki18: a streamed corpus in the wiki-18 file format (bounded memory; no in-memory "
                             "baselines)")
    parser.add_argument("--queries", type=int, default=500, help="queries for the BM25 timings")
    parser.add_argument("--baseline-queries", type=int, default=30,
                        help="queries for the rank_bm25 timing (it is slow)")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help="alternating timing rounds of the BM25 paths and baselines; each keeps its best "
                             f"(default {ROUNDS})")
    parser.add_argument("--reps", type=int, default=300, help="repetitions of the env, fork and journal timings")
    parser.add_argument("--skip-baseline", action="store_true", help="do not time rank_bm25 (for large corpora)")
    parser.add_argument("--skip-bm25s", action="store_true",
                        help="do not time bm25s (it holds the tokenised corpus in memory)")
    parser.add_argument("--skip-tantivy", action="store_true", help="do not time tantivy even where it is importable")
    parser.add_argument("--lucene-python", type=str, default=None,
                        help="python of a pyserini environment for the Lucene baseline (default: $TWICE_LUCENE_PYTHON; "
                             "none: skipped; `bash tests/sidecar/pyserini.sh --setup-only` builds one)")
    parser.add_argument("--skip-lucene", action="store_true", help="do not time Lucene even where its python is given")
    parser.add_argument("--workers", type=int, default=8,
                        help="worker processes for the memory figure (each makes the env and answers the queries; "
                             "0 skips)")
    parser.add_argument("--start-method", choices=("spawn", "forkserver"), default="spawn",
                        help="how the worker processes start: spawn (a fresh interpreter each) or forkserver "
                             "(forked from one server that has imported the workers' modules; its PSS is counted)")
    parser.add_argument("--forkserver-preload", choices=("env", "imports"), default="env",
                        help="with --start-method forkserver: what the server loads before it forks the workers: "
                             "env (imports, makes the env once and freezes its heap: "
                             "twice_envs.workers.preload_forkserver) or imports (the modules only)")
    parser.add_argument("--json", type=str, default=None, help="also write the figures to this file")
    progress.add_argument(parser)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``twice bench searchqa``: every figure measured in one run, printed, and with ``--json`` saved."""
    args = build_parser().parse_args(list(argv or []))
    progress.apply(args)
    wiki = args.scale == "wiki18"
    passages = args.passages if args.passages is not None else (WIKI18_PASSAGES if wiki else 100_000)
    rounds = max(1, args.rounds)
    fig: dict = {"passages_requested": passages, "scale": args.scale or "generated", "k": args.k, "rounds": rounds}
    env_kwargs = {"max_searches": 10**6, "max_turns": 10**7}

    # ------------------------------------------------------------- data and index
    corpus, queries = measure.corpus_and_queries(passages, wiki, max(args.queries, args.baseline_queries),
                                                 env_kwargs, fig)
    n = fig["passages"]
    print(f"corpus: {n} generated passages{' (wiki-18 format)' if wiki else ''}; generation {fig['generate_s']:.1f} s, "
          f"passage store {fig['store_s']:.1f} s")
    params = BM25Params()
    ix, tok, rss_before = measure.build_and_open_index(corpus, params, fig)

    # ------------------------------------------------------------- query throughput, the other engines beside
    k, qs = args.k, queries[: args.queries]
    work = index_dir(corpus.version, params).parent  # the engines' temporary folders go beside the index
    tantivy = None if args.skip_tantivy else TantivyBaseline.start(corpus.iter_contents(), tok, k, work, fig)
    lucene, lucene_note = LuceneBaseline.start(args.lucene_python, args.skip_lucene, corpus, tok, params, qs, k, work,
                                               fig)
    results = measure.time_queries(ix, qs, k, rounds, fig, tantivy=tantivy, lucene=lucene)
    if tantivy is not None:
        measure.agreement("tantivy", ("single",), results, fig)
        tantivy.close()
    if lucene is not None:
        measure.agreement("lucene", LuceneBaseline.MODES, results, fig)
        lucene.close()
    fig.update({f"{key}_after_queries": v for key, v in measure.rss().items()})
    fig.update({f"{key}_before_index": v for key, v in rss_before.items()})
    if not wiki and not args.skip_bm25s:
        time_bm25s(corpus, tok, params, qs, k, fig)
    if not wiki and not args.skip_baseline:
        time_rank_bm25(corpus, tok, params, queries[: args.baseline_queries], k, fig)

    # ------------------------------------------------------------- env, fork, journal; worker memory
    measure.time_env(env_kwargs, queries, k, args.reps, fig)
    if args.workers > 0:
        # this process lets go of the index and corpus first, so the workers share their pages only with each other
        del ix, corpus
        resources.clear()
        gc.collect()
        fig["worker_memory"] = worker_memory(args.workers, env_kwargs, qs, k, args.start_method,
                                             preload_env=args.forkserver_preload == "env")

    fig["index_bytes_per_passage"] = fig["index_disk_bytes"] / n
    fig["wiki18_index_gb_at_this_density"] = fig["index_bytes_per_passage"] * WIKI18_PASSAGES / 1e9
    print_report(fig, k=k, rounds=rounds, baseline_queries=args.baseline_queries, k1=params.k1, b=params.b,
                 lucene_note=lucene_note)
    if args.json:
        atomic_write_text(args.json, json.dumps(fig, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
