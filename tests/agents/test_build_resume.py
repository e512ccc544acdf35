"""Builds that resume: an interrupted build continued from its checkpoint ends with the weights of an
uninterrupted one, and a checkpoint that does not fit is refused by name."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from safetensors.torch import load_file

from tests.agents._tiny import TEST_CONFIG, tiny_dir
from twice_envs.agents.models import build, export, recipes, resume
from twice_envs.agents.models import cli as models_cli
from twice_envs.agents.sampling.policy import HFPolicy
from twice_envs.agents.training.checkpoint import CheckpointError

#: A short recipe through every supervised phase of a from-scratch build: the copying warm-up on
#: fewer layers, stacking, then length-bucketed transcripts.
CFG = replace(TEST_CONFIG, copy_steps=8, copy_layers=1, length_buckets=True, steps=12)


class Killed(Exception):
    """Stands for the process being killed."""


def kill_after(monkeypatch, phase: str, step: int) -> None:
    """Make the next build stop right after ``step`` of ``phase`` (after any checkpoint it saves then)."""
    real = resume.PhaseCheckpoint.after_step

    def after_step(self, n, *args, **kwargs):
        real(self, n, *args, **kwargs)
        if self.name == phase and n == step:
            raise Killed(f"{phase} step {n}")

    monkeypatch.setattr(resume.PhaseCheckpoint, "after_step", after_step)


def interrupted(tmp_path, monkeypatch, cfg=CFG, phase="sft", step=7, every=3, name="b"):
    out = tmp_path / name
    with monkeypatch.context() as m:
        kill_after(m, phase, step)
        with pytest.raises(Killed):
            build.build_tiny(out, cfg, progress=False, recipe="test", checkpoint_every=every)
    assert (out / "checkpoint" / "state.pt").is_file() and not (out / "config.json").exists()
    return out


def same_weights(a, b) -> bool:
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("phase,step", [("sft", 7), ("copy", 5)])
def test_an_interrupted_build_resumes_to_the_weights_of_an_uninterrupted_one(tmp_path, monkeypatch, phase, step):
    whole = build.build_tiny(tmp_path / "a", CFG, progress=False, recipe="test", checkpoint_every=3)
    assert not (whole / "checkpoint").exists()  # the finished build replaces its checkpoint
    out = interrupted(tmp_path, monkeypatch, phase=phase, step=step)
    blob = torch.load(out / "checkpoint" / "state.pt", weights_only=True)
    assert (blob["phase"], blob["step"], blob["recipe"]) == (phase, 6 if phase == "sft" else 3, "test")
    assert blob["build_version"] == recipes.TINY_RECIPE and set(blob["rng"]) == {"torch", "numpy", "python"}
    # the transcripts are read back, not played again
    monkeypatch.setattr(build, "scripted_episodes", lambda *a, **k: pytest.fail("transcripts drawn again"))
    done = build.build_tiny(out, CFG, progress=False, recipe="test", checkpoint_every=3, resume=True)
    assert same_weights(whole, done) and recipes.same_build(whole, done)
    assert not (done / "checkpoint").exists()


def test_an_adapter_build_checkpoints_its_adapters_only(tmp_path, monkeypatch):
    cfg = replace(TEST_CONFIG, base_model=str(tiny_dir()), adapter_layers=1, adapter_rank=2, steps=8, lr=1e-2)
    whole = build.build_tiny(tmp_path / "a", cfg, progress=False, recipe="test", checkpoint_every=2)
    out = interrupted(tmp_path, monkeypatch, cfg, step=5, every=2)
    blob = torch.load(out / "checkpoint" / "state.pt", weights_only=True)
    assert blob["trainable"] and all(k.rsplit(".", 1)[-1] in ("lora_a", "lora_b") for k in blob["trainable"])
    done = build.build_tiny(out, cfg, progress=False, recipe="test", checkpoint_every=2, resume=True)
    assert same_weights(whole, done)
    assert (whole / recipes.ADAPTER_FILE).read_bytes() == (done / recipes.ADAPTER_FILE).read_bytes()


def test_resume_without_a_checkpoint_starts_afresh_and_says_so(tmp_path, capsys):
    cfg = replace(TEST_CONFIG, steps=4)
    out = build.build_tiny(tmp_path / "new", cfg, recipe="test", resume=True)
    assert (out / "config.json").is_file()
    assert f"no checkpoint in {tmp_path / 'new' / 'checkpoint'}: starting the build afresh" in capsys.readouterr().err


@pytest.fixture
def saved(tmp_path_factory, monkeypatch):
    """A fresh copy of an interrupted build's folder."""
    root = tmp_path_factory.getbasetemp() / "resume-saved"
    if not root.exists():
        interrupted(root.parent / "resume-tmp", monkeypatch, name="b")
        shutil.move(str(root.parent / "resume-tmp" / "b"), str(root))
    copy = tmp_path_factory.mktemp("saved") / "b"
    shutil.copytree(root, copy)
    return copy


