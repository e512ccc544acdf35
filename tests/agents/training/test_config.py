"""The published training settings (the paper's Table 6)."""

import json

import pytest

from twice_envs.agents.credit.gigpo import GiGPOConfig
from twice_envs.agents.credit.twice import TwiceConfig
from twice_envs.agents.credit.vineppo import VineConfig
from twice_envs.agents.training.config import (
    TrainConfig,
    credit_settings,
    published_config,
    read_run_config,
    sampling_config,
    with_settings,
)
from twice_envs.agents.training.trainer import _lr_lambda
from twice_envs.errors import DataFormatError


def test_published_run_is_400_updates_with_a_20_update_warm_up():
    cfg = published_config()
    assert cfg.updates == 400
    assert (cfg.questions_per_update, cfg.group_size, cfg.lr, cfg.minibatches) == (256, 5, 1e-6, 4)
    # the scheduler steps once per minibatch: 4 steps per update, full rate from update 21 on
    lr = _lr_lambda(cfg.warmup_steps)
    assert cfg.warmup_steps == 80
    assert lr(4 * 20 - 2) < 1.0 and lr(4 * 20 - 1) == 1.0
    # the branching warm-up is a separate setting: q = 0.3 for 10 updates
    assert (credit_settings(cfg).warmup_updates, credit_settings(cfg).warmup_q) == (10, 0.3)


def test_published_warm_up_follows_the_minibatches_unless_given():
    assert published_config(minibatches=2).warmup_steps == 40
    assert published_config(minibatches=2, warmup_steps=7).warmup_steps == 7
    assert published_config(updates=5).updates == 5


def test_a_run_config_holds_its_methods_settings_and_reads_them_back(tmp_path):
    """Break: to_json writing the class defaults instead of the run's settings -> per_state 2 comes back."""
    cfg = TrainConfig(method="vineppo", credit=VineConfig(per_state=3))
    d = cfg.to_json()
    assert d["credit"] == {"per_state": 3, "budget": 3.2} and not {"twice", "vine_k", "ablations"} & set(d)
    (tmp_path / "config.json").write_text(json.dumps(d))
    assert read_run_config(tmp_path / "config.json") == cfg
    # no settings given: the method's defaults, written in full
    assert TrainConfig(method="grpo").to_json()["credit"] is None
    assert TrainConfig().to_json()["credit"] == json.loads(json.dumps(TwiceConfig().__dict__))
    assert with_settings(TrainConfig(method="crr"), beta=0.5, per_state=4).credit == TwiceConfig(beta=0.5)
    assert with_settings(TrainConfig(method="grpo"), beta=0.5).credit is None
    with pytest.raises(ValueError, match="credit: the settings of credit method 'grpo' are none, got TwiceConfig"):
        TrainConfig(method="grpo", credit=TwiceConfig())


def _write(tmp_path, **fields):
    data = {**TrainConfig(method="grpo").to_json(), **fields}
    data.pop("credit")
    (tmp_path / "config.json").write_text(json.dumps(data))
    return tmp_path / "config.json"


def test_a_run_folder_written_before_loads_with_the_settings_it_ran_with(tmp_path):
    """Break: legacy_credit dropping the ablations -> star 1; dropping vine_k -> per_state 2."""
    old = {"twice": {**TwiceConfig().__dict__, "beta": 0.5}, "vine_k": 3, "ablations": ["star"]}
    got = read_run_config(_write(tmp_path, method="twice", **old))
    assert got.credit == TwiceConfig(beta=0.5, star=2)
    got = read_run_config(_write(tmp_path, method="vineppo", twice=TwiceConfig().__dict__, vine_k=3, ablations=[]))
    assert got.credit == VineConfig(per_state=3, budget=None)
    got = read_run_config(_write(tmp_path, method="gigpo", twice=TwiceConfig().__dict__, vine_k=2, ablations=[]))
    assert got.credit == GiGPOConfig()


def test_an_older_run_whose_settings_cannot_be_kept_fails_naming_the_field(tmp_path):
    """Never resume with other settings: a grpo run trained with another key mode, or with an ablation."""
    flat = {**TwiceConfig().__dict__, "key_mode": "flat"}
    with pytest.raises(DataFormatError, match="twice.key_mode: 'flat' was the run's sampler key mode"):
        read_run_config(_write(tmp_path, method="grpo", twice=flat, vine_k=2, ablations=[]))
    with pytest.raises(DataFormatError, match=r"ablations: \['star'\] change Twice's settings"):
        read_run_config(_write(tmp_path, method="grpo", twice=TwiceConfig().__dict__, vine_k=2, ablations=["star"]))
    with pytest.raises(DataFormatError, match=r"credit.bogus: not a setting of credit method 'crr' \(TwiceConfig"):
        data = {**TrainConfig(method="crr").to_json()}
        data["credit"] = {"bogus": 1}
        (tmp_path / "config.json").write_text(json.dumps(data))
        read_run_config(tmp_path / "config.json")


def test_the_sampler_key_mode_is_the_methods_setting():
    assert sampling_config(TrainConfig(method="twice", credit=TwiceConfig(key_mode="flat"))).key_mode == "flat"
    assert sampling_config(TrainConfig(method="grpo")).key_mode == TwiceConfig.key_mode


def test_a_run_chooses_only_by_a_known_score():
    assert TrainConfig(choose="mean").choose == "mean" and TrainConfig().choose is None
    with pytest.raises(ValueError, match="choose must be one of"):
        TrainConfig(choose="max")
