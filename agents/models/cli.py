"""``twice models build-tiny | imitate-choices | export | smollm2 | info``: build, check and inspect the agent's models."""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from twice_envs.agents.models import build, export, quality, recipes, resume
from twice_envs.agents.models.dirs import SMOLLM2_NAME, models_dir
from twice_envs.agents.models.choice_imitation import ImitationConfig, imitate_choices
from twice_envs.agents.models.gguf import convert_smollm2, smollm2_gguf
from twice_envs.agents.sampling.choice import SCORES
from twice_envs.agents.sampling.devices import device_arg


def _model_name(recipe: str) -> str:
    return recipes.model_name(recipe) or recipe


def _check(args, cfg, parser) -> int:
    """Rebuild a shipped recipe in a temporary folder (or ``--out``) and compare its quality."""
    shipped = recipes.shipped_dir(args.recipe)
    if shipped is None:
        parser.error(f"--check compares a rebuild with a shipped model; the {args.recipe} recipe is not shipped")
    # the thread count does not change the result; every other setting does
    if replace(cfg, threads=recipes.RECIPES[args.recipe].threads) != recipes.RECIPES[args.recipe]:
        parser.error(f"--check rebuilds the shipped model: the {args.recipe} recipe without changes (only --threads)")
    tol = quality.QualityTolerance(loss=args.loss_tolerance)
    with tempfile.TemporaryDirectory() as tmp:
        out = build.build_tiny(Path(args.out or tmp) / _model_name(args.recipe), cfg, recipe=args.recipe,
                                 device=args.device)
        em_questions = args.questions if "SearchQA-v0" in cfg.envs else 0
        ref = quality.model_quality(shipped, cfg, episodes=args.transcripts, em_questions=em_questions)
        new = quality.model_quality(out, cfg, episodes=args.transcripts, em_questions=em_questions)
        ok, lines = quality.compare_quality(ref, new, tol)
        same = recipes.same_build(out, shipped)
    print(f"rebuilt {args.recipe} vs the shipped model {shipped}:")
    for line in lines:
        print(f"  {line}")
    print(f"  bytes: {'identical' if same else 'differ (expected on another CPU or library version)'}")
    print("same quality as the shipped model" if ok else "QUALITY DIFFERS from the shipped model")
    return 0 if ok else 1


