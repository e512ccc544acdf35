"""The runs of ``twice bench games``: each credit method trained from the same start model, several seeds
each, evaluated held-out before, during (``--eval-every``) and after training, and summarised per method.

A run's folder (``OUT/ENV/METHOD-sSEED``) holds its training files and its held-out curve
(:data:`CURVE_FILE`); ``--resume`` continues the runs of a folder to more updates (:func:`continue_run`).
"""

from __future__ import annotations

import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from twice_envs.agents.bench.games_compare import method_pairs, training_pairs
from twice_envs.agents.bench.games_config import GamesBenchConfig
from twice_envs.agents.bench.heldout import GameSetting, evaluate_game
from twice_envs.agents.lab.plots import plot_runs
from twice_envs.agents.models.load import load_policy
from twice_envs.agents.sampling.choice import choosing
from twice_envs.agents.stats import paired_change, wilson
from twice_envs.agents.training.config import cpu_config, read_run_config, with_settings
from twice_envs.agents.training.trainer import read_metrics, train
from twice_envs.progress import Progress
from twice_envs.trajectory import atomic_write_text

#: A run's held-out learning curve in its folder (kept by ``--resume``): ``{"eval": the evaluation's
#: noise seed, tasks and samples, "points": [[update, outcomes], ...]}``.
CURVE_FILE = "curve.json"
#: Settings in which a continued run may differ from the run it continues.
RESUME_FREE = ("updates", "out_dir")


