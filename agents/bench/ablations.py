"""``twice bench ablations``: every Twice ablation on the lab envs, at one budget, over seeds.

For each lab env (TextLab-v0, whose turns are several lines and whose policy depends on its own
text; SearchToy-v0, one-token turns) and each row — full Twice and each ablation of
:data:`~twice_envs.agents.credit.ablations.ABLATIONS` named in :data:`TABLE3` — and each seed:

* ``rho_bar``: the within-decision correlation of ``(U, U')`` of one twin at every decision of an
  audit batch, under the row's noise layout (its key mode, coupled or independent), centred on
  the exact ``V(s_{t+1})`` and ``V(s_t)``. Rows that do not change the noise share their layout's value.
* ``rev``: the published Table 3 "Rev.": the wrong-sign rate (zero credit is never wrong) of the row's
  twin credit ``A_hat`` over the decisions whose pairs it realised (a kept twin, self-twins included), at
  the budget ``beta`` after a predictor warm-up, against the exact ``A*`` of the audit batch. Positive
  weights and the episode term do not enter it, so ``twin-credit-only`` and ``no-inverse-weights`` read as
  full Twice, as in the published table.
* ``wrong_sign``, ``pearson`` and ``mse_vs_grpo`` (labelled "update ..."): the same figures of the advantage
  the row's update uses (``A_traj + omega A_hat / sigma_hat`` over every decision). The MSE is taken in
  utility units: the update's advantage times the batch scale ``sigma_hat`` against GRPO's ``A_traj`` times
  the same scale.
* ``sigma_batch`` and ``sigma_rms`` (full Twice only): the two readings of the batch scale ``sigma_hat``, the
  standard deviation of the batch's factual utilities (floored at ``sigma_min``, what the update divides by)
  and the root-mean-square of the batch's twin credits ``A_hat`` over its branched decisions (the scale that
  puts the twin term at unit size).
* ``budget``: the row's accounted auxiliary tokens over ``beta`` x policy tokens on that batch.
* ``area`` and ``final_value``: the area under the exact ``V(s0)`` curve (the mean ``V(s0)`` over the
  updates, :func:`~twice_envs.agents.bench.tuning.area`) and the exact ``V(s0)`` after a learning run
  (:func:`~twice_envs.agents.bench.learn.train_one`, the learning bench's setting) of Twice with the row's
  config, at the row's own step size: tuned per row and env on ``lr_grid`` with tuning seeds apart from
  the reporting ones, as ``twice bench learn`` tunes each method (:mod:`~twice_envs.agents.bench.tuning`);
  with an empty grid every row runs at one shared ``lr``, and the report says so. Each row's area is
  compared with full Twice's, paired seed by seed (the same factual noise seeds), with a 95% t interval.

Every figure is printed as the mean over seeds with a 95% percentile-bootstrap CI over seeds;
``ablations.json`` keeps the per-seed values, each row's step size and tuning scores (``step_sizes``)
and the paired differences from full Twice (``vs_full``); ``ablations.png`` plots the figures.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from twice_envs import progress
from twice_envs.agents import stats as cs
from twice_envs.agents.bench import learn, tuning
from twice_envs.agents.credit import twice
from twice_envs.agents.credit.ablations import ABLATIONS, apply_ablations
from twice_envs.agents.credit.grpo import episode_advantages
from twice_envs.agents.credit.predictor import decision_index
from twice_envs.agents.lab import toy
from twice_envs.agents.lab.lab_audit import LabAuditConfig, training_time_twice
from twice_envs.agents.lab.policies import lab_policy
from twice_envs.agents.lab.search_toy import SearchToySetting
from twice_envs.agents.lab.text_setting import TextLabSetting
from twice_envs.trajectory import atomic_write_text

#: The published Table 3 rows, in its order (names of :data:`ABLATIONS`).
TABLE3 = ("independent-twins", "per-episode-keys", "no-line-resync", "ngram-keys", "uniform-branching",
          "mixed-outcome", "skip-same-evidence", "no-inverse-weights", "no-self-twin-shortcut", "twin-credit-only",
          "star")
#: The lab envs the bench runs on: those whose noise layouts the rows change, both trained by the learning
#: bench (its learning figures need it).
ABLATION_ENVS = ("SearchToy-v0", "TextLab-v0")
#: Figures per row and seed.
FIGURES = ("rho_bar", "rev", "wrong_sign", "pearson", "mse_vs_grpo", "budget", "sigma_batch", "sigma_rms",
           "area", "final_value")


@dataclass
class AblationConfig:
    """Sizes of ``twice bench ablations`` (defaults: the reported run)."""

    envs: tuple = ABLATION_ENVS
    """Lab envs (a subset of :data:`ABLATION_ENVS`)."""
    rows: tuple = ("full",) + TABLE3
    """``full`` and ablation names (any of :data:`ABLATIONS`)."""
    seeds: int = 10
    """Independent seeds per row (audit batch and learning run each)."""
    audit_groups: int = 60
    """GRPO groups of the audit batch (5 episodes each)."""
    warmup_batches: int = 3
    """Batches that fit the predictor before the audited one."""
    updates: int = 30
    """Updates of each learning run."""
    groups: int = 8
    """GRPO groups per learning update."""
    beta: float = 0.7
    """The budget every row spends (accounted auxiliary tokens / policy tokens)."""
    search_setting: SearchToySetting = field(default_factory=SearchToySetting)
    """SearchToy's world and policy."""
    text_setting: TextLabSetting = field(default_factory=TextLabSetting)
    """TextLab's world and policy (its key mode is each row's)."""
    lr_grid: tuple = tuning.DEFAULT_GRID
    """Step sizes tuned per row and env (two or more); empty: every row at ``lr``."""
    tune_seeds: int = 2
    """Tuning runs per step size (seeds apart from the reporting ones)."""
    max_widen: int = tuning.DEFAULT_MAX_WIDEN
    """Step sizes the grid may gain beyond each end where a pick sits there."""
    lr: float = 1.0
    """The one step size every row shares when ``lr_grid`` is empty."""
    seed: int = 0
    """Base seed."""
    jobs: int = 1
    """Processes the learning runs spread over."""

    def __post_init__(self) -> None:
        bad = [r for r in self.rows if r != "full" and r not in ABLATIONS]
        if bad:
            raise ValueError(f"unknown ablation {bad[0]!r}; choose from full, {', '.join(ABLATIONS)}")
        bad_env = [e for e in self.envs if e not in ABLATION_ENVS]
        if bad_env:
            raise ValueError(f"ablation env must be one of {ABLATION_ENVS}, got {bad_env[0]!r}")
        self.lr_grid = tuning.check_grid(self.lr_grid, "lr_grid") if len(self.lr_grid) else ()
        if self.tune_seeds < 1 or self.jobs < 1 or self.max_widen < 0:
            raise ValueError(f"tune_seeds and jobs must be >= 1 and max_widen >= 0, got {self.tune_seeds}, "
                             f"{self.jobs}, {self.max_widen}")
        if 1000 * self.seeds > tuning.TUNE_SEED_OFFSET:
            raise ValueError(f"seeds must be at most {tuning.TUNE_SEED_OFFSET // 1000} (the tuning seeds follow)")


