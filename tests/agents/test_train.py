"""The trainer on CreditToy-v0 with a small random policy: wiring, metrics, exact resume, eval."""

import json

import numpy as np
import pytest
import torch

from twice_envs.agents.train import TrainConfig, evaluate, train

from .train_helpers import one_torch_thread, small_policy, toy_config  # noqa: F401


@pytest.fixture(scope="module")
def policy_factory():
    return lambda: small_policy(0)


def test_resume_continues_exactly(tmp_path, policy_factory):
    straight = toy_config(tmp_path / "a", method="twice", updates=2)
    m_straight = train(straight, policy=policy_factory(), progress=False)
    a_state = torch.load(tmp_path / "a" / "run" / "checkpoint" / "state.pt", weights_only=False)

    first = toy_config(tmp_path / "b", method="twice", updates=1)
    train(first, policy=policy_factory(), progress=False)
    resumed = toy_config(tmp_path / "b", method="twice", updates=2)
    m_resumed = train(resumed, policy=policy_factory(), progress=False, resume=True)
    b_state = torch.load(tmp_path / "b" / "run" / "checkpoint" / "state.pt", weights_only=False)

    assert len(m_resumed) == 1 and m_resumed[0]["update"] == 2
    for k in ("reward", "generated_tokens", "aux_tokens", "loss"):
        assert m_resumed[0][k] == m_straight[1][k], k
    for k, v in a_state["model"].items():
        assert torch.equal(v, b_state["model"][k]), k
    assert a_state["predictor"] == b_state["predictor"]
    assert a_state["rng"] == b_state["rng"]
    lines = (tmp_path / "b" / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(l)["update"] for l in lines] == [1, 2]
    # the update actually changed the weights
    init = policy_factory().model.state_dict()
    assert any(not torch.equal(v, a_state["model"][k]) for k, v in init.items())


@pytest.mark.parametrize("method", ["grpo", "crr", "vineppo"])
def test_every_method_trains_and_logs_its_metrics(tmp_path, policy_factory, method):
    m = train(toy_config(tmp_path, method=method, updates=1), policy=policy_factory(), progress=False)[0]
    for k in ("reward", "em", "generated_tokens", "aux_tokens", "realised_beta", "loss", "kl", "time"):
        assert k in m
    assert m["generated_tokens"] > 0
    if method == "grpo":
        assert m["aux_tokens"] == 0
    else:
        assert m["aux_tokens"] > 0
    if method == "crr":
        for k in ("rho", "self_twin_share", "tie_share", "mean_q"):
            assert k in m


def test_twice_logs_predictor_and_branching(tmp_path, policy_factory):
    cfg = toy_config(tmp_path, method="twice", updates=1)
    m = train(cfg, policy=policy_factory(), progress=False)[0]
    assert m["mean_q"] == pytest.approx(0.3)  # warm-up branching
    assert "predictor_auc" in m and "self_twin_share" in m and m["twins"] >= 1


def test_greedy_eval_reports_em_and_f1(policy_factory):
    from twice_envs.agents import toy  # noqa: F401

    cfg = TrainConfig(env="CreditToy-v0", indexed_tasks=False, max_new_tokens=3, max_turns=3)
    res = evaluate(policy_factory(), cfg, questions=3)
    assert res["n"] == 3 and 0.0 <= res["em"] <= 1.0 and "CreditToy-v0" in res["per_dataset"]


def test_config_round_trips_through_json():
    cfg = TrainConfig(ablations=("star",))
    assert TrainConfig.from_json(json.loads(json.dumps(cfg.to_json()))) == cfg