def continue_run(tc, out: Path, evaluation: dict) -> list:
    """Check that the run in ``out`` can be continued with the settings ``tc`` and return its saved curve.

    Its ``config.json`` must match ``tc`` except in :data:`RESUME_FREE`, it must hold no more
    updates than ``tc.updates``, and its saved curve must come from the same held-out episodes
    (``evaluation``: noise seed, tasks and samples), so that every point pairs with the start
    model's; otherwise a ``ValueError`` names the file and what differs. A folder without a
    checkpoint is a fresh start (an empty curve)."""
    if not (out / "checkpoint" / "state.pt").exists():
        return []
    file = out / "config.json"
    saved = read_run_config(file).to_json()
    new = tc.to_json()
    differ = sorted(k for k in set(saved) | set(new) if k not in RESUME_FREE and saved.get(k) != new.get(k))
    if differ:
        raise ValueError(f"{file}: the run was trained with other settings; "
                         + "; ".join(f"{k}: {saved.get(k)!r} there, {new.get(k)!r} now" for k in differ))
    done = max((r.get("update", 0) for r in read_metrics(out / "metrics.jsonl")), default=0) \
        if (out / "metrics.jsonl").exists() else 0
    if done > tc.updates:
        raise ValueError(f"{out}: the run already holds {done} updates, more than --updates {tc.updates}")
    curve_file = out / CURVE_FILE
    if not curve_file.exists():
        return []
    try:
        saved_curve = json.loads(curve_file.read_text())
        saved_eval = saved_curve["eval"]
        points = [(int(u), [int(x) for x in o]) for u, o in saved_curve["points"]]
    except (KeyError, TypeError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise ValueError(f"{curve_file}: not a curve file ({exc})") from None
    if saved_eval != evaluation:
        raise ValueError(f"{curve_file}: its points were evaluated on other held-out episodes "
                         f"({saved_eval} there, {evaluation} now)")
    return [(u, o) for u, o in points if u <= done]


def _save_curve(out: Path, evaluation: dict, curve: list) -> None:
    atomic_write_text(out / CURVE_FILE, json.dumps({"eval": evaluation, "points": curve}))


def _train_config(cfg: GamesBenchConfig, env_id: str, method: str, seed: int, out: Path, s: GameSetting):
    tc = cpu_config(env=env_id, env_kwargs=dict(s.env_kwargs), method=method, seed=seed, updates=cfg.updates,
                    model=cfg.start_model(env_id),
                    questions_per_update=cfg.tasks_per_update, group_size=cfg.group_size, max_turns=s.max_turns,
                    window=s.window, max_new_tokens=s.max_new_tokens, lr=cfg.lr, filter_groups=cfg.filter_groups,
                    indexed_tasks=False, checkpoint_every=10**9, micro_batch=cfg.micro_batch,
                    choose=cfg.choose, out_dir=str(out))
    tc = replace(tc, env_kwargs={**tc.env_kwargs, **(cfg.train_kwargs or {}).get(env_id, {})})
    return with_settings(tc, beta=cfg.beta)


def check_resumable(cfg: GamesBenchConfig) -> dict:
    """With ``cfg.resume``: check every run the bench would continue (:func:`continue_run`) before
    any of them trains, so that a run of other settings is refused at once, not after the others.
    Returns each run's saved curve by ``(env_id, method, seed)`` (none without ``cfg.resume``)."""
    curves = {}
    for env_id in cfg.envs if cfg.resume else ():
        setting = cfg.setting(env_id)
        for method in cfg.methods:
            for seed in cfg.seeds:
                out = Path(cfg.out) / env_id / f"{method}-s{seed}"
                curves[env_id, method, seed] = continue_run(_train_config(cfg, env_id, method, seed, out, setting),
                                                            out, _evaluation(cfg, env_id, seed))
    return curves


def _evaluation(cfg: GamesBenchConfig, env_id: str, seed: int) -> dict:
    """What decides the held-out episodes of a run's evaluations: noise seed, tasks and samples."""
    tasks, samples = cfg.eval_size(env_id)
    return {"noise_seed": cfg.eval_noise_seed + seed, "tasks": tasks, "samples": samples}


def _held_out(cfg: GamesBenchConfig, env_id: str, setting: GameSetting, policy, seed: int,
              progress: Optional[str] = None) -> dict:
    """``policy`` on the held-out tasks of ``env_id`` with the sampling noise of training seed ``seed``'s
    evaluations (the start model is evaluated on each seed's noise, so before and after pair up episode by
    episode: same task, same luck); ``progress`` names its progress line (None: none)."""
    tasks, samples = cfg.eval_size(env_id)
    return evaluate_game(policy, env_id, samples=samples, tasks=tasks, noise_seed=cfg.eval_noise_seed + seed,
                         setting=setting, progress=progress)


def train_and_evaluate(cfg: GamesBenchConfig, env_id: str, method: str, seed: int, setting: GameSetting,
                       curve: list, before_outcomes: list, log=print, show_progress: bool = True) -> dict:
    """One run of the comparison: ``method`` trained with training seed ``seed`` from the start model (in
    ``OUT/ENV/METHOD-sSEED``), evaluated held-out every ``cfg.eval_every`` updates and after training.

    ``curve``: the held-out points a continued run evaluated before (see :func:`continue_run`). Returns the
    run's figures (held-out after, its training metrics, its curve, the start model's outcomes it pairs with).
    It reads and writes only its own run folder and depends on nothing else but its arguments, so runs can go
    to other processes. ``show_progress``: a progress line of its updates, then of its final evaluation's
    episodes (:mod:`twice_envs.progress`; runs in other processes show none)."""
    out = Path(cfg.out) / env_id / f"{method}-s{seed}"
    policy = choosing(load_policy(cfg.start_model(env_id)), cfg.choose)  # trained in place
    tc = _train_config(cfg, env_id, method, seed, out, setting)
    evaluation = _evaluation(cfg, env_id, seed)
    curve = list(curve)
    name = f"{env_id} {method} seed {seed}"

    with Progress(f"{name} training", cfg.updates, unit="updates", show=None if show_progress else False) as bar:
        def on_update(m: dict) -> None:
            bar.update(m["update"] - bar.done)
            if cfg.eval_every and m["update"] % cfg.eval_every == 0 and m["update"] < cfg.updates:
                curve.append((m["update"], _held_out(cfg, env_id, setting, policy, seed)["all"]["outcomes"]))
                _save_curve(out, evaluation, curve)
                if bar.show:  # the message goes below the progress line drawn so far
                    bar.stream.write("\n")
                log(f"{name} update {m['update']}: held-out success {np.mean(curve[-1][1]):.3f}")

        train(tc, policy=policy, progress=False, log=on_update, resume=cfg.resume)
    rows = read_metrics(out / "metrics.jsonl")  # every update, those of a continued run's start too
    after = _held_out(cfg, env_id, setting, policy, seed, f"{name} held-out" if show_progress else None)
    # a run continued to the updates it already holds evaluates its last point again: one point an update
    curve = [(u, o) for u, o in curve if u != cfg.updates] + [(cfg.updates, after["all"]["outcomes"])]
    _save_curve(out, evaluation, curve)
    log(f"{env_id} {method} seed {seed}: success {after['all']['success']:.3f} "
        f"(before {np.mean(before_outcomes):.3f}), {np.mean([r['time'] for r in rows]):.1f} s/update")
    return {"seed": seed, "after": after, "train": rows, "curve": curve, "before_outcomes": before_outcomes}


def _run_all(cfg: GamesBenchConfig, runs: list[tuple], log) -> list[dict]:
    """:func:`train_and_evaluate` of each argument tuple in ``runs``, in order: in this process, or with
    ``cfg.jobs > 1`` in up to that many spawned processes at once (each run is seeded on its own and trains
    on one thread, so the figures do not depend on where it ran; the workers print their own lines, and this
    process shows the runs done out of all)."""
    if cfg.jobs <= 1 or len(runs) <= 1:
        return [train_and_evaluate(*r, log=log) for r in runs]
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(cfg.jobs, len(runs)), mp_context=spawn) as pool, \
            Progress(f"{runs[0][1]} runs", len(runs), unit="runs") as bar:
        futures = [pool.submit(train_and_evaluate, *r, show_progress=False) for r in runs]
        for _ in as_completed(futures):
            bar.update()
        done = [f.result() for f in futures]
    threads = cpu_config().threads
    if threads:  # as the runs leave it when they train here: a later env's start model is evaluated alike
        torch.set_num_threads(threads)
    return done


