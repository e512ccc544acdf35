"""``twice check-gpu --bundle DIR``: the distributions it bundles, the pip command it runs, the
folder it writes, and clear errors (a distribution not installed, a folder in use, pip failing)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from twice_envs.agents.gpu_check import bundle  # noqa: E402
from twice_envs.errors import TwiceError  # noqa: E402


def test_the_check_needs_the_extras_closure_without_torch():
    deps = bundle.needed_distributions(extras=("hf", "alfworld"))
    assert {"numpy", "gymnasium", "transformers", "accelerate", "gguf", "tokenizers", "safetensors", "alfworld",
            "textworld"} <= set(deps)
    assert "torch" not in deps and "twice-envs" not in deps
    assert not any(name.startswith(("nvidia-", "triton")) for name in deps)  # reached through torch only
    assert all(version and version[0].isdigit() for version in deps.values())


def test_a_needed_distribution_not_installed_is_named():
    with pytest.raises(TwiceError, match="not installed here: no-such-distribution-here"):
        bundle.needed_distributions("no-such-distribution-here", extras=())


def _fake_pip(calls: list, fail: bool = False):
    def run(cmd, **kwargs):
        calls.append(cmd)
        dest = Path(cmd[cmd.index("--wheel-dir") + 1])
        if fail:
            return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found for numpy==9.9")
        for req in cmd[cmd.index("--wheel-dir") + 2:]:
            name, _, version = req.partition("==")
            name, version = ("twice_envs", "0.1.0") if not version else (name.replace("-", "_"), version)
            (dest / f"{name}-{version}-py3-none-any.whl").write_bytes(b"")
        return subprocess.CompletedProcess(cmd, 0, "", "")
    return run


@pytest.fixture
def two_deps(monkeypatch):
    monkeypatch.setattr(bundle, "needed_distributions", lambda: {"gymnasium": "1.4.0", "typing-extensions": "4.16"})


def test_the_bundle_is_one_folder_of_wheels_with_its_instructions(tmp_path, two_deps):
    calls: list = []
    manifest = bundle.write_bundle(tmp_path / "b", run=_fake_pip(calls))
    (cmd,) = calls
    assert cmd[1:5] == ["-m", "pip", "wheel", "--no-deps"]
    assert str(bundle.project_source()) in cmd and "gymnasium==1.4.0" in cmd and "typing-extensions==4.16" in cmd
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["README.txt", "bundle.json", "wheels"]
    assert json.loads((tmp_path / "b" / "bundle.json").read_text()) == manifest
    assert manifest["left_out"] == ["torch"] and len(manifest["wheels"]) == 3
    readme = (tmp_path / "b" / "README.txt").read_text()
    assert "pip install --no-index --find-links wheels 'twice-envs[hf,alfworld,smollm2]'" in readme
    assert "twice check-gpu" in readme


def test_a_folder_in_use_is_refused(tmp_path, two_deps):
    (tmp_path / "old.whl").write_bytes(b"")
    with pytest.raises(TwiceError, match="not an empty folder"):
        bundle.write_bundle(tmp_path, run=_fake_pip([]))


def test_pip_failing_is_one_clear_error(tmp_path, two_deps):
    with pytest.raises(TwiceError) as err:
        bundle.write_bundle(tmp_path / "b", run=_fake_pip([], fail=True))
    msg = str(err.value)
    assert "gymnasium, twice-envs, typing-extensions" in msg and "No matching distribution found" in msg
