"""Smoke test of ``twice bench noise`` on tiny blocks (speed is not asserted here)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from twice_envs import bench_noise  # noqa: E402
from twice_envs.cli import BENCHES  # noqa: E402


def _ratio_agrees(ratio: float, t: float, base: float) -> bool:
    """``ratio`` (printed to 0.01) is ``t / base`` for some times that print as ``t`` and ``base`` (to 1 us)."""
    lo, hi = (t - 0.5) / (base + 0.5), (t + 0.5) / max(base - 0.5, 1e-9)
    return lo - 0.005 <= ratio <= hi + 0.005


def test_bench_noise_quick(capsys):
    assert BENCHES["noise"] == "twice_envs.bench_noise:main"
    assert bench_noise.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "median of 2" in out.splitlines()[0]
    rows = [line.split() for line in out.splitlines() if line[:1] == " " and "|" in line]
    assert [(r[0], r[1]) for r in rows] == [("1", "1000"), ("3", "1000"), ("1", "4099"), ("3", "4099")]
    for r in rows:
        # batch vocab | rand | keyed x | sample x cand% | flat x
        vocab = int(r[1])
        rand, keyed, keyed_x, sample, sample_x, cand, flat, flat_x = (
            float(tok.rstrip("%")) for tok in r[2:] if tok != "|")
        assert min(rand, keyed, sample, flat) > 0, r
        for t, x in ((keyed, keyed_x), (sample, sample_x), (flat, flat_x)):
            assert _ratio_agrees(x, t, rand), r
        # the block's maximum is always within reach; on peaked logits (4 favourites a row) little else is
        assert 100 / vocab - 0.005 <= cand < 5.0, r


def test_bench_noise_rejects_missing_cuda(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert bench_noise.main(["--quick", "--device", "cuda"]) == 2