def run_games_bench(cfg: GamesBenchConfig, log=print) -> dict:
    """Train every method from the same start model on every env; returns (and writes) the results."""

    if cfg.jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {cfg.jobs}")
    saved_curves = check_resumable(cfg)
    root = Path(cfg.out)
    config = {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.__dict__.items()}
    results: dict = {"config": config, "envs": {}}
    for env_id in cfg.envs:
        model = cfg.start_model(env_id)
        start = choosing(load_policy(model), cfg.choose)
        setting = cfg.setting(env_id)
        t0 = time.perf_counter()
        before_by_seed = {seed: _held_out(cfg, env_id, setting, start, seed, f"{env_id} start model seed {seed}")
                          for seed in cfg.seeds}
        before = _pooled([before_by_seed[s] for s in cfg.seeds])
        log(f"{env_id} start model {model}: held-out success {before['all']['success']:.3f} "
            f"valid {before['all']['valid_share']:.3f} ({time.perf_counter() - t0:.0f}s)")
        env_res: dict = {"model": model, "before": before, "methods": {}}
        keys = [(method, seed) for method in cfg.methods for seed in cfg.seeds]
        done = dict(zip(keys, _run_all(cfg, [(cfg, env_id, method, seed, setting,
                                              saved_curves.get((env_id, method, seed), []),
                                              before_by_seed[seed]["all"]["outcomes"]) for method, seed in keys], log)))
        for method in cfg.methods:  # one learning rate for every method (LLM training is too costly to tune)
            env_res["methods"][method] = {**_method_summary([done[method, seed] for seed in cfg.seeds]), "lr": cfg.lr}
        env_res["pairs"] = method_pairs(env_res["methods"])
        env_res["train_pairs"] = training_pairs(env_res["methods"])
        results["envs"][env_id] = env_res
        _plot(root, env_id, cfg)
    root.mkdir(parents=True, exist_ok=True)
    (root / "results.json").write_text(json.dumps(results, indent=1, default=float))
    return results


