"""``twice bench overfit``: can a method raise the training success on a few goals with mixed outcomes?

The first check when an env's training reward does not rise: if a trainer cannot fit a handful
of training tasks, more updates will not help. The bench

1. screens the first ``screen`` training tasks of the env's start model (``group_size`` episodes
   each, temperature 1) and keeps the ``tasks`` whose success rate is closest to 1/2 (mixed
   outcomes: every group carries outcome signal at the start);
2. trains ``method`` on exactly those tasks (``TrainConfig.task_ids``), ``tasks x group_size``
   episodes per update, until the success over the last ``window`` updates is significantly above
   the first ``window`` updates' (the two 95% Wilson intervals apart) or ``updates`` pass;
3. reports the curve (success, score where the env has one, invalid share, KL per update) and the
   first and last windows' success with their intervals.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, replace
from typing import Sequence

import numpy as np

from twice_envs import progress
from twice_envs.agents.bench.output import stderr_log, write_json
from twice_envs.agents.stats import wilson


@dataclass
class OverfitConfig:
    """Sizes of ``twice bench overfit`` (defaults: the published check, 10-20 minutes on two cores)."""

    env: str = "WebShop-v0"
    """Env (its own shipped start model is trained)."""
    method: str = "grpo"
    """Credit method."""
    tasks: int = 4
    """Training tasks kept after the screen."""
    group_size: int = 8
    """Episodes per task, in the screen and in every update."""
    screen: int = 48
    """Training tasks screened (the first of the train split)."""
    updates: int = 100
    """Most updates."""
    window: int = 5
    """Updates per window of the stopping rule."""
    seed: int = 0
    """Seed of the run (the screen's noise seed is derived from it)."""


def screen_tasks(policy, cfg, n: int, group_size: int, noise_seed: int) -> np.ndarray:
    """The success rate of each of the first ``n`` training tasks over ``group_size`` episodes."""
    from twice_envs.agents.rollout.episodes import rollout
    from twice_envs.agents.training.config import sampling_config
    from twice_envs.agents.training.evaluate import make_tasks

    eps = rollout(policy, cfg.env, make_tasks(range(n), cfg.train_split, True), group_size=group_size,
                  sampling=sampling_config(cfg), env_kwargs=cfg.env_kwargs, noise_seed=noise_seed,
                  max_turns=cfg.max_turns, window=cfg.window)
    head = next(iter(eps[0].measures)) if eps else "success"
    return np.array([np.mean([e.measures[head] for e in eps if e.group == g]) for g in range(n)])


def window_success(rows: Sequence[dict], measure: str, per_update: int) -> tuple[float, tuple[float, float]]:
    """The success of ``rows`` (updates of ``per_update`` episodes each) with its 95% Wilson interval."""
    hits = int(round(sum(r[measure] * per_update for r in rows)))
    n = per_update * len(rows)
    return hits / max(n, 1), wilson(hits, n)


def run_overfit(config: OverfitConfig, *, log=lambda m: None) -> dict:
    """Screen, then train until the last window's success is significantly above the first's."""
    from twice_envs.agents.models.load import env_model, load_policy, shipped_model_config
    from twice_envs.agents.training.trainer import init_state, train_update

    name, _ = env_model(None, config.env)
    policy = load_policy(name)
    # the env as twice train plays it with this model (its kwargs, window and turn cap)
    cfg = replace(shipped_model_config(name, config.env), method=config.method, group_size=config.group_size,
                  questions_per_update=config.tasks, seed=config.seed, eval_every=0)
    rates = screen_tasks(policy, cfg, config.screen, config.group_size, noise_seed=config.seed * 1_000_003 + 777)
    chosen = [int(g) for g in np.argsort(np.abs(rates - 0.5), kind="stable")[:config.tasks]]
    log(f"screened {config.screen} tasks; kept {chosen} (start success {np.round(rates[chosen], 2).tolist()})")
    cfg = replace(cfg, task_ids=tuple(chosen))
    state = init_state(cfg, policy)
    rows, per_update = [], config.tasks * config.group_size
    measure, verdict = None, "never"
    for u in range(config.updates):
        m = train_update(state, cfg, config.tasks, True)
        measure = measure or m["measures"][0]
        rows.append({k: m.get(k) for k in ("update", *m["measures"], "invalid_share", "kl", "mixed_groups", "time")})
        log(f"update {u + 1}: {measure} {m[measure]:.3f}  invalid {100 * m['invalid_share']:.1f}%  kl {m['kl']:.4f}")
        if len(rows) >= 2 * config.window:
            (_, (_, hi0)), (_, (lo1, _)) = (window_success(rows[:config.window], measure, per_update),
                                           window_success(rows[-config.window:], measure, per_update))
            if lo1 > hi0:
                verdict = f"after {len(rows)} updates"
                break
    first = window_success(rows[:config.window], measure, per_update)
    last = window_success(rows[-config.window:], measure, per_update)
    return {"config": asdict(config), "model": name, "chosen": chosen, "screen": rates.tolist(), "measure": measure,
            "curve": rows, "first": [first[0], list(first[1])], "last": [last[0], list(last[1])], "rose": verdict}


def format_overfit(res: dict) -> str:
    c, m = res["config"], res["measure"]
    (f, (flo, fhi)), (la, (llo, lhi)) = res["first"], res["last"]
    start = np.round([res["screen"][g] for g in res["chosen"]], 2).tolist()
    lines = [f"{c['env']} ({res['model']}), {c['method']}: {c['tasks']} training tasks {res['chosen']} x G = "
             f"{c['group_size']}, start {m} on the screen {start}",
             f"{m} per update: " + " ".join(f"{r[m]:.2f}" for r in res["curve"]),
             f"first {c['window']} updates: {f:.3f} [{flo:.3f}, {fhi:.3f}]; last {c['window']}: {la:.3f} "
             f"[{llo:.3f}, {lhi:.3f}] (95% Wilson); rose significantly: {res['rose']}"]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="twice bench overfit", description=__doc__.split("\n\n")[0])
    d = OverfitConfig()
    for field, kind in (("env", str), ("method", str), ("tasks", int), ("group_size", int), ("screen", int),
                        ("updates", int), ("window", int), ("seed", int)):
        p.add_argument("--" + field.replace("_", "-"), type=kind, default=getattr(d, field))
    p.add_argument("--out", default="runs/bench_overfit")
    progress.add_argument(p)
    a = p.parse_args(argv)
    progress.apply(a)
    if a.tasks > a.screen or min(a.tasks, a.group_size, a.window, a.updates) < 1:
        p.error("--tasks, --group-size, --window and --updates must be >= 1, and --tasks at most --screen")
    cfg = OverfitConfig(**{k: getattr(a, k) for k in asdict(d)})
    res = run_overfit(cfg, log=stderr_log("overfit"))
    print(format_overfit(res), end="")
    write_json(a.out, "overfit.json", res)
    return 0
