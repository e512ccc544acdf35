"""Smoke test of ``twice bench searchqa`` on small corpora: the printed figures are the saved ones and
hold together (speed itself is not asserted)."""

import json
import os
import re
import sys

import pytest

from twice_envs.cli import main
from twice_envs.envs.searchqa import bench as bench_mod
from twice_envs.envs.searchqa import bench_engines, bench_measure, bench_workers
from twice_envs.envs.searchqa import lucene_server as ls
from twice_envs.envs.searchqa import resources
from twice_envs.envs.searchqa.corpus_gen import WIKI18_PASSAGES


def _printed(text: str, pattern: str) -> list[float]:
    m = re.search(pattern, text)
    assert m, pattern
    return [float(g) for g in m.groups()]


def _run(tmp_path, monkeypatch, capsys, *args):
    monkeypatch.setenv("TWICE_CACHE", str(tmp_path / "cache"))
    resources.clear()
    out = tmp_path / "fig.json"
    rc = main(["bench", "searchqa", *args, "--json", str(out)])
    resources.clear()
    assert rc == 0
    return capsys.readouterr().out, json.loads(out.read_text())


def _check_common(text: str, fig: dict) -> None:
    n, q = fig["passages"], fig["queries"]
    for key in ("pruned_single_qps", "pruned_batched_qps", "exhaustive_single_qps", "exhaustive_batched_qps",
                "env_step_cached_search_us", "env_step_invalid_us", "one_retrieval_us", "fork4_us", "journal_memory_hit_us",
                "journal_sqlite_hit_us", "index_build_s", "index_build_peak_rss_bytes", "index_disk_bytes", "index_open_s"):
        assert fig[key] > 0, key
    # ratios are the quotients of the figures they compare, measured in the same run
    assert fig["pruned_over_exhaustive_single"] == pytest.approx(fig["pruned_single_qps"] / fig["exhaustive_single_qps"], rel=1e-12)
    assert fig["pruned_over_exhaustive_batched"] == pytest.approx(fig["pruned_batched_qps"] / fig["exhaustive_batched_qps"], rel=1e-12)
    assert fig["fork4_over_retrieval"] == pytest.approx(fig["fork4_us"] / fig["one_retrieval_us"], rel=1e-12)
    assert fig["index_bytes_per_passage"] == pytest.approx(fig["index_disk_bytes"] / n, rel=1e-12)
    assert fig["wiki18_index_gb_at_this_density"] == pytest.approx(fig["index_bytes_per_passage"] * WIKI18_PASSAGES / 1e9, rel=1e-12)
    assert fig["topk_identical"] == q
    # 8 bytes per posting at least (weight and passage), and a vocabulary of terms that occur
    assert fig["index_disk_bytes"] >= 8 * fig["index_nnz"] > 0 and 0 < fig["vocab_terms"] <= fig["index_nnz"]
    assert fig["rss_bytes_after_queries"] > 0 and fig["index_build_peak_rss_bytes"] > 10e6

    # the printed lines show the saved figures
    single, batched = _printed(text, r"  pruned\s+(\d+)\s+(\d+)\n")
    assert (single, batched) == (round(fig["pruned_single_qps"]), round(fig["pruned_batched_qps"]))
    single, batched = _printed(text, r"  exhaustive\s+(\d+)\s+(\d+)\n")
    assert (single, batched) == (round(fig["exhaustive_single_qps"]), round(fig["exhaustive_batched_qps"]))
    r1, r2, same, total = _printed(text, r"pruned / exhaustive\s+([\d.]+)x\s+([\d.]+)x\s+\(top-3 identical on (\d+)/(\d+) queries\)")
    assert (r1, r2) == (round(fig["pruned_over_exhaustive_single"], 1), round(fig["pruned_over_exhaustive_batched"], 1))
    assert same == total == q
    (build,) = _printed(text, r"build ([\d.]+) s \(peak RSS")
    assert build == round(fig["index_build_s"], 1)
    (postings,) = _printed(text, r"\((\d+) postings")
    assert postings == fig["index_nnz"]
    fork, ratio = _printed(text, r"fork\(4\)\s+([\d.]+) us  = ([\d.]+)x one retrieval")
    assert (fork, ratio) == (round(fig["fork4_us"], 1), round(fig["fork4_over_retrieval"], 2))
    (memory,) = _printed(text, r"memory layer\s+([\d.]+) us")
    (sqlite,) = _printed(text, r"SQLite \(WAL\) file\s+([\d.]+) us")
    assert (memory, sqlite) == (round(fig["journal_memory_hit_us"], 1), round(fig["journal_sqlite_hit_us"], 1))
    (gb,) = _printed(text, r"21,015,324 passages \(wiki-18\) -> ([\d.]+) GB")
    assert gb == round(fig["wiki18_index_gb_at_this_density"], 1)