def resume_build(out, cfg=CFG, recipe="test"):
    return build.build_tiny(out, cfg, progress=False, recipe=recipe, checkpoint_every=3, resume=True)


def test_a_checkpoint_of_another_recipe_or_config_is_refused_naming_what_differs(saved):
    state = saved / "checkpoint" / "state.pt"
    with pytest.raises(CheckpointError, match=rf"{state}: a checkpoint of recipe 'test', not of 'other'"):
        resume_build(saved, recipe="other")
    with pytest.raises(CheckpointError) as err:
        resume_build(saved, replace(CFG, lr=5e-3, steps=20))
    assert str(state) in str(err.value) and "lr: 0.01 in the checkpoint, 0.005 now" in str(err.value)
    assert "steps: 12 in the checkpoint, 20 now" in str(err.value) and "batch_size" not in str(err.value)


def test_a_damaged_checkpoint_is_refused_by_name(saved):
    state = saved / "checkpoint" / "state.pt"
    state.write_bytes(state.read_bytes()[:5000])
    with pytest.raises(CheckpointError, match=rf"{state}: not a readable build checkpoint"):
        resume_build(saved)
    assert not (saved / "config.json").exists()  # never a silent restart


def test_damaged_saved_transcripts_are_refused_by_name(saved):
    file = saved / "checkpoint" / "transcripts.json.gz"
    file.write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(CheckpointError, match=rf"{file}: not readable saved transcripts"):
        resume_build(saved)


@pytest.mark.parametrize("field,value,message", [
    ("build_version", recipes.TINY_RECIPE + 1, f"build version {recipes.TINY_RECIPE + 1}; this version builds version"),
    ("format", 99, "build checkpoint format 99; this version reads"),
])
def test_a_checkpoint_of_another_build_version_is_refused(saved, field, value, message):
    state = saved / "checkpoint" / "state.pt"
    blob = torch.load(state, weights_only=True)
    blob[field] = value
    torch.save(blob, state)
    with pytest.raises(CheckpointError, match=rf"{state}: .*{message}"):
        resume_build(saved)


