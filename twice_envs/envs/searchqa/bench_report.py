"""The text report of ``twice bench searchqa``: every figure of the bench's ``fig`` dict, on stdout."""

from __future__ import annotations

from twice_envs.envs.searchqa.corpus_gen import WIKI18_PASSAGES

MB = 1e6


def print_report(fig: dict, *, k: int, rounds: int, baseline_queries: int, k1: float, b: float,
                 lucene_note: str = "") -> None:
    """Print the figures: the index, query throughput against the other engines, the env's costs,
    worker memory and the index size at wiki-18's scale (``lucene_note``: why Lucene was not run)."""
    n, nb, mb = fig["passages"], fig["queries"], MB
    print(f"\nBM25 index on {n} passages")
    private = (f", of which private at most {fig['index_build_peak_private_bytes'] / mb:.0f} MB"
               if "index_build_peak_private_bytes" in fig else "")
    print(f"  build {fig['index_build_s']:.1f} s (peak RSS of the build process "
          f"{fig['index_build_peak_rss_bytes'] / mb:.0f} MB{private}; the rest is mapped files: libraries, corpus, "
          f"index), opened in {fig['index_open_s'] * 1e3:.1f} ms")
    print(f"  {fig['index_disk_bytes'] / mb:.1f} MB on disk ({fig['index_nnz']} postings, "
          f"{fig['index_bytes_per_passage']:.0f} B/passage, vocabulary {fig['vocab_terms']} terms); "
          f"passage store {fig['store_bytes'] / mb:.1f} MB")
    if "rss_anon_bytes_after_queries" in fig:
        print(f"  this process after the queries: RSS {fig['rss_bytes_after_queries'] / mb:.0f} MB = "
              f"{fig['rss_anon_bytes_after_queries'] / mb:.0f} MB private + "
              f"{fig['rss_file_bytes_after_queries'] / mb:.0f} MB mapped files (shared page cache; "
              f"{fig['rss_file_bytes_before_index'] / mb:.0f} MB before opening the index)")
    _print_engines(fig, k, nb, max(1, rounds), baseline_queries, k1, b, lucene_note)
    print("env and forks")
    print(f"  step, cached search     {fig['env_step_cached_search_us']:10.1f} us  "
          "(env overhead; retrieval read from the journal)")
    print(f"  step, invalid action    {fig['env_step_invalid_us']:10.1f} us")
    print(f"  one retrieval (BM25)    {fig['one_retrieval_us']:10.1f} us")
    print(f"  fork(4)                 {fig['fork4_us']:10.1f} us  = {fig['fork4_over_retrieval']:.2f}x one retrieval")
    print("journal hit latency")
    print(f"  memory layer            {fig['journal_memory_hit_us']:10.1f} us")
    print(f"  SQLite (WAL) file       {fig['journal_sqlite_hit_us']:10.1f} us")
    if "worker_memory" in fig:
        wm = fig["worker_memory"]
        if wm["start_method"] == "forkserver":
            print_forkserver_memory(wm)
        else:
            print_spawn_memory(wm)
    print(f"at this density, {WIKI18_PASSAGES:,} passages (wiki-18) -> "
          f"{fig['wiki18_index_gb_at_this_density']:.1f} GB of index on disk")


def _print_engines(fig: dict, k: int, nb: int, rounds: int, baseline_queries: int, k1: float, b: float,
                   lucene_note: str) -> None:
    """The query throughput table: the pruned and exhaustive paths, then each other engine timed."""
    mb = MB
    print(f"\nBM25 (k={k}), {nb} queries, q/s     single    batched   (best of {rounds} alternating rounds)")
    print(f"  pruned                   {fig['pruned_single_qps']:10.0f} {fig['pruned_batched_qps']:10.0f}")
    print(f"  exhaustive               {fig['exhaustive_single_qps']:10.0f} {fig['exhaustive_batched_qps']:10.0f}")
    print(f"  pruned / exhaustive      {fig['pruned_over_exhaustive_single']:9.1f}x "
          f"{fig['pruned_over_exhaustive_batched']:9.1f}x   "
          f"(top-{k} identical on {fig['topk_identical']}/{nb} queries)")
    if "bm25s_qps" in fig:
        print(f"  bm25s (numpy backend)    {fig['bm25s_qps']:10.0f}              pruned = "
              f"{fig['pruned_over_bm25s']:.1f}x (its build {fig['bm25s_build_s']:.1f} s, from tokens)")
    if "rank_bm25_qps" in fig:
        print(f"  rank_bm25 (BM25Okapi)    {fig['rank_bm25_qps']:10.1f}              pruned = "
              f"{fig['pruned_over_rank_bm25']:.1f}x ({baseline_queries} queries; its build "
              f"{fig['rank_bm25_build_s']:.1f} s)")
    if "tantivy_single_qps" in fig:
        print(f"  tantivy                  {fig['tantivy_single_qps']:10.0f}          -   pruned = "
              f"{fig['pruned_over_tantivy_single']:.2f}x, exhaustive = {fig['exhaustive_over_tantivy_single']:.2f}x "
              f"({fig['tantivy_version']}, k1 1.2, b 0.75; its build {fig['tantivy_build_s']:.1f} s incl. tokenising, "
              f"one writer thread; {fig['tantivy_disk_bytes'] / mb:.1f} MB)")
        print(f"  tantivy top-{k} vs exhaustive: identical on {fig['tantivy_topk_identical']}/{nb} queries, "
              f"{100 * fig['tantivy_topk_overlap']:.1f}% of passages shared (other k1, b and byte-quantised lengths)")
    if "lucene_single_qps" in fig:
        print(f"  Lucene (pyserini)        {fig['lucene_single_qps']:10.0f} {fig['lucene_batched_qps']:10.0f}   "
              "pruned = "
              f"{fig['pruned_over_lucene_single']:.2f}x / {fig['pruned_over_lucene_batched']:.2f}x, exhaustive = "
              f"{fig['exhaustive_over_lucene_single']:.2f}x / {fig['exhaustive_over_lucene_batched']:.2f}x")
        print(f"  Lucene {fig['lucene_version']} (pyserini {fig['lucene_pyserini_version']}, "
              f"Java {fig['lucene_java_version']}, k1 {k1}, b {b}): start {fig['lucene_startup_s']:.1f} s "
              f"(JVM and imports; not in q/s), build {fig['lucene_build_s']:.1f} s from pretokenised JSONL "
              f"(writing it: {fig['lucene_export_s']:.1f} s), one indexing thread, {fig['lucene_segments']} "
              f"segment(s), {fig['lucene_disk_bytes'] / mb:.1f} MB; opened in {fig['lucene_open_s']:.2f} s; "
              f"warm-up pass {fig['lucene_warmup_s']:.1f} s")
        print(f"  Lucene top-{k} vs exhaustive: identical on {fig['lucene_topk_identical']}/{nb} queries, "
              f"{100 * fig['lucene_topk_overlap']:.1f}% of passages shared (one-byte passage lengths, float32 scores)")
    elif lucene_note:
        print(f"  {lucene_note}")