@pytest.mark.slow
def test_bench_runs_small_and_reports_every_figure(tmp_path, monkeypatch, capsys):
    text, fig = _run(tmp_path, monkeypatch, capsys, "--passages", "1500", "--queries", "40", "--baseline-queries", "5", "--reps", "20")
    assert fig["passages_requested"] == 1500 and 1200 < fig["passages"] < 1800 and fig["scale"] == "generated"
    assert f"corpus: {fig['passages']} generated passages;" in text
    assert "BM25 (k=3), 40 queries" in text
    _check_common(text, fig)
    assert fig["rank_bm25_qps"] > 0 and fig["bm25s_qps"] > 0
    assert fig["pruned_over_rank_bm25"] == pytest.approx(fig["pruned_single_qps"] / fig["rank_bm25_qps"], rel=1e-12)
    assert fig["pruned_over_bm25s"] == pytest.approx(fig["pruned_single_qps"] / fig["bm25s_qps"], rel=1e-12)
    (qps, ratio) = _printed(text, r"bm25s \(numpy backend\)\s+(\d+)\s+pruned = ([\d.]+)x")
    assert (qps, ratio) == (round(fig["bm25s_qps"]), round(fig["pruned_over_bm25s"], 1))
    (qps, ratio) = _printed(text, r"rank_bm25 \(BM25Okapi\)\s+([\d.]+)\s+pruned = ([\d.]+)x")
    assert (qps, ratio) == (round(fig["rank_bm25_qps"], 1), round(fig["pruned_over_rank_bm25"], 1))

    # a second run finds everything in the cache, and still times a fresh build
    text2, fig2 = _run(tmp_path, monkeypatch, capsys, "--passages", "1500", "--queries", "40", "--reps", "5",
                       "--skip-baseline", "--skip-bm25s")
    assert fig2["index_disk_bytes"] == fig["index_disk_bytes"] and fig2["index_build_s"] > 0
    assert "rank_bm25_qps" not in fig2 and "bm25s_qps" not in fig2 and "rank_bm25" not in text2


@pytest.mark.slow
def test_bench_wiki18_scale_streams_a_small_corpus(tmp_path, monkeypatch, capsys):
    text, fig = _run(tmp_path, monkeypatch, capsys, "--scale", "wiki18", "--passages", "2000", "--queries", "30", "--reps", "10")
    assert fig["scale"] == "wiki18" and fig["passages"] == 2000
    assert "corpus: 2000 generated passages (wiki-18 format)" in text
    _check_common(text, fig)
    assert "rank_bm25_qps" not in fig and "bm25s_qps" not in fig  # no in-memory baselines at this scale
    corpus = next((tmp_path / "cache" / "searchqa" / "wiki18").glob("*/corpus.jsonl"))
    first = json.loads(corpus.open(encoding="utf-8").readline())
    assert set(first) == {"id", "contents"} and first["id"] == "0" and first["contents"].startswith('"')


