"""The text-game evaluation and ``twice bench games`` (a smoke run at a tiny size)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from types import SimpleNamespace

import pytest

from tests.agents._tiny import tiny_dir
from twice_envs.agents import stats
from twice_envs.agents.bench import games as gb
from twice_envs.agents.bench import games_compare, games_report, games_runs
from twice_envs.agents.bench import heldout
from twice_envs.agents.credit.registry import get_method
from twice_envs.agents.training.trainer import RunExistsError


def test_wilson_interval_matches_the_formula():
    lo, hi = stats.wilson(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)
    assert stats.wilson(0, 20)[0] == 0.0 and 0.15 < stats.wilson(0, 20)[1] < 0.17


def test_episodes_needed_to_separate_five_points():
    # 2 p (1 - p) (1.96 / 0.05)^2 at p = 0.5
    assert stats.episodes_for_difference(0.5) == 769
    assert stats.episodes_for_difference(0.2) == 492


def _ep(utility, invalid):
    return SimpleNamespace(utility=utility, turns=[SimpleNamespace(invalid=b) for b in invalid])


def test_summarize_counts_success_and_valid_turns_per_task_type():
    eps = [_ep(1.0, [False, False]), _ep(0.0, [True, False, False]),  # task 0 (type a), 2 samples
           _ep(0.5, [True]), _ep(1.0, [False])]  # task 1 (type b)
    s = heldout.summarize("WebShop-v0", eps, ["a", "b"], samples=2)
    assert s["all"]["episodes"] == 4 and s["all"]["success"] == 0.5  # a reward of 0.5 is no success
    assert s["all"]["valid_share"] == pytest.approx(5 / 7)
    assert s["a"]["success"] == 0.5 and s["a"]["valid_share"] == pytest.approx(4 / 5)
    assert s["b"]["valid_share"] == 0.5 and s["b"]["mean_reward"] == 0.75


def test_heldout_tasks_are_the_unseen_games_and_the_test_goals():
    import twice_envs

    tasks, types, kwargs = heldout.heldout_tasks("ALFWorld-v0")
    env = twice_envs.make("ALFWorld-v0", **kwargs).unwrapped
    assert kwargs["split"] == "valid_unseen" and len(tasks) == len(env.games)
    train = set(twice_envs.make("ALFWorld-v0").unwrapped.games)
    assert not train & set(env.games)
    # generated games in the rooms the train split never uses (the bundled 8 among them)
    from twice_envs.envs.alfworld.generator import TASK_LAYOUTS

    assert len(env.games) == 8 * heldout.GAMES["ALFWorld-v0"].heldout_games
    seen = {layout for s, _ in TASK_LAYOUTS.values() for layout in s}
    assert not {g.split("-")[1] for g in env.games} & seen
    assert set(twice_envs.make("ALFWorld-v0", split="valid_unseen").unwrapped.games) <= set(env.games)
    # a subset keeps every task type
    _, few, _ = heldout.heldout_tasks("ALFWorld-v0", 6)
    assert len(set(few)) == 5 and len(few) == 6
    assert set(types) <= {"pick_and_place_simple", "look_at_obj_in_light", "pick_clean_then_place_in_recep",
                          "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep", "pick_two_obj_and_place"}
    tasks, types, _ = heldout.heldout_tasks("WebShop-v0", 5)
    assert [t.options for t in tasks] == [{"split": "test", "index": i} for i in range(5)] and len(types) == 5
    # a setting of its own plays the same tasks with its own env kwargs
    plain = replace(heldout.GAMES["WebShop-v0"], env_kwargs={})
    again, _, kwargs = heldout.heldout_tasks("WebShop-v0", 5, plain)
    assert again == tasks and kwargs == {}


def test_bench_games_smoke(tmp_path, monkeypatch):
    cfg = gb.GamesBenchConfig(envs=("WebShop-v0",), seeds=(0,), updates=1, tasks_per_update=1, group_size=2,
                              eval_tasks=2, eval_samples=1, out=str(tmp_path), model={"WebShop-v0": str(tiny_dir())},
                              max_turns=2, max_new_tokens=8)
    seeds = []
    evaluate = heldout.evaluate_game

    def recording(*args, **kwargs):
        seeds.append(kwargs["noise_seed"])
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(games_runs, "evaluate_game", recording)
    res = gb.run_games_bench(cfg, log=lambda m: None)
    r = res["envs"]["WebShop-v0"]
    assert set(r["methods"]) == {"grpo", "grpo-2x", "gigpo", "twice", "crr"}
    assert r["before"]["all"]["episodes"] == 2
    def rows_of(m):
        return json.loads((tmp_path / "WebShop-v0" / f"{m}-s0" / "metrics.jsonl").read_text().splitlines()[0])

    for m, x in r["methods"].items():
        rows = [json.loads(l) for l in (tmp_path / "WebShop-v0" / f"{m}-s0" / "metrics.jsonl").read_text().splitlines()]
        n = 2 * get_method(m).rollouts  # 1 task x G = 2 episodes (GRPO (2x): 2 G) of 1-2 turns
        assert len(rows) == 1 and n <= rows[0]["turns"] <= 2 * n
        assert x["train_invalid_share"] == rows[0]["invalid_turns"] / rows[0]["turns"]
        assert x["train_mixed_groups"] == rows[0]["mixed_groups"] in (0.0, 1.0)  # one group
        assert x["episodes"] == 2 and x["success"] in (0.0, 0.5, 1.0)
        assert x["success_ci"][0] <= x["success"] <= x["success_ci"][1]
        # before and after are paired episode by episode: the change is the difference of the two success rates
        assert x["change"] == pytest.approx(x["success"] - r["before"]["all"]["success"])
    # the start model is evaluated on the noise of each seed's evaluation after training: 1 + 5 methods x 1 seed
    assert len(seeds) == 6 and len(set(seeds)) == 1
    # GRPO and GiGPO run no auxiliary rollouts
    assert r["methods"]["grpo"]["aux_tokens_per_update"] == 0 == r["methods"]["gigpo"]["aux_tokens_per_update"]
    text = gb.report(res)
    assert "ordering:" in text and "5-point difference" in text and "valid after" in text and "mixed groups" in text
    assert all(x["lr"] == cfg.lr for x in r["methods"].values()) and f"one shared learning rate lr={cfg.lr:g}" in text
    assert "improve on the start model" in text
    # every two methods pair up on their shared evaluation noise (5 methods: 10 pairs)
    assert len(r["pairs"]) == 10 and r["pairs"]["grpo - twice"]["change"] == pytest.approx(
        r["methods"]["grpo"]["success"] - r["methods"]["twice"]["success"])
    assert "paired differences between methods" in text and "grpo - crr:" in text
    assert all(0.0 <= x["eval_mean_reward"] <= 1.0 for x in r["methods"].values())
    assert json.loads((tmp_path / "results.json").read_text())["envs"]["WebShop-v0"]["model"] == str(tiny_dir())
    # each update's training success and batch are kept: the methods that sample G episodes a task drew the
    # same first batch, GRPO (2x) another; one update leaves no update after the first to pair
    batches = {m: x["train_curves"][0][0][2] for m, x in r["methods"].items()}
    assert len({batches[m] for m in ("grpo", "gigpo", "twice", "crr")}) == 1 != len(set(batches.values()))
    assert all(x["train_measure"] == "success" and x["train_curves"][0][0][:2] == [1, rows_of(m)["success"]]
               for m, x in r["methods"].items())
    assert r["train_pairs"] == {}


def test_ordering_shows_ties_and_the_report_never_claims_power_it_lacks():
    assert games_report.ordering({"grpo": 0.2, "twice": 0.5, "crr": 0.2}) == "twice > grpo = crr"
    ep = {"all": {"success": 0.0, "success_ci": [0.0, 0.3], "episodes": 8, "valid_share": 0.8}}
    method = {"success": 0.0, "success_ci": [0.0, 0.3], "episodes": 8, "aux_tokens_per_update": 0,
              "seconds_per_update": 1.0, "train_invalid_share": 0.1}
    text = gb.report({"envs": {"X": {"model": "m", "before": ep, "methods": {"grpo": method, "twice": method}}}})
    # success 0 on 8 episodes says nothing about a 5-point difference
    assert "cannot tell apart" in text and "grpo = twice" in text


@pytest.mark.parametrize("env_id,recipe", [("ALFWorld-v0", "alfworld"), ("WebShop-v0", "webshop")])
def test_games_play_each_model_as_its_recipe_trained_it(env_id, recipe):
    from twice_envs.agents.models.recipes import RECIPES

    setting, cfg = heldout.GAMES[env_id], RECIPES[recipe]
    assert setting.window == cfg.window and setting.max_turns == cfg.max_turns
    assert setting.env_kwargs == cfg.env_kwargs.get(env_id, {})


def test_the_bench_makes_the_env_as_the_start_model_was_trained(tmp_path):
    from twice_envs.agents.models.recipes import trained_env_kwargs

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "twice_model.json").write_text(json.dumps(
        {"config": {"env_kwargs": {"ALFWorld-v0": {"show_admissible": True, "show_task": True}}}}))
    cfg = gb.GamesBenchConfig(model={"ALFWorld-v0": str(tmp_path)})
    assert cfg.setting("ALFWorld-v0").env_kwargs == {"show_admissible": True, "show_task": True}
    assert trained_env_kwargs(tmp_path, "WebShop-v0") == {}
    assert cfg.setting("ALFWorld-v0").window is None  # trained on whole episodes
    (tmp_path / "twice_model.json").write_text(json.dumps({"config": {"window": 3}}))
    assert cfg.setting("ALFWorld-v0").window == 3
    (tmp_path / "twice_model.json").write_text(json.dumps({"config": {"window": "three"}}))
    with pytest.raises(ValueError, match="twice_model.json: window must be"):
        cfg.setting("ALFWorld-v0")
    # whole episodes: the turn cap of its transcripts, unless the run sets one; the env's setting for
    # other models; a windowed model plays to the env's own limit (None)
    (tmp_path / "twice_model.json").write_text(json.dumps({"config": {}}))
    assert cfg.setting("ALFWorld-v0").max_turns == heldout.GAMES["ALFWorld-v0"].max_turns
    (tmp_path / "twice_model.json").write_text(json.dumps({"config": {"max_turns": 30}}))
    assert cfg.setting("ALFWorld-v0").max_turns == 30
    assert replace(cfg, max_turns=8).setting("ALFWorld-v0").max_turns == 8
    (tmp_path / "twice_model.json").write_text(json.dumps({"config": {"window": 1, "max_turns": 30}}))
    assert cfg.setting("ALFWorld-v0").max_turns is None
    assert replace(cfg, max_turns=8).setting("ALFWorld-v0").max_turns == 8
    (tmp_path / "twice_model.json").write_text(json.dumps({"config": {"max_turns": 0}}))
    with pytest.raises(ValueError, match="twice_model.json: max_turns must be"):
        cfg.setting("ALFWorld-v0")
    (tmp_path / "twice_model.json").write_text("{not json")
    with pytest.raises(ValueError, match="twice_model.json"):
        cfg.setting("ALFWorld-v0")


def test_eval_every_gives_a_paired_held_out_curve_and_train_kwargs_reach_only_the_training_env(tmp_path, monkeypatch):
    cfg = gb.GamesBenchConfig(envs=("WebShop-v0",), methods=("grpo",), seeds=(0, 1), updates=2, tasks_per_update=1,
                              group_size=2, eval_tasks=2, eval_samples=1, out=str(tmp_path),
                              model={"WebShop-v0": str(tiny_dir())}, max_turns=2, max_new_tokens=8, eval_every=1,
                              train_kwargs={"WebShop-v0": {"reward": "success"}}, micro_batch=1, eval_noise_seed=77)
    calls, made = [], []
    evaluate, train = games_runs.evaluate_game, games_runs.train

    def recording(policy, env_id, **kwargs):
        calls.append(kwargs["noise_seed"])
        res = evaluate(policy, env_id, **kwargs)
        res["all"]["outcomes"] = [len(calls) % 2, 1]  # known outcomes: the curve must pool and pair exactly these
        return res

    def training(config, **kwargs):
        made.append(config)
        return train(config, **kwargs)

    monkeypatch.setattr(games_runs, "evaluate_game", recording)
    monkeypatch.setattr(games_runs, "train", training)
    r = gb.run_games_bench(cfg, log=lambda m: None)["envs"]["WebShop-v0"]
    # before (seeds 0, 1), then per seed the evaluation after update 1 and the one after training (update 2)
    assert calls == [77, 78, 77, 77, 78, 78]
    assert [c.env_kwargs.get("reward") for c in made] == ["success", "success"] and made[0].micro_batch == 1
    curve = r["methods"]["grpo"]["curve"]
    assert [c["update"] for c in curve] == [1, 2]
    # before: [1, 1] (seed 0) and [0, 1] (seed 1); update 1: calls 3 and 5 -> [1, 1, 1, 1]; update 2: [0, 1, 0, 1]
    assert curve[0]["success"] == 1.0 and curve[0]["change"] == pytest.approx(0.25)
    assert curve[1]["success"] == 0.5 and curve[1]["change"] == pytest.approx(-0.25)
    assert curve[-1]["change"] == r["methods"]["grpo"]["change"]  # the last point is the evaluation after training
    assert "grpo held-out by update" in gb.report({"envs": {"WebShop-v0": r}})


def test_the_command_line_passes_its_settings_to_the_bench(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(gb, "run_games_bench", lambda cfg: seen.append(cfg) or {"envs": {}})
    monkeypatch.setattr(gb, "report", lambda res: "report")
    assert gb.main(["--envs", "WebShop-v0", "--lr", "5e-5", "--seeds", "2", "--updates", "3", "--eval-tasks", "7"]) == 0
    cfg = seen[0]
    assert (cfg.envs, cfg.lr, cfg.seeds, cfg.updates, cfg.eval_tasks) == (("WebShop-v0",), 5e-5, (0, 1), 3, 7)
    assert cfg.eval_size("WebShop-v0") == (7, heldout.GAMES["WebShop-v0"].bench_eval[1])
    # with neither given, each env's evaluations take the size set for two cores
    assert gb.main(["--envs", "WebShop-v0"]) == 0
    assert seen[-1].eval_size("WebShop-v0") == (80, 1) and seen[-1].eval_size("ALFWorld-v0") == (16, 1)
    assert gb.main(["--envs", "WebShop-v0", "--eval-samples", "3"]) == 0
    assert seen[-1].eval_size("WebShop-v0") == (80, 3)
    with pytest.raises(SystemExit):
        gb.main(["--envs", "NoSuchGame-v0"])
    assert "unknown game env" in capsys.readouterr().err
    assert gb.main(["--envs", "WebShop-v0", "--eval-every", "5", "--micro-batch", "16", "--eval-noise-seed", "9",
                    "--train-kwarg", "WebShop-v0:reward=success", "--train-kwarg", "WebShop-v0:max_steps=15"]) == 0
    cfg = seen[-1]
    assert (cfg.eval_every, cfg.micro_batch, cfg.eval_noise_seed) == (5, 16, 9)
    assert cfg.train_kwargs == {"WebShop-v0": {"reward": "success", "max_steps": 15}}
    assert gb.main(["--envs", "WebShop-v0", "--jobs", "2"]) == 0 and seen[-1].jobs == 2
    assert seen[-2].jobs == 1  # one process unless asked
    for bad in (["--train-kwarg", "reward=success"], ["--train-kwarg", "WebShop-v0:reward"],
                ["--eval-every", "-1"], ["--micro-batch", "0"], ["--jobs", "0"]):
        with pytest.raises(SystemExit):
            gb.main(["--envs", "WebShop-v0", *bad])
    assert "ENV:KEY=VALUE" in capsys.readouterr().err


def test_paired_change_is_the_mean_difference_with_its_interval():
    after, before = [1, 1, 0, 1, 0, 1], [0, 1, 0, 0, 0, 1]
    res = stats.paired_change(after, before)
    # differences 1, 0, 0, 1, 0, 0: mean 1/3, sample std sqrt(4/15)
    half = 1.96 * (4 / 15) ** 0.5 / 6 ** 0.5
    assert res["change"] == pytest.approx(1 / 3)
    assert res["change_ci"] == pytest.approx([1 / 3 - half, 1 / 3 + half])
    assert res["improves"] is False  # 1/3 - 0.413 < 0
    assert stats.paired_change([1] * 30 + [0] * 10, [0] * 30 + [0] * 10)["improves"] is True
    assert stats.paired_change([0] * 10, [0] * 10) == {"change": 0.0, "change_ci": [0.0, 0.0], "improves": False, "n": 10}
    with pytest.raises(ValueError, match="same nonzero length"):
        stats.paired_change([1, 0], [1])


def test_methods_pair_up_on_shared_noise_and_the_report_sizes_the_pairs():
    a, b, c = [1, 1, 0, 1, 0, 1] * 20, [0, 1, 0, 0, 0, 1] * 20, [1, 1, 0, 1, 0, 1] * 20
    pairs = games_compare.method_pairs({"twice": {"outcomes": a}, "grpo": {"outcomes": b}, "crr": {"outcomes": c}})
    assert list(pairs) == ["twice - grpo", "twice - crr", "grpo - crr"]
    assert pairs["twice - grpo"] == stats.paired_change(a, b)
    assert pairs["twice - crr"]["change_ci"] == [0.0, 0.0]
    half, n, need = stats.pairs_resolution(pairs)
    # the widest pair: differences 1, 0, 0, 1, 0, 0 repeated (mean 1/3, sample variance 2/9 * 120/119)
    sd = (2 / 9 * 120 / 119) ** 0.5
    assert n == 120 and half == pytest.approx(1.96 * sd / 120 ** 0.5)
    assert need == math.ceil(120 * (half / 0.05) ** 2)
    # identical outcomes say nothing about power: the half-width is floored at 5% discordant pairs
    half0, _, need0 = stats.pairs_resolution({"x-y": stats.paired_change([0] * 40, [0] * 40)})
    assert half0 == pytest.approx(1.96 * (0.05 / 40) ** 0.5) and need0 == 77
    method = {"success": 0.5, "success_ci": [0.4, 0.6], "episodes": 120, "aux_tokens_per_update": 0,
              "seconds_per_update": 1.0, "train_invalid_share": 0.1}
    ep = {"all": {"success": 0.5, "success_ci": [0.4, 0.6], "episodes": 120, "valid_share": 0.8}}
    text = gb.report({"envs": {"X": {"model": "m", "before": ep, "methods": {"twice": method, "grpo": method},
                                     "pairs": {"twice - grpo": pairs["twice - grpo"]}}}})
    assert "twice - grpo: +0.333" in text and "significant" in text and "cannot tell apart" in text
    # hyphenated method names stay whole in the report
    hyphens = games_compare.method_pairs({"grpo-2x": {"outcomes": a}, "tree-grpo": {"outcomes": b}})
    text = gb.report({"envs": {"X": {"model": "m", "before": ep, "methods": {"grpo-2x": method, "tree-grpo": method},
                                     "pairs": hyphens}}})
    assert list(hyphens) == ["grpo-2x - tree-grpo"] and "    grpo-2x - tree-grpo: +0.333" in text


def test_every_comparison_names_the_learning_rate_it_was_measured_at():
    """Break: leaving the rate out of the ordering line -> "at one shared learning rate lr=0.0002" is missing."""
    a, b = [1, 1, 0, 1, 0, 1] * 20, [0, 1, 0, 0, 0, 1] * 20
    method = {"success": 0.5, "success_ci": [0.4, 0.6], "episodes": 120, "aux_tokens_per_update": 0,
              "seconds_per_update": 1.0, "train_invalid_share": 0.1}
    ep = {"all": {"success": 0.5, "success_ci": [0.4, 0.6], "episodes": 120, "valid_share": 0.8}}
    pairs = games_compare.method_pairs({"twice": {"outcomes": a}, "grpo": {"outcomes": b}})
    env = {"model": "m", "before": ep, "methods": {"twice": method, "grpo": method}, "pairs": pairs}
    text = gb.report({"config": {"lr": 2e-4}, "envs": {"X": env}})
    assert "ordering: twice = grpo (at one shared learning rate lr=0.0002, not tuned per method: an order here is " \
           "not a method's win)" in text
    assert "paired differences between methods (same tasks and noise) at one shared learning rate lr=0.0002" in text
    # rates of their own are named each; none recorded says so
    env["methods"] = {"twice": {**method, "lr": 1e-4}, "grpo": {**method, "lr": 3e-4}}
    assert "at learning rates twice 0.0001, grpo 0.0003" in gb.report({"envs": {"X": env}})
    env["methods"] = {"twice": method, "grpo": method}
    assert "at learning rates not recorded" in gb.report({"envs": {"X": env}})


def test_t_quantiles_and_the_paired_mean_interval():
    # Student t quantiles as tabulated
    for p, df, q in ((0.975, 1, 12.7062), (0.975, 14, 2.1448), (0.975, 18, 2.1009), (0.995, 5, 4.0321),
                     (0.975, 1000, 1.9623)):
        assert stats.t_quantile(p, df) == pytest.approx(q, abs=1e-4)
    res = stats.paired_mean([0.1, 0.3, 0.2])
    half = 4.3027 * 0.1 / 3 ** 0.5  # t(0.975, 2) x sample sd / root n
    assert res["mean"] == pytest.approx(0.2) and res["n"] == 3
    assert res["ci"] == pytest.approx([0.2 - half, 0.2 + half], abs=1e-4) and res["significant"] is False
    assert stats.paired_mean([0.2, 0.3, 0.25])["significant"] is True  # 0.25 +- 0.124
    for bad in (lambda: stats.paired_mean([0.1]), lambda: stats.t_quantile(0.4, 3), lambda: stats.t_quantile(0.9, 0)):
        with pytest.raises(ValueError):
            bad()


def test_training_measures_pair_only_on_updates_that_sampled_the_same_batch():
    # seed 0 of each method: [update, success, batch digest]
    a = {"train_measure": "success", "train_curves": [[[1, 0.5, "b1"], [2, 0.6, "b2"], [3, 0.9, "b3"], [4, 0.8, "b4"]]]}
    b = {"train_measure": "success", "train_curves": [[[1, 0.5, "b1"], [2, 0.5, "b2"], [3, 0.6, "b3"], [4, 0.1, "other"]]]}
    two_x = {"train_measure": "success", "train_curves": [[[1, 0.5, "x1"], [2, 0.7, "x2"], [3, 0.7, "x3"]]]}
    old = {"train_measure": "success", "train_curves": [[[1, 0.5, None], [2, 0.5, None], [3, 0.5, None]]]}
    pairs = games_compare.training_pairs({"twice": a, "grpo": b, "grpo-2x": two_x, "old": old, "none": {}})
    # update 1 (both start models) and update 4 (other tasks) are left out: differences 0.1 and 0.3
    assert list(pairs) == ["twice - grpo"]
    got, want = pairs["twice - grpo"], stats.paired_mean([0.1, 0.3])
    assert got["mean"] == pytest.approx(want["mean"]) and got["ci"] == pytest.approx(want["ci"])
    assert (got["n"], got["significant"], got["updates"], got["measure"]) == (2, False, [2, 3], "success")
    ep = {"all": {"success": 0.5, "success_ci": [0.4, 0.6], "episodes": 4, "valid_share": 0.8}}
    method = {"success": 0.5, "success_ci": [0.4, 0.6], "episodes": 4, "aux_tokens_per_update": 0,
              "seconds_per_update": 1.0, "train_invalid_share": 0.1}
    text = gb.report({"envs": {"X": {"model": "m", "before": ep, "methods": {"twice": method, "grpo": method},
                                     "train_pairs": pairs}}})
    assert "twice - grpo: success +0.200 [-1.071, +1.471] over 2 updates (2-3) not significant" in text


def test_eval_only_writes_its_outcomes_and_pairs_them_with_an_earlier_run(tmp_path, capsys):
    def run(out, *extra):
        return gb.main(["--eval-only", "--envs", "WebShop-v0", "--model", f"WebShop-v0={tiny_dir()}",
                        "--eval-tasks", "2", "--max-turns", "2", "--max-new-tokens", "8", "--out", str(out), *extra])

    assert run(tmp_path / "a", "--eval-samples", "2") == 0
    first = tmp_path / "a" / "heldout.json"
    data = json.loads(first.read_text())["WebShop-v0"]
    assert (data["eval_tasks"], data["eval_samples"], data["noise_seed"]) == (2, 2, gb.HELDOUT_NOISE_SEED)
    outcomes = data["figures"]["all"]["outcomes"]
    assert len(outcomes) == 4 and data["model"] == str(tiny_dir())
    # the same model on the same games and noise keys plays the same episodes: no change at all
    assert run(tmp_path / "b", "--eval-samples", "2", "--against", str(first)) == 0
    assert "paired change of success against" in capsys.readouterr().out
    again = json.loads((tmp_path / "b" / "heldout.json").read_text())["WebShop-v0"]["figures"]
    assert again == data["figures"]
    # episode k pairs with episode k of the earlier run
    data["figures"]["all"]["outcomes"] = [1 - x for x in outcomes]
    flipped = tmp_path / "flipped.json"
    flipped.write_text(json.dumps({"WebShop-v0": data}))
    assert run(tmp_path / "c", "--eval-samples", "2", "--against", str(flipped)) == 0
    change = sum(outcomes) / 4 - (1 - sum(outcomes) / 4)
    assert f"paired change of success against {tiny_dir()}: {change:+.3f}" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="eval_samples=2.*this run with .*eval_samples=1.*not the same episodes"):
        run(tmp_path / "d", "--eval-samples", "1", "--against", str(first))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SystemExit, match=rf"--against {bad}: "):
        run(tmp_path / "e", "--against", str(bad))
    with pytest.raises(SystemExit):
        gb.main(["--envs", "WebShop-v0", "--against", str(first)])
    assert "--against compares two --eval-only runs" in capsys.readouterr().err


def _run_results(tmp_path, name, methods, before=(1, 0, 1, 0), **config):
    """A results.json as ``twice bench games`` writes it, for the methods ``{name: outcomes}``."""
    ep = {"all": {"success": sum(before) / len(before), "success_ci": [0.1, 0.9], "episodes": len(before),
                  "valid_share": 0.9, "outcomes": list(before)}}
    summary = lambda o: {"success": sum(o) / len(o), "success_ci": [0.1, 0.9], "episodes": len(o),  # noqa: E731
                         "aux_tokens_per_update": 0, "seconds_per_update": 1.0, "train_invalid_share": 0.0,
                         "outcomes": list(o), **stats.paired_change(list(o), list(before))}
    cfg = {**gb.GamesBenchConfig(envs=("WebShop-v0",), methods=tuple(methods), out=str(tmp_path / name)).__dict__,
           **config}
    res = {"config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.items()},
           "envs": {"WebShop-v0": {"model": "tiny-webshop", "before": ep,
                                   "methods": {m: summary(o) for m, o in methods.items()}, "pairs": {}}}}
    (tmp_path / name).mkdir()
    (tmp_path / name / "results.json").write_text(json.dumps(res))
    return str(tmp_path / name)


def test_merge_joins_runs_of_other_methods_into_one_paired_comparison(tmp_path, capsys):
    a = _run_results(tmp_path, "a", {"grpo": (1, 1, 1, 0)}, eval_every=5)
    b = _run_results(tmp_path, "b", {"twice": (1, 0, 1, 1), "crr": (0, 0, 1, 0)}, eval_every=0)
    for run, method, curve in (("a", "grpo", [[1, 0.5, "u1"], [2, 0.75, "u2"], [3, 0.5, "u3"]]),
                               ("b", "twice", [[1, 0.5, "u1"], [2, 0.5, "u2"], [3, 0.25, "u3"]])):
        f = tmp_path / run / "results.json"
        res = json.loads(f.read_text())
        res["envs"]["WebShop-v0"]["methods"][method].update(train_measure="success", train_curves=[curve])
        f.write_text(json.dumps(res))
    out = tmp_path / "joined"
    assert gb.main(["--merge", a, b, "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    e = res["envs"]["WebShop-v0"]
    assert list(e["methods"]) == ["grpo", "twice", "crr"] == res["config"]["methods"]
    assert e["pairs"]["grpo - twice"] == stats.paired_change([1, 1, 1, 0], [1, 0, 1, 1])
    assert set(e["pairs"]) == {"grpo - twice", "grpo - crr", "twice - crr"}
    # training success pairs across the runs, on updates 2 and 3 (crr kept no training curve)
    assert list(e["train_pairs"]) == ["grpo - twice"] and e["train_pairs"]["grpo - twice"]["mean"] == 0.25
    assert res["merged_from"] == [str(tmp_path / "a" / "results.json"), str(tmp_path / "b" / "results.json")]
    text = capsys.readouterr().out
    assert "paired differences between methods" in text and "grpo - crr: +0.500" in text

    # what would pair unlike episodes, or hide a method, is refused with the files named
    c = _run_results(tmp_path, "c", {"gigpo": (1, 1, 1, 1)}, updates=99)
    d = _run_results(tmp_path, "d", {"gigpo": (1, 1, 1, 1)}, before=(0, 0, 1, 1))
    dup = _run_results(tmp_path, "dup", {"grpo": (0, 0, 0, 0)})
    model = _run_results(tmp_path, "model", {"gigpo": (1, 1, 1, 1)})
    other = json.loads((tmp_path / "model" / "results.json").read_text())
    other["envs"]["WebShop-v0"]["model"] = "other"
    (tmp_path / "model" / "results.json").write_text(json.dumps(other))
    empty = _run_results(tmp_path, "empty", {"gigpo": (1, 1, 1, 1)})
    (tmp_path / "empty" / "results.json").write_text(json.dumps({**other, "envs": {"WebShop-v0": {"model": "x"}}}))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "results.json").write_text("{oops")
    for args, match in (([a, c], r"c/results\.json and .*a/results\.json were run with different settings \(updates\)"),
                        ([a, d], r"d/results\.json and .*: the start model's held-out episodes of WebShop-v0 differ"),
                        ([a, model], r"model/results\.json and .* start WebShop-v0 from different models \(other and "
                                     r"tiny-webshop\)"),
                        ([a, empty], r"empty/results\.json: WebShop-v0 lacks the start model's held-out outcomes"),
                        ([a, dup], r"grpo on WebShop-v0 is in both .*a/results\.json and .*dup/results\.json"),
                        ([a, str(tmp_path / "bad")], r"bad/results\.json: not a readable results\.json"),
                        ([a], r"two runs or more")):
        with pytest.raises(SystemExit):
            gb.main(["--merge", *args, "--out", str(tmp_path / "never")])
        assert re.search(match, capsys.readouterr().err), match
    assert not (tmp_path / "never").exists()


def test_resume_continues_each_run_to_more_updates_and_keeps_its_curve(tmp_path, monkeypatch):
    """`--resume` carries a comparison to more updates: each run continues from its checkpoint (its first
    updates are not trained again), its earlier curve points are kept, and a run of other settings or with
    more updates than asked is refused by name."""
    base = dict(envs=("WebShop-v0",), methods=("grpo",), seeds=(0,), tasks_per_update=1, group_size=2, eval_tasks=2,
                eval_samples=1, out=str(tmp_path), model={"WebShop-v0": str(tiny_dir())}, max_turns=2,
                max_new_tokens=8, eval_every=1)
    run = tmp_path / "WebShop-v0" / "grpo-s0"
    first = gb.run_games_bench(gb.GamesBenchConfig(updates=2, **base), log=lambda m: None)
    rows_before = (run / "metrics.jsonl").read_text().splitlines()
    assert json.loads((run / "config.json").read_text())["model"] == str(tiny_dir())  # the model it trained
    with pytest.raises(RunExistsError):
        gb.run_games_bench(gb.GamesBenchConfig(updates=4, **base), log=lambda m: None)  # not without --resume
    started = []
    train = games_runs.train
    monkeypatch.setattr(games_runs, "train", lambda config, **kw: started.append(kw["resume"]) or train(config, **kw))
    res = gb.run_games_bench(gb.GamesBenchConfig(updates=4, resume=True, **base), log=lambda m: None)
    rows = (run / "metrics.jsonl").read_text().splitlines()
    assert started == [True] and rows[:2] == rows_before and [json.loads(r)["update"] for r in rows] == [1, 2, 3, 4]
    curve = res["envs"]["WebShop-v0"]["methods"]["grpo"]["curve"]
    assert [c["update"] for c in curve] == [1, 2, 3, 4]
    assert curve[0] == first["envs"]["WebShop-v0"]["methods"]["grpo"]["curve"][0]  # kept from curve.json
    # continued to the updates it holds: nothing trains, its last point is evaluated again, not added twice
    again = gb.run_games_bench(gb.GamesBenchConfig(updates=4, resume=True, **base), log=lambda m: None)
    assert (run / "metrics.jsonl").read_text().splitlines() == rows
    assert again["envs"]["WebShop-v0"]["methods"]["grpo"]["curve"] == curve
    with pytest.raises(ValueError, match=r"config.json.*lr: 0.0002 there, 0.001 now"):
        gb.check_resumable(gb.GamesBenchConfig(updates=6, resume=True, **{**base, "lr": 1e-3}))
    with pytest.raises(ValueError, match="already holds 4 updates, more than --updates 3"):
        gb.check_resumable(gb.GamesBenchConfig(updates=3, resume=True, **base))
    gb.check_resumable(gb.GamesBenchConfig(updates=3, **base))  # without --resume nothing is checked
    with pytest.raises(ValueError, match=r"curve.json: its points were evaluated on other held-out episodes"):
        gb.check_resumable(gb.GamesBenchConfig(updates=6, resume=True, **{**base, "eval_noise_seed": 5}))
    (run / games_runs.CURVE_FILE).write_text("[[1, [0, 1]]]")  # not the file's layout
    with pytest.raises(ValueError, match="curve.json: not a curve file"):
        gb.check_resumable(gb.GamesBenchConfig(updates=6, resume=True, **base))


def test_runs_in_processes_of_their_own_give_the_figures_of_one_process(tmp_path):
    """``jobs=2`` trains the runs in two spawned processes; each run's training metrics and held-out outcomes
    are those of the same run trained in this process."""
    base = dict(envs=("WebShop-v0",), methods=("grpo", "twice"), seeds=(0, 1), updates=1, tasks_per_update=1,
                group_size=2, eval_tasks=2, eval_samples=1, model={"WebShop-v0": str(tiny_dir())}, max_turns=2,
                max_new_tokens=8)
    here = gb.run_games_bench(gb.GamesBenchConfig(out=str(tmp_path / "one"), **base), log=lambda m: None)
    there = gb.run_games_bench(gb.GamesBenchConfig(out=str(tmp_path / "two"), jobs=2, **base), log=lambda m: None)
    timing = ("time", "time_rollout", "time_credit", "time_update")
    for m in ("grpo", "twice"):
        a, b = here["envs"]["WebShop-v0"]["methods"][m], there["envs"]["WebShop-v0"]["methods"][m]
        assert {k: v for k, v in a.items() if k != "seconds_per_update"} == \
            {k: v for k, v in b.items() if k != "seconds_per_update"}
        for s in (0, 1):
            rows = [[{k: v for k, v in json.loads(line).items() if k not in timing}
                     for line in (tmp_path / run / "WebShop-v0" / f"{m}-s{s}" / "metrics.jsonl").read_text().splitlines()]
                    for run in ("one", "two")]
            assert rows[0] == rows[1] and len(rows[0]) == 1
    assert here["envs"]["WebShop-v0"]["pairs"] == there["envs"]["WebShop-v0"]["pairs"]
    # each method's figures are its own runs' (Twice's twins add tokens, GRPO samples none)
    twice, grpo = (there["envs"]["WebShop-v0"]["methods"][m]["aux_tokens_per_update"] for m in ("twice", "grpo"))
    assert twice > 0 == grpo
    # the setting is free in a merge (it does not change what is compared)
    assert "jobs" in games_compare.MERGE_FREE
    with pytest.raises(ValueError, match="jobs"):
        gb.run_games_bench(gb.GamesBenchConfig(out=str(tmp_path / "bad"), jobs=0, **base), log=lambda m: None)


def test_evaluations_and_runs_show_progress_lines_and_none_with_no_progress(tmp_path, monkeypatch, capsys):
    from twice_envs import progress

    monkeypatch.setattr(progress, "_forced", None)  # restored after the test
    progress.set_enabled(True)  # as on a terminal
    args = ["--eval-only", "--envs", "WebShop-v0", "--model", f"WebShop-v0={tiny_dir()}", "--eval-tasks", "2",
            "--eval-samples", "2", "--max-turns", "2", "--max-new-tokens", "8"]
    assert gb.main([*args, "--out", str(tmp_path / "a")]) == 0
    out, err = capsys.readouterr()
    # every episode counted (the rollout reports the episodes over), on stderr; the figures on stdout
    assert err.split("\r")[-1].startswith("WebShop-v0 held-out: 4/4 episodes (100%), ") and err.endswith("\n")
    assert "episodes (100%)" not in out and "success" in out
    cfg = gb.GamesBenchConfig(envs=("WebShop-v0",), methods=("grpo",), seeds=(0,), updates=1, tasks_per_update=1,
                              group_size=2, eval_tasks=2, eval_samples=1, out=str(tmp_path / "r"),
                              model={"WebShop-v0": str(tiny_dir())}, max_turns=2, max_new_tokens=8)
    gb.run_games_bench(cfg, log=lambda m: None)
    lines = [chunk.strip() for chunk in capsys.readouterr().err.split("\r") if chunk.endswith("\n")]
    assert [line.split(",")[0] for line in lines if line.startswith("WebShop-v0")] == ["WebShop-v0 start model seed 0: 2/2 episodes (100%)",
                                                      "WebShop-v0 grpo seed 0 training: 1/1 updates (100%)",
                                                      "WebShop-v0 grpo seed 0 held-out: 2/2 episodes (100%)"]
    assert gb.main([*args, "--out", str(tmp_path / "b"), "--no-progress"]) == 0  # still as on a terminal
    assert "WebShop-v0" not in capsys.readouterr().err and not progress.enabled()


def test_the_bench_chooses_among_listed_actions_with_policy_choice(tmp_path, monkeypatch, capsys):
    """``--policy choice``: the runs train and evaluate a choosing policy (WebShop lists its clickable elements
    after a search). Break: the runs loading the plain policy -> no chosen turn."""
    cfg = gb.GamesBenchConfig(envs=("WebShop-v0",), methods=("grpo", "twice"), seeds=(0,), updates=1,
                              tasks_per_update=2, group_size=2, eval_tasks=2, eval_samples=1, out=str(tmp_path),
                              max_turns=3, choose="sum")  # the shipped tiny-webshop searches, then clicks
    res = gb.run_games_bench(cfg, log=lambda m: None)
    for m in ("grpo", "twice"):
        run = tmp_path / "WebShop-v0" / f"{m}-s0"
        assert json.loads((run / "config.json").read_text())["choose"] == "sum"
        row = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
        assert 0 < row["chosen_turns"] < row["turns"]  # searches are generated, clicks chosen
    assert "choosing among listed actions by sum" in gb.report(res)
    seen = []
    monkeypatch.setattr(gb, "run_games_bench", lambda c: seen.append(c) or {"envs": {}})
    monkeypatch.setattr(gb, "report", lambda r: "report")
    assert gb.main(["--envs", "WebShop-v0", "--policy", "choice", "--score", "mean"]) == 0
    assert gb.main(["--envs", "WebShop-v0"]) == 0
    assert [c.choose for c in seen] == ["mean", None]