def models_main(argv: Sequence[str]) -> int:
    """``twice models build-tiny | export | smollm2 | info``."""
    parser = argparse.ArgumentParser(prog="twice models", description="Build or inspect the agent's models.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build-tiny", help="build a tiny model from scripted transcripts (cached)")
    b.add_argument("--out", default=None, help="output directory (default: the cache)")
    b.add_argument("--steps", type=int, default=None, help="training steps")
    b.add_argument("--episodes", type=int, default=None, help="scripted episodes per env")
    b.add_argument("--envs", default=None, help="comma-separated env ids (default: the recipe's)")
    b.add_argument("--threads", type=int, default=None, help="CPU threads for training (default 2; 0: torch's default)")
    b.add_argument("--recipe", choices=sorted(recipes.RECIPES), default=recipes.DEFAULT_RECIPE,
                   help=f"{recipes.DEFAULT_RECIPE} (default): the tiny model; "
                        + "; ".join(f"{r}: {n}" for n, r in recipes.NAMED_MODELS.items() if r != recipes.DEFAULT_RECIPE)
                        + "; format: faster, learns the action format only (see RECIPES)")
    b.add_argument("--device", default="cpu", type=device_arg,
                   help="where the model trains: cpu (default), cuda, cuda:N; the weights are saved from the CPU")
    b.add_argument("--force", action="store_true", help="rebuild even if cached (or start over a checkpointed build)")
    b.add_argument("--resume", default=None, metavar="DIR",
                   help="continue the interrupted build whose output folder is DIR from its checkpoint "
                        "(DIR/checkpoint; none there: start afresh) and finish it into DIR")
    b.add_argument("--checkpoint-every", type=int, default=resume.CHECKPOINT_EVERY, metavar="N",
                   help=f"save a checkpoint into OUT/checkpoint every N training steps (default "
                        f"{resume.CHECKPOINT_EVERY}; 0: none)")
    b.add_argument("--check", action="store_true",
                   help="rebuild a shipped recipe in a temporary folder (or --out) and check that its quality "
                        "(teacher-forced loss, dev EM) is within tolerance of the shipped model")
    b.add_argument("--transcripts", type=int, default=40, help="--check: fixed transcripts per env (default 40)")
    b.add_argument("--questions", type=int, default=100, help="--check: SearchQA dev questions for EM (0: skip)")
    b.add_argument("--loss-tolerance", type=float, default=quality.QualityTolerance().loss,
                   help="--check: allowed loss increase in nats per turn token")
    e = sub.add_parser("export", help="write the model of an unfinished build's last checkpoint, to evaluate it",
                       description="Write the model an interrupted (or still running) build saved in its last "
                                   "checkpoint, DIR/checkpoint, as a model folder OUT; the checkpoint is not changed "
                                   "and the build continues from it with --resume DIR.")
    e.add_argument("dir", metavar="DIR", help="the build's output folder (the one given to --resume)")
    e.add_argument("--out", required=True, metavar="OUT", help="the model folder to write (replaced if present)")
    c = sub.add_parser("imitate-choices", help="train a model to choose its env's listed actions as the scripted "
                                               "teacher does (a choice start model)")
    c.add_argument("--model", required=True, help="start model: a name (tiny-alfworld, tiny-webshop) or folder")
    c.add_argument("--env", default=ImitationConfig.env)
    c.add_argument("--out", required=True, help="the model folder to write")
    c.add_argument("--episodes", type=int, default=ImitationConfig.episodes, help="teacher episodes")
    c.add_argument("--steps", type=int, default=ImitationConfig.steps, help="optimiser steps")
    c.add_argument("--batch-size", type=int, default=ImitationConfig.batch_size, help="episodes per step")
    c.add_argument("--lr", type=float, default=ImitationConfig.lr)
    c.add_argument("--score", choices=sorted(SCORES), default=ImitationConfig.score)
    c.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("smollm2", help="convert the SmolLM2-135M GGUF file to a cached safetensors copy")
    s.add_argument("--force", action="store_true")
    sub.add_parser("info", help="show the cached models")
    args = parser.parse_args(argv)
    if args.cmd == "build-tiny":
        cfg = replace(recipes.RECIPES[args.recipe])
        if args.steps is not None:
            cfg.steps = args.steps
        if args.episodes is not None:
            cfg.episodes_per_env = args.episodes
        if args.threads is not None:
            cfg.threads = args.threads
        if args.envs:
            cfg.envs = tuple(e.strip() for e in args.envs.split(",") if e.strip())
        if args.checkpoint_every < 0:
            parser.error("--checkpoint-every must be >= 0")
        if args.check:
            if args.resume:
                parser.error("--check rebuilds in a temporary folder; it does not take --resume")
            return _check(args, cfg, parser)
        if args.resume and args.out and Path(args.out).resolve() != Path(args.resume).resolve():
            parser.error("--resume DIR continues the build into DIR, where its checkpoint is; drop --out or give the same folder")
        name = _model_name(args.recipe)
        if name not in recipes.NAMED_MODELS and not (args.out or args.resume):
            parser.error(f"--recipe {args.recipe} needs --out DIR (it builds no named model)")
        out = Path(args.resume or args.out) if (args.resume or args.out) else models_dir() / name
        waiting = resume.checkpoint_summary(out)
        if args.resume is None and waiting is not None and not args.force:
            parser.error(f"{out / resume.CHECKPOINT_DIR} holds the checkpoint of an interrupted build ({waiting}): "
                         f"continue it with --resume {out}, or start over with --force")
        if recipes.tiny_is_current(out, args.recipe) and not args.force and waiting is None:
            print(f"{out}: already built (use --force to rebuild)")
            return 0
        build.build_tiny(out, cfg, recipe=args.recipe, device=args.device, checkpoint_every=args.checkpoint_every,
                         resume=args.resume is not None)
        print(out)
        return 0
    if args.cmd == "imitate-choices":
        try:
            icfg = ImitationConfig(env=args.env, episodes=args.episodes, steps=args.steps, batch_size=args.batch_size,
                                   lr=args.lr, score=args.score, seed=args.seed)
        except ValueError as exc:
            parser.error(str(exc))
        imitate_choices(args.model, args.out, icfg)
        return 0
    if args.cmd == "export":
        out = Path(args.out)
        if out.resolve() == Path(args.dir).resolve():
            parser.error("--out must be another folder than DIR: the build finishes into DIR")
        path = export.export_checkpoint(args.dir, out)
        meta = json.loads((path / "twice_model.json").read_text())
        step = meta["checkpoint"]
        print(f"{path} (recipe {meta['recipe_name']}, {step['phase']} step {step['step']}/{step['steps']})")
        return 0
    if args.cmd == "smollm2":
        out = models_dir() / SMOLLM2_NAME
        if (out / "config.json").exists() and not args.force:
            print(f"{out}: already converted (use --force to redo)")
            return 0
        print(convert_smollm2(out))
        return 0
    print(f"models directory: {models_dir()}")
    for recipe, shipped in recipes.SHIPPED.items():
        if recipes.tiny_is_current(shipped, recipe):
            state = "present"
        else:
            state = "adapters" if recipes.shipped_adapter(recipe) is not None else "missing"
        print(f"  shipped {_model_name(recipe)}: {shipped} ({state})")
    for name in recipes.MODEL_NAMES:
        path = models_dir() / name
        if (path / "config.json").exists():
            meta_file = path / "twice_model.json"
            meta = json.loads(meta_file.read_text()) if meta_file.exists() else {}
            size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
            extra = f", {meta['parameters'] / 1e6:.2f}M params" if "parameters" in meta else ""
            print(f"  {name}: {path} ({size / 1e6:.1f} MB{extra})")
        else:
            print(f"  {name}: not built")
    try:
        print(f"  smollm2 GGUF source: {smollm2_gguf()}")
    except Exception as exc:  # noqa: BLE001 - informational
        print(f"  smollm2 GGUF source: unavailable ({exc})")
    return 0
