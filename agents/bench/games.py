"""Text games on the CPU: evaluate the tiny game models, and ``twice bench games`` (RL methods compared).

:func:`evaluate_game` samples a policy (temperature 1, the standard rollout) on held-out
tasks: ALFWorld's ``valid_unseen`` games (layouts never seen in training) and WebShop's
``test`` goals, and reports success, the share of valid turns and both per task type.

``twice bench games`` trains GRPO, GRPO (2x), GiGPO, Twice and CRR (the registered methods that join
it; each samples its registered ``rollouts`` times the group size per task) from the same start model for N
updates on each env, several seeds each, and reports held-out success before and after
(95% Wilson intervals over all held-out episodes of a method), auxiliary tokens and seconds
per update, the invalid share of training turns, and the learning curves (PNG).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from twice_envs.agents.bench.heldout import GAMES, GameSetting, evaluate_game
from twice_envs.agents.bench.output import write_json
from twice_envs.agents.credit.registry import methods as registered_methods
from twice_envs.agents.models.load import load_policy, resolve_model_dir
from twice_envs.agents.models.recipes import (
    play_max_turns,
    trained_env_kwargs,
    trained_window,
)
from twice_envs.agents.sampling.devices import device_arg, torch_device
from twice_envs.agents.stats import (
    episodes_for_difference,
    paired_change,
    paired_mean,
    pairs_resolution,
    wilson,
)
from twice_envs.agents.training.config import cpu_config, read_run_config
from twice_envs.agents.training.trainer import read_metrics, train
from twice_envs.play import parse_value
from twice_envs.trajectory import atomic_write_text

#: The noise seed of ``--eval-only`` evaluations: two runs on the same tasks draw the same noise keys,
#: so their episodes pair up (same game, same luck).
HELDOUT_NOISE_SEED = 10**6


# ----------------------------------------------------------------------------- the RL comparison
@dataclass
class GamesBenchConfig:
    """``twice bench games`` settings (the defaults are sized for two shared CPU cores)."""

    envs: tuple[str, ...] = ("ALFWorld-v0", "WebShop-v0")
    """Envs to compare on."""
    methods: tuple[str, ...] = field(default_factory=lambda: registered_methods("games"))
    """Credit methods (each starts from the same model; default: the registered methods that join this bench)."""
    seeds: tuple[int, ...] = (0, 1, 2)
    """Training seeds per method."""
    updates: int = 4
    """Policy updates per run."""
    tasks_per_update: int = 4
    """Training tasks per update."""
    group_size: int = 4
    """Episodes per training task."""
    eval_tasks: Optional[int] = None
    """Held-out tasks per evaluation (None: the env's ``GameSetting.bench_eval``, or with
    ``--eval-only`` the whole held-out set: all ALFWorld valid_unseen games, 100 WebShop test goals)."""
    eval_samples: Optional[int] = None
    """Episodes per held-out task and evaluation (None: the env's ``GameSetting.bench_eval``; 4 with
    ``--eval-only``)."""
    lr: float = 2e-4
    """Learning rate."""
    filter_groups: bool = False
    """Dynamic sampling for every method (:attr:`~twice_envs.agents.training.config.TrainConfig.filter_groups`):
    train on ``tasks_per_update`` groups whose returns differ, drawing up to ``TrainConfig.max_sample_batches``
    batches an update."""
    beta: float = 0.5
    """Auxiliary budget of Twice and CRR."""
    out: str = "runs/games"
    """Output folder (a run folder per env, method and seed; results.json; curves PNG)."""
    model: Optional[dict] = None
    """Start model per env id (None: the env's tiny game model)."""
    max_turns: Optional[int] = None
    """Turn cap of training and held-out episodes (None: the start model's, else the env's :data:`GAMES` setting)."""
    max_new_tokens: Optional[int] = None
    """Tokens per turn at most (None: the env's :data:`GAMES` setting)."""
    eval_every: int = 0
    """Also evaluate held-out success every N updates while a method trains (0: only after training): the
    method's held-out learning curve, each point paired with the start model (``curve`` in results.json)."""
    train_kwargs: Optional[dict] = None
    """Extra ``make`` kwargs of the training env per env id, e.g. ``{"WebShop-v0": {"reward": "success"}}``
    (train on the success the held-out figures count, not the graded score); held-out envs are unchanged."""
    micro_batch: Optional[int] = None
    """Episodes per forward/backward pass of an update (:attr:`TrainConfig.micro_batch`; None: a whole
    minibatch). Bounds the memory of large updates."""
    resume: bool = False
    """Continue each run whose folder holds a checkpoint to ``updates`` (:func:`continue_run`): a
    comparison measured at one size is carried to a larger one without training its first updates
    again; the curve points evaluated before (``curve.json`` of each run) are kept."""
    eval_noise_seed: int = 10**6 + 1
    """Noise seed of the held-out evaluations of training seed 0 (seed ``s`` uses this plus ``s``): the same
    seed gives the same held-out luck, so runs with the same seed pair up episode by episode."""
    jobs: int = 1
    """Runs (a method and a seed each) trained at once, each in a spawned process of its own (one per core puts
    every core to work). The figures do not depend on it (each run trains
    on one thread from its own seed)."""

    def start_model(self, env_id: str) -> str:
        """The start model of ``env_id`` (name or folder)."""
        return (self.model or {}).get(env_id) or GAMES[env_id].model

    def eval_size(self, env_id: str) -> tuple[Optional[int], int]:
        """``(tasks, samples)`` of each evaluation in the RL comparison: each as set, else the env's default."""
        tasks, samples = GAMES[env_id].bench_eval
        return (tasks if self.eval_tasks is None else self.eval_tasks), (self.eval_samples or samples)

    def setting(self, env_id: str) -> GameSetting:
        """The env's :data:`GAMES` setting with this run's overrides; the env is made with the kwargs
        the start model was trained with (:func:`~twice_envs.agents.models.recipes.trained_env_kwargs`), with
        its history window unless the setting names one, and with its turn cap
        (:func:`~twice_envs.agents.models.recipes.play_max_turns`) unless ``max_turns`` is set."""

        s = GAMES[env_id]
        model_dir = resolve_model_dir(self.start_model(env_id))
        kwargs = {**s.env_kwargs, **trained_env_kwargs(model_dir, env_id)}
        window = s.window if s.window is not None else trained_window(model_dir)
        turns = self.max_turns or play_max_turns(model_dir, s.max_turns)
        return replace(s, env_kwargs=kwargs, max_turns=turns,
                       max_new_tokens=self.max_new_tokens or s.max_new_tokens, window=window)


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
                    out_dir=str(out))
    tc = replace(tc, env_kwargs={**tc.env_kwargs, **(cfg.train_kwargs or {}).get(env_id, {})})
    return replace(tc, twice=replace(tc.twice, beta=cfg.beta))


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