def test_bench_worker_memory_and_tantivy_baseline(tmp_path, monkeypatch, capsys):
    text, fig = _run(tmp_path, monkeypatch, capsys, "--passages", "2000", "--queries", "20", "--reps", "5",
                     "--skip-baseline", "--skip-bm25s", "--workers", "2")
    wm = fig["worker_memory"]
    assert wm["workers"] == 2 and wm["queries"] == 20 and wm["many"]["workers"] == 2
    reports = wm["many"]["reports"]
    assert len(reports) == 2 and all(r["hits"] > 0 and r["rss_bytes"] > 10e6 for r in reports + [wm["one"]])
    assert "worker memory (2 spawned processes at once" in text
    if wm["measure"] == "pss":  # /proc/PID/smaps_rollup readable
        one = wm["one"]["pss_bytes"]
        assert 0 < wm["one"]["uss_bytes"] <= one <= wm["one"]["rss_bytes"]
        assert wm["many"]["pss_sum_bytes"] == sum(r["pss_bytes"] for r in reports)
        assert wm["pss_sum_over_one"] == pytest.approx(wm["many"]["pss_sum_bytes"] / one, rel=1e-12)
        assert wm["added_pss_per_worker_bytes"] == pytest.approx(wm["many"]["pss_sum_bytes"] - one, rel=1e-12)
        (ratio, added) = _printed(text, r"PSS sum of 2 / PSS of 1 = ([\d.]+)x; each extra worker adds ([\d.]+) MB PSS")
        assert (ratio, added) == (round(wm["pss_sum_over_one"], 2), round(wm["added_pss_per_worker_bytes"] / 1e6, 1))
    else:
        assert wm["rss_sum_over_one"] > 0 and "RSS counts shared pages" in text

    try:
        import tantivy  # noqa: F401
    except ImportError:
        assert "tantivy_single_qps" not in fig and "tantivy" not in text
        pytest.skip("tantivy is not installed: its baseline is not run")
    q = fig["queries"]
    assert fig["tantivy_single_qps"] > 0 and fig["tantivy_build_s"] > 0 and fig["tantivy_disk_bytes"] > 0
    assert fig["pruned_over_tantivy_single"] == pytest.approx(fig["pruned_single_qps"] / fig["tantivy_single_qps"], rel=1e-12)
    assert 0 <= fig["tantivy_topk_identical"] <= q and 0.0 <= fig["tantivy_topk_overlap"] <= 1.0  # partial by design
    (qps, ratio) = _printed(text, r"  tantivy\s+(\d+)\s+-\s+pruned = ([\d.]+)x")
    assert (qps, ratio) == (round(fig["tantivy_single_qps"]), round(fig["pruned_over_tantivy_single"], 2))
    (same, total) = _printed(text, r"tantivy top-3 vs exhaustive: identical on (\d+)/(\d+) queries")
    assert (same, total) == (fig["tantivy_topk_identical"], q)



