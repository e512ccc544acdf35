"""``twice demo``: what a coupled twin buys, on the credit lab and on SearchQA with the tiny model.

1. **Lab audit** on SearchToy-v0 (:mod:`twice_envs.agents.lab.lab_audit`): every estimator's credit
   against exact advantages on about three thousand decisions, the published Table 2 first, and
   how strongly the twins are coupled (rho-bar).
2. **Learning where coupling is strong and where it is weak** (:mod:`twice_envs.agents.bench.learn`):
   GRPO and Twice on ChoiceLab-v0 at two settings of its coupling knob (``shuffle`` 0 and 1), each
   method at its own step size tuned on seeds kept apart, exact ``V(s0)`` per update.
3. **The LLM run**: loads the tiny model (shipped with the package), measures greedy dev EM on
   generated single-hop SearchQA questions, trains GRPO and Twice for the same updates on the same
   questions at one shared step size (printed as such), and measures dev EM again.
4. **A summary** of at most 40 lines (:mod:`.demo_summary`): the figures that matter, each with its
   95% CI and a plain sentence; the full tables go to ``report.txt`` and every figure to
   ``summary.json``.
5. **The explorer** (``twice view``): one HTML file with every run's episodes and twins.

The LLM credit audit is not part of the demo: its oracle cannot resolve the ``|A*| >= 0.05``
threshold at a size that fits here (:data:`LLM_AUDIT_ROLLOUTS`), so the summary says so and names the
command that runs it. ``--quick`` shrinks every stage for a smoke test.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

from twice_envs import progress as progress_mod
from twice_envs.agents import stats as cs
from twice_envs.agents.bench import learn as bench_learn
from twice_envs.agents.bench.demo_summary import Figure, Summary, lab_figures, learn_figure, lines
from twice_envs.agents.bench.games import paired_change
from twice_envs.agents.lab.choice_lab import ChoiceLabSetting
from twice_envs.agents.lab.lab_audit import LabAuditConfig
from twice_envs.agents.lab.lab_audit import run_lab_audit as lab_audit
from twice_envs.agents.lab.report import format_lab, write_lab
from twice_envs.agents.models.load import load_policy
from twice_envs.agents.training.config import cpu_config
from twice_envs.agents.training.trainer import evaluate, train
from twice_envs.agents.view.cli import write_explorer
from twice_envs.trajectory import atomic_write_text

#: Oracle rollouts per state the LLM audit needs before its standard error of ``A*`` falls below the
#: ``|A*| >= 0.05`` threshold with the tiny model on SearchQA: the median SE measured 0.164 at 8
#: rollouts, and it falls as ``1 / sqrt(rollouts)``, so ``8 * (0.164 / 0.05) ** 2`` is about 86.
LLM_AUDIT_ROLLOUTS = 96


@dataclass
class DemoConfig:
    """Sizes of the demo's stages (the defaults fit in under ten minutes on two CPU cores)."""

    lab_groups: int = 120
    """Lab audit: GRPO groups of five SearchToy episodes (about five decisions each)."""
    lab_pairs: tuple = (1,)
    """Lab audit: ``J`` values for Twice and CRR (the summary uses ``J = 1``: one twin per decision for both;
    Twice's self-twins cost nothing)."""
    learn_shuffles: tuple = (0.0, 1.0)
    """Learning: ChoiceLab's ``shuffle`` at the strongly and the weakly coupled end."""
    learn_seeds: int = 6
    """Learning: reporting seeds per method and setting."""
    learn_updates: int = 20
    """Learning: updates per run."""
    learn_grid: tuple = (4.0, 8.0, 16.0)
    """Learning: the step sizes each method is tuned on."""
    learn_tune_seeds: int = 1
    """Learning: tuning seeds per step size (apart from the reporting seeds; ``twice bench learn`` uses 2)."""
    learn_groups: int = 8
    """Learning: GRPO groups of five episodes per update."""
    updates: int = 6
    """LLM run: updates per method."""
    questions_per_update: int = 6
    """Questions per update (G = 5 episodes each)."""
    eval_questions: int = 60
    """Dev questions for the before/after EM."""
    question_mix: tuple = (1.0, 0.0, 0.0, 0.0)
    """Shares of single-hop, 2-hop, 3-hop and comparison questions in the generated SearchQA
    tasks (the generator's ``mix``). Single-hop only: the questions within the tiny model's
    reach (dev EM 0.13 greedy there, about 0 on the others), so more episodes carry reward."""
    out: str = "runs/demo"
    """Where runs, plots, tables and the summary go."""
    seed: int = 0
    """Seed shared by every run (same questions, same noise seeds)."""
    jobs: int = 2
    """Processes the learning runs spread over (the figures do not depend on it)."""