def _held_out(cfg: GamesBenchConfig, env_id: str, setting: GameSetting, policy, seed: int) -> dict:
    """``policy`` on the held-out tasks of ``env_id`` with the sampling noise of training seed ``seed``'s
    evaluations (the start model is evaluated on each seed's noise, so before and after pair up episode by
    episode: same task, same luck)."""
    tasks, samples = cfg.eval_size(env_id)
    return evaluate_game(policy, env_id, samples=samples, tasks=tasks, noise_seed=cfg.eval_noise_seed + seed,
                         setting=setting)


def train_and_evaluate(cfg: GamesBenchConfig, env_id: str, method: str, seed: int, setting: GameSetting,
                       curve: list, before_outcomes: list, log=print) -> dict:
    """One run of the comparison: ``method`` trained with training seed ``seed`` from the start model (in
    ``OUT/ENV/METHOD-sSEED``), evaluated held-out every ``cfg.eval_every`` updates and after training.

    ``curve``: the held-out points a continued run evaluated before (see :func:`continue_run`). Returns the
    run's figures (held-out after, its training metrics, its curve, the start model's outcomes it pairs with).
    It reads and writes only its own run folder and depends on nothing else but its arguments, so runs can go
    to other processes."""
    out = Path(cfg.out) / env_id / f"{method}-s{seed}"
    policy = load_policy(cfg.start_model(env_id))  # trained in place
    tc = _train_config(cfg, env_id, method, seed, out, setting)
    evaluation = _evaluation(cfg, env_id, seed)
    curve = list(curve)

    def on_update(m: dict) -> None:
        if cfg.eval_every and m["update"] % cfg.eval_every == 0 and m["update"] < cfg.updates:
            curve.append((m["update"], _held_out(cfg, env_id, setting, policy, seed)["all"]["outcomes"]))
            _save_curve(out, evaluation, curve)
            log(f"{env_id} {method} seed {seed} update {m['update']}: held-out success {np.mean(curve[-1][1]):.3f}")

    train(tc, policy=policy, progress=False, log=on_update, resume=cfg.resume)
    rows = read_metrics(out / "metrics.jsonl")  # every update, those of a continued run's start too
    after = _held_out(cfg, env_id, setting, policy, seed)
    # a run continued to the updates it already holds evaluates its last point again: one point an update
    curve = [(u, o) for u, o in curve if u != cfg.updates] + [(cfg.updates, after["all"]["outcomes"])]
    _save_curve(out, evaluation, curve)
    log(f"{env_id} {method} seed {seed}: success {after['all']['success']:.3f} "
        f"(before {np.mean(before_outcomes):.3f}), {np.mean([r['time'] for r in rows]):.1f} s/update")
    return {"seed": seed, "after": after, "train": rows, "curve": curve, "before_outcomes": before_outcomes}


