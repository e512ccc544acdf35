"""Smoke test of ``twice bench searchqa`` on a small corpus: the printed figures are the saved ones and
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


@pytest.mark.slow
def test_bench_runs_small_and_reports_every_figure(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TWICE_CACHE", str(tmp_path / "cache"))
    resources.clear()
    out = tmp_path / "fig.json"
    rc = main(["bench", "searchqa", "--passages", "1500", "--queries", "40", "--baseline-queries", "5", "--reps", "20", "--json", str(out)])
    resources.clear()
    assert rc == 0
    text = capsys.readouterr().out
    fig = json.loads(out.read_text())
    assert fig["passages_requested"] == 1500 and 1200 < fig["passages"] < 1800
    assert f"corpus: {fig['passages']} generated passages" in text
    assert f"BM25 (k=3) on {fig['passages']} passages, 40 queries (5 for rank_bm25)" in text
    for key in ("bm25_single_qps", "bm25_batched_qps", "rank_bm25_qps", "env_step_cached_search_us", "env_step_invalid_us",
                "one_retrieval_us", "fork4_us", "journal_memory_hit_us", "journal_sqlite_hit_us", "index_build_peak_bytes"):
        assert fig[key] > 0, key

    # ratios are the quotients of the figures they compare
    assert fig["speedup_single"] == pytest.approx(fig["bm25_single_qps"] / fig["rank_bm25_qps"], rel=1e-12)
    assert fig["speedup_batched"] == pytest.approx(fig["bm25_batched_qps"] / fig["rank_bm25_qps"], rel=1e-12)
    assert fig["fork4_over_retrieval"] == pytest.approx(fig["fork4_us"] / fig["one_retrieval_us"], rel=1e-12)
    assert fig["index_bytes_per_passage"] == pytest.approx(fig["index_bytes"] / fig["passages"], rel=1e-12)
    assert fig["wiki18_index_gb_at_this_density"] == pytest.approx(
        fig["index_bytes_per_passage"] * WIKI18_PASSAGES / 1e9, rel=1e-12)
    assert fig["env_step_overhead_excl_retrieval_us"] == fig["env_step_cached_search_us"]
    # 8 bytes per posting at least (score and passage id), and a vocabulary of terms that occur
    assert fig["index_bytes"] >= 8 * fig["index_nnz"] > 0 and 0 < fig["vocab_terms"] <= fig["index_nnz"]

    # the printed lines show the saved figures
    single, speedup = _printed(text, r"ours, single query\s+(\d+) q/s\s+([\d.]+)x rank_bm25")
    batched, speedup_b = _printed(text, r"ours, batched\s+(\d+) q/s\s+([\d.]+)x rank_bm25")
    assert (single, speedup) == (round(fig["bm25_single_qps"]), round(fig["speedup_single"], 1))
    assert (batched, speedup_b) == (round(fig["bm25_batched_qps"]), round(fig["speedup_batched"], 1))
    fork, ratio = _printed(text, r"fork\(4\)\s+([\d.]+) us  = ([\d.]+)x one retrieval")
    assert (fork, ratio) == (round(fig["fork4_us"], 1), round(fig["fork4_over_retrieval"], 2))
    (memory,) = _printed(text, r"memory layer\s+([\d.]+) us")
    (sqlite,) = _printed(text, r"SQLite \(WAL\) file\s+([\d.]+) us")
    assert (memory, sqlite) == (round(fig["journal_memory_hit_us"], 1), round(fig["journal_sqlite_hit_us"], 1))
    (postings,) = _printed(text, r"\((\d+) postings")
    assert postings == fig["index_nnz"]
    (gb,) = _printed(text, r"21,015,324 passages \(wiki-18\) -> ([\d.]+) GB")
    assert gb == round(fig["wiki18_index_gb_at_this_density"], 1)