class _RunsCode:
    """Unpickling it would create a file: what a malicious checkpoint could do."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def test_a_checkpoint_that_would_run_code_is_refused_not_run(saved):
    state = saved / "checkpoint" / "state.pt"
    marker = saved / "ran"
    blob = torch.load(state, weights_only=True)
    blob["losses"] = _RunsCode(marker)
    torch.save(blob, state)
    with pytest.raises(CheckpointError, match=rf"{state}: refused to load: it holds objects other than tensors"):
        resume_build(saved)
    assert not marker.exists()


def test_the_cli_continues_a_build_and_refuses_to_start_over_a_checkpoint_unasked(tmp_path, monkeypatch, capsys):
    out = tmp_path / "fmt"
    args = ["build-tiny", "--recipe", "format", "--steps", "4", "--episodes", "4", "--threads", "1",
            "--envs", "CoinChain-v0", "--checkpoint-every", "2"]
    with monkeypatch.context() as m:
        kill_after(m, "sft", 3)
        with pytest.raises(Killed):
            models_cli.models_main(args + ["--out", str(out)])
    with pytest.raises(SystemExit):
        models_cli.models_main(args + ["--out", str(out)])
    err = capsys.readouterr().err
    assert "holds the checkpoint of an interrupted build (recipe 'format', sft phase, step 2/4)" in err
    assert f"--resume {out}" in err
    with pytest.raises(SystemExit):
        models_cli.models_main(args + ["--resume", str(out), "--out", str(tmp_path / "elsewhere")])
    assert models_cli.models_main(args + ["--resume", str(out)]) == 0
    assert recipes.tiny_is_current(out, "format") and not (out / "checkpoint").exists()


def test_a_fresh_build_removes_an_older_checkpoint(saved, monkeypatch):
    with monkeypatch.context() as m:
        kill_after(m, "copy", 1)  # before its own first save
        with pytest.raises(Killed):
            build.build_tiny(saved, CFG, progress=False, recipe="test", checkpoint_every=3)
    assert not (saved / "checkpoint" / "state.pt").exists()


# ------------------------------------------------------------------ export: the model of a checkpoint
def record_at(monkeypatch, phase: str, step: int, seen: dict) -> None:
    """Record the model's trainable weights and its logits on a fixed input right after ``step`` of
    ``phase``, then stop the build there (as :func:`kill_after`)."""
    real = resume.PhaseCheckpoint.after_step

    def after_step(self, n, model, *args, **kwargs):
        real(self, n, model, *args, **kwargs)
        if self.name == phase and n == step:
            with torch.no_grad():
                seen["weights"] = resume.trainable_state(model)
                seen["logits"] = model(torch.arange(3, 19).unsqueeze(0)).logits.clone()
            raise Killed(f"{phase} step {n}")

    monkeypatch.setattr(resume.PhaseCheckpoint, "after_step", after_step)


def test_export_writes_the_model_of_the_last_checkpoint_and_the_build_still_resumes(tmp_path, monkeypatch):
    whole = build.build_tiny(tmp_path / "a", CFG, progress=False, recipe="test", checkpoint_every=3)
    out, seen = tmp_path / "b", {}
    with monkeypatch.context() as m:
        record_at(m, "sft", 6, seen)
        with pytest.raises(Killed):
            build.build_tiny(out, CFG, progress=False, recipe="test", checkpoint_every=3)
    state = (out / "checkpoint" / "state.pt").read_bytes()
    got = export.export_checkpoint(out, tmp_path / "at6", recipe="test", cfg=CFG)
    weights = load_file(str(got / "model.safetensors"))
    assert weights and all(torch.equal(weights[k], seen["weights"][k]) for k in weights)
    # the tokenizer is the build's, trained again on the saved transcripts
    assert (got / "tokenizer.json").read_bytes() == (whole / "tokenizer.json").read_bytes()
    model = HFPolicy.from_pretrained(got).model
    with torch.no_grad():
        assert torch.equal(model(torch.arange(3, 19).unsqueeze(0)).logits, seen["logits"])
    meta = json.loads((got / "twice_model.json").read_text())
    assert meta["checkpoint"] == {"phase": "sft", "step": 6, "steps": 12} and meta["recipe_name"] == "test"
    assert not recipes.tiny_is_current(got, "test")  # never taken for the finished build
    assert (out / "checkpoint" / "state.pt").read_bytes() == state  # the checkpoint is left as it was
    done = resume_build(out)
    assert same_weights(whole, done)


def test_export_of_an_adapted_build_writes_its_adapters_and_merges_them(tmp_path, monkeypatch):
    cfg = replace(TEST_CONFIG, base_model=str(tiny_dir()), adapter_layers=1, adapter_rank=2, steps=8, lr=1e-2)
    out, seen = tmp_path / "b", {}
    with monkeypatch.context() as m:
        record_at(m, "sft", 4, seen)
        with pytest.raises(Killed):
            build.build_tiny(out, cfg, progress=False, recipe="test", checkpoint_every=2)
    got = export.export_checkpoint(out, tmp_path / "at4", recipe="test", cfg=cfg)
    adapters = load_file(str(got / recipes.ADAPTER_FILE))
    assert adapters.keys() == seen["weights"].keys()
    assert all(torch.equal(adapters[k], seen["weights"][k]) for k in adapters)
    model = HFPolicy.from_pretrained(got).model  # the merged weights: the same function, up to rounding
    with torch.no_grad():
        torch.testing.assert_close(model(torch.arange(3, 19).unsqueeze(0)).logits, seen["logits"],
                                   rtol=1e-4, atol=1e-4)
    assert json.loads((got / "twice_model.json").read_text())["adapter"]["base_model"] == str(tiny_dir())


def test_export_refuses_a_drill_checkpoint_a_missing_one_and_another_recipe(tmp_path, monkeypatch, saved):
    drill = interrupted(tmp_path, monkeypatch, phase="copy", step=5, name="drill")
    with pytest.raises(CheckpointError, match="saved in the copy drill .*no model to export yet"):
        export.export_checkpoint(drill, tmp_path / "x", recipe="test", cfg=CFG)
    with pytest.raises(CheckpointError, match=rf"{tmp_path / 'none' / 'checkpoint' / 'state.pt'}: no build checkpoint"):
        export.export_checkpoint(tmp_path / "none", tmp_path / "x")
    with pytest.raises(CheckpointError, match="a checkpoint of recipe 'test', not of 'other'"):
        export.export_checkpoint(saved, tmp_path / "x", recipe="other")
    with pytest.raises(CheckpointError, match="lr: 0.01 in the checkpoint, 0.005 now"):
        export.export_checkpoint(saved, tmp_path / "x", recipe="test", cfg=replace(CFG, lr=5e-3))
    assert not (tmp_path / "x").exists()


def test_the_cli_exports_a_checkpoint(tmp_path, monkeypatch, capsys):
    out = tmp_path / "fmt"
    args = ["build-tiny", "--recipe", "format", "--steps", "4", "--episodes", "4", "--threads", "1",
            "--envs", "CoinChain-v0", "--checkpoint-every", "2", "--out", str(out)]
    with monkeypatch.context() as m:
        kill_after(m, "sft", 3)
        with pytest.raises(Killed):
            models_cli.models_main(args)
    with pytest.raises(SystemExit):
        models_cli.models_main(["export", str(out), "--out", str(out)])
    assert "--out must be another folder than DIR" in capsys.readouterr().err
    # the model is built by the config the checkpoint records: the build's --envs and --steps included
    assert models_cli.models_main(["export", str(out), "--out", str(tmp_path / "m")]) == 0
    assert f"{tmp_path / 'm'} (recipe format, sft step 2/4)" in capsys.readouterr().out
    meta = json.loads((tmp_path / "m" / "twice_model.json").read_text())
    assert meta["config"]["envs"] == ["CoinChain-v0"] and meta["config"]["steps"] == 4
    assert HFPolicy.from_pretrained(tmp_path / "m").model is not None
    assert models_cli.models_main(args[:-2] + ["--resume", str(out)]) == 0  # and the build goes on
    assert recipes.tiny_is_current(out, "format")


def test_a_recorded_config_is_read_back_as_it_was_and_unknown_fields_are_refused(saved):
    blob = torch.load(saved / "checkpoint" / "state.pt", weights_only=True)
    assert resume.recorded_config(json.loads(blob["config"]), "f") == CFG
    with pytest.raises(CheckpointError, match="f: its recipe config has fields this version does not know: wings"):
        resume.recorded_config({**json.loads(blob["config"]), "wings": 2}, "f")