def print_spawn_memory(wm: dict) -> None:
    """The worker-memory lines of ``--start-method spawn``."""
    mb = MB
    w, one, many, bare = wm["workers"], wm["one"], wm["many"], wm["bare"]
    print(f"worker memory ({w} spawned processes at once, each makes SearchQA-v0 and answers the "
          f"{wm['queries']} queries)")
    if wm["measure"] == "pss":
        print(f"  1 worker alone          RSS {one['rss_bytes'] / mb:6.0f} MB, PSS {one['pss_bytes'] / mb:6.0f} MB, "
              f"USS {one['uss_bytes'] / mb:6.0f} MB   (idle interpreter with the imports: PSS "
              f"{bare['pss_bytes'] / mb:.0f} MB, USS {bare['uss_bytes'] / mb:.0f} MB)")
        print(f"  {w} workers, sums        RSS {many['rss_sum_bytes'] / mb:6.0f} MB, "
              f"PSS {many['pss_sum_bytes'] / mb:6.0f} MB, USS {many['uss_sum_bytes'] / mb:6.0f} MB")
        print(f"  PSS sum of {w} / PSS of 1 = {wm['pss_sum_over_one']:.2f}x; each extra worker adds "
              f"{wm['added_pss_per_worker_bytes'] / mb:.1f} MB PSS")
    else:
        print(f"  1 worker RSS {one['rss_bytes'] / mb:.0f} MB; {w} workers RSS sum {many['rss_sum_bytes'] / mb:.0f} MB "
              f"= {wm['rss_sum_over_one']:.2f}x (RSS counts shared pages in every process; {wm['note']})")


def print_forkserver_memory(wm: dict) -> None:
    """The worker-memory lines of ``--start-method forkserver``."""
    mb = MB
    w, one, many, bare, alone = wm["workers"], wm["one"], wm["many"], wm["bare"], wm["server_alone"]
    print(f"worker memory ({w} processes at once forked from one forkserver, each makes SearchQA-v0 and answers the "
          f"{wm['queries']} queries; the server preloads {', '.join(wm['preload'])}; the same server for every line)")
    if wm["measure"] == "pss":
        one_s, many_s = wm["one_server"], many["server"]
        print(f"  forkserver alone        RSS {alone['rss_bytes'] / mb:6.0f} MB, "
              f"PSS {alone['pss_bytes'] / mb:6.0f} MB, "
              f"USS {alone['uss_bytes'] / mb:6.0f} MB   (with one idle forked worker: server PSS "
              f"{wm['bare_server']['pss_bytes'] / mb:.0f} MB + worker PSS {bare['pss_bytes'] / mb:.0f} MB, "
              f"USS {bare['uss_bytes'] / mb:.0f} MB)")
        print(f"  1 worker                RSS {one['rss_bytes'] / mb:6.0f} MB, PSS {one['pss_bytes'] / mb:6.0f} MB, "
              f"USS {one['uss_bytes'] / mb:6.0f} MB;  + server PSS {one_s['pss_bytes'] / mb:.0f} MB "
              f"= total PSS {wm['one_total_pss_bytes'] / mb:.0f} MB")
        print(f"  {w} workers, sums        RSS {many['rss_sum_bytes'] / mb:6.0f} MB, "
              f"PSS {many['pss_sum_bytes'] / mb:6.0f} MB, USS {many['uss_sum_bytes'] / mb:6.0f} MB;  "
              f"+ server PSS {many_s['pss_bytes'] / mb:.0f} MB = total PSS {wm['many_total_pss_bytes'] / mb:.0f} MB")
        print(f"  total PSS with {w} / total PSS with 1 = {wm['total_pss_over_one']:.2f}x; each extra worker adds "
              f"{wm['added_pss_per_worker_bytes'] / mb:.1f} MB PSS")
    else:
        print(f"  1 worker + server RSS {wm['one_server']['rss_bytes'] / mb + one['rss_bytes'] / mb:.0f} MB; "
              f"{w} workers + server RSS {many['rss_total_bytes'] / mb:.0f} MB = {wm['rss_total_over_one']:.2f}x "
              f"(RSS counts shared pages in every process; {wm['note']})")