@pytest.mark.parametrize("preload", ["env", "imports"])
def test_bench_worker_memory_forkserver_counts_the_server(tmp_path, monkeypatch, capsys, preload):
    import multiprocessing

    if "forkserver" not in multiprocessing.get_all_start_methods():
        pytest.skip("no forkserver start method on this platform")
    text, fig = _run(tmp_path, monkeypatch, capsys, "--passages", "2000", "--queries", "20", "--reps", "5", "--rounds", "1",
                     "--skip-baseline", "--skip-bm25s", "--skip-tantivy", "--skip-lucene", "--workers", "2",
                     "--start-method", "forkserver", "--forkserver-preload", preload)
    wm = fig["worker_memory"]
    assert wm["start_method"] == "forkserver" and wm["workers"] == 2 and wm["many"]["workers"] == 2
    assert list(wm["preload"])[: len(bench_workers.FORKSERVER_PRELOAD)] == list(bench_workers.FORKSERVER_PRELOAD)
    reports = wm["many"]["reports"]
    # with the env preloaded, every worker (and the idle one) finds the index and questions loaded by the server
    assert all(bool(r["resources_cached"]) == (preload == "env") for r in reports + [wm["one"], wm["bare"]])
    from twice_envs.workers import ENV_VAR

    assert ENV_VAR not in os.environ  # the bench leaves no preload behind
    assert len(reports) == 2 and all(r["hits"] > 0 and r["rss_bytes"] > 10e6 for r in reports + [wm["one"]])
    # the workers found the env's modules imported by the server (a spawned worker imports them itself)
    assert all(r["modules_imported"] < 10 for r in reports + [wm["one"], wm["bare"]])
    # one server, measured at each measurement, and stopped afterwards
    pid = wm["server_alone"]["pid"]
    assert wm["bare_server"]["pid"] == wm["one_server"]["pid"] == wm["many"]["server"]["pid"] == pid
    assert not os.path.exists(f"/proc/{pid}/stat") or bench_workers.parent_pid(pid) != os.getpid()
    assert "worker memory (2 processes at once forked from one forkserver" in text
    if wm["measure"] != "pss":  # /proc/PID/smaps_rollup not readable: RSS only
        assert wm["rss_total_over_one"] > 0 and "RSS counts shared pages" in text
        pytest.skip("/proc/PID/smaps_rollup is not readable: PSS is not measured")
    one, one_server, many_server = wm["one"]["pss_bytes"], wm["one_server"]["pss_bytes"], wm["many"]["server"]["pss_bytes"]
    assert 0 < wm["server_alone"]["uss_bytes"] <= wm["server_alone"]["pss_bytes"] <= wm["server_alone"]["rss_bytes"]
    assert 0 < one_server and 0 < many_server and 0 < wm["one"]["uss_bytes"] <= one <= wm["one"]["rss_bytes"]
    # the totals are the server's PSS plus the workers' PSS, read together
    assert wm["many"]["pss_sum_bytes"] == sum(r["pss_bytes"] for r in reports)
    assert wm["one_total_pss_bytes"] == one_server + one
    assert wm["many_total_pss_bytes"] == many_server + wm["many"]["pss_sum_bytes"]
    assert wm["bare_total_pss_bytes"] == wm["bare_server"]["pss_bytes"] + wm["bare"]["pss_bytes"]
    assert wm["total_pss_over_one"] == pytest.approx(wm["many_total_pss_bytes"] / wm["one_total_pss_bytes"], rel=1e-12)
    assert wm["added_pss_per_worker_bytes"] == pytest.approx(wm["many_total_pss_bytes"] - wm["one_total_pss_bytes"], rel=1e-12)
    mb = 1e6
    (server,) = _printed(text, r"forkserver alone\s+RSS\s+\d+ MB, PSS\s+(\d+) MB")
    assert server == round(wm["server_alone"]["pss_bytes"] / mb)
    (pss, server, total) = _printed(text, r"  1 worker\s+RSS\s+\d+ MB, PSS\s+(\d+) MB, USS\s+\d+ MB;  "
                                          r"\+ server PSS (\d+) MB = total PSS (\d+) MB")
    assert (pss, server, total) == (round(one / mb), round(one_server / mb), round(wm["one_total_pss_bytes"] / mb))
    (pss, server, total) = _printed(text, r"  2 workers, sums\s+RSS\s+\d+ MB, PSS\s+(\d+) MB, USS\s+\d+ MB;  "
                                          r"\+ server PSS (\d+) MB = total PSS (\d+) MB")
    assert (pss, server, total) == (round(wm["many"]["pss_sum_bytes"] / mb), round(many_server / mb),
                                    round(wm["many_total_pss_bytes"] / mb))
    (ratio, added) = _printed(text, r"total PSS with 2 / total PSS with 1 = ([\d.]+)x; each extra worker adds ([\d.]+) MB PSS")
    assert (ratio, added) == (round(wm["total_pss_over_one"], 2), round(wm["added_pss_per_worker_bytes"] / mb, 1))