def _run_all(cfg: GamesBenchConfig, runs: list[tuple], log) -> list[dict]:
    """:func:`train_and_evaluate` of each argument tuple in ``runs``, in order: in this process, or with
    ``cfg.jobs > 1`` in up to that many spawned processes at once (each run is seeded on its own and trains
    on one thread, so the figures do not depend on where it ran; the workers print their own lines)."""
    if cfg.jobs <= 1 or len(runs) <= 1:
        return [train_and_evaluate(*r, log=log) for r in runs]
    with ProcessPoolExecutor(max_workers=min(cfg.jobs, len(runs)), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(train_and_evaluate, *r) for r in runs]
        done = [f.result() for f in futures]
    threads = cpu_config().threads
    if threads:  # as the runs leave it when they train here: a later env's start model is evaluated alike
        import torch

        torch.set_num_threads(threads)
    return done


def run_games_bench(cfg: GamesBenchConfig, log=print) -> dict:
    """Train every method from the same start model on every env; returns (and writes) the results."""

    if cfg.jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {cfg.jobs}")
    saved_curves = check_resumable(cfg)
    root = Path(cfg.out)
    results: dict = {"config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.__dict__.items()}, "envs": {}}
    for env_id in cfg.envs:
        model = cfg.start_model(env_id)
        start = load_policy(model)
        setting = cfg.setting(env_id)
        t0 = time.perf_counter()
        before_by_seed = {seed: _held_out(cfg, env_id, setting, start, seed) for seed in cfg.seeds}
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
        "train_mixed_groups": float(np.mean([r.get("mixed_groups", float("nan")) for r in rows])) if rows else float("nan"),
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


def method_pairs(methods: dict) -> dict:
    """Paired success differences between every two methods, ``{"twice - grpo": paired_change(...)}`` (the
    spaces keep the two names apart: method names such as ``grpo-2x`` hold hyphens).

    Every method is evaluated on the same held-out tasks with the same sampling noise per seed, so
    their episodes pair up one to one (same task, same luck) and the difference's interval is that of
    the per-episode differences, narrower than that of two independent rates when outcomes agree."""
    names = [m for m, x in methods.items() if x.get("outcomes")]
    return {f"{a} - {b}": paired_change(methods[a]["outcomes"], methods[b]["outcomes"])
            for i, a in enumerate(names) for b in names[i + 1:]}


def training_pairs(methods: dict) -> dict:
    """Paired differences of the training measure between every two methods, ``{"twice - grpo": ...}``:
    the mean over the updates (of every seed) on which the two runs sampled the same tasks with the
    same luck (the same ``batch`` digest in their metrics), with a Student t interval over those
    updates (:func:`~twice_envs.agents.stats.paired_mean`).

    The first update is left out: both runs play it with the start model, so it differs by nothing.
    A method that samples more episodes per task (GRPO (2x)) shares no batch with the others, nor do
    two runs on an update where their dynamic sampling drew different batches; a pair with fewer than
    two shared updates is absent."""
    names = [m for m, x in methods.items() if x.get("train_curves")]
    out = {}
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            diffs, updates = [], []
            for ca, cb in zip(methods[a]["train_curves"], methods[b]["train_curves"]):
                by_update = {u: (v, batch) for u, v, batch in cb}
                for u, v, batch in ca:
                    w, other = by_update.get(u, (None, None))
                    if u > 1 and batch is not None and batch == other and v is not None and w is not None:
                        diffs.append(v - w)
                        updates.append(u)
            if len(diffs) >= 2:
                out[f"{a} - {b}"] = {**paired_mean(diffs), "updates": [min(updates), max(updates)],
                                     "measure": methods[a].get("train_measure")}
    return out


#: Settings that may differ between runs joined by :func:`merge_results`: they do not change what a
#: method is trained on or how its final evaluation is drawn.
MERGE_FREE = ("methods", "out", "eval_every", "resume", "jobs")


def _compared_settings(results: dict) -> dict:
    return {k: v for k, v in results["config"].items() if k not in MERGE_FREE}


def merge_results(paths: Sequence[str | Path]) -> dict:
    """One comparison from several runs of ``twice bench games``, each with methods of its own (one
    process per core): their methods side by side and the paired differences between every two.

    Pairing needs the same held-out episodes and noise: the runs must agree on every setting but
    :data:`MERGE_FREE` and on the start model's held-out outcomes, episode by episode; a run that
    differs, or a method found in two runs, raises :class:`ValueError` naming the files and what
    differs. A path is a run's output folder or its ``results.json``."""
    files = [Path(p) / "results.json" if Path(p).is_dir() else Path(p) for p in paths]
    if len(files) < 2:
        raise ValueError("merging needs the results of two runs or more")
    runs = []
    for f in files:
        try:
            runs.append(json.loads(f.read_text()))
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"{f}: not a readable results.json of twice bench games ({exc})") from None
        if not isinstance(runs[-1].get("config"), dict) or not isinstance(runs[-1].get("envs"), dict):
            raise ValueError(f"{f}: not a results.json of twice bench games (no 'config' and 'envs')")
    first, base = files[0], _compared_settings(runs[0])
    merged: dict = {"config": dict(runs[0]["config"], methods=[], out=None), "merged_from": [str(f) for f in files],
                    "envs": {}}
    owner: dict = {}
    for f, r in zip(files, runs):
        mine = _compared_settings(r)
        differ = sorted(k for k in set(base) | set(mine) if base.get(k) != mine.get(k))
        if differ:
            raise ValueError(f"{f} and {first} were run with different settings ({', '.join(differ)}): their "
                             "methods were not trained or evaluated alike")
        for env_id, e in r["envs"].items():
            try:
                model, outcomes, methods = e["model"], e["before"]["all"]["outcomes"], e["methods"]
            except (KeyError, TypeError):
                raise ValueError(f"{f}: {env_id} lacks the start model's held-out outcomes or the methods "
                                 "(not a results.json of twice bench games?)") from None
            into = merged["envs"].setdefault(env_id, {"model": model, "before": e["before"], "methods": {}})
            if model != into["model"]:
                raise ValueError(f"{f} and {first} start {env_id} from different models ({model} and "
                                 f"{into['model']})")
            if outcomes != into["before"]["all"]["outcomes"]:
                raise ValueError(f"{f} and {first}: the start model's held-out episodes of {env_id} differ "
                                 "(other held-out noise, tasks or env data), so the methods' episodes do not pair up")
            for method, x in methods.items():
                if (env_id, method) in owner:
                    raise ValueError(f"{method} on {env_id} is in both {owner[env_id, method]} and {f}: merge "
                                     "runs of different methods")
                owner[env_id, method] = f
                into["methods"][method] = x
                if method not in merged["config"]["methods"]:
                    merged["config"]["methods"].append(method)
    for e in merged["envs"].values():
        e["pairs"] = method_pairs(e["methods"])
        e["train_pairs"] = training_pairs(e["methods"])
    return merged


