"""Section (a): it fails against a reference with one bit flipped; its key rows span every field's
edge values; its comparison tells bits from tolerance."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from twice_envs.agents.gpu_check import philox  # noqa: E402
from twice_envs.agents.gpu_check.context import CPU_SIZES, Context  # noqa: E402
from twice_envs.agents.gpu_check.report import run_section  # noqa: E402


def test_philox_section_fails_against_a_corrupted_reference(tmp_path):
    ctx = Context(cpu_mode=True, device="cpu", sizes=CPU_SIZES, work=tmp_path, reference=philox.CorruptedReference())
    sec = run_section("a", "philox", lambda s, dl: philox.section_philox(ctx, s, dl), 60, hard=False)
    assert sec["status"] == "FAIL", sec["lines"]
    failed = {c["name"] for c in sec["results"]["checks"] if c["status"] == "FAIL"}
    for name in ("known-answer vectors of the reference", "Philox4x32-10 words of every key row",
                 "token keys (token_keys_torch)", "token keys (tensor kernel)", "uniforms at 4 ids per row",
                 "Gumbel float64 at 4 ids per row"):
        assert name in failed
    assert any(n.startswith("noise words") for n in failed)
    bad = next(c for c in sec["results"]["checks"] if c["name"] == "token keys (token_keys_torch)")
    assert bad["mismatches"] == 1 and bad["first_mismatch"]["got"] != bad["first_mismatch"]["reference"]
    # the device side itself still matches the known answers
    ok = next(c for c in sec["results"]["checks"] if c["name"] == "known-answer vectors on CPU")
    assert ok["status"] == "PASS"


def test_edge_key_rows_cover_every_field():
    rows = philox.edge_key_rows(2000, (0, 0xFFFFFFFF))
    assert rows.shape == (2000, 6) and rows.min() >= 0 and rows.max() <= 0xFFFFFFFF
    for j in range(6):
        assert set(philox.EDGE32) <= set(rows[:, j].tolist())
    assert len({tuple(r) for r in rows[:64].tolist()}) == 64  # every combination of the two values


def test_compare_tells_bits_from_tolerance():
    a = np.array([1.0, 2.0])
    b = np.nextafter(a, 3.0)
    assert philox.compare_arrays("x", a, b)["status"] == "FAIL"
    assert philox.compare_arrays("x", a, b, kind="tol", tol=1e-12)["status"] == "PASS"
    assert philox.compare_arrays("x", np.array([1, 2]), np.array([1, 3], dtype=np.uint32))["mismatches"] == 1
