"""Smoke test of ``twice bench searchqa`` on small corpora: the printed figures are the saved ones and
hold together (speed itself is not asserted)."""

import json
import re

import pytest

from twice_envs.cli import main
from twice_envs.envs.searchqa import resources
from twice_envs.envs.searchqa.bench import WIKI18_PASSAGES


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
