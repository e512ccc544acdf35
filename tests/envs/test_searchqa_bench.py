"""Smoke test of ``twice bench searchqa`` on a small corpus (figures are printed, not asserted on speed)."""

import json

import pytest

from twice_envs.cli import main
from twice_envs.envs.searchqa import resources


@pytest.mark.slow
def test_bench_runs_small_and_reports_every_figure(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TWICE_CACHE", str(tmp_path / "cache"))
    resources.clear()
    out = tmp_path / "fig.json"
    rc = main(["bench", "searchqa", "--passages", "1500", "--queries", "40", "--baseline-queries", "5", "--reps", "20", "--json", str(out)])
    resources.clear()
    assert rc == 0
    text = capsys.readouterr().out
    for line in ("x rank_bm25", "fork(4)", "memory layer", "SQLite", "score arrays", "wiki-18"):
        assert line in text
    fig = json.loads(out.read_text())
    for key in ("bm25_single_qps", "bm25_batched_qps", "rank_bm25_qps", "speedup_single", "env_step_overhead_excl_retrieval_us",
                "fork4_us", "one_retrieval_us", "journal_memory_hit_us", "journal_sqlite_hit_us", "index_bytes", "index_build_peak_bytes"):
        assert fig[key] > 0
    assert 1200 < fig["passages"] < 1800