def _plot(root: Path, env_id: str, cfg: GamesBenchConfig) -> None:
    try:
        from twice_envs.agents.lab.plots import plot_runs
    except ImportError:  # pragma: no cover
        return
    runs = [root / env_id / f"{m}-s{s}" for m in cfg.methods for s in cfg.seeds]
    try:
        plot_runs(runs, root / f"curves-{env_id}.png", labels=[r.name for r in runs], window=1)
    except Exception as exc:  # noqa: BLE001 - matplotlib missing: the figures are in results.json
        print(f"(no plot: {exc})")


def ordering(success: dict) -> str:
    """Methods from best to worst success, ``=`` between equal figures (``twice > crr = grpo``)."""
    order = sorted(success, key=lambda m: -success[m])
    out = order[0]
    for a, b in zip(order, order[1:]):
        out += (" = " if abs(success[a] - success[b]) < 1e-12 else " > ") + b
    return out


def lr_label(results: dict, methods: dict) -> str:
    """How the methods' learning rates compare: ``at one shared learning rate lr=...`` (the bench trains
    every method at ``--lr``, untuned), the rates if they differ, or that none was recorded."""
    default = (results.get("config") or {}).get("lr")
    lrs = {m: x.get("lr", default) for m, x in methods.items()}
    if any(v is None for v in lrs.values()):
        return "at learning rates not recorded"
    if len(set(lrs.values())) == 1:
        return f"at one shared learning rate lr={next(iter(lrs.values())):g}"
    return "at learning rates " + ", ".join(f"{m} {v:g}" for m, v in lrs.items())


