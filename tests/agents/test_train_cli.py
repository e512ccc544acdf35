"""The command lines end to end on CreditToy with a small saved model: train, eval, audit, plot."""

import json

import pytest

from twice_envs.agents.cli.train import eval_main, train_main
from twice_envs.agents.lab.cli import audit_main
from twice_envs.agents.lab.plots import plot_main
from twice_envs.agents.training.trainer import RunExistsError

from .train_helpers import one_torch_thread, small_policy  # noqa: F401

ENV = "twice_envs.agents.lab.toy:CreditToy-v0"


def test_train_eval_audit_plot_commands(tmp_path, capsys):
    policy = small_policy(0)
    model_dir = tmp_path / "model"
    policy.model.save_pretrained(model_dir)
    policy.tokenizer.save_pretrained(model_dir)
    run = tmp_path / "run"
    args = ["--env", ENV, "--model", str(model_dir), "--updates", "2", "--questions", "2", "--group-size", "2",
            "--max-new-tokens", "3", "--out", str(run)]
    assert train_main(args + ["--method", "twice", "--ablation", "star"]) == 0
    rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows] == [1, 2]
    captured = capsys.readouterr()
    err = captured.err
    assert "[twice] update 1/2  reward " in err and "[twice] update 2/2  reward " in err
    lr = json.loads((run / "config.json").read_text())["lr"]
    assert f"twice trained at learning rate lr={lr:g}, not tuned" in captured.out
    # the run folder is taken now: --overwrite starts it again (quietly with --no-progress)
    with pytest.raises(RunExistsError):
        train_main(args + ["--method", "twice", "--ablation", "star"])
    assert train_main(args + ["--method", "twice", "--ablation", "star", "--overwrite", "--no-progress"]) == 0
    assert " update " not in capsys.readouterr().err
    assert [json.loads(l)["update"] for l in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert json.loads((run / "config.json").read_text())["credit"]["star"] == 2  # the ablation's K = 2
    assert (run / "checkpoint" / "state.pt").exists()
    assert train_main(args[:-2] + ["--out", str(tmp_path / "grpo"), "--method", "grpo"]) == 0

    assert eval_main(["--checkpoint", str(run), "--questions", "2"]) == 0
    assert "EM" in capsys.readouterr().out
    assert audit_main(["--checkpoint", str(run), "--env", ENV, "--questions", "2", "--oracle-rollouts", "2",
                       "--group-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "wrong-sign" in out and (run / "audit" / "audit.png").exists()
    png = tmp_path / "curves.png"
    assert plot_main([str(run), str(tmp_path / "grpo"), "--out", str(png)]) == 0
    assert png.stat().st_size > 1000


def test_train_keeps_the_history_window_a_model_was_trained_with(tmp_path, monkeypatch):
    import twice_envs.agents.cli.train as train_mod

    policy = small_policy(0)
    model_dir = tmp_path / "model"
    policy.model.save_pretrained(model_dir)
    policy.tokenizer.save_pretrained(model_dir)
    (model_dir / "twice_model.json").write_text(json.dumps({"config": {"window": 2}}))
    seen = []
    monkeypatch.setattr(train_mod, "train", lambda cfg, **kw: seen.append(cfg))
    args = ["--env", ENV, "--model", str(model_dir), "--out", str(tmp_path / "run")]
    assert train_main(args) == 0
    assert train_main(args + ["--window", "1"]) == 0
    assert [cfg.window for cfg in seen] == [2, 1]
    assert train_main(args + ["--choose", "sum"]) == 0
    assert [cfg.choose for cfg in seen] == [None, None, "sum"]


def test_budget_summary_counts_the_updates_past_the_warm_up():
    from twice_envs.agents.cli.train import budget_summary, format_budget

    rows = [{"aux_target": 100.0, "aux_planned": 60.0, "aux_accounted": 55.0, "aux_tokens": 40, "warmup": True},
            {"aux_target": 100.0, "aux_planned": 100.0, "aux_accounted": 90.0, "aux_tokens": 80},
            {"aux_target": 300.0, "aux_planned": 300.0, "aux_accounted": 330.0, "aux_tokens": 200},
            {"aux_tokens": 0}]  # a method without a budget
    b = budget_summary(rows, n_boot=200)
    assert b["updates"] == 2
    assert b["accounted"]["value"] == pytest.approx(420 / 400) and b["generated"]["value"] == pytest.approx(280 / 400)
    assert b["accounted"]["lo"] <= b["accounted"]["value"] <= b["accounted"]["hi"]
    assert "accounted 1.050" in format_budget(b, 0.7)
    assert budget_summary(rows[:1]) is None and budget_summary([{"aux_tokens": 0}]) is None


def test_each_env_defaults_to_its_own_shipped_model_and_a_foreign_model_is_named(monkeypatch, capsys):
    from twice_envs.agents.cli import train as train_cli
    from twice_envs.agents.cli.rollout import model_help
    from twice_envs.agents.models.load import env_model
    from twice_envs.agents.models.recipes import model_for_env

    assert [model_for_env(e) for e in ("SearchQA-v0", "WebShop-v0", "ALFWorld-v0")] == \
        ["tiny", "tiny-webshop", "tiny-alfworld"]
    assert all(name in model_help() for name in ("tiny", "tiny-webshop", "tiny-alfworld", "smollm2-135m"))
    assert env_model(None, "WebShop-v0")[0] == "tiny-webshop" and capsys.readouterr().err == ""
    env_model("tiny", "WebShop-v0")
    err = capsys.readouterr().err
    assert "'tiny' was trained for SearchQA-v0" in err and "--model tiny-webshop" in err
    seen = {}
    monkeypatch.setattr(train_cli, "train", lambda cfg, **kw: seen.setdefault("cfg", cfg))
    monkeypatch.setattr(train_cli, "load_policy", lambda name: name)
    assert train_cli.train_main(["--env", "WebShop-v0", "--out", "/nonexistent/unused"]) == 0
    cfg = seen["cfg"]
    assert cfg.model == "tiny-webshop" and cfg.env_kwargs.get("show_admissible") is True
    assert cfg.max_turns == 6  # the turn cap of tiny-webshop's transcripts (SearchQA's CPU default is 4)
    assert cfg.lr == train_cli.cpu_config().lr  # the CPU settings of a shipped model


def test_audit_and_eval_play_a_shipped_game_model_as_train_does(monkeypatch, capsys):
    """`twice audit --checkpoint tiny-webshop` and `twice eval --checkpoint tiny-webshop` play WebShop with the
    model's transcript settings (show_admissible, 6 turns), and the audit's --env-kwargs go over them."""
    from twice_envs.agents.cli import train as train_cli
    from twice_envs.agents.lab import cli as audit

    seen = {}
    monkeypatch.setattr(audit, "load_policy", lambda name: name)
    monkeypatch.setattr(audit, "run_audit", lambda policy, cfg: seen.setdefault("audit", cfg) and None)
    monkeypatch.setattr(audit, "format_table", lambda res: "")
    monkeypatch.setattr(audit, "write_outputs", lambda res, out: {})
    assert audit.audit_main(["--checkpoint", "tiny-webshop", "--env", "WebShop-v0",
                             "--env-kwargs", '{"reward": "success"}']) == 0
    cfg = seen["audit"]
    assert cfg.env_kwargs == {"show_admissible": True, "reward": "success"}
    assert cfg.max_turns == 6 and cfg.window is None
    with pytest.raises(SystemExit):
        audit.audit_main(["--checkpoint", "tiny-webshop", "--env", "WebShop-v0", "--env-kwargs", "[1]"])
    assert "--env-kwargs" in capsys.readouterr().err

    monkeypatch.setattr(train_cli, "load_policy", lambda name: name)
    result = {"em": 0.0, "em_ci": (0.0, 0.0), "f1": 0.0, "n": 0, "measure": "em", "measures": [], "per_dataset": {}}
    monkeypatch.setattr(train_cli, "evaluate", lambda policy, cfg, **kw: seen.setdefault("eval", cfg) and result)
    assert train_cli.eval_main(["--checkpoint", "tiny-webshop", "--env", "WebShop-v0"]) == 0
    assert seen["eval"].max_turns == 6 and seen["eval"].env_kwargs == {"show_admissible": True}
