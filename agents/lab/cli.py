"""``twice audit``: the credit audit of a checkpoint against oracle advantages, or of a lab env against exact ones.

``twice audit --checkpoint C --env ENV`` audits a trained or shipped model (:mod:`~twice_envs.agents.lab.audit`);
``twice audit --env SearchToy-v0`` (or another lab env, :data:`~twice_envs.agents.lab.policies.LAB_ENVS`, with no
checkpoint) runs the lab audit (:mod:`~twice_envs.agents.lab.lab_audit`). Both show their progress on a terminal
(``--no-progress``: never), print the tables and write their files.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

import twice_envs
from twice_envs import progress
from twice_envs.agents.lab.audit import AuditConfig, format_table, run_audit, write_outputs
from twice_envs.agents.lab.choice_lab import ChoiceLabSetting, choice_setting_from_args
from twice_envs.agents.lab.lab_audit import LabAuditConfig, run_lab_audit
from twice_envs.agents.lab.policies import (
    LAB_ENVS,
    add_setting_args,
    lab_policy,
    setting_from_args,
    text_setting_from_args,
)
from twice_envs.agents.lab.report import format_lab, write_lab
from twice_envs.agents.lab.text_setting import TextLabSetting
from twice_envs.agents.models.load import load_policy, load_run_policy, shipped_model_config
from twice_envs.agents.models.recipes import MODEL_NAMES
from twice_envs.agents.models.runs import TRUST_HELP, checked_run_config
from twice_envs.agents.training.evaluate import indexed_split_size, make_tasks
from twice_envs.play import parse_env_kwargs


def lab_main(argv: Sequence[str]) -> int:
    """``twice audit --env SearchToy-v0 [--pairs J ...]``: the lab audit."""
    p = argparse.ArgumentParser(prog="twice audit", description="Credit lab audit against exact advantages.")
    p.add_argument("--env", default="SearchToy-v0", choices=LAB_ENVS)
    p.add_argument("--groups", type=int, default=LabAuditConfig.groups)
    p.add_argument("--pairs", type=int, nargs="+", default=list(LabAuditConfig.pairs), help="J values")
    p.add_argument("--vine-k", type=int, nargs="+", default=list(LabAuditConfig.vine_k), help="K values")
    p.add_argument("--beta", type=float, default=LabAuditConfig.beta)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-boot", type=int, default=LabAuditConfig.n_boot)
    p.add_argument("--out", default="runs/lab_audit")
    add_setting_args(p)
    progress.add_argument(p)
    a = p.parse_args(argv)
    progress.apply(a)
    if min(a.pairs) < 1 or min(a.vine_k) < 1:
        p.error("--pairs and --vine-k must be >= 1")
    if a.groups < 1 or a.n_boot < 1:
        p.error("--groups and --n-boot must be >= 1")
    try:
        setting = setting_from_args(a)
        text_setting = text_setting_from_args(a) if a.env == "TextLab-v0" else TextLabSetting()
        choice_setting = choice_setting_from_args(a) if a.env == "ChoiceLab-v0" else ChoiceLabSetting()
    except ValueError as exc:
        p.error(str(exc))
    cfg = LabAuditConfig(env=a.env, setting=setting, text_setting=text_setting,
                         choice_setting=choice_setting, groups=a.groups,
                         pairs=tuple(sorted(set(a.pairs))), vine_k=tuple(sorted(set(a.vine_k))), beta=a.beta,
                         seed=a.seed, n_boot=a.n_boot)
    res = run_lab_audit(cfg, policy=lab_policy(cfg.env, cfg.setting, cfg.text_setting, cfg.choice_setting))
    print(format_lab(res), end="")
    paths = write_lab(res, Path(a.out))
    print("written: " + ", ".join(str(v) for v in paths.values()))
    return 0


def audit_main(argv: Sequence[str]) -> int:
    """``twice audit --checkpoint C --env ENV``; the lab envs (exact A*, no checkpoint) go to
    :func:`lab_main`."""
    if any(a in LAB_ENVS for a in argv) and "--checkpoint" not in argv:
        return lab_main(argv)
    p = argparse.ArgumentParser(prog="twice audit", description="Credit audit against oracle advantages.")
    p.add_argument("--checkpoint", required=True,
                   help="run directory, its checkpoint/, or a shipped model (" + ", ".join(MODEL_NAMES) + ")")
    p.add_argument("--env", default="SearchQA-v0")
    p.add_argument("--env-kwargs", default="{}",
                   help="JSON kwargs for the env, over those the model was trained with "
                        "(e.g. {\"reward\": \"success\"})")
    p.add_argument("--questions", type=int, default=AuditConfig.questions)
    p.add_argument("--split", default=AuditConfig.split,
                   help="the split the questions come from, where the env names them by split (default %(default)s)")
    p.add_argument("--decisions", type=int, default=AuditConfig.decisions,
                   help="audit at least this many decisions where the groups hold them: further episodes of each "
                        "group are audited after the first (default: the first episode of each group only)")
    p.add_argument("--oracle-rollouts", type=int, default=AuditConfig.oracle_rollouts,
                   help="independent rollouts per state for the oracle A* (default %(default)s; the table's header "
                        "gives the standard error of A* this leaves)")
    p.add_argument("--group-size", type=int, default=AuditConfig.group_size)
    p.add_argument("--mixed-only", action="store_true",
                   help="audit only questions whose group has mixed outcomes (--questions candidates are screened)")
    p.add_argument("--pairs", type=int, nargs="+", default=list(AuditConfig.pairs),
                   help="J values: independent pairs (Twice) and counterfactuals (CRR) per decision")
    p.add_argument("--vine-k", type=int, nargs="+", default=list(AuditConfig.vine_k), help="VinePPO K values")
    p.add_argument("--beta", type=float, default=AuditConfig.beta, help="budget of the training-time Twice row")
    p.add_argument("--no-training-row", action="store_true", help="skip the training-time Twice rows")
    p.add_argument("--n-boot", type=int, default=AuditConfig.n_boot, help="bootstrap resamples")
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="output directory (default: RUN/audit or audit/)")
    p.add_argument("--trust-kwargs", action="store_true", help=TRUST_HELP)
    progress.add_argument(p)
    a = p.parse_args(argv)
    progress.apply(a)
    if min(a.pairs) < 1 or min(a.vine_k) < 1:
        p.error("--pairs and --vine-k must be >= 1")
    if a.oracle_rollouts < 1:
        p.error("--oracle-rollouts must be >= 1")
    if a.questions < 1 or a.group_size < 1 or a.decisions < 0:
        p.error("--questions and --group-size must be >= 1 and --decisions >= 0")
    extra_kwargs = parse_env_kwargs(p, a.env_kwargs)
    if a.checkpoint in MODEL_NAMES:  # played as `twice train` plays it on this env
        tcfg = shipped_model_config(a.checkpoint, a.env)
        policy = load_policy(a.checkpoint)
        out = Path(a.out or "audit")
    else:  # the run's config.json passes the trust rule before the model loads
        checked_run_config(a.checkpoint, env=a.env, trusted=a.trust_kwargs, exempt=extra_kwargs,
                           kwargs_follow_env=False)
        policy, tcfg = load_run_policy(a.checkpoint)
        run = Path(a.checkpoint)
        out = Path(a.out) if a.out else (run.parent if run.name == "checkpoint" else run) / "audit"
    same_env = a.env == tcfg.env
    cfg = AuditConfig(env=a.env, env_kwargs={**(tcfg.env_kwargs if same_env else {}), **extra_kwargs},
                      questions=a.questions, window=tcfg.window if same_env else None,
                      oracle_rollouts=a.oracle_rollouts, group_size=a.group_size, mixed_only=a.mixed_only,
                      max_new_tokens=a.max_new_tokens or tcfg.max_new_tokens, max_turns=tcfg.max_turns,
                      indexed_tasks=tcfg.indexed_tasks, seed=a.seed, pairs=tuple(sorted(set(a.pairs))),
                      vine_k=tuple(sorted(set(a.vine_k))), beta=a.beta, training_row=not a.no_training_row,
                      n_boot=a.n_boot, split=a.split, decisions=a.decisions)
    # where questions are named by split and index (or a split is asked for), the env's own check of the split
    # and of the last question's index
    if cfg.indexed_tasks and (indexed_split_size(cfg, cfg.split) is not None or cfg.split != AuditConfig.split):
        try:
            twice_envs.make(cfg.env, **cfg.env_kwargs).reset(
                seed=0, options=make_tasks([cfg.questions - 1], cfg.split, True)[0].options)
        except ValueError as exc:
            p.error(f"--split {cfg.split!r} / --questions {cfg.questions}: {exc}")
    res = run_audit(policy, cfg)
    print(format_table(res), end="")
    paths = write_outputs(res, out)
    print("written: " + ", ".join(str(v) for v in paths.values()))
    return 0
