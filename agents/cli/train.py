"""``twice train`` and ``twice eval``: the command lines of the trainer."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from twice_envs.agents.cli.rollout import parse_env_kwargs
from twice_envs.agents.credit.ablations import ABLATIONS
from twice_envs.agents.credit.registry import describe, methods
from twice_envs.agents.models.load import (
    load_policy,
    load_run_policy,
    resolve_model_dir,
)
from twice_envs.agents.models.recipes import trained_env_kwargs, trained_window
from twice_envs.agents.training.config import cpu_config, published_config
from twice_envs.agents.training.evaluate import evaluate
from twice_envs.agents.training.trainer import train


def _parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("--env", default="SearchQA-v0", help="env id (default SearchQA-v0)")
    p.add_argument("--model", default="tiny", help="tiny, smollm2-135m or a local HF model directory")
    return p


def train_main(argv: Sequence[str]) -> int:
    """``twice train --env ENV --model MODEL --method METHOD [--ablation ...]``."""
    p = _parser("twice train")
    p.description = "Train an agent with a registered credit method (CPU defaults for --model tiny)."
    p.add_argument("--method", choices=methods(), default="twice", help="credit method: " + describe())
    p.add_argument("--ablation", action="append", default=[], choices=sorted(ABLATIONS),
                   help="a Twice ablation (repeatable)")
    p.add_argument("--updates", type=int, default=None)
    p.add_argument("--questions", type=int, default=None, help="tasks per update")
    p.add_argument("--group-size", type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--beta", type=float, default=None, help="auxiliary budget (Twice/CRR)")
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--max-turns", type=int, default=None, help="turn cap per episode")
    p.add_argument("--window", type=int, default=None,
                   help="turns of history in the context (default: the window a tiny model was trained with, "
                        "else the whole episode)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="run directory (default runs/METHOD)")
    p.add_argument("--resume", action="store_true", help="continue from the run directory's checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in the run directory")
    p.add_argument("--no-progress", action="store_true", help="no line per update on stderr")
    p.add_argument("--eval-every", type=int, default=None)
    p.add_argument("--env-kwargs", default="{}",
                   help="JSON kwargs for the env, over those a tiny model was trained with (e.g. show_admissible)")
    p.add_argument("--published", action="store_true", help="use the published settings even for the tiny model")
    a = p.parse_args(argv)
    base = cpu_config() if a.model == "tiny" and not a.published else published_config()
    model_dir = resolve_model_dir(a.model)
    env_kwargs = {**trained_env_kwargs(model_dir, a.env), **parse_env_kwargs(p, a.env_kwargs)}
    over: dict[str, Any] = {"env": a.env, "model": a.model, "method": a.method, "ablations": tuple(a.ablation),
                            "seed": a.seed, "env_kwargs": env_kwargs, "window": trained_window(model_dir),
                            "out_dir": a.out or f"runs/{a.method}" + "".join(f"+{x}" for x in a.ablation)}
    for name, key in (("updates", "updates"), ("questions", "questions_per_update"), ("group_size", "group_size"),
                      ("lr", "lr"), ("max_new_tokens", "max_new_tokens"), ("eval_every", "eval_every"),
                      ("max_turns", "max_turns"), ("window", "window")):
        if getattr(a, name) is not None:
            over[key] = getattr(a, name)
    cfg = replace(base, **over)
    if a.beta is not None:
        cfg = replace(cfg, twice=replace(cfg.twice, beta=a.beta))
    if a.resume and a.overwrite:
        p.error("--resume and --overwrite exclude each other")
    train(cfg, policy=load_policy(cfg.model), resume=a.resume, overwrite=a.overwrite, progress=not a.no_progress)
    print(f"metrics: {Path(cfg.out_dir) / 'metrics.jsonl'}\ncheckpoint: {Path(cfg.out_dir) / 'checkpoint'}")
    return 0


def eval_main(argv: Sequence[str]) -> int:
    """``twice eval --checkpoint RUN [--env ENV]``: greedy EM and F1 per dataset."""
    p = argparse.ArgumentParser(prog="twice eval", description="Greedy evaluation (EM and F1 per dataset).")
    p.add_argument("--checkpoint", required=True, help="run directory, its checkpoint/, or a model name (tiny)")
    p.add_argument("--env", default=None)
    p.add_argument("--split", default="dev")
    p.add_argument("--questions", type=int, default=None)
    a = p.parse_args(argv)
    if a.checkpoint in ("tiny", "smollm2-135m"):
        policy, cfg = load_policy(a.checkpoint), cpu_config(model=a.checkpoint)
    else:
        policy, cfg = load_run_policy(a.checkpoint)
    if a.env:
        cfg = replace(cfg, env=a.env)
    res = evaluate(policy, cfg, questions=a.questions, split=a.split)
    lo, hi = res["em_ci"]
    print(f"{cfg.env} {a.split}: EM {res['em']:.3f} [95% CI {lo:.3f}, {hi:.3f}]  F1 {res['f1']:.3f}  (n={res['n']})")
    for name, r in res["per_dataset"].items():
        print(f"  {name:<16} EM {r['em']:.3f}  F1 {r['f1']:.3f}  (n={r['n']})")
    return 0