def report(results: dict) -> str:
    """The results as text: a table per env, the ordering, and whether the intervals separate 5 points.
    Every comparison names the learning rates it was measured at: at one shared learning rate, untuned,
    a difference is not a method's win (a method whose update is larger gains from the rate alone)."""
    lines = []
    for env_id, r in results["envs"].items():
        shared = lr_label(results, r["methods"])
        b = r["before"]["all"]
        lines.append(f"{env_id} (start model {r['model']}): before {b['success']:.3f} "
                     f"[{b['success_ci'][0]:.3f}, {b['success_ci'][1]:.3f}] n={b['episodes']}, valid {b['valid_share']:.3f}, "
                     f"reward {b.get('mean_reward', float('nan')):.3f}")
        lines.append(f"  {'method':<7} {'after':>6} {'95% CI':>15} {'n':>5} {'change (paired) [95% CI]':>26} "
                     f"{'aux tok/upd':>11} {'s/upd':>6} {'train invalid':>13} {'mixed groups':>12} {'valid after':>11} "
                     f"{'reward after':>12}")
        ms = r["methods"]
        for m, x in ms.items():
            reward = x.get("eval_mean_reward", float("nan"))
            ch = x.get("change_ci", [float("nan")] * 2)
            change = f"{x.get('change', float('nan')):+.3f} [{ch[0]:+.3f}, {ch[1]:+.3f}]"
            lines.append(f"  {m:<7} {x['success']:6.3f} [{x['success_ci'][0]:.3f}, {x['success_ci'][1]:.3f}] "
                         f"{x['episodes']:5d} {change:>26} {x['aux_tokens_per_update']:11.0f} {x['seconds_per_update']:6.1f} "
                         f"{x['train_invalid_share']:13.3f} {x.get('train_mixed_groups', float('nan')):12.3f} "
                         f"{x.get('eval_valid_share', float('nan')):11.3f} {reward:12.3f}")
        for m, x in ms.items():
            if len(x.get("curve", ())) > 1:  # evaluated while training (--eval-every)
                lines.append(f"  {m} held-out by update, change (paired) [95% CI]: " + ", ".join(
                    f"{c['update']}: {c['change']:+.3f} [{c['change_ci'][0]:+.3f}, {c['change_ci'][1]:+.3f}]"
                    for c in x["curve"]))
        if ms:
            lines.append("  ordering: " + ordering({m: x["success"] for m, x in ms.items()}) + f" ({shared}, not "
                         "tuned per method: an order here is not a method's win)")
            better = [m for m, x in ms.items() if x.get("improves")]
            lines.append(f"  improve on the start model (paired interval above 0): {', '.join(better) or 'none'} "
                         f"of {len(ms)}")
            pairs = r.get("pairs") or {}
            if pairs:
                lines.append(f"  paired differences between methods (same tasks and noise) {shared}, 95% CI:")
                for name, x in pairs.items():
                    ci = x["change_ci"]
                    sig = "significant" if ci[0] > 0 or ci[1] < 0 else "not significant"
                    lines.append(f"    {name}: {x['change']:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}] {sig}")
                half, n, need = pairs_resolution(pairs)
                verdict = "can" if half <= 0.05 else "cannot"
                lines.append(f"  the widest paired interval between two methods has half-width {half:.3f}: it {verdict} "
                             f"tell apart a 5-point difference (every pair would need about {need} held-out episodes "
                             f"per method at the observed spread; here {n})")
            train_pairs = r.get("train_pairs") or {}
            if train_pairs:
                lines.append("  paired training differences (updates that sampled the same tasks with the same luck; "
                             f"t interval over them) {shared}, 95% CI:")
                for name, x in train_pairs.items():
                    sig = "significant" if x["significant"] else "not significant"
                    lines.append(f"    {name}: {x['measure']} {x['mean']:+.3f} [{x['ci'][0]:+.3f}, {x['ci'][1]:+.3f}] over "
                                 f"{x['n']} updates ({x['updates'][0]}-{x['updates'][1]}) {sig}")
            if not pairs:
                n = min(x["episodes"] for x in ms.values())
                p = float(np.mean([x["success"] for x in ms.values()]))
                # the same floor as episodes_for_difference: near 0 or 1 the normal approximation says too little
                q = min(max(p, 0.05), 0.95)
                half = 1.96 * math.sqrt(2 * q * (1 - q) / max(n, 1))
                need = episodes_for_difference(p)
                verdict = "can" if half <= 0.05 else "cannot"
                lines.append(f"  a 95% interval of a difference between two methods has half-width {half:.3f}: it "
                             f"{verdict} tell apart a 5-point difference (that needs about {need} held-out episodes "
                             f"per method at success {p:.2f}; here {n})")
    return "\n".join(lines)