# ---------------------------------------------------------------- Lucene (pyserini) baseline

#: Runs the real server file with a stand-in engine: an in-memory index that scores a passage by the
#: number of query-term occurrences it holds (ties by docid), and that prints on fd 1 and stdout as
#: Java's logging would, to check that such output never reaches the replies.
STAND_IN = r"""
import importlib.util, json, os, sys, time
if len(sys.argv) > 1:  # the server file, loaded by path as the bench runs it
    spec = importlib.util.spec_from_file_location("lucene_server", sys.argv[1])
    server = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(server)
else:  # started by the bench itself (no arguments)
    from twice_envs.envs.searchqa import lucene_server as server
mode = sys.argv[2] if len(sys.argv) > 2 else "ok"

class StandIn:
    versions = {"lucene": "0.0-stand-in", "pyserini": "none", "java": "none"}

    def __init__(self):
        if mode == "fail-start":
            raise RuntimeError("no JVM here")
        self.postings, self.ready = {}, False

    def build(self, input, index):
        os.write(1, b"[main] INFO IndexCollection - a log line on fd 1\n")
        print("a print on stdout")
        if mode == "crash":
            os._exit(3)
        docs = 0
        for name in sorted(os.listdir(input)):
            with open(os.path.join(input, name), encoding="utf-8") as fh:
                for line in fh:
                    d = json.loads(line)
                    for t in d["contents"].split():
                        self.postings.setdefault(t, []).append(d["id"])
                    docs += 1
        os.makedirs(index)
        with open(os.path.join(index, "segment"), "w") as fh:
            fh.write("x" * 100)
        return {"build_s": 0.01, "index_bytes": server.dir_bytes(index), "docs": docs, "segments": 1}

    def open(self, index, k1, b):
        self.ready = True
        return {"open_s": 0.001, "docs": -1}

    def search(self, mode, k, queries):
        if not self.ready:
            raise RuntimeError("no index is open")
        t0 = time.perf_counter()
        hits = []
        for q in queries:
            score = {}
            for t in q.split():
                for d in self.postings.get(t, []):
                    score[d] = score.get(d, 0) + 1
            hits.append([int(d) for d in sorted(score, key=lambda d: (-score[d], d))[:k]])
        return {"seconds": max(time.perf_counter() - t0, 1e-6), "hits": hits}

raise SystemExit(server.main(StandIn))
"""


def _stand_in(tmp_path, mode="ok"):
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    return [sys.executable, "-I", str(script), str(bench_engines.LUCENE_SERVER), mode]


def test_lucene_protocol_framing():
    assert ls.docid(7) == "0000000007" and len(ls.docid(21_015_323)) == ls.DOCID_WIDTH
    assert sorted(ls.docid(i) for i in (10, 9, 100, 2)) == [ls.docid(i) for i in (2, 9, 10, 100)]  # string order = position
    with pytest.raises(ValueError):
        ls.docid(10**ls.DOCID_WIDTH)
    reply = {"ok": True, "op": "search", "seconds": 0.5, "hits": [[1, 2], []]}
    line = ls.encode(reply)
    assert line.startswith(ls.MARK) and line.endswith("\n") and line.count("\n") == 1
    assert ls.decode(line) == reply
    assert ls.decode("[main] INFO IndexCollection - Starting indexer\n") is None  # other output is skipped
    for bad in (ls.MARK + "{not json\n", ls.MARK + "[1, 2]\n", ls.MARK + '{"ok": "yes"}\n'):
        with pytest.raises(ls.ProtocolError):
            ls.decode(bad)
    req = ls.parse_request('{"op": "search", "mode": "batched", "k": 3, "queries": ["a b", ""]}\n')
    assert req["queries"] == ["a b", ""] and ls.parse_request(ls.encode({"op": "quit"}))["op"] == "quit"
    assert ls.parse_request('{"op": "open", "index": "/x", "k1": 0.9, "b": 0}')["b"] == 0
    for bad, why in (("nope", "not JSON"), ('{"op": "delete"}', "needs an 'op'"), ('{"op": "build", "input": "/x"}', "'index'"),
                     ('{"op": "search", "mode": "single", "k": true, "queries": []}', "'k'"),
                     ('{"op": "search", "mode": "both", "k": 3, "queries": []}', "mode must be"),
                     ('{"op": "search", "mode": "single", "k": 0, "queries": []}', "k >= 1"),
                     ('{"op": "search", "mode": "single", "k": 3, "queries": [["a"]]}', "must be strings"),
                     ('{"op": "open", "index": "/x", "k1": "0.9", "b": 0.4}', "'k1'")):
        with pytest.raises(ls.ProtocolError, match=why):
            ls.parse_request(bad)


