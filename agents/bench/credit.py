"""``twice bench credit``: credit quality and training efficiency of Twice against baselines.

In one run, with fixed seeds:

0. **Credit audit on CreditToy-v0**, where the advantages are exact, then on
   SearchToy-v0, both through the credit lab (:mod:`twice_envs.agents.lab.lab_audit`, bootstrap
   CIs): every decision gets a coupled twin, an independent counterfactual and VinePPO's
   value rollouts.

On generated SearchQA with the tiny model:

1. **Credit audit** (:mod:`twice_envs.agents.lab.audit`, bootstrap CIs; one twin or
   counterfactual per decision for Twice and CRR) of the dev questions whose group has mixed outcomes (screened from
   ``--audit-questions`` candidates; where a weak policy fails every episode no
   estimator has anything to measure): wrong-sign rate of Twice vs CRR (target: Twice <= 1/3 of CRR),
   Pearson correlation of Twice's credit with the oracle (target >= 0.7), Twice's MSE
   relative to GRPO's (target <= 0.3).
2. **Training**: GRPO and Twice for the same updates on the same questions; the
   updates Twice needs to reach GRPO's final dev EM, as a share of GRPO's (target
   <= 60%); Twice's realised auxiliary tokens vs ``beta`` x policy tokens after the
   predictor warm-up (target within 5%); wall time per update, Twice / GRPO
   (target <= 1 + beta + 0.1).

Figures print as a table with the targets; ``--json FILE`` also writes them.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import numpy as np

from twice_envs import progress
from twice_envs.agents.bench.output import stderr_log
from twice_envs.agents.credit.registry import get_method
from twice_envs.agents.credit.twice import TwiceConfig
from twice_envs.agents.lab.audit import run_audit
from twice_envs.agents.lab.audit_config import AuditConfig
from twice_envs.agents.lab.lab_audit import LabAuditConfig, run_lab_audit
from twice_envs.agents.lab.report import format_lab, format_table, write_lab, write_outputs
from twice_envs.agents.models.load import load_policy
from twice_envs.agents.training.config import cpu_config
from twice_envs.agents.training.trainer import train


def _updates_to_reach(evals: list[tuple[int, float]], target: float) -> int | None:
    for u, em in evals:
        if em >= target - 1e-12:
            return u
    return None


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="twice bench credit", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke run, not the reported figures)")
    p.add_argument("--out", default="runs/bench_credit")
    p.add_argument("--updates", type=int, default=None)
    p.add_argument("--audit-questions", type=int, default=None)
    p.add_argument("--oracle-rollouts", type=int, default=None)
    p.add_argument("--json", default=None, help="also write the figures to this file")
    p.add_argument("--skip-training", action="store_true")
    p.add_argument("--model", default="tiny", help="tiny, smollm2-135m or a model directory")
    p.add_argument("--max-new-tokens", type=int, default=None, help="tokens per turn at most (default: the CPU default, 128)")
    progress.add_argument(p)
    a = p.parse_args(argv)
    progress.apply(a)

    q = a.quick
    updates = a.updates or (3 if q else 30)
    eval_every = 1 if q else 5
    audit_q = a.audit_questions or (3 if q else 300)
    oracle = a.oracle_rollouts or (2 if q else 64)
    out = Path(a.out)
    t0 = time.time()
    log = stderr_log("credit")
    fig: dict = {}

    log("audit on CreditToy-v0 (exact advantages, keyed categorical policy)")
    toy_res = run_lab_audit(LabAuditConfig(env="CreditToy-v0", groups=150 if q else 600, pairs=(1,),
                                                   n_boot=200 if q else 1000))
    print(format_lab(toy_res), end="")
    trows = {r["method"]: r for r in toy_res.rows}
    for k, name in (("twice", "twice J1"), ("crr", "crr J1"), ("grpo", "grpo"), ("vineppo", "vineppo K2")):
        fig[f"toy_wrong_sign_{k}"] = trows[name]["wrong_sign"]["value"]
        fig[f"toy_pearson_{k}"] = trows[name]["pearson"]["value"]
        fig[f"toy_mse_vs_grpo_{k}"] = trows[name]["mse_vs_grpo"]["value"]
    fig["toy_rho_twin"] = trows["twice J1"]["rho_bar"]["value"]

    log("credit lab on SearchToy-v0 (exact advantages, CIs; twice audit --env SearchToy-v0 for its options)")
    lab_res = run_lab_audit(LabAuditConfig(groups=24 if q else 240, n_boot=200 if q else 1000))
    print(format_lab(lab_res), end="")
    write_lab(lab_res, out / "lab")
    fig["lab"] = {r["method"]: {k: v for k, v in r.items() if k != "method"} for r in lab_res.rows}
    fig["lab_budget_ratio"] = lab_res.budget["twice"]["accounted_ratio"]
    fig["lab_generated_ratio"] = lab_res.budget["twice"]["generated_ratio"]

    policy = load_policy(a.model)
    turn_tokens = a.max_new_tokens or cpu_config().max_new_tokens
    log(f"audit: the mixed-outcome groups among {audit_q} dev questions, {oracle} oracle rollouts per state")
    res = run_audit(policy, AuditConfig(questions=audit_q, oracle_rollouts=oracle, seed=7, max_new_tokens=turn_tokens,
                                        mixed_only=True), log=log)
    print(f"\nSearchQA-v0, model {a.model}, oracle A* from rollouts ({res.questions} of {audit_q} dev questions "
          "have mixed outcomes):")
    print(format_table(res), end="")
    write_outputs(res, out / "audit")
    rows = {r["method"]: r for r in res.rows}
    fig["wrong_sign_twice"] = rows["twice J1"]["wrong_sign"]["value"]
    fig["wrong_sign_crr"] = rows["crr J1"]["wrong_sign"]["value"]
    fig["pearson_twice"] = rows["twice J1"]["pearson"]["value"]
    fig["mse_twice_vs_grpo"] = rows["twice J1"]["mse_vs_grpo"]["value"]
    fig["audit"] = {m: {k: v for k, v in r.items() if k != "method"} for m, r in rows.items()}
    fig["audit_decisions"] = len(res.oracle)
    fig["audit_scored"] = int(np.sum(np.abs(res.oracle) >= res.config.threshold))
    fig["audit_questions"] = res.questions
    fig["audit_candidates"] = audit_q

    if not a.skip_training:
        base = cpu_config(updates=updates, eval_every=eval_every, eval_questions=20 if q else 60, seed=3,
                          checkpoint_every=updates, questions_per_update=2 if q else 6, model=a.model,
                          max_new_tokens=turn_tokens)
        twice_settings = TwiceConfig(warmup_updates=1) if q else TwiceConfig()
        runs = {}
        for method in ("grpo", "twice"):
            log(f"training {method}: {updates} updates")
            credit = get_method(method).settings(twice_settings)
            runs[method] = train(replace(base, method=method, credit=credit, out_dir=str(out / method)),
                                 progress=progress.enabled(), policy=load_policy(a.model), eval_before=True)
        evals = {}
        for m in runs:
            rows0 = [json.loads(l) for l in (out / m / "metrics.jsonl").read_text().splitlines() if l.strip()]
            evals[m] = [(r["update"], r["eval"]["em"]) for r in rows0 if "eval" in r]
        target = evals["grpo"][-1][1]
        initial = evals["grpo"][0][1]
        # only meaningful when GRPO improved on the initial policy
        reach = _updates_to_reach([e for e in evals["twice"] if e[0] > 0], target) if target > initial else None
        fig["initial_dev_em"] = initial
        fig["grpo_final_dev_em"] = target
        fig["twice_final_dev_em"] = evals["twice"][-1][1]
        fig["twice_updates_to_grpo_final"] = reach
        fig["twice_updates_share"] = reach / updates if reach is not None else None
        warm = twice_settings.warmup_updates
        post = [r for r in runs["twice"] if r["update"] > warm]
        target_tok = sum(r.get("aux_target") or 0 for r in post)
        fig["realised_aux_over_budget"] = (sum(r.get("aux_accounted") or 0 for r in post) / target_tok
                                           if target_tok else None)
        fig["generated_aux_over_budget"] = (sum(r["aux_tokens"] for r in post) / target_tok if target_tok else None)
        # time per update, excluding the evaluation (measured separately from the update itself)
        t_g = float(np.mean([r["time"] for r in runs["grpo"]]))
        t_t = float(np.mean([r["time"] for r in runs["twice"]]))
        fig["seconds_per_update_grpo"] = t_g
        fig["seconds_per_update_twice"] = t_t
        fig["time_ratio_twice_over_grpo"] = t_t / t_g
        fig["time_ratio_target"] = 1 + twice_settings.beta + 0.1
        fig["dev_em_curves"] = evals

    print()
    print(f"{'figure':<44}{'measured':>10}  target (published)")

    def row(name, value, target):
        v = "n/a" if value is None else (f"{value:.3f}" if isinstance(value, float) else str(value))
        print(f"{name:<44}{v:>10}  {target}")
    row("CreditToy: wrong-sign Twice", fig["toy_wrong_sign_twice"], "")
    row("CreditToy: wrong-sign CRR", fig["toy_wrong_sign_crr"], "")
    tw_c = fig["toy_wrong_sign_crr"]
    row("CreditToy:   Twice / CRR", fig["toy_wrong_sign_twice"] / tw_c if tw_c else None, "<= 0.333")
    row("CreditToy: Pearson(Twice, A*)", fig["toy_pearson_twice"], ">= 0.7")
    row("CreditToy: MSE Twice / MSE GRPO", fig["toy_mse_vs_grpo_twice"], "<= 0.3")
    row("CreditToy: MSE CRR / MSE GRPO", fig["toy_mse_vs_grpo_crr"], "")
    ws_t, ws_c = fig["wrong_sign_twice"], fig["wrong_sign_crr"]
    row("SearchQA: wrong-sign rate, Twice", ws_t, "<= 1/3 of CRR (6.9%)")
    row("SearchQA: wrong-sign rate, CRR", ws_c, "(21.7%)")
    row("SearchQA:   Twice / CRR", ws_t / ws_c if ws_c else None, "<= 0.333")
    row("SearchQA: Pearson(Twice credit, oracle)", fig["pearson_twice"], ">= 0.7 (0.72)")
    row("SearchQA: MSE Twice / MSE GRPO", fig["mse_twice_vs_grpo"], "<= 0.3 (0.23)")
    row("SearchQA: audited decisions with |A*| >= 0.05", fig["audit_scored"],
        f"of {fig['audit_decisions']} ({fig['audit_questions']} mixed-outcome questions of {audit_q})")
    if not a.skip_training:
        row("initial dev EM (greedy)", fig["initial_dev_em"], "")
        row("GRPO final dev EM", fig["grpo_final_dev_em"], "")
        row("Twice final dev EM", fig["twice_final_dev_em"], "")
        row("Twice updates to GRPO's final EM / GRPO's", fig["twice_updates_share"],
            "<= 0.6" + ("" if fig["grpo_final_dev_em"] > fig["initial_dev_em"] else " (n/a: GRPO did not improve)"))
        row("realised aux tokens / (beta x policy tokens)", fig["realised_aux_over_budget"], "within 0.95-1.05")
        row("time per update Twice / GRPO", fig["time_ratio_twice_over_grpo"], f"<= {fig['time_ratio_target']:.2f}")
    print(f"(wall time {time.time() - t0:.0f}s; audit files in {out / 'audit'})")
    if a.json:
        Path(a.json).write_text(json.dumps(fig, indent=1))
    return 0