def _eval_only(cfg: GamesBenchConfig, device: str, against: Optional[str]) -> int:
    """``--eval-only``: held-out figures of each env's start model, per task type, written to
    ``OUT/heldout.json``; with ``against`` (an earlier run's file), the paired change of success."""
    before = _read_heldout(against) if against else {}
    results = {}
    for env_id in cfg.envs:
        model = cfg.start_model(env_id)
        t0 = time.perf_counter()
        res = evaluate_game(load_policy(model, device=device), env_id, samples=cfg.eval_samples or 4,
                            tasks=cfg.eval_tasks, noise_seed=HELDOUT_NOISE_SEED, setting=cfg.setting(env_id))
        seconds = time.perf_counter() - t0
        print(f"{env_id} {model}, held-out, temperature 1 ({seconds:.0f}s):")
        for kind, x in sorted(res.items(), key=lambda kv: kv[0] != "all"):
            print(f"  {kind:<32} success {x['success']:.3f} [{x['success_ci'][0]:.3f}, {x['success_ci'][1]:.3f}] "
                  f"valid turns {x['valid_share']:.3f} ({x['episodes']} episodes, {x['turns']} turns)")
        results[env_id] = {"model": str(model), "eval_tasks": cfg.eval_tasks, "eval_samples": cfg.eval_samples or 4,
                           "noise_seed": HELDOUT_NOISE_SEED, "seconds": round(seconds, 1), "figures": res}
        if env_id in before:
            _print_paired(env_id, results[env_id], before[env_id], against)
    write_json(cfg.out, "heldout.json", results)
    return 0


