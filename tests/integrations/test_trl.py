"""TRL's GRPOTrainer with the project's rollouts and per-token twin credit (CPU, tiny model, SearchQA-v0)."""

import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from twice_envs.agents.credit.twice import TwiceConfig  # noqa: E402
from twice_envs.integrations import trl as twice_trl  # noqa: E402
from twice_envs.integrations.episodes import response_row  # noqa: E402


@pytest.fixture
def trainer(tmp_path):
    from trl import GRPOConfig

    from twice_envs.agents.models.load import load_policy

    torch.manual_seed(0)
    policy = load_policy("tiny")
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2, max_steps=2,
                      learning_rate=1e-3, beta=0.0, temperature=1.0, use_cpu=True, report_to=[], logging_steps=1,
                      save_strategy="no", seed=0, gradient_checkpointing=False)
    # every decision branched (warm-up q = 1), so twins run in each batch; F1 minus a search cost
    # gives the tiny model's episodes different outcomes (plain EM is 0 on almost every task)
    cfg = twice_trl.TwinRolloutConfig(env_id="SearchQA-v0", env_kwargs={"reward": "cost_f1"}, method="twice",
                                      max_turns=3, max_new_tokens=128, credit=TwiceConfig(warmup_q=1.0), seed=0)
    rollout = twice_trl.TwinRollout(cfg)
    t = twice_trl.TwinCreditGRPOTrainer(model=policy.model, reward_funcs=twice_trl.env_utility, args=args,
                                        train_dataset=twice_trl.task_dataset(8), processing_class=policy.tokenizer,
                                        rollout_func=rollout)
    return t, rollout


def test_task_prompts_round_trip_and_reject_junk():
    task = twice_trl.parse_task(twice_trl.task_prompt(3, {"split": "dev", "index": 3}))
    assert task.seed == 3 and task.options == {"split": "dev", "index": 3}
    with pytest.raises(ValueError, match="task_prompt"):
        twice_trl.parse_task("what is the capital of France?")


def test_a_batch_must_repeat_each_task_num_generations_times_in_a_row():
    rollout = twice_trl.TwinRollout(twice_trl.TwinRolloutConfig(method="grpo"))
    a, b, c = (twice_trl.task_prompt(i) for i in range(3))
    with pytest.raises(ValueError, match="rows 0..1 should repeat one task"):
        rollout.play(None, [a, b, b, a], group_size=2)
    with pytest.raises(ValueError, match="3 rows do not make groups of num_generations = 2"):
        rollout.play(None, [a, a, b], group_size=2)
    with pytest.raises(ValueError, match=r"equally often .* \[1, 2\]"):
        rollout.play(None, [a, a, b])
    with pytest.raises(ValueError, match="6 rows cannot be split over 4 processes"):
        rollout.play(None, [a, a, b, b, c, c], group_size=2, processes=twice_trl.Processes(0, 4, lambda x: x))


def test_group_size_scales_with_the_methods_rollouts_and_methods_trl_cannot_serve_are_refused():
    assert twice_trl.num_generations("grpo", 5) == 5 and twice_trl.num_generations("grpo-2x", 5) == 10
    with pytest.raises(ValueError, match="'ppo' needs a critic"):
        twice_trl.TwinRollout(twice_trl.TwinRolloutConfig(method="ppo"))
    with pytest.raises(ValueError, match="'twice-tree' grows further factual episodes"):
        twice_trl.TwinRollout(twice_trl.TwinRolloutConfig(method="twice-tree"))
    with pytest.raises(ValueError, match="'igpo' needs each task's gold answer.*'WebShop-v0'"):
        twice_trl.TwinRollout(twice_trl.TwinRolloutConfig(method="igpo", env_id="WebShop-v0"))


def test_loss_at_ratio_one_is_minus_mean_advantage_over_generated_tokens(trainer):
    t, rollout = trainer
    prompts = [twice_trl.task_prompt(i, {"split": "train", "index": i}) for i in (0, 0, 1, 1)]
    t.model.train()
    out = t._generate_and_score_completions([{"prompt": p} for p in prompts])
    episodes = rollout.last_episodes
    assert len(episodes) == 4 and [e.group for e in episodes] == [0, 0, 1, 1]
    # the env mask is the rollout's loss mask: observation tokens are 0
    for b, ep in enumerate(episodes):
        row = response_row(ep)
        n = len(row.response_ids)
        assert out["completion_ids"][b, :n].tolist() == row.response_ids
        assert out["tool_mask"][b, :n].tolist() == row.mask
    assert any(0 in response_row(ep).mask for ep in episodes), "no observation tokens in the batch"
    assert rollout.last_aux_tokens > 0, "no twins were run"
    adv, mask = out["advantages"], out["completion_mask"] * out["tool_mask"]
    assert adv.shape == out["completion_ids"].shape
    assert torch.all(adv[mask == 0] == 0)
    assert torch.any(adv != 0), "all advantages are 0: the test would not see the loss"
    t.current_gradient_accumulation_steps = 1
    loss = t.compute_loss(t.model, out)
    expected = -(adv * mask).sum() / mask.sum()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-7)
    # observation tokens never enter the loss, whatever advantage they carry
    poisoned = dict(out, advantages=adv + 1000.0 * (mask == 0))
    assert t.compute_loss(t.model, poisoned).item() == pytest.approx(loss.item(), rel=1e-6, abs=1e-7)


def test_two_optimizer_steps_change_the_parameters(trainer):
    t, _ = trainer
    before = {k: v.detach().clone() for k, v in t.model.named_parameters()}
    t.train()
    assert t.state.global_step == 2
    changed = [k for k, v in t.model.named_parameters() if not torch.equal(v.detach(), before[k])]
    assert changed, "no parameter changed after two optimiser steps"