def test_lucene_server_loop_in_process():
    import io

    class Engine:
        versions = {"lucene": "x"}

        def search(self, mode, k, queries):
            return {"seconds": 1.0, "hits": [[len(q)] * k for q in queries]}

    requests = "\n".join([json.dumps({"op": "search", "mode": "single", "k": 2, "queries": ["ab", "c"]}),
                          "{broken", json.dumps({"op": "open", "index": "/x", "k1": 0.9, "b": 0.4}), "",
                          json.dumps({"op": "quit"}), json.dumps({"op": "search", "mode": "single", "k": 1, "queries": []})])
    out = io.StringIO()
    assert ls.serve(Engine, io.StringIO(requests + "\n"), out) == 0
    replies = [ls.decode(line) for line in out.getvalue().splitlines(keepends=True)]
    assert [r["ok"] for r in replies] == [True, True, False, False, True]  # hello, search, bad line, failed open, quit
    assert replies[0]["op"] == "hello" and replies[0]["versions"] == {"lucene": "x"} and replies[0]["startup_s"] >= 0
    assert replies[1] == {"ok": True, "op": "search", "seconds": 1.0, "hits": [[2, 2], [1, 1]]}
    assert "not JSON" in replies[2]["error"] and "AttributeError" in replies[3]["error"]
    assert replies[4]["op"] == "quit"  # nothing is answered after it

    out = io.StringIO()
    assert ls.serve(lambda: 1 / 0, io.StringIO(""), out) == 1
    (hello,) = [ls.decode(line) for line in out.getvalue().splitlines(keepends=True)]
    assert hello["ok"] is False and "ZeroDivisionError" in hello["error"]