def row_config(row: str) -> twice.TwiceConfig:
    """The Twice settings of a row (``full``: the published defaults)."""
    return twice.TwiceConfig() if row == "full" else apply_ablations(twice.TwiceConfig(), [row])


def _policy(env: str, config: AblationConfig, key_mode: str):
    text = replace(config.text_setting, key_mode=key_mode)
    return lab_policy(env, config.search_setting, text)


def layout_rho(env: str, config: AblationConfig, key_mode: str, coupled: bool, seed: int) -> float:
    """rho-bar of one twin at every decision of an audit batch under a noise layout."""
    policy = _policy(env, config, key_mode)
    eps, envs = toy.toy_rollouts(policy, config.audit_groups, 5, noise_seed=seed)
    index = decision_index(eps)
    oracle = np.concatenate(toy.exact_advantages(policy, eps))
    v_state = np.concatenate([policy.episode_values([policy.action_of(t.text) for t in e.turns]) for e in eps])
    tw = toy.toy_twins(policy, eps, envs, index, coupled=coupled, branch=1, fresh_salt=3 + seed % 1_000_000)
    u = np.array([eps[i].utility for i, _ in index])
    u_twin = np.array([w.utility for w in tw])
    return cs.per_decision_rho(u, u_twin, v_state + oracle, v_state)