QUICK = DemoConfig(updates=2, questions_per_update=2, eval_questions=8, lab_groups=12, learn_seeds=2,
                   learn_updates=3, learn_grid=(4.0, 16.0), learn_tune_seeds=1, learn_groups=2, jobs=1)


class Stages:
    """Stage announcements on stderr (``[demo 42 s] 2/4 ...``), under the shared progress rule."""

    def __init__(self, total: int, show: bool):
        self.total, self.show, self.n, self.t0 = total, show, 0, time.time()

    def __call__(self, msg: str) -> None:
        self.n += 1
        if self.show:
            print(f"[demo {time.time() - self.t0:4.0f} s] {self.n}/{self.total} {msg}", file=sys.stderr, flush=True)


def run_lab_audit(cfg: DemoConfig, out: Path, report: io.StringIO) -> dict:
    """Stage 1: the SearchToy lab audit; returns its JSON document (also written to ``out/lab``)."""
    acfg = LabAuditConfig(groups=cfg.lab_groups, pairs=tuple(cfg.lab_pairs), vine_k=(1,), n_boot=500,
                          seed=cfg.seed)
    audit = lab_audit(acfg)
    report.write("== credit lab audit (SearchToy-v0, exact A*) ==\n" + format_lab(audit) + "\n")
    paths = write_lab(audit, out / "lab")
    return json.loads(Path(paths["json"]).read_text())


def run_learning(cfg: DemoConfig, shuffle: float, out: Path, report: io.StringIO) -> dict:
    """Stage 2 at one ChoiceLab setting: GRPO and Twice, each at its tuned step size."""
    lcfg = bench_learn.LearnConfig(env="ChoiceLab-v0", choice_setting=ChoiceLabSetting(shuffle=shuffle),
                                   methods=("grpo", "twice"), seeds=cfg.learn_seeds, updates=cfg.learn_updates,
                                   groups=cfg.learn_groups, lr_grid=tuple(cfg.learn_grid),
                                   tune_seeds=cfg.learn_tune_seeds, seed=cfg.seed, jobs=cfg.jobs)
    res = bench_learn.run_learn(lcfg)
    report.write(f"== learning on ChoiceLab-v0, shuffle {shuffle:g} ==\n" + bench_learn.format_learn(res) + "\n")
    bench_learn.write_learn(res, out / "lab" / f"learn_shuffle{shuffle:g}")
    return res


def em_figure(key: str, e: dict) -> Figure:
    return Figure(key, float(e["em"]), float(e["em_ci"][0]), float(e["em_ci"][1]), fmt=".3f",
                  meaning="dev exact match, greedy, 95% Wilson interval")


def em_lines(before: dict, runs: dict) -> list[str]:
    """The dev EM table for ``report.txt`` (95% Wilson intervals; each method's step size) and each
    method's change, paired question by question, with 95% intervals."""
    def em(e: dict) -> str:
        return f"{e['em']:.3f} [{e['em_ci'][0]:.3f}, {e['em_ci'][1]:.3f}]"

    out = [f"{'':<8}{'dev EM before':>24}{'dev EM after':>24}{'s/update':>10}{'aux/policy tokens':>19}{'lr':>8}"]
    for method, r in runs.items():
        out.append(f"{method:<8}{em(before):>24}{em(r['after']):>24}{r['seconds_per_update']:>10.1f}"
                   f"{r['realised_beta']:>19.2f}{r['lr']:>8g}")
    for method, r in runs.items():
        c = paired_change(r["after"]["outcomes"], before["outcomes"])
        out.append(f"{method} after - before: {c['change']:+.3f} [{c['change_ci'][0]:+.3f}, {c['change_ci'][1]:+.3f}]"
                   f" ({c['n']} questions, paired)")
    return out


