"""The demo's pipeline (train GRPO and Twice, eval before/after, audit, plots) on CreditToy."""

import json
from dataclasses import replace
from pathlib import Path

from twice_envs.agents.bench.demo import DemoConfig, em_lines, run_demo
from twice_envs.agents.credit.registry import methods as registered_methods

from .train_helpers import one_torch_thread, small_policy  # noqa: F401


def test_demo_pipeline_writes_runs_plots_and_audit(tmp_path, capsys):
    demo_dir = tmp_path / "demo"
    cfg = DemoConfig(updates=2, questions_per_update=2, eval_questions=3, audit_questions=2, oracle_rollouts=2,
                     out=str(demo_dir), lab_groups=12, lab_pairs=(1,), learn_seeds=2, learn_updates=2)
    overrides = dict(indexed_tasks=False, group_size=3, max_new_tokens=3, max_turns=3)
    res = run_demo(cfg, env="CreditToy-v0", load=lambda: small_policy(0), overrides=overrides)
    captured = capsys.readouterr()
    assert "dev EM before" in captured.out and "learning curves:" in captured.out
    assert "twice - grpo after training at one shared learning rate lr=" in captured.out
    assert "summary (credit lab" in captured.out and "twice J1 vs crr J1" in captured.out
    assert "final exact V(s0) at one shared learning rate lr=1 (not a method's win)" in captured.out
    assert "one shared lr=1 for every method, not tuned" in captured.out
    methods = [r["method"] for r in res["lab"]["rows"]]
    # the diagnostic rows, then the registered methods without one (their update's advantage)
    diagnostic = ["grpo", "grpo 2G", "gigpo", "twice J1", "crr J1", "vineppo K1", "vineppo K2", "twice-train"]
    # Twice's update row next to its training-time credit, then every other registered method
    assert methods == diagnostic + ["twice"] + [m for m in registered_methods() if m not in diagnostic + ["twice"]]
    assert len(res["lab"]["learn"]["methods"]["twice"]["curve"]) == 3
    expected = {"curves": demo_dir / "curves.png", "audit.png": demo_dir / "audit" / "audit.png",
                "audit.csv": demo_dir / "audit" / "audit.csv"}
    for key, path in expected.items():
        assert Path(res["paths"][key]) == path, key
        assert path.stat().st_size > 0, key
    for key in ("lab_scatter", "learn_png", "lab_json"):
        path = Path(res["paths"][key])
        assert demo_dir in path.parents and path.stat().st_size > 0, key
    for method in ("grpo", "twice"):
        rows = [json.loads(line) for line in (demo_dir / method / "metrics.jsonl").read_text().splitlines()]
        assert [r["update"] for r in rows] == [0, 1, 2, 2] and "eval" in rows[0] and "eval" in rows[-1], method
        assert (demo_dir / method / "checkpoint" / "state.pt").is_file(), method
    assert set(res) >= {"before", "grpo", "twice"}
    # the trainer's progress: one line per update and method, on stderr
    progress = [line for line in captured.err.splitlines() if " update " in line]
    assert [line.split("  ")[0] for line in progress] == ["[grpo] update 1/2", "[grpo] update 2/2",
                                                          "[twice] update 1/2", "[twice] update 2/2"]
    # a second demo into the same folder replaces the first one's runs
    run_demo(replace(cfg, updates=1), env="CreditToy-v0", progress=False, load=lambda: small_policy(0),
             overrides=overrides)
    assert capsys.readouterr().err == ""
    rows = [json.loads(line) for line in (demo_dir / "twice" / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows] == [0, 1, 1]


def test_demo_cli_passes_the_model_and_turn_length(monkeypatch):
    from twice_envs.agents.bench import demo

    seen = {}
    monkeypatch.setattr(demo, "run_demo", lambda cfg, **kw: seen.update(kw, cfg=cfg))
    assert demo.demo_main(["--quick", "--model", "some/dir", "--max-new-tokens", "128", "--no-progress"]) == 0
    assert seen["model"] == "some/dir" and seen["overrides"] == {"max_new_tokens": 128} and seen["cfg"] == demo.QUICK
    assert seen["progress"] is False
    assert demo.demo_main(["--quick"]) == 0
    # progress lines also when stderr is not a terminal (a log file, CI)
    assert seen["model"] == "tiny" and seen["overrides"] is None and seen["progress"] is True


def test_the_demo_trains_on_single_hop_searchqa_unless_told_otherwise():
    from twice_envs.agents.bench import demo

    cfg = DemoConfig()
    assert demo.trainer_overrides(cfg, "SearchQA-v0") == {"env_kwargs": {"generator": {"mix": [1.0, 0.0, 0.0, 0.0]}}}
    assert demo.trainer_overrides(cfg, "SearchQA-v0", {"env_kwargs": {}, "lr": 1.0}) == {"env_kwargs": {}, "lr": 1.0}
    assert demo.trainer_overrides(cfg, "CreditToy-v0", {"max_new_tokens": 3}) == {"max_new_tokens": 3}


def test_em_lines_give_intervals_and_paired_changes():
    before = {"em": 0.1, "em_ci": [0.05, 0.2], "outcomes": [1.0] * 2 + [0.0] * 18}
    grpo = {"after": {"em": 0.1, "em_ci": [0.05, 0.2], "outcomes": [1.0] * 2 + [0.0] * 18},
            "seconds_per_update": 1.0, "realised_beta": 0.0}
    # twice answers 10 more questions and loses none: a paired gain of 0.5, clearly significant
    twice = {"after": {"em": 0.6, "em_ci": [0.4, 0.8], "outcomes": [1.0] * 12 + [0.0] * 8},
             "seconds_per_update": 2.0, "realised_beta": 0.5}
    lines = em_lines(before, {"grpo": grpo, "twice": twice})
    assert "0.100 [0.05, 0.20]" in lines[1] and "0.600 [0.40, 0.80]" in lines[2]
    assert lines[3] == "grpo after - before: +0.000 [+0.000, +0.000], not significant (20 questions, paired)"
    assert lines[4].startswith("twice after - before: +0.500 [+0.275, +0.725], significant")
    assert lines[5].startswith("twice - grpo after training: +0.500")


def test_the_llm_comparison_names_its_shared_learning_rate():
    """Break: dropping the rate from the twice - grpo line -> "at one shared learning rate" is missing."""
    before = {"em": 0.1, "em_ci": [0.05, 0.2], "outcomes": [1.0] * 2 + [0.0] * 18}
    run = {"after": before, "seconds_per_update": 1.0, "realised_beta": 0.0, "lr": 2e-4}
    lines = em_lines(before, {"grpo": run, "twice": run})
    assert lines[0].endswith("lr") and lines[1].endswith("0.0002")
    assert lines[-1].startswith("twice - grpo after training at one shared learning rate lr=0.0002: +0.000")