def credit_figures(env: str, config: AblationConfig, row: str, seed: int) -> dict:
    """The row's twin credit (over the decisions it realised pairs for) and update advantage at the budget,
    scored against the exact ``A*`` of one audit batch, and both readings of ``sigma_hat`` for full Twice."""
    tcfg = row_config(row)
    policy = _policy(env, config, tcfg.key_mode)
    eps, envs = toy.toy_rollouts(policy, config.audit_groups, 5, noise_seed=seed)
    oracle = np.concatenate(toy.exact_advantages(policy, eps))
    lab_cfg = LabAuditConfig(env=env, beta=config.beta, warmup_batches=config.warmup_batches, seed=seed)
    tt = training_time_twice(policy, eps, envs, lab_cfg, tcfg)
    a_traj = episode_advantages([e.utility for e in eps], [e.group for e in eps])
    traj = np.concatenate([np.full(len(e.turns), a_traj[i]) for i, e in enumerate(eps)])
    scale = tt.stats["sigma_hat"]
    twin = twin_figures(tt.stats["decisions"], oracle, [e.utility for e in eps], scales=row == "full",
                        sigma_min=tcfg.sigma_min)
    return {**twin, "wrong_sign": cs.wrong_sign_rate(tt.update, oracle),
            "pearson": cs.pearson(tt.update, oracle),
            "mse_vs_grpo": cs.mse_ratio(tt.update * scale, oracle, traj * scale),
            "budget": tt.stats["aux_accounted"] / tt.stats["aux_target"]}


def twin_figures(decisions: dict, oracle: np.ndarray, utilities: Sequence[float], *, scales: bool,
                 sigma_min: float = 0.1) -> dict:
    """``rev``: the wrong-sign rate of the twin credit ``decisions["a_hat"]`` over the decisions that realised a
    pair (``decisions["realised"] > 0``); with ``scales``, ``sigma_batch`` (the standard deviation of
    ``utilities``, at least ``sigma_min``) and ``sigma_rms`` (the RMS of ``a_hat`` over the branched decisions),
    else NaN. ``decisions`` is a twin step's ``stats["decisions"]``, in the order of ``oracle``."""
    a_hat = np.asarray(decisions["a_hat"], dtype=np.float64)
    realised = np.asarray(decisions["realised"]) > 0
    branched = np.asarray(decisions["branched"], dtype=bool)
    nan = float("nan")
    return {"rev": cs.wrong_sign_rate(a_hat[realised], np.asarray(oracle)[realised]),
            "sigma_batch": twice.sigma_hat(utilities, sigma_min) if scales else nan,
            "sigma_rms": float(np.sqrt(np.mean(a_hat[branched] ** 2))) if scales and branched.any() else nan}


def _learn_config(env: str, config: AblationConfig, row: str) -> learn.LearnConfig:
    return learn.LearnConfig(env=env, setting=config.search_setting, methods=("twice",), lr_grid=(),
                             text_setting=replace(config.text_setting, key_mode=row_config(row).key_mode),
                             updates=config.updates, groups=config.groups, beta=config.beta, seed=config.seed)


def learning_runs(env: str, config: AblationConfig, seeds: Sequence[int], log=lambda m: None) -> dict:
    """Each row's step size (tuned on ``config.lr_grid``, else ``config.lr``) and its learning curves of
    Twice with the row's settings on ``seeds``: ``{row: {"lr", "tuning", "curves"}}``."""
    arms = {row: ("twice", _learn_config(env, config, row), row_config(row)) for row in config.rows}
    tuned = {}
    if config.lr_grid:
        tuned = learn.tune_runs(arms, config.lr_grid, tuning.tuning_seeds(config.seed, config.tune_seeds),
                                config.max_widen, config.jobs)
        log(f"{env} step sizes: " + ", ".join(f"{row} {t.lr:g}" for row, t in tuned.items()))
    lrs = {row: tuned[row].lr if tuned else config.lr for row in config.rows}
    runs = [learn.Run("twice", s, lrs[row], arms[row][1], arms[row][2]) for row in config.rows for s in seeds]
    flat = learn.train_many(runs, config.jobs, "ablation runs")
    return {row: {"lr": lrs[row], "tuning": tuned[row].as_dict() if tuned else None,
                  "curves": [flat[i * len(seeds) + k].values for k in range(len(seeds))]}
            for i, row in enumerate(config.rows)}


