"""``twice bench cost``: seconds and tokens per update of every credit method, relative to GRPO.

On SearchQA (or any trainable env), every method runs the updates of the same start model (default: the
shipped ``tiny`` SearchQA model) with the same CPU settings, and the methods take their updates in turns
(update 1 of every method, then update 2, ...), so a slow spell of a shared machine lands on all of
them alike. Every run's generator starts from the same seed, so every method samples the same tasks and
noise at each update. By default the updates stop before the optimiser (``train=False``): every method
credits batches of the start model itself, so its tokens are not mixed with how it changed its policy
(each method's policy would drift its own way, and the lengths of its episodes with it); ``train=True``
trains each method's copy as ``twice train`` does.

On a lab env (:data:`LAB_ENVS`), every method credits batches of the lab's initial policy (no
learning: the tokens of a method are not mixed with how it changed the policy), on the same noise
seeds for every method; a method's step carries its state (Twice's predictor and twin cost ratio)
from batch to batch, and the first ``skip`` batches are its warm-up (Twice branches at its warm-up
probability there).

Reported per method, over the updates after the first ``skip`` (the first pays one-off costs):
seconds per update, generated factual tokens and auxiliary tokens per update, and the ratio of
its mean seconds and mean total tokens (factual + auxiliary) to GRPO's, each with a 95% percentile
bootstrap CI that resamples update indices jointly for the method and GRPO (paired by update), beside
the published ratio (:data:`PUBLISHED_TOKENS`, the paper's Tok. column) and whether the measured one
is within ``tolerance`` (5%) of it.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Sequence

import numpy as np

from twice_envs import progress
from twice_envs.agents import stats as cs
from twice_envs.agents.bench.output import stderr_log, write_json
from twice_envs.agents.credit.registry import CreditContext, check_env, factual_group_size, get_method, run_credit
from twice_envs.agents.credit.registry import methods as registered_methods
from twice_envs.agents.lab import toy
from twice_envs.agents.lab.policies import lab_policy
from twice_envs.agents.lab.runners import lab_critic, lab_step_fns

#: The paper's Tok. column (Tables 1, 2 and 14): generated tokens per update relative to GRPO's,
#: auxiliary rollouts included, by registered method name.
PUBLISHED_TOKENS: dict[str, float] = {
    "grpo": 1.0, "grpo-2x": 2.0, "ppo": 1.0, "igpo": 1.0, "gigpo": 1.0, "tree-grpo": 1.0, "at2po": 1.0,
    "tree-grpo-coupled": 1.0, "vineppo": 3.2, "crr": 1.7, "twice": 1.7, "ppo-twice": 1.7, "twice-igpo": 1.7,
    "twice-tree": 1.7, "twice-alloc": 1.7,
}
#: The lab envs the bench measures on the lab's initial policy.
LAB_ENVS = ("SearchToy-v0", "TextLab-v0")


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
    train: bool = False
    """Trainable envs: step each method's optimiser too (False: every update credits the start model)."""
    n_boot: int = 2000
    """Bootstrap resamples."""
    tolerance: float = 0.05
    """A measured token ratio within this share of the published one is marked as matching it."""


def _ratio_ci(x: np.ndarray, base: np.ndarray, n_boot: int, seed: int) -> dict:
    return cs.bootstrap_ci(lambda a, b: float(a.mean() / b.mean()), x, base, n_boot=n_boot, seed=seed).as_dict()


def run_cost(config: CostConfig, *, log=lambda m: None) -> dict:
    """Every method's figures and ratios to GRPO: trained in turns (:data:`LAB_ENVS`: credited on the lab's
    initial policy, :func:`lab_rows`)."""
    if config.updates <= config.skip:
        raise ValueError(f"updates ({config.updates}) must exceed skip ({config.skip})")
    methods = ("grpo",) + tuple(m for m in config.methods if m != "grpo")
    for m in methods:
        check_env(m, config.env)
    rows = lab_rows(config, methods, log) if config.env in LAB_ENVS else train_rows(config, methods, log)
    return summarise(config, rows)


def train_rows(config: CostConfig, methods: Sequence[str], log) -> dict[str, list[dict]]:
    """Train every method ``updates`` times in turns; each update's metrics and seconds, per method."""
    from twice_envs.agents.models.load import load_policy, resolve_model_dir
    from twice_envs.agents.models.recipes import trained_env_kwargs, trained_window
    from twice_envs.agents.training.config import cpu_config
    from twice_envs.agents.training.trainer import init_state, train_update, training_pool

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
            row = train_update(state, cfg, pool, indexed, learn=config.train)
            row["wall"] = time.perf_counter() - t0
            rows[m].append(row)
            log(f"update {u + 1}/{config.updates} {m}: {row['wall']:.1f} s, {row['generated_tokens']} + "
                f"{row['aux_tokens']} aux tokens")
    return rows


def lab_rows(config: CostConfig, methods: Sequence[str], log, group_size: int = 5) -> dict[str, list[dict]]:
    """Every method credits ``updates`` batches of ``questions`` tasks of the lab's initial policy (the same
    noise seeds for every method; its roots per task as registered), carrying its state from batch to batch;
    Twice's predictor warms up on the first ``skip``. Each batch's seconds, factual and auxiliary tokens."""
    policy = lab_policy(config.env)
    rows: dict[str, list[dict]] = {m: [] for m in methods}
    for m in methods:
        rng, state, critic = np.random.default_rng(config.seed), None, lab_critic(m, policy)
        method = get_method(m)
        for u in range(config.updates):
            t0 = time.perf_counter()
            eps, envs = toy.toy_rollouts(policy, config.questions, factual_group_size(m, group_size),
                                         noise_seed=config.seed * 100_003 + u)
            ctx = CreditContext(policy=policy, rng=rng, update=u, noise_seed=config.seed * 100_003 + u,
                                config=method.settings(warmup_updates=config.skip), predictor_state=state,
                                critic=critic, runners=lab_step_fns(envs))
            res = run_credit(method, eps, ctx)
            state = res.predictor_state or state
            rows[m].append({"wall": time.perf_counter() - t0, "aux_tokens": int(res.aux_tokens),
                            "generated_tokens": sum(e.num_generated_tokens for e in eps)})
        log(f"{config.env} {m}: {np.mean([r['aux_tokens'] for r in rows[m][config.skip:]]):.0f} aux tokens per batch")
    return rows