def _read_heldout(path: str) -> dict:
    """The envs of an earlier ``--eval-only`` run's ``heldout.json`` (a clear error naming the file)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(data, dict) or not all(isinstance(v, dict) and "figures" in v for v in data.values()):
            raise ValueError("not the heldout.json of a 'twice bench games --eval-only' run")
    except (OSError, ValueError) as exc:
        raise SystemExit(f"--against {path}: {exc}") from None
    return data


def _print_paired(env_id: str, now: dict, then: dict, path: str) -> None:
    """The paired change of held-out success of ``env_id`` from the run ``then`` to the run ``now``
    (each episode compared with the same game and noise key's episode of the other run)."""
    same = ("eval_tasks", "eval_samples", "noise_seed")
    if any(now.get(k) != then.get(k) for k in same):
        raise SystemExit(f"--against {path}: {env_id} was evaluated with "
                         + ", ".join(f"{k}={then.get(k)!r}" for k in same) + "; this run with "
                         + ", ".join(f"{k}={now.get(k)!r}" for k in same) + ": not the same episodes")
    pair = paired_change(now["figures"]["all"]["outcomes"], then["figures"]["all"]["outcomes"])
    lo, hi = pair["change_ci"]
    verdict = "significant" if lo > 0 or hi < 0 else "not significant"
    print(f"  paired change of success against {then['model']}: {pair['change']:+.3f} [{lo:+.3f}, {hi:+.3f}] "
          f"over {pair['n']} episodes ({verdict})")


def parse_train_kwargs(items: Sequence[str]) -> dict:
    """``["WebShop-v0:reward=success", ...]`` as ``{"WebShop-v0": {"reward": "success"}}``; a value is read
    as JSON where it is JSON (numbers, true, null...), else kept as a string. A malformed item raises
    :class:`ValueError` naming it."""
    out: dict = {}
    for item in items:
        env_id, sep, pair = item.partition(":")
        key, eq, value = pair.partition("=")
        if not (sep and eq and env_id and key):
            raise ValueError(f"{item!r} is not ENV:KEY=VALUE")
        out.setdefault(env_id, {})[key] = parse_value(value)
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``twice bench games``."""
    p = argparse.ArgumentParser(prog="twice bench games", description=__doc__.split("\n\n")[1])
    d = GamesBenchConfig()
    p.add_argument("--envs", default=",".join(d.envs))
    p.add_argument("--methods", default=",".join(d.methods),
                   help=f"comma-separated credit methods (registered: {', '.join(registered_methods())})")
    p.add_argument("--seeds", type=int, default=len(d.seeds), help="training seeds per method")
    p.add_argument("--updates", type=int, default=d.updates)
    p.add_argument("--tasks", type=int, default=d.tasks_per_update, help="training tasks per update")
    p.add_argument("--group-size", type=int, default=d.group_size)
    p.add_argument("--eval-tasks", type=int, default=None,
                   help="held-out tasks per evaluation (default: per env, sized for two cores; --eval-only: all)")
    p.add_argument("--eval-samples", type=int, default=None,
                   help="episodes per held-out task (default: per env; --eval-only: 4)")
    p.add_argument("--model", action="append", default=[], help="ENV=MODEL start model (repeatable)")
    p.add_argument("--lr", type=float, default=d.lr, help="learning rate of the policy updates")
    p.add_argument("--filter-groups", action="store_true",
                   help="dynamic sampling: train on --tasks groups whose returns differ "
                        f"(up to {cpu_config().max_sample_batches} batches an update)")
    p.add_argument("--eval-every", type=int, default=d.eval_every, metavar="N",
                   help="also evaluate held-out every N updates while training: the learning curve (0: after only)")
    p.add_argument("--train-kwarg", action="append", default=[], metavar="ENV:KEY=VALUE",
                   help="a make() kwarg of ENV's training env (VALUE as JSON, else a string; repeatable), "
                        "e.g. WebShop-v0:reward=success")
    p.add_argument("--micro-batch", type=int, default=None,
                   help="episodes per forward/backward pass of an update (bounds memory; default: a minibatch)")
    p.add_argument("--eval-noise-seed", type=int, default=d.eval_noise_seed,
                   help="noise seed of the held-out evaluations of training seed 0 (seed s adds s)")
    p.add_argument("--out", default=d.out)
    p.add_argument("--jobs", type=int, default=d.jobs,
                   help="runs (a method and a seed each) trained at once, one process each, say one per core "
                        "(the figures do not depend on it)")
    p.add_argument("--merge", nargs="+", default=None, metavar="RUN",
                   help="join the results of runs of other methods (their --out folders, run alike, e.g. one "
                        "process per core) into one comparison with paired differences; writes OUT/results.json")
    p.add_argument("--resume", action="store_true",
                   help="continue each run of OUT that holds a checkpoint to --updates (the same settings "
                        "otherwise): measure a comparison at a larger size without training its first updates again")
    p.add_argument("--max-turns", type=int, default=None, help="turn cap (default: per env)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="tokens per turn (default: per env)")
    p.add_argument("--eval-only", action="store_true",
                   help="only evaluate the start models on the held-out tasks (per task type)")
    p.add_argument("--device", default="cpu", type=device_arg,
                   help="with --eval-only: where the models run (cpu, cuda, cuda:N); training runs on the CPU")
    p.add_argument("--against", default=None, metavar="FILE",
                   help="with --eval-only: the heldout.json of an earlier --eval-only run on the same held-out "
                        "tasks; prints the paired change of success (the same games and sampling noise)")
    a = p.parse_args(argv)
    if a.merge:
        try:
            res = merge_results(a.merge)
        except ValueError as exc:
            p.error(f"--merge: {exc}")
        res["config"]["out"] = a.out
        print(report(res))
        atomic_write_text(Path(a.out) / "results.json", json.dumps(res, indent=1, default=float))
        print(f"results: {Path(a.out) / 'results.json'}")
        return 0
    if a.against and not a.eval_only:
        p.error("--against compares two --eval-only runs: add --eval-only")
    if not a.eval_only and torch_device(a.device).type != "cpu":
        p.error("--device applies with --eval-only: the comparison trains on the CPU")
    if a.eval_every < 0 or (a.micro_batch is not None and a.micro_batch < 1) or a.jobs < 1:
        p.error("--eval-every must be >= 0, --micro-batch >= 1 and --jobs >= 1")
    try:
        train_kwargs = parse_train_kwargs(a.train_kwarg)
    except ValueError as exc:
        p.error(f"--train-kwarg: {exc}")
    cfg = GamesBenchConfig(
        envs=tuple(e for e in a.envs.split(",") if e), methods=tuple(m for m in a.methods.split(",") if m),
        seeds=tuple(range(a.seeds)), updates=a.updates, tasks_per_update=a.tasks, group_size=a.group_size,
        eval_tasks=a.eval_tasks, eval_samples=a.eval_samples, lr=a.lr, filter_groups=a.filter_groups, out=a.out,
        max_turns=a.max_turns,
        max_new_tokens=a.max_new_tokens, eval_every=a.eval_every, train_kwargs=train_kwargs or None,
        micro_batch=a.micro_batch, eval_noise_seed=a.eval_noise_seed, resume=a.resume, jobs=a.jobs,
        model=dict(x.split("=", 1) for x in a.model) or None)
    bad = [m for m in cfg.methods if m not in registered_methods()]
    if bad:
        p.error(f"unknown credit methods {bad}; registered: {', '.join(registered_methods())}")
    unknown = [e for e in {*cfg.envs, *(cfg.train_kwargs or {})} if e not in GAMES]
    if unknown:
        p.error(f"unknown game env(s) {unknown}; choose from {', '.join(GAMES)}")
    if a.eval_only:
        return _eval_only(cfg, a.device, a.against)
    try:
        check_resumable(cfg)
    except ValueError as exc:
        p.error(f"--resume: {exc}")
    res = run_games_bench(cfg)
    print(report(res))
    print(f"results: {Path(cfg.out) / 'results.json'}")
    return 0
