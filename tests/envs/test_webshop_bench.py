"""Smoke test of ``twice bench webshop``: the figures it prints are the ones it saves, consistently
(nothing is timed against a target here)."""

import json
import re

import pytest

from twice_envs.envs.webshop.bench import main


def _ms(text: str, pattern: str) -> list[float]:
    m = re.search(pattern, text)
    assert m, pattern
    return [float(g) for g in m.groups()]


def test_bench_quick(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["--quick", "--products", "300", "--queries", "5", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    data = json.loads(out.read_text())
    size = data["sizes"]["300"]
    assert size["products"] == 300 and size["goals"] > 0 and data["search"]["queries"] == 5
    assert size["cold_load_s"] > 0 and size["cached_reload_s"] > 0 and size["process_reload_s"] > 0
    assert size["files_mb"] > 0 and size["cache_mb"] > 0 and size["process_rss_after_load_mb"] > 0
    assert data["peak_rss_mb"] >= size["peak_rss_mb"] > 0
    assert f"reload in a new process {size['process_reload_s']:.3f} s" in text

    # worker memory: one process, then two at once, measured together; the bench itself let go of
    # the catalogue first
    w = data["workers"]
    assert w["one"]["workers"] == 1 and w["many"]["workers"] == 2 and not w["bench_maps_cache"]
    assert all(r["load_s"] > 0 and r["rss_mb"] > 0 for r in w["many"]["reports"])
    if w["one"]["reports"][0]["smaps"] is not None:
        many = w["many"]
        assert many["pss_sum_mb"] <= many["rss_sum_mb"]
        pss_extra = many["pss_sum_mb"] - w["one"]["reports"][0]["smaps"]["pss_mb"]  # one extra process
        assert w["extra_process_pss_mb"] == pytest.approx(pss_extra)
        assert f"PSS sum {many['pss_sum_mb']:.0f} MB" in text and f"+{pss_extra:.0f} MB PSS" in text

    s = data["search"]
    p50, p95, b50, ratio = _ms(text, r"search on 300 products \(5 queries\): p50 ([\d.]+) ms, p95 ([\d.]+) ms \| "
                                     r"rank_bm25 p50 ([\d.]+) ms -> ratio ([\d.]+)x")
    assert (p50, p95, b50) == tuple(round(v * 1e3, 3) for v in (s["p50_s"], s["p95_s"], s["rank_bm25_p50_s"]))
    assert 0 < s["p50_s"] <= s["p95_s"] and ratio == round(s["rank_bm25_p50_s"] / s["p50_s"], 1)

    c = data["click"]
    c50, c95, h50, ratio = _ms(text, r"click step: p50 ([\d.]+) ms, p95 ([\d.]+) ms \| "
                                     r"HTML render\+parse baseline p50 ([\d.]+) ms -> ratio ([\d.]+)x")
    assert (c50, c95, h50) == tuple(round(v * 1e3, 3) for v in (c["p50_s"], c["p95_s"], c["html_parse_baseline_p50_s"]))
    assert 0 < c["p50_s"] <= c["p95_s"] and ratio == round(c["html_parse_baseline_p50_s"] / c["p50_s"], 1)

    f = data["fork"]
    f50, s50, d50, ratio, state_ratio = _ms(
        text, r"fork at turn 10: env.fork p50 ([\d.]+) ms \(env state snapshot\+restore ([\d.]+) ms\) \| "
              r"deepcopy baseline p50 ([\d.]+) ms -> ratio ([\d.]+)x \(state alone (\d+)x\)")
    assert (f50, s50, d50) == tuple(round(v * 1e3, 3) for v in (f["fork_p50_s"], f["snapshot_restore_p50_s"],
                                                                 f["deepcopy_p50_s"]))
    assert ratio == round(f["deepcopy_p50_s"] / f["fork_p50_s"], 1)
    assert state_ratio == round(f["deepcopy_p50_s"] / f["snapshot_restore_p50_s"])
    # a fork is a snapshot restore plus more (a fresh env, the digest check): never cheaper
    assert 0 < f["snapshot_restore_p50_s"] < f["fork_p50_s"]


def test_bench_without_baseline_and_workers_reports_growth(tmp_path, capsys):
    out = tmp_path / "bench.json"
    keep = tmp_path / "kept"
    assert main(["--quick", "--products", "200", "400", "--queries", "3", "--baseline-max", "300", "--workers", "0",
                 "--dir", str(keep), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert "rank_bm25_build_s" in data["sizes"]["200"] and "rank_bm25_build_s" not in data["sizes"]["400"]
    assert data["search"]["rank_bm25_p50_s"] is None and "rank_bm25 baseline skipped (> 300 products)" in text
    assert "workers" not in data
    g = data["growth_per_100k"]
    r0, r1 = data["sizes"]["200"], data["sizes"]["400"]
    assert g["files_mb"] == pytest.approx((r1["files_mb"] - r0["files_mb"]) * 500) and g["files_mb"] > 0
    assert "growth per 100k products (200 -> 400)" in text
    # --dir keeps the generated files in the original format, and their caches
    assert (keep / "data400" / "items_generated.json").read_text().startswith('[{"asin": ')
    assert len(list((keep / "cache400").iterdir())) == 1


@pytest.mark.parametrize("actions", [["search[red shirt]"], ["search[red shirt]", "click[next >]"]])
def test_the_html_baseline_reads_back_the_page_it_times(actions):
    # the click-step baseline is only fair if it renders and parses the same text the env returns
    # (its page's <title> comes first)
    def read_back(page):
        title, _, rest = _html_baseline(page).partition(" [SEP] ")
        assert title == "t"
        return rest

    import twice_envs
    from twice_envs.envs.webshop.bench import _html_baseline

    env = twice_envs.make("WebShop-v0")
    obs, info = env.reset(seed=0)
    for a in actions:
        obs, *_, info = env.step(a)
    assert read_back(obs) == obs
    item = next(a for a in info["admissible_actions"] if a.startswith("click[") and a not in
                ("click[back to search]", "click[next >]", "click[< prev]"))
    obs, *_ = env.step(item)
    assert read_back(obs) == obs
