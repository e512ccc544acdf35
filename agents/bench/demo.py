"""``twice demo``: the credit lab's evidence, then GRPO and Twice on SearchQA with the tiny model.

1. **Lab audit** on SearchToy-v0 (:mod:`twice_envs.agents.lab.runner`): every estimator's credit
   against exact advantages on over a thousand decisions, with bootstrap CIs, the
   one-pair ceiling and a scatter per method.
2. **Learning curves** on SearchToy (:mod:`twice_envs.agents.bench.learn`): exact
   ``V(s0)`` per update for each method over several seeds, with CI bands, every method at one
   shared learning rate (printed; tuning each method's is ``twice bench learn``'s job).
3. **The LLM run**: loads the tiny model (the copy shipped with the package), measures
   greedy dev EM on generated single-hop SearchQA questions, trains GRPO and Twice for
   the same number of updates on the same questions at one shared learning rate (printed),
   measures dev EM again, audits the Twice policy's credit on the dev questions whose group
   has mixed outcomes, and writes the learning curves and the audit plot.
4. **A summary** that says which differences are statistically significant.
5. **The explorer** (``twice view``): one HTML file with every run's episodes and twins, the
   learning curves and both audits' scatters.

``--quick`` shrinks every stage for a smoke test.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

from twice_envs.agents.bench import learn as bench_learn
from twice_envs.agents.bench.games import paired_change
from twice_envs.agents.lab import runner as lab
from twice_envs.agents.lab.audit import (
    AuditConfig,
    NothingToAudit,
    format_table,
    run_audit,
    write_outputs,
)
from twice_envs.agents.lab.plots import plot_runs
from twice_envs.agents.models.load import load_policy
from twice_envs.agents.training.config import cpu_config
from twice_envs.agents.training.trainer import evaluate, train
from twice_envs.agents.view.cli import write_explorer
from twice_envs.trajectory import atomic_write_text


@dataclass
class DemoConfig:
    """Sizes of the demo's stages (defaults fit a few minutes on two CPU cores)."""

    lab_groups: int = 120
    """Lab audit: GRPO groups of five SearchToy episodes (about five decisions each)."""
    lab_pairs: tuple = (1, 2)
    """Lab audit: ``J`` values for Twice and CRR."""
    learn_seeds: int = 10
    """Learning curves: seeds per method."""
    learn_updates: int = 15
    """Learning curves: updates per seed."""
    learn_lr: float = 1.0
    """Learning curves: the one step size every method shares (not tuned; ``twice bench learn`` tunes)."""
    updates: int = 6
    """LLM run: updates per method (6 keeps the whole demo under 10 minutes on two cores)."""
    questions_per_update: int = 6
    """Questions per update (G = 5 episodes each)."""
    eval_questions: int = 60
    """Dev questions for the before/after EM."""
    audit_questions: int = 24
    """Held-out questions screened for the audit (those whose group has mixed outcomes are audited)."""
    oracle_rollouts: int = 8
    """Rollouts per state for the audit's oracle."""
    question_mix: tuple = (1.0, 0.0, 0.0, 0.0)
    """Shares of single-hop, 2-hop, 3-hop and comparison questions in the generated SearchQA
    tasks (the generator's ``mix``). Single-hop only: the questions within the tiny model's
    reach (dev EM 0.13 greedy there, about 0 on the others), so more episodes carry reward."""
    out: str = "runs/demo"
    """Where runs, plots and the audit go."""
    seed: int = 0
    """Seed shared by both runs (same questions, same noise seeds)."""


QUICK = DemoConfig(updates=2, questions_per_update=2, eval_questions=8, audit_questions=2, oracle_rollouts=2,
                   lab_groups=12, lab_pairs=(1,), learn_seeds=2, learn_updates=2)


def run_lab_stages(cfg: DemoConfig, out: Path, say=print) -> dict:
    """Stages 1 and 2: the lab audit and the learning curves; returns their figures."""

    say(f"lab audit on SearchToy-v0: {cfg.lab_groups} groups x 5 episodes, exact A* for every decision")
    acfg = lab.LabAuditConfig(groups=cfg.lab_groups, pairs=tuple(cfg.lab_pairs), vine_k=(1, 2), n_boot=500,
                              seed=cfg.seed)
    audit = lab.run_lab_audit(acfg)
    print(lab.format_lab(audit), end="")
    apaths = lab.write_lab(audit, out / "lab")
    say(f"learning curves on SearchToy: {cfg.learn_seeds} seeds x {cfg.learn_updates} updates per method")
    # one shared step size, not tuned (tuning every method would exceed the demo's time): the report says so
    lcfg = bench_learn.LearnConfig(seeds=cfg.learn_seeds, updates=cfg.learn_updates, groups=6, seed=cfg.seed,
                                   lr_grid=(), lr=cfg.learn_lr)
    learn = bench_learn.run_learn(lcfg)
    print(bench_learn.format_learn(learn), end="")
    lpaths = bench_learn.write_learn(learn, out / "lab")
    return {"audit": audit, "learn": learn, "paths": {"lab_scatter": str(apaths["png"]), "lab_json": str(apaths["json"]),
                                                      "learn_png": str(lpaths["png"]), "learn_json": str(lpaths["json"])}}