def run_ablations(config: AblationConfig, *, log=lambda m: None) -> dict:
    """Every row on every env and seed; returns per-seed figures and their CIs."""
    out = {"config": asdict(config), "envs": {}, "step_sizes": {}, "vs_full": {}}
    seeds = [config.seed + 1000 * k for k in range(config.seeds)]
    for env in config.envs:
        rho_cache: dict = {}
        rows = {}
        learning = learning_runs(env, config, seeds, log)
        for row in config.rows:
            tcfg = row_config(row)
            per_seed = {f: [] for f in FIGURES}
            t0 = time.time()
            for k in range(config.seeds):
                seed = config.seed + 1000 * k
                layout = (tcfg.key_mode, tcfg.coupled, seed)
                if layout not in rho_cache:
                    rho_cache[layout] = layout_rho(env, config, tcfg.key_mode, tcfg.coupled, seed)
                per_seed["rho_bar"].append(rho_cache[layout])
                for f, v in credit_figures(env, config, row, seed).items():
                    per_seed[f].append(v)
                values = learning[row]["curves"][k]
                per_seed["area"].append(tuning.area(values))
                per_seed["final_value"].append(float(values[-1]))
            rows[row] = {f: {"seeds": vals, **_ci(vals, config.seed)} for f, vals in per_seed.items()}
            log(f"{env} {row}: rho-bar {rows[row]['rho_bar']['value']:.3f}, final V(s0) "
                f"{rows[row]['final_value']['value']:.3f} ({time.time() - t0:.0f} s)")
        out["envs"][env] = rows
        out["step_sizes"][env] = {row: {"lr": r["lr"], "tuning": r["tuning"]} for row, r in learning.items()}
        if "full" in rows:
            full = rows["full"]["area"]["seeds"]
            out["vs_full"][env] = {row: tuning.paired_difference(rows[row]["area"]["seeds"], full)
                                   for row in rows if row != "full"}
    return out


def _ci(values: Sequence[float], seed: int) -> dict:
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return {"value": float("nan"), "lo": float("nan"), "hi": float("nan"), "n": 0}
    return {**cs.bootstrap_ci(np.mean, v, seed=seed).as_dict(), "n": int(v.size)}


def format_ablations(res: dict) -> str:
    """One table per env: each figure as mean [95% CI] over seeds."""
    out = io.StringIO()
    heads = {"rho_bar": "rho-bar", "rev": "Rev. % (twin credit)", "wrong_sign": "update wrong-sign %",
             "pearson": "update Pearson", "mse_vs_grpo": "update MSE/GRPO", "budget": "accounted/budget",
             "sigma_batch": "sigma_hat: outcome std", "sigma_rms": "sigma_hat: twin RMS", "area": "area (mean V(s0))",
             "final_value": "final V(s0)"}
    for env, rows in res["envs"].items():
        out.write(f"{env} (mean [95% CI] over {res['config']['seeds']} seeds; budget beta = "
                  f"{res['config']['beta']})\n")
        out.write(f"{'row':<22}" + "".join(f"{heads[f]:>24}" for f in FIGURES) + "\n")
        for row, figs in rows.items():
            cells = []
            for f in FIGURES:
                e, k = figs[f], (100.0 if f in ("rev", "wrong_sign") else 1.0)
                cells.append("n/a" if not np.isfinite(e["value"]) else
                             f"{e['value'] * k:.3f} [{e['lo'] * k:.3f}, {e['hi'] * k:.3f}]")
            out.write(f"{row:<22}" + "".join(f"{c:>24}" for c in cells) + "\n")
        write_step_sizes(out, res, env)
    return out.getvalue()


