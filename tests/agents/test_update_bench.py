"""``twice bench update``: both ways of the update's passes timed on one batch, and what it reports."""

from __future__ import annotations

import json
import re

import pytest

from tests.agents._tiny import tiny_dir
from twice_envs.agents.bench.update import WAYS, main


def test_update_bench_times_both_ways_on_the_same_batch(tmp_path, capsys):
    assert main(["--quick", "--env", "CoinChain-v0", "--model", str(tiny_dir()), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    r = json.loads((tmp_path / "update.json").read_text())
    assert r["episodes"] == 2 * 2 and r["micro_batches"] == 1  # --quick: 2 tasks x 2, one micro-batch of 16
    assert r["real_tokens"] <= r["positions"] and 0 < r["generated_tokens"] < r["real_tokens"]
    assert [len(r["seconds"][w]) for w in WAYS] == [2, 2] and min(min(r["seconds"][w]) for w in WAYS) > 0
    ratio = r["ratio"]
    assert ratio["value"] == pytest.approx(sum(r["seconds"][WAYS[1]]) / sum(r["seconds"][WAYS[0]]))
    assert ratio["lo"] <= ratio["value"] <= ratio["hi"]
    assert r["max_abs_logprob_diff"] < 1e-4  # the same log-probs both ways, up to float rounding
    shown = re.search(r"causal only / padding mask: x([\d.]+) \[([\d.]+), ([\d.]+)\]", out)
    assert shown and float(shown.group(1)) == pytest.approx(ratio["value"], abs=0.005)


@pytest.mark.parametrize("flag", ["--repeats", "--max-turns"])
def test_update_bench_refuses_sizes_below_one(flag, capsys):
    with pytest.raises(SystemExit) as exc:
        main([flag, "0"])
    assert exc.value.code == 2 and f"{flag} must be >= 1" in capsys.readouterr().err


def test_update_bench_caps_the_turns(tmp_path):
    assert main(["--quick", "--env", "CoinChain-v0", "--model", str(tiny_dir()), "--max-turns", "1",
                 "--out", str(tmp_path)]) == 0
    r = json.loads((tmp_path / "update.json").read_text())
    assert r["episodes"] == 4 and r["turns"] == 4  # one turn each
