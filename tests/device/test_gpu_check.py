"""The GPU check script (``tests/device/gpu_check.py``) in its CPU mode: the report's structure, the
sections' criteria, and that section a's comparison fails against a corrupted reference."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.device import gpu_check  # noqa: E402
from twice_envs.noise import KEY_MODES  # noqa: E402

HERE = Path(__file__).resolve().parent
SECTION_KEYS = {"id", "title", "status", "criterion", "budget_s", "seconds", "results", "lines", "error"}


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    work = tmp_path_factory.mktemp("work")
    rc = gpu_check.main(["--cpu", "--out", str(out), "--work", str(work)], hard_timeouts=False)
    return rc, json.loads((out / "gpu_check.json").read_text()), (out / "gpu_check.txt").read_text()


@pytest.mark.slow
def test_cpu_mode_report_structure(cpu_run):
    rc, report, text = cpu_run
    assert rc == 0 and report["ok"] is True
    assert report["mode"].startswith("cpu")
    assert [s["id"] for s in report["sections"]] == list(gpu_check.SECTIONS)
    for sec in report["sections"]:
        assert set(sec) >= SECTION_KEYS
        assert sec["status"] in gpu_check.STATUSES
        assert sec["error"] is None, sec["error"]
        assert 0 <= sec["seconds"] <= sec["budget_s"] + 5
        header = sec["title"] if sec["id"] == "setup" else f"({sec['id']}) {sec['title']}"
        assert f"== {header}: {sec['status']}" in text
    assert "summary: setup INFO, a PASS, b PASS, c INFO, d PASS; ok" in text


@pytest.mark.slow
def test_cpu_mode_sections(cpu_run):
    _, report, _ = cpu_run
    by = {s["id"]: s for s in report["sections"]}
    assert by["setup"]["results"]["model"]["name"] == "tiny"
    # (a): every comparison ran and matched; float32 Gumbel noise is reported, not judged
    checks = by["a"]["results"]["checks"]
    assert {c["status"] for c in checks} <= {"PASS", "INFO"}
    assert sum(c["status"] == "PASS" for c in checks) >= 12
    assert by["a"]["results"]["key_rows"] == gpu_check.CPU_SIZES.keys
    # (b): all four key modes and greedy, fp32 judged, bf16 measured against the CPU's fp32 tokens
    fp32, bf16 = by["b"]["results"]["fp32_vs_cpu_fp32"], by["b"]["results"]["bf16_vs_cpu_fp32"]
    assert set(fp32) == set(bf16) == set(KEY_MODES) | {"greedy"}
    for cmp in fp32.values():
        assert cmp["status"] == "PASS" and cmp["rows"] == gpu_check.CPU_SIZES.b_batch
    assert all(0.0 <= c["share_identical"] <= 1.0 and len(c["first_divergence"]) == c["rows"] for c in bf16.values())
    # (c): a ratio per batch size, every variant timed on the same number of tokens
    batches = by["c"]["results"]["batches"]
    assert set(batches) == {str(b) for b in gpu_check.CPU_SIZES.c_batches}
    for b, row in batches.items():
        assert len(set(row["tokens"].values())) == 1
        assert row["tokens"]["keyed"] == int(b) * gpu_check.CPU_SIZES.c_tokens
        assert row["keyed_over_plain"] > 0 and row["keyed_over_greedy"] > 0
        assert set(row["step_ms"]) == {"keyed_choice (kernel)", "keyed processor step", "plain multinomial", "argmax"}
    # (d): the build ran its steps and a rate came out of its step lines
    d = by["d"]["results"]
    assert d["rc"] == 0 and d["step_lines"][-1][1] == gpu_check.CPU_SIZES.d_steps
    assert d["rate"]["steps_per_s"] > 0
    assert "--steps 3" in d["command"]


def _cpu_context(tmp_path):
    return gpu_check.Context(cpu_mode=True, device="cpu", sizes=gpu_check.CPU_SIZES, work=tmp_path)


def test_philox_section_fails_against_a_corrupted_reference(tmp_path):
    ctx = _cpu_context(tmp_path)
    sec = gpu_check.run_section(
        "a", "philox", lambda s, dl: gpu_check.section_philox(ctx, s, dl, gpu_check.CorruptedReference()), 60,
        hard=False)
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


def test_a_forged_divergence_is_not_float_error(tmp_path):
    from twice_envs.agents.sampling.policy import SamplingConfig

    ctx = _cpu_context(tmp_path)
    policy = ctx.policy("cpu", "float32")
    request = gpu_check.make_requests(ctx.tokenizer(), 1)[0]
    for greedy in (False, True):
        sampling = SamplingConfig(temperature=1.0, top_p=0.95, max_new_tokens=3, greedy=greedy)
        ref = policy.generate([request], sampling)[0].token_ids
        forged = [(ref[0] + 1) % policy.vocab_size, *ref[1:]]
        d = gpu_check.explain_divergence(policy, policy, request, sampling, ref, forged, 0)
        assert d["logit_diff_max"] == 0.0 and d["explained"] is False, d
        same = gpu_check.explain_divergence(policy, policy, request, sampling, ref, ref, 0)
        assert same["gap"] == 0.0 and same["explained"] is True


def test_corrupt_reference_flag_fails_the_run(tmp_path):
    rc = gpu_check.main(["--cpu", "--sections", "a", "--corrupt-reference", "--out", str(tmp_path / "r"),
                         "--work", str(tmp_path / "w")], hard_timeouts=False)
    report = json.loads((tmp_path / "r" / "gpu_check.json").read_text())
    assert rc == 1 and report["ok"] is False
    assert [s["id"] for s in report["sections"]] == ["setup", "a"]
    assert report["sections"][1]["status"] == "FAIL"
    assert "FAILED" in (tmp_path / "r" / "gpu_check.txt").read_text()


def test_cuda_sections_skip_without_cuda(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    rc = gpu_check.main(["--out", str(tmp_path / "r"), "--work", str(tmp_path / "w")], hard_timeouts=False)
    report = json.loads((tmp_path / "r" / "gpu_check.json").read_text())
    assert rc == 0
    for sec in report["sections"][1:]:
        assert sec["status"] == "SKIP" and sec["lines"] == ["skipped: no CUDA"]


def test_a_section_past_its_budget_is_stopped_and_the_next_runs():
    def slow(sec, deadline):
        time.sleep(5)

    t0 = time.monotonic()
    sec = gpu_check.run_section("x", "slow", slow, 0.2, hard=True, grace=0.2)
    assert time.monotonic() - t0 < 3
    assert sec["status"] == "FAIL" and "time budget" in sec["error"]

    def broken(sec, deadline):
        raise RuntimeError("boom")

    sec = gpu_check.run_section("y", "broken", broken, 5)
    assert sec["status"] == "ERROR" and "boom" in sec["error"]


def test_edge_key_rows_cover_every_field():
    rows = gpu_check.edge_key_rows(2000, (0, 0xFFFFFFFF))
    assert rows.shape == (2000, 6) and rows.min() >= 0 and rows.max() <= 0xFFFFFFFF
    for j in range(6):
        assert set(gpu_check.EDGE32) <= set(rows[:, j].tolist())
    assert len({tuple(r) for r in rows[:64].tolist()}) == 64  # every combination of the two values


def test_compare_rows_and_step_rate():
    cmp = gpu_check.compare_rows([[1, 2, 3], [4, 5], [6, 7]], [[1, 2, 3], [4, 9], [6]])
    assert cmp["first_divergence"] == [None, 1, 1]
    assert (cmp["tokens_identical"], cmp["tokens"], cmp["rows_identical"]) == (5, 7, 1)
    rate = gpu_check.step_rate([(10.0, 1), (20.0, 26), (30.0, 50)])
    assert rate["steps_per_s"] == round(49 / 20, 3) and rate["last_stretch_steps_per_s"] == round(24 / 10, 3)
    assert gpu_check.step_rate([(1.0, 1)]) is None


def test_compare_tells_bits_from_tolerance():
    a = np.array([1.0, 2.0])
    b = np.nextafter(a, 3.0)
    assert gpu_check._compare("x", a, b)["status"] == "FAIL"
    assert gpu_check._compare("x", a, b, kind="tol", tol=1e-12)["status"] == "PASS"
    assert gpu_check._compare("x", np.array([1, 2]), np.array([1, 3], dtype=np.uint32))["mismatches"] == 1


def test_scripts_parse():
    for script in ("run.sh", "prepare.sh"):
        subprocess.run(["bash", "-n", str(HERE / script)], check=True)
