"""``twice bench cost``: seconds and tokens per update of every credit method, relative to GRPO.

Every method trains the same start model (default: the shipped ``tiny`` SearchQA model) with the
same CPU settings, and the methods take their updates in turns (update 1 of every method, then
update 2, ...), so a slow spell of a shared machine lands on all of them alike. Every run's
generator starts from the same seed, so the first update of every method samples the same tasks
and noise; later ones differ, as methods draw different numbers of coins.

Reported per method, over the updates after the first ``skip`` (the first pays one-off costs):
seconds per update, generated factual tokens and auxiliary tokens per update, and the ratio of
its mean seconds and mean total tokens (factual + auxiliary) to GRPO's, each with a 95% percentile
bootstrap CI that resamples update indices jointly for the method and GRPO (paired by update).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Sequence

import numpy as np

from twice_envs.agents import stats as cs
from twice_envs.agents.bench.output import stderr_log, write_json
from twice_envs.agents.credit.registry import check_env
from twice_envs.agents.credit.registry import methods as registered_methods


@dataclass
class CostConfig:
    """Sizes of ``twice bench cost`` (defaults: about ten minutes on two shared cores)."""

    env: str = "SearchQA-v0"
    """Env every method trains on."""
    model: str = "tiny"
    """Start model (a shipped name or a local model directory)."""
    methods: tuple = field(default_factory=registered_methods)
    """Credit methods (default: every registered method; GRPO is always measured, as the baseline)."""
    updates: int = 4
    """Updates per method, including the skipped ones."""
    questions: int = 8
    """Tasks per update (the CPU default of ``twice train --model tiny``)."""
    skip: int = 1
    """First updates left out of the figures."""
    seed: int = 0
    """Seed of every run (the same tasks and noise seeds for every method)."""
    n_boot: int = 2000
    """Bootstrap resamples."""


def _ratio_ci(x: np.ndarray, base: np.ndarray, n_boot: int, seed: int) -> dict:
    return cs.bootstrap_ci(lambda a, b: float(a.mean() / b.mean()), x, base, n_boot=n_boot, seed=seed).as_dict()


def run_cost(config: CostConfig, *, log=lambda m: None) -> dict:
    """Train every method ``updates`` times in turns; return per-method figures and ratios to GRPO."""
    from twice_envs.agents.models.load import load_policy, resolve_model_dir
    from twice_envs.agents.models.recipes import trained_env_kwargs, trained_window
    from twice_envs.agents.training.config import cpu_config
    from twice_envs.agents.training.trainer import init_state, train_update, training_pool

    if config.updates <= config.skip:
        raise ValueError(f"updates ({config.updates}) must exceed skip ({config.skip})")
    methods = ("grpo",) + tuple(m for m in config.methods if m != "grpo")
    for m in methods:
        check_env(m, config.env)
    model_dir = resolve_model_dir(config.model)
    base = cpu_config(env=config.env, model=config.model, seed=config.seed, updates=config.updates,
                      env_kwargs=trained_env_kwargs(model_dir, config.env), window=trained_window(model_dir),
                      eval_every=0, questions_per_update=config.questions)
    pool, indexed = training_pool(base)
    runs = {m: (replace(base, method=m), init_state(replace(base, method=m), load_policy(config.model)))
            for m in methods}
    rows: dict[str, list[dict]] = {m: [] for m in methods}
    for u in range(config.updates):
        for m, (cfg, state) in runs.items():
            t0 = time.perf_counter()
            row = train_update(state, cfg, pool, indexed)
            row["wall"] = time.perf_counter() - t0
            rows[m].append(row)
            log(f"update {u + 1}/{config.updates} {m}: {row['wall']:.1f} s, {row['generated_tokens']} + "
                f"{row['aux_tokens']} aux tokens")
    kept = {m: r[config.skip:] for m, r in rows.items()}
    arr = lambda m, k: np.array([r[k] for r in kept[m]], dtype=np.float64)  # noqa: E731
    g_sec, g_tok = arr("grpo", "wall"), arr("grpo", "generated_tokens") + arr("grpo", "aux_tokens")
    out = {"config": asdict(config), "methods": {}}
    for m in methods:
        sec, gen, aux = arr(m, "wall"), arr(m, "generated_tokens"), arr(m, "aux_tokens")
        out["methods"][m] = {
            "seconds": cs.bootstrap_ci(np.mean, sec, n_boot=config.n_boot, seed=config.seed).as_dict(),
            "generated": float(gen.mean()), "aux": float(aux.mean()),
            "seconds_vs_grpo": _ratio_ci(sec, g_sec, config.n_boot, config.seed),
            "tokens_vs_grpo": _ratio_ci(gen + aux, g_tok, config.n_boot, config.seed),
        }
    return out


def format_cost(res: dict) -> str:
    f = lambda e: f"{e['value']:.2f} [{e['lo']:.2f}, {e['hi']:.2f}]"  # noqa: E731
    c = res["config"]
    n = c["updates"] - c["skip"]
    width = max(8, *(len(m) + 1 for m in res["methods"]))
    lines = [f"{c['env']}, model {c['model']}: {n} updates per method after {c['skip']} skipped, methods in turns",
             f"{'method':<{width}} {'s/update [95% CI]':>22} {'factual tok':>12} {'aux tok':>9} "
             f"{'seconds / GRPO':>20} {'tokens / GRPO':>20}"]
    for m, r in res["methods"].items():
        lines.append(f"{m:<{width}} {f(r['seconds']):>22} {r['generated']:>12.0f} {r['aux']:>9.0f} "
                     f"{f(r['seconds_vs_grpo']):>20} {f(r['tokens_vs_grpo']):>20}")
    lines.append("(tokens = factual + auxiliary generated per update; ratios are of means, CIs resample updates "
                 "paired with GRPO's)")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="twice bench cost", description=__doc__.split("\n\n")[0])
    d = CostConfig()
    p.add_argument("--env", default=d.env)
    p.add_argument("--model", default=d.model)
    p.add_argument("--methods", nargs="+", default=list(d.methods), choices=registered_methods())
    p.add_argument("--updates", type=int, default=d.updates)
    p.add_argument("--skip", type=int, default=d.skip)
    p.add_argument("--questions", type=int, default=d.questions, help="tasks per update")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--out", default="runs/bench_cost")
    a = p.parse_args(argv)
    if a.updates <= a.skip:
        p.error(f"--updates ({a.updates}) must exceed --skip ({a.skip})")
    cfg = CostConfig(env=a.env, model=a.model, methods=tuple(a.methods), updates=a.updates, skip=a.skip, seed=a.seed,
                     questions=a.questions)
    try:
        res = run_cost(cfg, log=stderr_log("cost"))
    except ValueError as exc:  # a method the env cannot serve, named before any rollout
        p.error(str(exc))
    print(format_cost(res), end="")
    write_json(a.out, "cost.json", res)
    return 0
