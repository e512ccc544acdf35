"""``twice bench choice`` at a tiny size (twice_envs.agents.bench.choice)."""

from __future__ import annotations

import json

import pytest

from twice_envs.agents.bench import choice as bench
from twice_envs.cli import BENCHES


def test_the_choice_bench_prints_the_speed_ratio_and_the_coupling_at_a_tiny_size(tmp_path, capsys):
    assert BENCHES["choice"] == "twice_envs.agents.bench.choice:main"
    assert bench.main(["--quick", "--envs", "WebShop-v0", "--scores", "sum", "--coupling", "--coupling-groups", "1",
                       "--no-progress", "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "x free" in text and "choice (sum)" in text and "rho-bar" in text
    res = json.loads((tmp_path / "choice.json").read_text())
    free, chosen = res["speed"]["WebShop-v0"]
    assert free["way"] == "free text" and free["chosen_share"] == 0.0
    assert chosen["chosen_share"] > 0 and chosen["decisions"] > 0 and chosen["decisions_per_s"] > 0
    ways = [r["way"] for r in res["coupling"]["WebShop-v0"]]
    assert ways == ["free text", "choice (sum)"]


@pytest.mark.parametrize("argv, words", [(["--scores", "max"], "unknown"), (["--envs", "Nope-v0"], "unknown"),
                                         (["--rounds", "0"], "--rounds must be >= 1")])
def test_bad_bench_arguments_are_named(argv, words, capsys):
    with pytest.raises(SystemExit):
        bench.main(argv)
    assert words in capsys.readouterr().err
