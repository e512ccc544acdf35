"""``twice bench cost``: every method's seconds and tokens per update against GRPO's, measured in turns."""

import pytest

from twice_envs.agents.bench.cost import CostConfig, format_cost, run_cost


def test_cost_bench_measures_each_method_against_grpo_in_the_same_run():
    res = run_cost(CostConfig(methods=("grpo-2x",), updates=2, skip=1, questions=2, n_boot=200))
    grpo, double = res["methods"]["grpo"], res["methods"]["grpo-2x"]
    assert list(res["methods"]) == ["grpo", "grpo-2x"]  # GRPO always measured, first
    assert grpo["seconds_vs_grpo"]["value"] == pytest.approx(1.0)
    assert grpo["tokens_vs_grpo"]["value"] == pytest.approx(1.0)
    # twice the rollouts per task: more factual tokens, no auxiliary ones, and a tokens ratio that says so
    assert double["aux"] == 0 and double["generated"] > grpo["generated"]
    assert double["tokens_vs_grpo"]["value"] == pytest.approx(double["generated"] / grpo["generated"])
    assert "grpo-2x" in format_cost(res)


def test_cost_bench_refuses_updates_it_would_skip_entirely():
    with pytest.raises(ValueError, match="must exceed skip"):
        run_cost(CostConfig(methods=("grpo",), updates=1, skip=1))


def test_the_lab_table_sets_every_method_beside_the_published_tok_column():
    """Break: a tree method given G roots (no registered roots share) spends about 2.5x GRPO's tokens, not 1.0x."""
    res = run_cost(CostConfig(env="SearchToy-v0", methods=("grpo-2x", "tree-grpo"), updates=3, skip=1, questions=6,
                              n_boot=200))
    rows = res["methods"]
    assert rows["grpo-2x"]["published_tokens"] == 2.0 and rows["tree-grpo"]["published_tokens"] == 1.0
    assert rows["grpo-2x"]["tokens_vs_grpo"]["value"] == pytest.approx(2.0, abs=0.3)
    assert rows["tree-grpo"]["tokens_vs_grpo"]["value"] == pytest.approx(1.0, abs=0.15)
    assert rows["grpo"]["matches_published"] is True
    text = format_cost(res)
    assert "published" in text and "1.00x" in text and "2.00x" in text


def test_the_cost_bench_credits_the_start_model_unless_asked_to_train(monkeypatch):
    """Break: train_update's learn flag ignored -> the weights move in the frozen run."""
    import torch

    from twice_envs.agents.bench import cost
    from twice_envs.agents.training import trainer

    seen, real = [], trainer.train_update

    def recording(state, cfg, pool, indexed, **kw):
        before = [p.detach().clone() for p in state.policy.model.parameters()]
        row = real(state, cfg, pool, indexed, **kw)
        moved = any(not torch.equal(a, p) for a, p in zip(before, state.policy.model.parameters()))
        seen.append((kw.get("learn", True), moved, "loss" in row))
        return row

    monkeypatch.setattr(trainer, "train_update", recording)
    res = cost.run_cost(CostConfig(methods=("grpo",), updates=2, skip=1, questions=1, n_boot=50))
    assert seen == [(False, False, False)] * 2 and "every update on the start model" in format_cost(res)
    seen.clear()
    res = cost.run_cost(CostConfig(methods=("grpo",), updates=2, skip=1, questions=1, n_boot=50, train=True))
    # the optimiser ran (its loss is reported; the weights move only where some advantage is not zero)
    assert [(learn, loss) for learn, _, loss in seen] == [(True, True)] * 2
    assert "each method training its own copy" in format_cost(res)
