"""``twice train`` and ``twice eval``: the command lines of the trainer."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from twice_envs.agents import stats as cs
from twice_envs.agents.cli.rollout import model_help
from twice_envs.agents.credit import settings
from twice_envs.agents.credit.ablations import ABLATIONS, apply_ablations
from twice_envs.agents.credit.registry import describe, methods
from twice_envs.agents.credit.twice import TwiceConfig
from twice_envs.agents.models.load import (
    env_model,
    load_policy,
    load_run_policy,
    shipped_model_config,
)
from twice_envs.agents.models.recipes import MODEL_NAMES, NAMED_MODELS, play_settings
from twice_envs.agents.sampling.choice import SCORES
from twice_envs.agents.models.runs import TRUST_HELP, checked_run_config
from twice_envs.agents.training.config import cpu_config, published_config
from twice_envs.agents.training.evaluate import evaluate
from twice_envs.agents.training.trainer import read_metrics, train
from twice_envs.play import parse_env_kwargs


def _parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("--env", default="SearchQA-v0", help="env id (default SearchQA-v0)")
    p.add_argument("--model", default=None, help=model_help())
    return p


def train_main(argv: Sequence[str]) -> int:
    """``twice train --env ENV --model MODEL --method METHOD [--PREFIX.FIELD VALUE ...] [--ablation ...]``: the
    method's settings come from its config class's flags (:mod:`~twice_envs.agents.credit.settings`)."""
    p = _parser("twice train")
    p.description = "Train an agent with a registered credit method (CPU defaults for the shipped models)."
    p.add_argument("--method", choices=methods(), default="twice", help="credit method: " + describe())
    p.add_argument("--ablation", action="append", default=[], choices=sorted(ABLATIONS),
                   help="a Twice ablation (repeatable; for the methods that read Twice's settings)")
    p.add_argument("--updates", type=int, default=None)
    p.add_argument("--questions", type=int, default=None, help="tasks per update")
    p.add_argument("--group-size", type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--critic-lr", type=float, default=None,
                   help="critic learning rate, for methods that need a critic (default: 10x the default policy "
                        "rate, the PPO recipe's ratio)")
    p.add_argument("--minibatches", type=int, default=None, help="optimiser steps per update")
    p.add_argument("--micro-batch", type=int, default=None,
                   help="episodes per forward/backward pass (gradients accumulate; bounds memory)")
    p.add_argument("--filter-groups", action="store_true",
                   help="dynamic sampling (DAPO): train on task groups whose returns differ, drawing further "
                        "batches of tasks (at most --max-sample-batches) until --questions such groups are kept")
    p.add_argument("--max-sample-batches", type=int, default=None, help=f"batches an update draws at most (default {cpu_config().max_sample_batches})")
    p.add_argument("--beta", type=float, default=None,
                   help="auxiliary budget: the method's beta setting (short for --twice.beta)")
    p.add_argument("--warmup-updates", type=int, default=None,
                   help="Twice's predictor warm-up: updates that branch every decision with q 0.3 (short for "
                        "--twice.warmup_updates)")
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--max-turns", type=int, default=None, help="turn cap per episode")
    p.add_argument("--window", type=int, default=None,
                   help="turns of history in the context (default: the window a tiny model was trained with, "
                        "else the whole episode)")
    p.add_argument("--choose", choices=sorted(SCORES), default=None,
                   help="where the env lists its actions, choose among them by this score of their token "
                        "log-probs and train each choice as one decision (default: generate every turn)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="run directory (default runs/METHOD)")
    p.add_argument("--resume", action="store_true", help="continue from the run directory's checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in the run directory")
    p.add_argument("--no-progress", action="store_true", help="no line per update on stderr")
    p.add_argument("--eval-every", type=int, default=None)
    p.add_argument("--env-kwargs", default="{}",
                   help="JSON kwargs for the env, over those a tiny model was trained with (e.g. show_admissible)")
    p.add_argument("--published", action="store_true", help="use the published settings even for the tiny model")
    settings.add_flags(p)
    a = p.parse_args(argv)
    a.model, model_dir = env_model(a.model, a.env)
    base = cpu_config() if a.model in NAMED_MODELS and not a.published else published_config()
    # a game model plays the env kwargs, window and turn cap of its transcripts (tiny-webshop 6 turns,
    # tiny-alfworld 12), a windowed one to the env's limit (smol-alfworld: 50)
    played = play_settings(a.model, model_dir, a.env, base.max_turns)
    played["env_kwargs"] = {**played["env_kwargs"], **parse_env_kwargs(p, a.env_kwargs)}
    try:
        credit = method_settings(a)
    except ValueError as exc:
        p.error(str(exc))
    over: dict[str, Any] = {"env": a.env, "model": a.model, "method": a.method, "credit": credit,
                            "seed": a.seed, "choose": a.choose, **played,
                            "out_dir": a.out or f"runs/{a.method}" + "".join(f"+{x}" for x in a.ablation)}
    for name, key in (("updates", "updates"), ("questions", "questions_per_update"), ("group_size", "group_size"),
                      ("lr", "lr"), ("critic_lr", "critic_lr"), ("max_new_tokens", "max_new_tokens"),
                      ("eval_every", "eval_every"), ("minibatches", "minibatches"), ("micro_batch", "micro_batch"),
                      ("max_turns", "max_turns"), ("window", "window"), ("max_sample_batches", "max_sample_batches")):
        if getattr(a, name) is not None:
            over[key] = getattr(a, name)
    if a.filter_groups:
        over["filter_groups"] = True
    for name in ("minibatches", "micro_batch", "max_sample_batches"):
        if getattr(a, name) is not None and getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    cfg = replace(base, **over)
    if a.resume and a.overwrite:
        p.error("--resume and --overwrite exclude each other")
    train(cfg, policy=load_policy(cfg.model), resume=a.resume, overwrite=a.overwrite, progress=not a.no_progress)
    metrics = Path(cfg.out_dir) / "metrics.jsonl"
    budget = budget_summary(read_metrics(metrics)) if metrics.exists() else None
    if budget is not None:
        print(format_budget(budget, getattr(cfg.credit, "beta", float("nan"))))
    print(f"{cfg.method} trained at learning rate lr={cfg.lr:g}, not tuned (kept in config.json): another method's "
          "run at the same rate compares with it at one shared learning rate, which says nothing of either's best")
    print(f"metrics: {Path(cfg.out_dir) / 'metrics.jsonl'}\ncheckpoint: {Path(cfg.out_dir) / 'checkpoint'}")
    return 0


def method_settings(a) -> Any:
    """The chosen method's settings from ``--METHOD.FIELD`` flags (:mod:`~twice_envs.agents.credit.settings`),
    then the ``--ablation``, ``--beta`` and ``--warmup-updates`` shorthands; a flag the method's settings
    cannot take raises naming it."""
    shorthands = {"beta": a.beta, "warmup_updates": a.warmup_updates}
    given = {k: v for k, v in shorthands.items() if v is not None}
    for key, value in given.items():
        setattr(a, f"{settings.flag_prefix(TwiceConfig)}.{key}", value)  # the shorthands name Twice's settings
    if a.warmup_updates is not None and a.warmup_updates < 0:
        raise ValueError("--warmup-updates must be >= 0")
    credit = settings.settings_from_flags(a.method, a)
    if a.ablation:
        if not isinstance(credit, TwiceConfig):
            raise ValueError(f"--ablation changes Twice's settings, which --method {a.method} does not read")
        credit = apply_ablations(credit, a.ablation)
    return credit


def budget_summary(rows: Sequence[dict], *, n_boot: int = 2000, seed: int = 0) -> Optional[dict]:
    """The budget over a run's updates past the predictor's warm-up (updates with a budget,
    ``aux_target``, that are not flagged ``warmup``): accounted and generated auxiliary tokens over
    the target, each a ratio of sums with a percentile bootstrap CI over updates. None when no
    update planned against the budget (a method without one, or a run still in its warm-up)."""
    post = [r for r in rows if r.get("aux_target") and not r.get("warmup")]
    if not post:
        return None
    tgt = np.array([r["aux_target"] for r in post], dtype=np.float64)
    out = {"updates": len(post)}
    for name, key in (("accounted", "aux_accounted"), ("generated", "aux_tokens")):
        x = np.array([r[key] for r in post], dtype=np.float64)
        ratio = lambda a, t: float(a.sum() / t.sum())  # noqa: E731
        out[name] = cs.bootstrap_ci(ratio, x, tgt, n_boot=n_boot, seed=seed).as_dict()
    return out


def format_budget(b: dict, beta: float) -> str:
    f = lambda e: f"{e['value']:.3f} [{e['lo']:.3f}, {e['hi']:.3f}]"  # noqa: E731
    return (f"budget over {b['updates']} updates past the warm-up (target beta x policy tokens, beta {beta}): "
            f"accounted {f(b['accounted'])}, truly generated {f(b['generated'])} (95% CI over updates)")


def eval_main(argv: Sequence[str]) -> int:
    """``twice eval --checkpoint RUN [--env ENV] [--trust-kwargs]``: greedy EM and F1 per dataset.

    A run folder's ``config.json`` passes the trust rule first (:func:`checked_run_config`)."""
    p = argparse.ArgumentParser(prog="twice eval", description="Greedy evaluation (EM and F1 per dataset).")
    p.add_argument("--checkpoint", required=True, help="run directory, its checkpoint/, or a shipped model (" + ", ".join(MODEL_NAMES) + ")")
    p.add_argument("--env", default=None)
    p.add_argument("--split", default="dev")
    p.add_argument("--questions", type=int, default=None)
    p.add_argument("--trust-kwargs", action="store_true", help=TRUST_HELP)
    a = p.parse_args(argv)
    if a.checkpoint in MODEL_NAMES:
        cfg = shipped_model_config(a.checkpoint, a.env or "SearchQA-v0")
        policy = load_policy(a.checkpoint)
    else:
        checked = checked_run_config(a.checkpoint, env=a.env, trusted=a.trust_kwargs)  # before the model loads
        policy, cfg = load_run_policy(a.checkpoint)
        if checked is not None:  # the run's env by the registry key the check found, never a module to import
            cfg = replace(cfg, env=checked.env)
    if a.env:
        cfg = replace(cfg, env=a.env)
    res = evaluate(policy, cfg, questions=a.questions, split=a.split)
    lo, hi = res["em_ci"]
    print(f"{cfg.env} {a.split}: EM {res['em']:.3f} [95% CI {lo:.3f}, {hi:.3f}]  F1 {res['f1']:.3f}  (n={res['n']})")
    if res["measure"] != "em":  # a game: its own measures
        print("  " + "  ".join(f"{k} {res[k]:.3f}" for k in res["measures"]))
    for name, r in res["per_dataset"].items():
        print(f"  {name:<16} EM {r['em']:.3f}  F1 {r['f1']:.3f}  (n={r['n']})")
    return 0
