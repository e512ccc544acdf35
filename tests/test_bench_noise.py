"""Smoke test of ``twice bench noise`` on tiny blocks (speed is not asserted here)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from twice_envs import bench_noise  # noqa: E402
from twice_envs.cli import BENCHES  # noqa: E402


def test_bench_noise_quick(capsys):
    assert BENCHES["noise"] == "twice_envs.bench_noise:main"
    assert bench_noise.main(["--quick"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line[:1] == " " and "|" in line]
    assert [(r[0], r[1]) for r in rows] == [("1", "1000"), ("3", "1000"), ("1", "4099"), ("3", "4099")]
    for r in rows:
        numbers = [float(tok.rstrip("%")) for tok in r if tok != "|"]
        assert all(x > 0 for x in numbers)


def test_bench_noise_rejects_missing_cuda(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert bench_noise.main(["--quick", "--device", "cuda"]) == 2