def _pooled(summaries: list[dict]) -> dict:
    """The ``all`` figures of several evaluations pooled (episodes, successes, turns added up)."""
    rows = [x["all"] for x in summaries]
    n = sum(r["episodes"] for r in rows)
    wins = sum(r["outcomes"].count(1) for r in rows)
    turns = sum(r["turns"] for r in rows)
    valid = sum(r["valid_share"] * r["turns"] for r in rows)
    return {"all": {"episodes": n, "success": wins / max(n, 1), "success_ci": list(wilson(wins, n)), "turns": turns,
                    "valid_share": valid / max(turns, 1),
                    "mean_reward": sum(r["mean_reward"] * r["episodes"] for r in rows) / max(n, 1),
                    "outcomes": [o for r in rows for o in r["outcomes"]]}}


def _method_summary(per_seed: list[dict]) -> dict:
    n = sum(s["after"]["all"]["episodes"] for s in per_seed)
    wins = sum(s["after"]["all"]["success"] * s["after"]["all"]["episodes"] for s in per_seed)
    rows = [r for s in per_seed for r in s["train"]]
    turns = sum(r.get("turns", 0) for r in rows)
    bad = sum(r.get("invalid_turns", 0) for r in rows)
    outcomes = [o for s in per_seed for o in s["after"]["all"]["outcomes"]]
    before = [o for s in per_seed for o in s["before_outcomes"]]
    measure = _headline(rows)
    return {
        "success": wins / max(n, 1), "success_ci": list(wilson(wins, n)), "episodes": n,
        "per_seed": [s["after"]["all"]["success"] for s in per_seed],
        "aux_tokens_per_update": float(np.mean([r["aux_tokens"] for r in rows])) if rows else 0.0,
        "seconds_per_update": float(np.mean([r["time"] for r in rows])) if rows else 0.0,
        "train_invalid_share": bad / max(turns, 1),
        # only groups whose returns differ get outcome credit (GRPO's, GiGPO's episode term)
        "train_mixed_groups": (float(np.mean([r.get("mixed_groups", float("nan")) for r in rows])) if rows
                               else float("nan")),
        "eval_valid_share": float(np.mean([s["after"]["all"]["valid_share"] for s in per_seed])),
        "eval_mean_reward": float(np.mean([s["after"]["all"]["mean_reward"] for s in per_seed])),
        "outcomes": outcomes,
        **paired_change(outcomes, before),
        "curve": held_out_curve(per_seed, before),
        "train_measure": measure,
        "train_curves": [[[r["update"], r.get(measure), r.get("batch")] for r in s["train"]] for s in per_seed],
    }


def _headline(rows: list[dict]) -> str:
    """The env's headline measure in a run's metrics rows (success on the games), else the reward."""
    return next((r["measures"][0] for r in rows if r.get("measures")), "reward")


def held_out_curve(per_seed: list[dict], before: list) -> list[dict]:
    """The held-out learning curve of a method: at each evaluated update, success over all seeds' episodes
    and its change from ``before`` (the start model's outcomes on the same episodes) paired episode by
    episode (:func:`paired_change`)."""
    points = []
    for i, (update, _) in enumerate(per_seed[0]["curve"]):
        outcomes = [o for s in per_seed for o in s["curve"][i][1]]
        points.append({"update": update, "success": float(np.mean(outcomes)), **paired_change(outcomes, before)})
    return points


def _plot(root: Path, env_id: str, cfg: GamesBenchConfig) -> None:
    """The training curves of every run on ``env_id`` in ``OUT/curves-ENV.png`` (where matplotlib is installed)."""
    runs = [root / env_id / f"{m}-s{s}" for m in cfg.methods for s in cfg.seeds]
    try:
        plot_runs(runs, root / f"curves-{env_id}.png", labels=[r.name for r in runs], window=1)
    except Exception as exc:  # noqa: BLE001 - matplotlib missing: the figures are in results.json
        print(f"(no plot: {exc})")