def trainer_overrides(cfg: DemoConfig, env: str, overrides: dict | None = None) -> dict:
    """The trainer settings the demo changes: on SearchQA, the generator's question mix
    (unless ``overrides`` names its own env kwargs)."""
    out = dict(overrides or {})
    if env == "SearchQA-v0" and "env_kwargs" not in out:
        out["env_kwargs"] = {"generator": {"mix": list(cfg.question_mix)}}
    return out


def run_llm(cfg: DemoConfig, out: Path, report: io.StringIO, *, env: str, model: str, progress: bool, load,
            overrides: dict | None = None) -> dict:
    """Stage 3: dev EM, GRPO and Twice training at one shared step size, dev EM again."""
    policy = load()
    base = cpu_config(env=env, model=model, updates=cfg.updates, questions_per_update=cfg.questions_per_update,
                      eval_questions=cfg.eval_questions, seed=cfg.seed, checkpoint_every=cfg.updates,
                      **trainer_overrides(cfg, env, overrides))
    before = evaluate(policy, base)
    runs = {}
    for method in ("grpo", "twice"):
        run_cfg = replace(base, method=method, out_dir=str(out / method))
        trained = load()
        # the demo owns its folder: a second ``twice demo`` replaces the first one's runs
        metrics = train(run_cfg, progress=progress, overwrite=True, policy=trained)
        after = evaluate(trained, run_cfg)
        runs[method] = {"after": after, "lr": run_cfg.lr,
                        "seconds_per_update": sum(m["time"] for m in metrics) / len(metrics),
                        "realised_beta": sum(m["aux_tokens"] for m in metrics)
                        / max(1, sum(m["generated_tokens"] for m in metrics))}
        # dev EM before and after in the run's metrics, so its plot shows both
        mfile = Path(run_cfg.out_dir) / "metrics.jsonl"
        atomic_write_text(mfile, json.dumps({"update": 0, "eval": before}) + "\n" + mfile.read_text()
                          + json.dumps({"update": cfg.updates, "eval": after}) + "\n")
    report.write(f"== SearchQA ({env}), {model} model, {cfg.updates} updates per method ==\n"
                 + "\n".join(em_lines(before, runs)) + "\n")
    return {"before": before, **runs}