def summary_lines(lab_res: dict) -> list[str]:
    """Plain sentences on which lab differences are significant (95% bootstrap CIs)."""
    lines = []
    for c in lab_res["audit"].comparisons:
        if c["baseline"].startswith("grpo") and c["figure"] == "pearson":
            continue
        better = (c["diff"]["value"] > 0) == (c["figure"] == "pearson")
        verdict = ("significantly " + ("better" if better else "worse")) if c["significant"] else "not significantly different"
        lines.append(f"{c['figure']}: {c['twice']} vs {c['baseline']} (no more aux tokens): "
                     f"{c['diff']['value']:+.3f} [{c['diff']['lo']:+.3f}, {c['diff']['hi']:+.3f}], {verdict}")
    learn = lab_res["learn"]["methods"]
    g = learn["grpo"]["final"]
    for m, r in learn.items():
        if m == "grpo":
            continue
        f = r["final"]
        sep = f["lo"] > g["hi"] or f["hi"] < g["lo"]
        lines.append(f"final exact V(s0) at one shared learning rate lr={r['lr']:g} (not a method's win): "
                     f"{m} {f['value']:.3f} [{f['lo']:.3f}, {f['hi']:.3f}] vs GRPO {g['value']:.3f} "
                     f"[{g['lo']:.3f}, {g['hi']:.3f}]: " + ("CIs do not overlap" if sep else "CIs overlap"))
    return lines


def em_lines(before: dict, runs: dict) -> list[str]:
    """The dev EM table (95% Wilson intervals; each method's learning rate) and each method's change and
    Twice's difference from GRPO at their shared learning rate, paired question by question (greedy
    decoding, the same questions), with 95% intervals."""
    def em(e: dict) -> str:
        return f"{e['em']:.3f} [{e['em_ci'][0]:.2f}, {e['em_ci'][1]:.2f}]"

    lines = [f"{'':<8}{'dev EM before':>22}{'dev EM after':>22}{'s/update':>10}{'aux/policy tokens':>19}{'lr':>8}"]
    for method, r in runs.items():
        lines.append(f"{method:<8}{em(before):>22}{em(r['after']):>22}{r['seconds_per_update']:>10.1f}"
                     f"{r['realised_beta']:>19.2f}{r.get('lr', float('nan')):>8g}")

    def change(label: str, after: list, base: list) -> str:
        c = paired_change(after, base)
        lo, hi = c["change_ci"]
        verdict = "significant" if lo > 0 or hi < 0 else "not significant"
        return f"{label}: {c['change']:+.3f} [{lo:+.3f}, {hi:+.3f}], {verdict} ({c['n']} questions, paired)"

    for method, r in runs.items():
        lines.append(change(f"{method} after - before", r["after"]["outcomes"], before["outcomes"]))
    if {"grpo", "twice"} <= set(runs):
        shared = f" at one shared learning rate lr={runs['twice']['lr']:g}" if "lr" in runs["twice"] else ""
        lines.append(change(f"twice - grpo after training{shared}", runs["twice"]["after"]["outcomes"],
                            runs["grpo"]["after"]["outcomes"]))
    return lines


def trainer_overrides(cfg: DemoConfig, env: str, overrides: dict | None = None) -> dict:
    """The trainer settings the demo changes: on SearchQA, the generator's question mix
    (unless ``overrides`` names its own env kwargs)."""
    out = dict(overrides or {})
    if env == "SearchQA-v0" and "env_kwargs" not in out:
        out["env_kwargs"] = {"generator": {"mix": list(cfg.question_mix)}}
    return out