def write_step_sizes(out: io.StringIO, res: dict, env: str) -> None:
    """Each row's step size and its area's paired difference from full Twice's (tuned, or one shared lr)."""
    cfg, steps, vs = res["config"], res["step_sizes"].get(env, {}), res["vs_full"].get(env, {})
    if cfg["lr_grid"]:
        grid = ", ".join(f"{x:g}" for x in cfg["lr_grid"])
        out.write(f"learning: each row at its own step size, tuned on lr grid {grid} with {cfg['tune_seeds']} tuning "
                  f"seeds apart from the reporting ones ({tuning.SELECTION_RULE})\n")
    else:
        out.write(f"learning: every row at one shared lr={cfg['lr']:g}, not tuned: a difference in area or final V(s0) "
                  "is measured at one shared step size and is not a row's win\n")
    for row, st in steps.items():
        d = vs.get(row)
        diff = "" if d is None else (f"; area - full, paired: {d['mean']:+.3f} [{d['ci'][0]:+.3f}, {d['ci'][1]:+.3f}]"
                                     + (" (CI excludes 0)" if d["significant"] else ""))
        out.write(f"  {row:<22} lr {st['lr']:g}{diff}\n")
    if cfg["lr_grid"]:
        for line in learn.format_tuning({row: st["tuning"] for row, st in steps.items()}, 24, "row"):
            out.write(f"  {line}\n")


def plot_ablations(res: dict, out: Path) -> Path:
    """One panel per figure: each row's mean and CI, one colour per env."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figs = ("rho_bar", "rev", "wrong_sign", "final_value")
    fig, axes = plt.subplots(1, len(figs), figsize=(4.2 * len(figs), 5.5), sharey=True)
    for ax, f in zip(axes, figs):
        for j, (env, rows) in enumerate(res["envs"].items()):
            names = list(rows)
            y = np.arange(len(names)) + 0.2 * j
            v = np.array([rows[n][f]["value"] for n in names])
            lo = np.array([rows[n][f]["lo"] for n in names])
            hi = np.array([rows[n][f]["hi"] for n in names])
            ax.errorbar(v, y, xerr=[v - lo, hi - v], fmt="o", label=env, capsize=2)
            ax.set_yticks(np.arange(len(names)) + 0.1, names)
        ax.set_title(f)
        ax.grid(alpha=0.3)
    axes[0].invert_yaxis()
    axes[-1].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def write_ablations(res: dict, out_dir: Path) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "ablations.json", json.dumps(res, indent=1, default=float))
    return {"json": out_dir / "ablations.json", "png": plot_ablations(res, out_dir / "ablations.png")}


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="twice bench ablations", description=__doc__.split("\n\n")[0])
    p.add_argument("--envs", nargs="+", default=list(ABLATION_ENVS), choices=ABLATION_ENVS)
    p.add_argument("--rows", nargs="+", default=["full", *TABLE3], metavar="ROW",
                   help=f"full and ablation names ({', '.join(ABLATIONS)})")
    p.add_argument("--seeds", type=int, default=AblationConfig.seeds)
    p.add_argument("--audit-groups", type=int, default=AblationConfig.audit_groups)
    p.add_argument("--updates", type=int, default=AblationConfig.updates)
    p.add_argument("--groups", type=int, default=AblationConfig.groups)
    p.add_argument("--beta", type=float, default=AblationConfig.beta)
    tuning.add_step_size_args(p, what="row", tune_seeds=AblationConfig.tune_seeds,
                              max_widen=AblationConfig.max_widen, lr=AblationConfig.lr)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=2, help="processes the learning runs spread over (default 2)")
    p.add_argument("--out", default="runs/bench_ablations")
    progress.add_argument(p)
    a = p.parse_args(argv)
    progress.apply(a)
    try:
        cfg = AblationConfig(envs=tuple(a.envs), rows=tuple(a.rows), seeds=a.seeds, audit_groups=a.audit_groups,
                             updates=a.updates, groups=a.groups, beta=a.beta, seed=a.seed, jobs=a.jobs,
                             **tuning.step_size_settings(a, AblationConfig.lr))
    except ValueError as exc:
        p.error(str(exc))
    t0 = time.time()
    res = run_ablations(cfg, log=lambda m: print(f"[bench ablations {time.time() - t0:5.0f}s] {m}", file=sys.stderr,
                                                 flush=True))
    print(format_ablations(res), end="")
    paths = write_ablations(res, Path(a.out))
    print("written: " + ", ".join(str(v) for v in paths.values()))
    return 0