def summarise(config: CostConfig, rows: dict[str, list[dict]]) -> dict:
    """Per method, over the updates after ``skip``: seconds, factual and auxiliary tokens, their ratios to GRPO's
    (paired by update) and the published token ratio."""
    kept = {m: r[config.skip:] for m, r in rows.items()}
    arr = lambda m, k: np.array([r[k] for r in kept[m]], dtype=np.float64)  # noqa: E731
    g_sec, g_tok = arr("grpo", "wall"), arr("grpo", "generated_tokens") + arr("grpo", "aux_tokens")
    out = {"config": asdict(config), "methods": {}}
    for m in rows:
        sec, gen, aux = arr(m, "wall"), arr(m, "generated_tokens"), arr(m, "aux_tokens")
        tokens = _ratio_ci(gen + aux, g_tok, config.n_boot, config.seed)
        published = PUBLISHED_TOKENS.get(m, float("nan"))
        out["methods"][m] = {
            "seconds": cs.bootstrap_ci(np.mean, sec, n_boot=config.n_boot, seed=config.seed).as_dict(),
            "generated": float(gen.mean()), "aux": float(aux.mean()),
            "seconds_vs_grpo": _ratio_ci(sec, g_sec, config.n_boot, config.seed),
            "tokens_vs_grpo": tokens, "published_tokens": published,
            "matches_published": bool(abs(tokens["value"] / published - 1) <= config.tolerance)
            if np.isfinite(published) else None,
        }
    return out


def format_cost(res: dict) -> str:
    f = lambda e: f"{e['value']:.2f} [{e['lo']:.2f}, {e['hi']:.2f}]"  # noqa: E731
    c = res["config"]
    n = c["updates"] - c["skip"]
    width = max(8, *(len(m) + 1 for m in res["methods"]))
    what = ("the lab's initial policy: {n} batches per method after {skip} warm-up batches" if c["env"] in LAB_ENVS
            else "model {model}: {n} updates per method after {skip} skipped, methods in turns, "
            + ("each method training its own copy" if c.get("train") else "every update on the start model"))
    lines = [f"{c['env']}, " + what.format(n=n, skip=c["skip"], model=c["model"]),
             f"{'method':<{width}} {'s/update [95% CI]':>22} {'factual tok':>12} {'aux tok':>9} "
             f"{'seconds / GRPO':>20} {'tokens / GRPO':>20} {'published':>10} {'within':>7}"]
    for m, r in res["methods"].items():
        pub = r["published_tokens"]
        within = "n/a" if r["matches_published"] is None else ("yes" if r["matches_published"] else "no")
        lines.append(f"{m:<{width}} {f(r['seconds']):>22} {r['generated']:>12.0f} {r['aux']:>9.0f} "
                     f"{f(r['seconds_vs_grpo']):>20} {f(r['tokens_vs_grpo']):>20} "
                     f"{(f'{pub:.2f}x' if np.isfinite(pub) else '-'):>10} {within:>7}")
    lines.append(f"(tokens = factual + auxiliary generated per update; ratios are of means, CIs resample updates "
                 f"paired with GRPO's; published: the paper's Tok. column; within: the measured ratio within "
                 f"{100 * c['tolerance']:.0f}% of it)")
    return "\n".join(lines) + "\n"


def _serves(method: str, env: str) -> bool:
    try:
        check_env(method, env)
    except ValueError:
        return False
    return True


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="twice bench cost", description=__doc__.split("\n\n")[0])
    d = CostConfig()
    p.add_argument("--env", default=d.env, help=f"env (default {d.env}; {', '.join(LAB_ENVS)}: the lab's initial "
                   "policy, no model)")
    p.add_argument("--model", default=d.model)
    p.add_argument("--methods", nargs="+", default=None, choices=registered_methods(),
                   help="default: every registered method the env can serve")
    p.add_argument("--updates", type=int, default=d.updates)
    p.add_argument("--skip", type=int, default=d.skip)
    p.add_argument("--questions", type=int, default=d.questions, help="tasks per update (labs: groups per batch)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--train", action="store_true",
                   help="trainable envs: step each method's optimiser too (default: every update credits the start "
                        "model, so no method's tokens depend on how it changed its policy)")
    p.add_argument("--out", default="runs/bench_cost")
    progress.add_argument(p)
    a = p.parse_args(argv)
    progress.apply(a)
    if a.updates <= a.skip:
        p.error(f"--updates ({a.updates}) must exceed --skip ({a.skip})")
    methods = a.methods if a.methods is not None else [m for m in registered_methods() if _serves(m, a.env)]
    cfg = CostConfig(env=a.env, model=a.model, methods=tuple(methods), updates=a.updates, skip=a.skip, seed=a.seed,
                     questions=a.questions, train=a.train)
    try:
        res = run_cost(cfg, log=stderr_log("cost"))
    except ValueError as exc:  # a method the env cannot serve, named before any rollout
        p.error(str(exc))
    print(format_cost(res), end="")
    write_json(a.out, "cost.json", res)
    return 0