def run_demo(cfg: DemoConfig, *, env: str = "SearchQA-v0", model: str = "tiny", progress: bool = True,
             load=None, overrides: dict | None = None) -> dict:
    """Run the demo and print its summary; returns ``{"summary", "before", "grpo", "twice", "paths"}``.

    ``load()`` returns a fresh policy (default: ``load_policy(model)``) and ``overrides`` change the
    trainer's CPU defaults (both for tests on small envs). ``progress`` shows stage and update lines on
    stderr (only on a terminal, see :mod:`twice_envs.progress`)."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    show = progress and progress_mod.enabled()
    say = Stages(3 + len(cfg.learn_shuffles), show)
    report, summary, t0 = io.StringIO(), Summary(), time.time()

    say(f"lab audit on SearchToy-v0: {cfg.lab_groups} groups x 5 episodes, exact A* at every decision")
    audit = run_lab_audit(cfg, out, report)
    for fig in lab_figures(audit):
        summary.add(fig)
    summary.settings.update(lab_decisions=audit["decisions"], lab_episodes=cfg.lab_groups * 5)
    summary.ran.append(f"credit lab audit, SearchToy-v0: {audit['decisions']} decisions of {cfg.lab_groups * 5} "
                       "episodes, exact advantages")

    for shuffle, key in zip(cfg.learn_shuffles, ("learn_strong", "learn_weak")):
        say(f"learning on ChoiceLab-v0 at shuffle {shuffle:g}: GRPO and Twice, step sizes tuned on "
            f"{', '.join(f'{x:g}' for x in cfg.learn_grid)}")
        res = run_learning(cfg, shuffle, out, report)
        summary.add(learn_figure(key, res))
        summary.settings.update({f"{key}_shuffle": shuffle, f"{key}_lr_grpo": res["methods"]["grpo"]["lr"],
                                 f"{key}_lr_twice": res["methods"]["twice"]["lr"]})
    summary.settings.update(learn_seeds=cfg.learn_seeds, learn_updates=cfg.learn_updates)
    summary.ran.append(f"learning, ChoiceLab-v0: GRPO and Twice, {cfg.learn_seeds} seeds x {cfg.learn_updates} "
                       "updates, each at its own tuned lr")

    say(f"SearchQA with the {model} model: GRPO and Twice, {cfg.updates} updates each")
    llm = run_llm(cfg, out, report, env=env, model=model, progress=show, overrides=overrides,
                  load=load or (lambda: load_policy(model)))
    summary.add(em_figure("em_before", llm["before"]))
    for method in ("grpo", "twice"):
        summary.add(em_figure(f"em_{method}", llm[method]["after"]))
    c = paired_change(llm["twice"]["after"]["outcomes"], llm["grpo"]["after"]["outcomes"])
    lo, hi = c["change_ci"]
    summary.add(Figure("em_twice_minus_grpo", c["change"], lo, hi, significant=bool(lo > 0 or hi < 0),
                       meaning="Twice's dev EM - GRPO's after training, paired question by question"))
    summary.settings.update(em_questions=c["n"], llm_lr=llm["twice"]["lr"], llm_updates=cfg.updates,
                            llm_questions_per_update=cfg.questions_per_update,
                            llm_audit_threshold=cs.THRESHOLD, llm_audit_rollouts=LLM_AUDIT_ROLLOUTS)
    summary.ran.append(f"{env}, {model} model: GRPO and Twice, {cfg.updates} updates of "
                       f"{cfg.questions_per_update} questions, dev EM on {c['n']} questions")
    summary.notes += [f"The LLM credit audit is left out: its oracle needs about {LLM_AUDIT_ROLLOUTS} rollouts per "
                      f"state to resolve |A*| >= {cs.THRESHOLD:g},", "over an hour here. Run it on the Twice run with:",
                      f"twice audit --checkpoint {out / 'twice'} --mixed-only --oracle-rollouts {LLM_AUDIT_ROLLOUTS}"]

    say("writing the explorer and the summary")
    explorer = write_explorer(out, title="twice demo")
    summary.settings["seconds"] = round(time.time() - t0)
    paths = {"summary.json": out / "summary.json", "report.txt": out / "report.txt",
             "lab audit": out / "lab" / "lab_audit.json", "learning curves": out / "lab" / "learn_shuffle*/learn.png",
             "LLM runs": f"{out / 'grpo'}, {out / 'twice'}", "explorer": f"{explorer} (open it in a browser)"}
    summary.files = {k: str(v) for k, v in paths.items()}
    text = lines(summary)
    atomic_write_text(out / "report.txt", report.getvalue())
    atomic_write_text(out / "summary.json", json.dumps({**summary.as_dict(), "lines": text}, indent=1))
    print("\n".join(text))
    return {"summary": summary.as_dict(), "lines": text, "before": llm["before"], "grpo": llm["grpo"],
            "twice": llm["twice"], "paths": {"explorer": str(explorer), "summary": str(out / "summary.json"),
                                             "report": str(out / "report.txt")}}


def demo_main(argv: Sequence[str]) -> int:
    """``twice demo [--quick] [--out DIR] [--model M --max-new-tokens N] [--no-progress]``."""
    p = argparse.ArgumentParser(prog="twice demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes for a smoke test")
    p.add_argument("--out", default=None, help="output directory (default runs/demo)")
    p.add_argument("--updates", type=int, default=None, help="LLM updates per method (default 6)")
    p.add_argument("--model", default="tiny", help="tiny (default), smollm2-135m or a model directory")
    p.add_argument("--max-new-tokens", type=int, default=None, help="tokens per turn at most (default 128)")
    progress_mod.add_argument(p)
    a = p.parse_args(argv)
    cfg = QUICK if a.quick else DemoConfig()
    if a.out:
        cfg = replace(cfg, out=a.out)
    if a.updates:
        cfg = replace(cfg, updates=a.updates)
    overrides = {"max_new_tokens": a.max_new_tokens} if a.max_new_tokens else None
    run_demo(cfg, model=a.model, progress=progress_mod.apply(a), overrides=overrides)
    return 0
