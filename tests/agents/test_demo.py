"""The demo: lab audit, learning at tuned step sizes, GRPO and Twice on an LLM env, and a summary under 40 lines."""

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from twice_envs.agents.bench import demo
from twice_envs.agents.bench.demo import DemoConfig, em_lines, run_demo
from twice_envs.agents.bench.demo_summary import MAX_LINES, Figure, Summary, lines

from .train_helpers import one_torch_thread, small_policy  # noqa: F401

NUMBER = re.compile(r"(?<![\w.\-/])[+-]?\d+(?:\.\d+)?(?![\w/])")
#: numbers that are part of the summary's fixed wording: "95% CIs" and "X = 1 / (1 - rho-bar)"
WORDING = {"95", "1"}


def printed_numbers_not_in_json(text_lines: list, doc: dict) -> list:
    """Every number printed in the summary's findings and run lines that no figure or setting in ``doc`` gives."""
    allowed = set(WORDING)
    for f in doc["figures"].values():
        for v in (f["value"], f["lo"], f["hi"]):
            allowed |= {f"{v:{f['fmt']}}", f"{v:+{f['fmt']}}"}
    for v in doc["settings"].values():
        allowed |= {f"{v:g}", str(v)} if isinstance(v, (int, float)) else set()
    body = text_lines[:text_lines.index("where the rest is:")]
    return [n for line in body for n in NUMBER.findall(line) if n not in allowed]


def test_demo_pipeline_prints_a_short_summary_whose_figures_are_in_its_json(tmp_path, capsys):
    demo_dir = tmp_path / "demo"
    cfg = replace(demo.QUICK, out=str(demo_dir))
    overrides = dict(indexed_tasks=False, group_size=3, max_new_tokens=3, max_turns=3)
    res = run_demo(cfg, env="CreditToy-v0", load=lambda: small_policy(0), overrides=overrides)
    captured = capsys.readouterr()
    printed = captured.out.rstrip("\n").split("\n")
    assert printed == res["lines"] and len(printed) <= MAX_LINES
    doc = json.loads((demo_dir / "summary.json").read_text())
    assert doc["lines"] == printed
    assert printed_numbers_not_in_json(printed, doc) == []
    # the figures the summary is about are all there, each with its interval
    assert {"lab_twice_wrong_sign", "lab_crr_wrong_sign", "lab_rho_bar", "learn_strong", "learn_weak", "em_before",
            "em_grpo", "em_twice", "em_twice_minus_grpo"} <= set(doc["figures"])
    for f in doc["figures"].values():
        assert f["lo"] <= f["value"] <= f["hi"] or f["key"] == "lab_wrong_sign_times_less", f
    text = captured.out
    assert re.search(r"Twice - GRPO [+-]\d", text) and "area under the exact V(s0) curve" in text and "shared lr" in text and "not tuned" in text and "The LLM credit audit is left out" in text
    # the full tables go to report.txt, not the screen
    report = (demo_dir / "report.txt").read_text()
    assert "== credit lab audit" in report and "tuning: mean area" in report and "dev EM before" in report
    assert "tuning: mean area" not in text
    for name in ("lab/lab_audit.json", "lab/learn_shuffle0/learn.png", "lab/learn_shuffle1/learn.json",
                 "explorer.html"):
        assert (demo_dir / name).stat().st_size > 0, name
    for method in ("grpo", "twice"):
        rows = [json.loads(line) for line in (demo_dir / method / "metrics.jsonl").read_text().splitlines()]
        assert [r["update"] for r in rows] == [0, 1, 2, 2] and "eval" in rows[0] and "eval" in rows[-1], method
        assert (demo_dir / method / "checkpoint" / "state.pt").is_file(), method
    # stderr is not a terminal here: no progress lines at all
    assert captured.err == ""
    # a second demo into the same folder replaces the first one's runs
    run_demo(replace(cfg, updates=1), env="CreditToy-v0", progress=False, load=lambda: small_policy(0),
             overrides=overrides)
    capsys.readouterr()
    rows = [json.loads(line) for line in (demo_dir / "twice" / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows] == [0, 1, 1]


def test_the_number_check_catches_a_printed_figure_that_is_not_in_the_json():
    s = Summary(figures={"em_before": Figure("em_before", 0.1, 0.05, 0.2), "em_grpo": Figure("em_grpo", 0.15, 0.1, 0.3),
                         "em_twice": Figure("em_twice", 0.22, 0.1, 0.3)}, files={"x": "y"})
    text = lines(s)
    doc = s.as_dict()
    assert printed_numbers_not_in_json(text, doc) == []
    doc["figures"]["em_twice"]["value"] = 0.25
    assert printed_numbers_not_in_json(text, doc) == ["0.220"]


def test_the_summary_refuses_to_grow_past_its_limit():
    s = Summary(ran=["x"] * MAX_LINES)
    with pytest.raises(RuntimeError, match="more than 40"):
        lines(s)


def test_demo_cli_passes_the_model_and_turn_length(monkeypatch):
    seen = {}
    monkeypatch.setattr(demo, "run_demo", lambda cfg, **kw: seen.update(kw, cfg=cfg))
    assert demo.demo_main(["--quick", "--model", "some/dir", "--max-new-tokens", "128", "--no-progress"]) == 0
    assert seen["model"] == "some/dir" and seen["overrides"] == {"max_new_tokens": 128} and seen["cfg"] == demo.QUICK
    assert seen["progress"] is False
    demo.progress_mod.set_enabled(None)
    assert demo.demo_main(["--quick"]) == 0
    assert seen["model"] == "tiny" and seen["overrides"] is None


def test_the_demo_trains_on_single_hop_searchqa_unless_told_otherwise():
    cfg = DemoConfig()
    assert demo.trainer_overrides(cfg, "SearchQA-v0") == {"env_kwargs": {"generator": {"mix": [1.0, 0.0, 0.0, 0.0]}}}
    assert demo.trainer_overrides(cfg, "SearchQA-v0", {"env_kwargs": {}, "lr": 1.0}) == {"env_kwargs": {}, "lr": 1.0}
    assert demo.trainer_overrides(cfg, "CreditToy-v0", {"max_new_tokens": 3}) == {"max_new_tokens": 3}


def test_em_lines_give_intervals_and_paired_changes():
    before = {"em": 0.1, "em_ci": [0.05, 0.2], "outcomes": [1.0] * 2 + [0.0] * 18}
    grpo = {"after": {"em": 0.1, "em_ci": [0.05, 0.2], "outcomes": [1.0] * 2 + [0.0] * 18},
            "seconds_per_update": 1.0, "realised_beta": 0.0, "lr": 2e-4}
    # twice answers 10 more questions and loses none: a paired gain of 0.5
    twice = {"after": {"em": 0.6, "em_ci": [0.4, 0.8], "outcomes": [1.0] * 12 + [0.0] * 8},
             "seconds_per_update": 2.0, "realised_beta": 0.5, "lr": 2e-4}
    out = em_lines(before, {"grpo": grpo, "twice": twice})
    assert "0.100 [0.050, 0.200]" in out[1] and "0.600 [0.400, 0.800]" in out[2] and out[1].endswith("0.0002")
    assert out[3] == "grpo after - before: +0.000 [+0.000, +0.000] (20 questions, paired)"
    assert out[4].startswith("twice after - before: +0.500 [+0.275, +0.725]")
