"""The demo's pipeline (train GRPO and Twice, eval before/after, audit, plots) on CreditToy."""

from twice_envs.agents.demo import DemoConfig, run_demo

from .train_helpers import one_torch_thread, small_policy  # noqa: F401


def test_demo_pipeline_writes_runs_plots_and_audit(tmp_path, capsys):
    from twice_envs.agents import toy  # noqa: F401

    cfg = DemoConfig(updates=1, questions_per_update=2, eval_questions=3, audit_questions=2, oracle_rollouts=2,
                     out=str(tmp_path / "demo"), lab_groups=12, lab_pairs=(1,), learn_seeds=2, learn_updates=2)
    res = run_demo(cfg, env="CreditToy-v0", progress=False, load=lambda: small_policy(0),
                   overrides=dict(indexed_tasks=False, group_size=3, max_new_tokens=3, max_turns=3))
    out = capsys.readouterr().out
    assert "dev EM before" in out and "learning curves:" in out
    assert "summary (credit lab" in out and "twice J1 vs crr J1" in out and "final exact V(s0)" in out
    assert len(res["lab"]["rows"]) == 6 and len(res["lab"]["learn"]["methods"]["twice"]["curve"]) == 3
    for key in ("curves", "audit.png", "audit.csv", "lab_scatter", "learn_png", "lab_json"):
        assert (tmp_path / "demo").exists()
        from pathlib import Path

        assert Path(res["paths"][key]).stat().st_size > 0
    assert set(res) >= {"before", "grpo", "twice"}


def test_demo_cli_passes_the_model_and_turn_length(monkeypatch):
    from twice_envs.agents import demo

    seen = {}
    monkeypatch.setattr(demo, "run_demo", lambda cfg, **kw: seen.update(kw, cfg=cfg))
    assert demo.demo_main(["--quick", "--model", "some/dir", "--max-new-tokens", "128", "--no-progress"]) == 0
    assert seen["model"] == "some/dir" and seen["overrides"] == {"max_new_tokens": 128} and seen["cfg"] == demo.QUICK
    assert demo.demo_main(["--quick", "--no-progress"]) == 0
    assert seen["model"] == "tiny" and seen["overrides"] is None


def test_the_demo_trains_on_single_hop_searchqa_unless_told_otherwise():
    from twice_envs.agents import demo

    cfg = DemoConfig()
    assert demo.trainer_overrides(cfg, "SearchQA-v0") == {"env_kwargs": {"generator": {"mix": [1.0, 0.0, 0.0, 0.0]}}}
    assert demo.trainer_overrides(cfg, "SearchQA-v0", {"env_kwargs": {}, "lr": 1.0}) == {"env_kwargs": {}, "lr": 1.0}
    assert demo.trainer_overrides(cfg, "CreditToy-v0", {"max_new_tokens": 3}) == {"max_new_tokens": 3}
