"""The LLM critic of PPO on a small policy: where it reads values, that a fit lowers the value
loss, and that a resumed run's critic continues exactly."""

import numpy as np
import pytest
import torch

from twice_envs.agents.rollout.context import turn_context
from twice_envs.agents.rollout.episodes import rollout
from twice_envs.agents.training.config import sampling_config
from twice_envs.agents.training.critic import LLMCritic, value_positions
from twice_envs.agents.training.evaluate import make_tasks
from twice_envs.agents.training.trainer import train

from ..train_helpers import one_torch_thread, small_policy, toy_config  # noqa: F401


def _episodes(policy, tmp_path, window=None, n=3):
    cfg = toy_config(tmp_path, window=window)
    return rollout(policy, cfg.env, make_tasks(range(n), cfg.train_split, False), group_size=2,
                   sampling=sampling_config(cfg), noise_seed=4, max_turns=3, window=window)


@pytest.mark.parametrize("window", [None, 1])
def test_values_are_read_at_the_last_token_of_each_turns_context(tmp_path, window):
    """Break: reading at the turn's first generated token (j, not j - 1) puts one token too many before it."""
    policy = small_policy(0)
    eps = _episodes(policy, tmp_path, window)
    assert any(len(e.turns) == 3 for e in eps)
    for ep in eps:
        seen = []
        for ids, marks in value_positions(ep):
            for t, j in marks:
                assert ids[:j + 1] == turn_context(ep, t), (t, window)
                seen.append(t)
        assert sorted(seen) == list(range(len(ep.turns)))
    critic = LLMCritic(policy.model, lr=1e-2, pad_id=policy.pad_id)
    vals = critic.values(eps)
    assert [v.shape for v in vals] == [(len(e.turns),) for e in eps]
    assert all(np.all(v == 0) for v in vals)  # the head starts at zero


def test_a_fit_lowers_the_value_loss_on_a_fixed_batch_and_leaves_the_policy_alone(tmp_path):
    """Break: a fit that never steps the optimiser leaves the loss where it was."""
    policy = small_policy(0)
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    eps = _episodes(policy, tmp_path)
    rng = np.random.default_rng(0)
    targets = [rng.random(len(e.turns)) for e in eps]
    critic = LLMCritic(policy.model, lr=1e-2, minibatches=2, pad_id=policy.pad_id)
    losses = [critic.fit(eps, targets)["value_loss"] for _ in range(8)]
    v = critic.values(eps)
    final = 0.5 * np.mean(np.concatenate([(a - b) ** 2 for a, b in zip(v, targets)]))
    assert final < 0.5 * losses[0]
    assert all(torch.equal(v, policy.model.state_dict()[k]) for k, v in before.items())  # a separate copy


def test_a_resumed_ppo_run_continues_its_critic_exactly(tmp_path):
    """Break: not restoring the critic in load_checkpoint resumes it from the initial copy (weights differ)."""
    kw = {"method": "ppo", "questions_per_update": 4, "seed": 3}  # a seed whose first batch has a return above 0
    straight = train(toy_config(tmp_path / "a", updates=2, **kw), policy=small_policy(0), progress=False)
    a = torch.load(tmp_path / "a" / "run" / "checkpoint" / "state.pt", weights_only=True)
    train(toy_config(tmp_path / "b", updates=1, **kw), policy=small_policy(0), progress=False)
    resumed = train(toy_config(tmp_path / "b", updates=2, **kw), policy=small_policy(0), progress=False, resume=True)
    b = torch.load(tmp_path / "b" / "run" / "checkpoint" / "state.pt", weights_only=True)
    assert straight[0]["reward"] > 0 and straight[0]["value_loss"] > 0  # the critic had something to learn
    assert resumed[0]["value_loss"] == straight[1]["value_loss"]
    for part in ("body", "head"):
        for k, v in a["critic"][part].items():
            assert torch.equal(v, b["critic"][part][k]), (part, k)
    assert a["critic"]["optimizer"]["state"].keys() == b["critic"]["optimizer"]["state"].keys()
    assert not torch.equal(a["critic"]["head"]["weight"], torch.zeros_like(a["critic"]["head"]["weight"]))
    g = train(toy_config(tmp_path / "c", method="grpo", updates=1), policy=small_policy(0), progress=False)
    assert "value_loss" not in g[0]
    assert "critic" not in torch.load(tmp_path / "c" / "run" / "checkpoint" / "state.pt", weights_only=True)


def test_twice_train_method_ppo_runs_an_update_on_searchqa_with_the_shipped_tiny_model(tmp_path):
    """Break: dropping ("critic_lr", "critic_lr") from the CLI's flag table leaves config.json at the default rate."""
    import json

    from twice_envs.agents.cli.train import train_main

    run = tmp_path / "run"
    assert train_main(["--env", "SearchQA-v0", "--model", "tiny", "--method", "ppo", "--updates", "1", "--questions",
                       "2", "--group-size", "2", "--critic-lr", "1e-3", "--out", str(run), "--no-progress"]) == 0
    row = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert row["update"] == 1 and "value_loss" in row and "explained_variance" in row
    assert json.loads((run / "config.json").read_text())["critic_lr"] == 1e-3
    assert "critic" in torch.load(run / "checkpoint" / "state.pt", weights_only=True)
