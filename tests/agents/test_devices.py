"""Device names checked before any work: the library calls, the CLIs, and a build on a GPU where there is one."""

from __future__ import annotations

import json

import pytest
import torch

from tests.agents._tiny import TEST_CONFIG
from twice_envs.agents.bench.games import main as games_main
from twice_envs.agents.models import build, dirs, load
from twice_envs.agents.models import cli as models_cli
from twice_envs.agents.models.sft import teacher_forced_loss
from twice_envs.agents.sampling.devices import torch_device

#: a CUDA device this machine does not have, whatever it has
ABSENT = f"cuda:{torch.cuda.device_count() if torch.cuda.is_available() else 0}"


def test_known_devices_pass_and_others_are_named():
    assert torch_device("cpu") == torch.device("cpu")
    for bad, why in ((ABSENT, "not available here"), ("gpu", "not a torch device"), ("meta", "cpu, cuda or mps")):
        with pytest.raises(ValueError, match=f"device '{bad}'.*{why}"):
            torch_device(bad)


def test_a_missing_device_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(build, "scripted_episodes", lambda *a, **k: pytest.fail("work started"))
    with pytest.raises(ValueError, match=f"device '{ABSENT}' is not available"):
        build.build_tiny(tmp_path / "m", TEST_CONFIG, progress=False, recipe="test", device=ABSENT)
    assert not (tmp_path / "m").exists()
    # the model folder is fine: the error names the device, not the folder
    with pytest.raises(ValueError, match=f"device '{ABSENT}'") as err:
        load.load_policy(str(dirs.SHIPPED_TINY), device=ABSENT)
    assert not isinstance(err.value, dirs.ModelFolderError)
    with pytest.raises(SystemExit) as exit_:
        models_cli.models_main(["build-tiny", "--recipe", "format", "--out", str(tmp_path / "m"), "--device", ABSENT])
    assert exit_.value.code == 2
    with pytest.raises(SystemExit):
        games_main(["--eval-only", "--envs", "WebShop-v0", "--device", ABSENT])
    assert capsys.readouterr().err.count(f"device '{ABSENT}' is not available here") == 2


def test_a_cpu_build_records_its_device(tmp_path):
    out = build.build_tiny(tmp_path / "m", TEST_CONFIG, progress=False, recipe="test")
    assert json.loads((out / "twice_model.json").read_text())["device"] == "cpu"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_build_on_the_gpu_trains_there_and_saves_from_the_cpu(tmp_path):
    from twice_envs.agents.models.sft import sft_sequences
    from twice_envs.agents.models.transcripts import scripted_episodes
    from twice_envs.agents.sampling.policy import HFPolicy

    gpu = build.build_tiny(tmp_path / "gpu", TEST_CONFIG, progress=False, recipe="test", device="cuda")
    cpu = build.build_tiny(tmp_path / "cpu", TEST_CONFIG, progress=False, recipe="test")
    assert json.loads((gpu / "twice_model.json").read_text())["device"] == "cuda"
    a, b = HFPolicy.from_pretrained(gpu), HFPolicy.from_pretrained(cpu)
    assert next(a.model.parameters()).device.type == "cpu"
    eps = scripted_episodes("CoinChain-v0", 20, seed=99, max_turns=TEST_CONFIG.max_turns)
    seqs = sft_sequences(a.tokenizer, eps, TEST_CONFIG.max_len)
    # float training differs in its last bits between devices, not in what it learns
    loss_gpu, loss_cpu = teacher_forced_loss(a.model, seqs), teacher_forced_loss(b.model, seqs)
    assert abs(loss_gpu - loss_cpu) < 0.1 * loss_cpu + 0.02
