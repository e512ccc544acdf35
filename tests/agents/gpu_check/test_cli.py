"""``twice check-gpu`` in its CPU mode: the report's structure and the sections' criteria; the
self-test flag; sections skipped without CUDA; bad arguments."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch  # noqa: E402

from twice_envs import cli as twice_cli  # noqa: E402
from twice_envs.agents.gpu_check import cli  # noqa: E402
from twice_envs.agents.gpu_check.context import CPU_SIZES  # noqa: E402
from twice_envs.agents.gpu_check.report import STATUSES  # noqa: E402
from twice_envs.noise import KEY_MODES  # noqa: E402

SECTION_KEYS = {"id", "title", "status", "criterion", "budget_s", "seconds", "results", "lines", "error"}


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    work = tmp_path_factory.mktemp("work")
    rc = cli.check_gpu_main(["--cpu", "--out", str(out), "--work", str(work)], hard_timeouts=False)
    return rc, json.loads((out / "gpu_check.json").read_text()), (out / "gpu_check.txt").read_text()


@pytest.mark.slow
def test_cpu_mode_report_structure(cpu_run):
    rc, report, text = cpu_run
    assert rc == 0 and report["ok"] is True
    assert report["mode"].startswith("cpu")
    assert [s["id"] for s in report["sections"]] == [s.id for s in cli.SECTIONS]
    for sec in report["sections"]:
        assert set(sec) >= SECTION_KEYS
        assert sec["status"] in STATUSES
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
    assert by["a"]["results"]["key_rows"] == CPU_SIZES.keys
    # (b): all four key modes and greedy, fp32 judged, bf16 measured against the CPU's fp32 tokens
    fp32, bf16 = by["b"]["results"]["fp32_vs_cpu_fp32"], by["b"]["results"]["bf16_vs_cpu_fp32"]
    assert set(fp32) == set(bf16) == set(KEY_MODES) | {"greedy"}
    for cmp in fp32.values():
        assert cmp["status"] == "PASS" and cmp["rows"] == CPU_SIZES.b_batch
    assert all(0.0 <= c["share_identical"] <= 1.0 and len(c["first_divergence"]) == c["rows"] for c in bf16.values())
    # (c): a ratio per batch size, every variant timed on the same number of tokens
    batches = by["c"]["results"]["batches"]
    assert set(batches) == {str(b) for b in CPU_SIZES.c_batches}
    for b, row in batches.items():
        assert len(set(row["tokens"].values())) == 1
        assert row["tokens"]["keyed"] == int(b) * CPU_SIZES.c_tokens
        assert row["keyed_over_plain"] > 0 and row["keyed_over_greedy"] > 0
        assert set(row["step_ms"]) == {"keyed_choice (kernel)", "keyed processor step", "plain multinomial", "argmax"}
    # (d): the build ran its steps and a rate came out of its step lines
    d = by["d"]["results"]
    assert d["rc"] == 0 and d["step_lines"][-1][1] == CPU_SIZES.d_steps
    assert d["rate"]["steps_per_s"] > 0
    assert "--steps 3" in d["command"]


def test_corrupt_reference_flag_fails_the_run(tmp_path):
    rc = cli.check_gpu_main(["--cpu", "--sections", "a", "--corrupt-reference", "--out", str(tmp_path / "r"),
                             "--work", str(tmp_path / "w")], hard_timeouts=False)
    report = json.loads((tmp_path / "r" / "gpu_check.json").read_text())
    assert rc == 1 and report["ok"] is False
    assert [s["id"] for s in report["sections"]] == ["setup", "a"]
    assert report["sections"][1]["status"] == "FAIL"
    assert "FAILED" in (tmp_path / "r" / "gpu_check.txt").read_text()


def test_cuda_sections_skip_without_cuda(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    rc = cli.check_gpu_main(["--out", str(tmp_path / "r"), "--work", str(tmp_path / "w")], hard_timeouts=False)
    report = json.loads((tmp_path / "r" / "gpu_check.json").read_text())
    assert rc == 0
    assert [s["id"] for s in report["sections"]] == ["setup", "a", "b", "c", "d"]
    for sec in report["sections"][1:]:
        assert sec["status"] == "SKIP" and sec["lines"] == ["skipped: no CUDA"]


def test_a_failed_setup_skips_the_model_sections(tmp_path):
    rc = cli.check_gpu_main(["--cpu", "--sections", "abc", "--model", str(tmp_path / "no-model"),
                             "--out", str(tmp_path / "r"), "--work", str(tmp_path / "w")], hard_timeouts=False)
    by = {s["id"]: s for s in json.loads((tmp_path / "r" / "gpu_check.json").read_text())["sections"]}
    assert rc == 1
    assert by["setup"]["status"] == "ERROR" and "no-model" in by["setup"]["lines"][-1]
    assert by["a"]["status"] == "PASS"  # Philox needs no model
    assert by["b"]["status"] == by["c"]["status"] == "SKIP"


@pytest.mark.parametrize("argv, words", [
    (["--sections", "ax"], "--sections: unknown section(s) x"),
    (["--budgets", "a=fast"], "--budgets: 'a=fast'"),
    (["--budgets", "e=10"], "--budgets: 'e=10'"),
    (["--device", "tpu"], "--device: invalid choice"),
])
def test_bad_arguments_are_named(argv, words, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(argv)
    assert exc.value.code == 2 and words in capsys.readouterr().err


def test_the_command_is_registered(capsys):
    assert twice_cli.main(["--help"]) == 0
    assert "check-gpu" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        twice_cli.main(["check-gpu", "--help"])
    assert exc.value.code == 0 and "--bundle DIR" in capsys.readouterr().out
