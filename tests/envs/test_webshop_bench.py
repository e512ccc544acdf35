"""Smoke test of ``twice bench webshop`` (numbers are for people; nothing is timed here)."""

import json

from twice_envs.envs.webshop.bench import main


def test_bench_quick(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["--quick", "--products", "300", "--queries", "5", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    for part in ("cold load+index", "cached reload", "search on 300 products", "click step", "fork at turn 10", "peak RSS"):
        assert part in text
    data = json.loads(out.read_text())
    assert data["sizes"]["300"]["products"] == 300 and data["search"]["queries"] == 5
    assert data["fork"]["fork_p50_s"] > 0 and data["click"]["p50_s"] > 0