def run_demo(cfg: DemoConfig, *, env: str = "SearchQA-v0", model: str = "tiny", progress: bool = True,
             load=None, overrides: dict | None = None) -> dict:
    """Run the demo; ``load()`` returns a fresh policy (default: ``load_policy(model)``) and
    ``overrides`` change the trainer's CPU defaults (both for tests on small envs)."""

    out = Path(cfg.out)
    t0 = time.time()
    say = lambda msg: print(f"[demo {time.time() - t0:5.0f}s] {msg}", flush=True)  # noqa: E731
    lab_res = run_lab_stages(cfg, out, say)
    say(f"loading the {model} model")
    load = load or (lambda: load_policy(model))
    policy = load()
    base = cpu_config(env=env, model=model, updates=cfg.updates, questions_per_update=cfg.questions_per_update,
                      eval_questions=cfg.eval_questions, seed=cfg.seed, checkpoint_every=cfg.updates,
                      **trainer_overrides(cfg, env, overrides))
    before = evaluate(policy, base)
    say(f"dev EM before training: {before['em']:.3f} (F1 {before['f1']:.3f}, {before['n']} questions)")
    results = {"before": before}
    trained = {}
    for method in ("grpo", "twice"):
        run_cfg = replace(base, method=method, out_dir=str(out / method))
        say(f"training {method} for {cfg.updates} updates -> {run_cfg.out_dir}")
        trained[method] = load()
        # the demo owns its folder: a second ``twice demo`` replaces the first one's runs
        metrics = train(run_cfg, progress=progress, overwrite=True, policy=trained[method])
        after = evaluate(trained[method], run_cfg)
        results[method] = {"after": after, "lr": run_cfg.lr,
                           "seconds_per_update": sum(m["time"] for m in metrics) / len(metrics),
                           "realised_beta": sum(m["aux_tokens"] for m in metrics) / max(1, sum(m["generated_tokens"] for m in metrics))}
        # record dev EM before and after in the run's metrics so the plot shows both
        mfile = Path(run_cfg.out_dir) / "metrics.jsonl"
        rows = mfile.read_text()
        atomic_write_text(mfile, json.dumps({"update": 0, "eval": before}) + "\n" + rows +
                          json.dumps({"update": cfg.updates, "eval": after}) + "\n")
        say(f"{method}: dev EM {before['em']:.3f} -> {after['em']:.3f}")
    curves = plot_runs([out / "grpo", out / "twice"], out / "curves.png", labels=["GRPO", "Twice"])
    say("auditing the Twice policy's credit")
    acfg = AuditConfig(env=env, env_kwargs=base.env_kwargs, questions=cfg.audit_questions,
                       oracle_rollouts=cfg.oracle_rollouts, max_new_tokens=base.max_new_tokens,
                       max_turns=base.max_turns, indexed_tasks=base.indexed_tasks, seed=cfg.seed, mixed_only=True)
    try:
        res = run_audit(trained["twice"], acfg)
    except NothingToAudit as exc:  # a policy whose groups all end alike leaves no decision to audit
        res, paths = None, {}
        say(str(exc))
    else:
        paths = write_outputs(res, out / "audit")
        print(format_table(res), end="")
        print()
    for line in em_lines(before, {m: results[m] for m in ("grpo", "twice")}):
        print(line)
    audit_line = f"{paths['audit.png']} (table: {paths['audit.csv']})" if paths else "none (nothing to audit)"
    print(f"\nlearning curves: {curves}\ncredit audit:    {audit_line}\n"
          f"runs:            {out / 'grpo'}, {out / 'twice'} (metrics.jsonl, checkpoint/)")
    print("\nsummary (credit lab, 95% bootstrap CIs):")
    for line in summary_lines(lab_res):
        print("  " + line)
    print(f"lab scatter:     {lab_res['paths']['lab_scatter']}\nlab curves:      {lab_res['paths']['learn_png']}")
    explorer = write_explorer(out, title="twice demo")
    print(f"explorer:        {explorer} (open it in a browser)")
    say("done")
    results["paths"] = {"curves": str(curves), **{k: str(v) for k, v in paths.items()}, **lab_res["paths"],
                        "explorer": str(explorer)}
    results["lab"] = {"rows": lab_res["audit"].rows, "comparisons": lab_res["audit"].comparisons,
                      "learn": lab_res["learn"]}
    return results


def demo_main(argv: Sequence[str]) -> int:
    """``twice demo [--quick] [--out DIR] [--model M --max-new-tokens N]``."""
    p = argparse.ArgumentParser(prog="twice demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes for a smoke test")
    p.add_argument("--out", default=None, help="output directory (default runs/demo)")
    p.add_argument("--updates", type=int, default=None)
    p.add_argument("--no-progress", action="store_true", help="no line per training update on stderr")
    p.add_argument("--model", default="tiny", help="tiny (default), smollm2-135m or a model directory")
    p.add_argument("--max-new-tokens", type=int, default=None, help="tokens per turn at most (default 128)")
    a = p.parse_args(argv)
    cfg = QUICK if a.quick else DemoConfig()
    if a.out:
        cfg = replace(cfg, out=a.out)
    if a.updates:
        cfg = replace(cfg, updates=a.updates)
    overrides = {"max_new_tokens": a.max_new_tokens} if a.max_new_tokens else None
    run_demo(cfg, model=a.model, progress=not a.no_progress, overrides=overrides)
    return 0