def test_lucene_client_and_server_process_with_a_stand_in(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    bench_engines.lucene_export(["Alpha beta", "beta gamma gamma", "", "delta"], lambda t: t.lower().split(), docs / "p.jsonl")
    lines = [json.loads(line) for line in (docs / "p.jsonl").read_text().splitlines()]
    assert lines[1] == {"id": "0000000001", "contents": "beta gamma gamma"} and lines[2]["contents"] == ""

    server = bench_engines.LuceneServer(_stand_in(tmp_path), tmp_path / "server.log")
    try:
        assert server.hello["versions"]["lucene"] == "0.0-stand-in" and server.startup_wall_s > 0
        built = server.request("build", input=str(docs), index=str(tmp_path / "index"))
        assert built == {"ok": True, "op": "build", "build_s": 0.01, "index_bytes": 100, "docs": 4, "segments": 1}
        with pytest.raises(SystemExit, match="the Lucene server failed: ProtocolError: 'search' mode must be"):
            server.request("search", mode="both", k=2, queries=["beta"])
        server.request("open", index=str(tmp_path / "index"), k1=0.9, b=0.4)
        found = server.request("search", mode="batched", k=2, queries=["beta", "gamma beta", "zeta"])
        assert found["hits"] == [[0, 1], [1, 0], []] and found["seconds"] > 0  # the failed request did not end it
    finally:
        server.close()
    assert server.proc.returncode == 0
    log = (tmp_path / "server.log").read_text()
    assert "a log line on fd 1" in log and "a print on stdout" in log  # in the log, not among the replies

    with pytest.raises(SystemExit, match="could not be started with '/nonexistent/python'"):
        bench_engines.LuceneServer(["/nonexistent/python", "-I", str(bench_engines.LUCENE_SERVER)], tmp_path / "s1.log")
    with pytest.raises(SystemExit, match="failed: RuntimeError: no JVM here"):
        bench_engines.LuceneServer(_stand_in(tmp_path, "fail-start"), tmp_path / "s2.log")
    server = bench_engines.LuceneServer(_stand_in(tmp_path, "crash"), tmp_path / "s3.log")
    with pytest.raises(SystemExit, match=r"(?s)exited \(status 3\) without a reply.*a log line on fd 1"):
        server.request("build", input=str(docs), index=str(tmp_path / "index3"))
    server.close()


def _check_lucene(text: str, fig: dict, real: bool) -> None:
    q, n = fig["queries"], fig["passages"]
    for key in ("lucene_single_qps", "lucene_batched_qps", "lucene_build_s", "lucene_disk_bytes", "lucene_startup_s",
                "lucene_export_s", "lucene_warmup_s"):
        assert fig[key] > 0, key
    assert fig["lucene_open_s"] >= 0 and fig["lucene_segments"] >= 1
    for mode in ("single", "batched"):
        assert fig[f"pruned_over_lucene_{mode}"] == pytest.approx(fig[f"pruned_{mode}_qps"] / fig[f"lucene_{mode}_qps"], rel=1e-12)
        assert fig[f"exhaustive_over_lucene_{mode}"] == pytest.approx(
            fig[f"exhaustive_{mode}_qps"] / fig[f"lucene_{mode}_qps"], rel=1e-12)
    assert 0 <= fig["lucene_topk_identical"] <= q and 0.0 <= fig["lucene_topk_overlap"] <= 1.0
    single, batched, r1, r2 = _printed(text, r"  Lucene \(pyserini\)\s+(\d+)\s+(\d+)\s+pruned = ([\d.]+)x / ([\d.]+)x")
    assert (single, batched) == (round(fig["lucene_single_qps"]), round(fig["lucene_batched_qps"]))
    assert (r1, r2) == (round(fig["pruned_over_lucene_single"], 2), round(fig["pruned_over_lucene_batched"], 2))
    (same, total) = _printed(text, r"Lucene top-3 vs exhaustive: identical on (\d+)/(\d+) queries")
    assert (same, total) == (fig["lucene_topk_identical"], q)
    (build,) = _printed(text, r"build ([\d.]+) s from pretokenised JSONL")
    assert build == round(fig["lucene_build_s"], 1)
    assert f"Lucene {fig['lucene_version']} (pyserini {fig['lucene_pyserini_version']}" in text
    assert "Lucene: skipped" not in text
    if real:
        assert fig["lucene_docs"] == n  # every generated passage has terms
        assert fig["lucene_version"].startswith("9.") and fig["lucene_java_version"].startswith("21")
        # the same terms, lengths (short passages: exact in Lucene's byte), k1 and b: only float32 sums
        # could flip a near tie (measured: every query identical; with Lucene's default English analyzer
        # on the queries instead of the whitespace one, 41 / 50 and 91% of passages shared)
        assert fig["lucene_topk_overlap"] >= 0.98 and fig["lucene_topk_identical"] >= 0.96 * q


def test_bench_lucene_path_with_a_stand_in_server(tmp_path, monkeypatch, capsys):
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    # the bench runs `python -I LUCENE_SERVER`: here the stand-in, which then imports the real server module
    monkeypatch.setattr(bench_engines, "LUCENE_SERVER", script)
    text, fig = _run(tmp_path, monkeypatch, capsys, "--passages", "1500", "--queries", "20", "--reps", "5",
                     "--skip-baseline", "--skip-bm25s", "--skip-tantivy", "--workers", "0", "--rounds", "3",
                     "--lucene-python", sys.executable)
    _check_common(text, fig)
    _check_lucene(text, fig, real=False)
    assert fig["rounds"] == 3 and "20 queries, q/s     single    batched   (best of 3 alternating rounds)" in text
    assert fig["lucene_version"] == "0.0-stand-in" and fig["lucene_docs"] == fig["passages"]
    assert not list((tmp_path / "cache").rglob("lucene-*"))  # its folder is removed

    monkeypatch.delenv("TWICE_LUCENE_PYTHON", raising=False)
    text, fig = _run(tmp_path, monkeypatch, capsys, "--passages", "1500", "--queries", "20", "--reps", "5",
                     "--skip-baseline", "--skip-bm25s", "--skip-tantivy", "--workers", "0")
    assert "lucene_single_qps" not in fig and "Lucene: skipped (no pyserini environment" in text


def test_bench_lucene_baseline(tmp_path, monkeypatch, capsys):
    python = os.environ.get("TWICE_LUCENE_PYTHON")
    if not python:
        if os.environ.get("TWICE_REQUIRE_LUCENE") == "1":
            pytest.fail("TWICE_LUCENE_PYTHON is not set")
        pytest.skip("no pyserini environment (TWICE_LUCENE_PYTHON; bash tests/sidecar/pyserini.sh builds one)")
    text, fig = _run(tmp_path, monkeypatch, capsys, "--passages", "2000", "--queries", "50", "--reps", "5",
                     "--skip-baseline", "--skip-bm25s", "--skip-tantivy", "--workers", "0", "--lucene-python", python)
    _check_common(text, fig)
    _check_lucene(text, fig, real=True)


def test_a_generated_corpus_too_large_to_name_says_so_and_points_to_the_wiki18_format(monkeypatch):
    from twice_envs.envs.searchqa import corpus_gen

    names = corpus_gen._Names(corpus_gen.Rng(0))
    names.unique(lambda: "Ba")
    with pytest.raises(RuntimeError, match="name space exhausted after 1 distinct names.*wiki-18"):
        names.unique(lambda: "Ba")  # every new name collides: the space is exhausted

    def exhausted(*a, **k):
        names.unique(lambda: "Ba")

    monkeypatch.setattr(bench_measure, "write_generated", exhausted)
    with pytest.raises(SystemExit, match=r"--passages 5,000,000: name space exhausted.*--scale wiki18 --passages 5000000"):
        bench_mod.main(["--passages", "5000000", "--skip-baseline", "--skip-bm25s", "--workers", "0"])


def test_the_bench_shows_progress_on_stderr_and_none_with_no_progress(tmp_path, monkeypatch, capfd):
    from twice_envs import progress

    monkeypatch.setattr(progress, "_forced", None)  # restored after the test
    monkeypatch.setenv("TWICE_CACHE", str(tmp_path / "cache"))
    small = ["bench", "searchqa", "--passages", "1500", "--queries", "20", "--reps", "5", "--skip-baseline",
             "--skip-bm25s", "--skip-tantivy", "--skip-lucene", "--workers", "0", "--rounds", "2"]
    progress.set_enabled(True)  # as on a terminal
    resources.clear()
    assert main(small) == 0
    out, err = capfd.readouterr()
    assert "BM25 timing: 2/2 rounds (100%)" in err and "BM25 timing" not in out  # the figures stay on stdout
    resources.clear()
    assert main([*small, "--no-progress"]) == 0  # still as on a terminal
    out, err = capfd.readouterr()
    assert "BM25 timing" not in err and not progress.enabled() and out.startswith("corpus: ")
    resources.clear()
