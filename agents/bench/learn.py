"""``twice bench learn``: lab policies (SearchToy or TextLab) trained with each credit method, each
method at its own best step size.

Every method starts from the same initial policy (:data:`LEARN_ENVS`: SearchToy's tabular softmax,
or TextLab's multi-line policy whose action logits are trained) and samples the same factual
batches' noise seeds; after every update the policy's exact ``V(s0)`` is computed by dynamic
programming, so a curve has no evaluation noise. Advantages come from
:func:`~twice_envs.agents.credit.registry.run_credit` (the registered methods) with the lab's twin
runners; Twice and CRR spend the same auxiliary budget ``beta`` x policy tokens, VinePPO its ``K``
rollouts per state. The update is the policy's own score-function gradient,
``theta += lr policy.policy_gradient(episodes, A)`` (for the tabular softmax
``theta[s] += lr mean_episodes sum_t A_t (e_a - pi(s)) / T``).

**Step sizes** (:mod:`~twice_envs.agents.bench.tuning`): each method's ``lr`` is tuned on the grid
``lr_grid`` with ``tune_seeds`` tuning seeds that never report, picked by the highest mean area
(a tie to the smaller step size), the grid widened where a pick sits at its end; then every method
runs at its own pick on the ``seeds`` reporting seeds. With an empty grid every method runs at the
one shared ``lr``, and the report says so: a difference measured there is not a method's win.

**Reported** on the reporting seeds, paired (every method samples the same factual noise seeds):

* ``area``, the headline: the area under the exact-value curve over the updates divided by their
  number (trapezoid rule; the mean ``V(s0)`` over the run, on the value's scale), with a 95%
  bootstrap CI over seeds, and its difference from GRPO's area seed by seed (95% t interval);
* the final ``V(s0)`` (95% bootstrap CI);
* updates to the threshold (``threshold``, default GRPO's final mean ``V(s0)`` at its step size):
  the first update at which the mean curve reaches it, a 95% CI from resampling seeds (the same
  resamples for every method, so the difference from GRPO's is paired too);
* realised auxiliary tokens over ``beta`` x policy tokens (Twice: after its warm-up).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple, Optional, Sequence

import numpy as np
import torch

from twice_envs import progress
from twice_envs.agents import stats as cs
from twice_envs.agents.bench import tuning
from twice_envs.agents.bench.output import stderr_log
from twice_envs.agents.credit import twice
from twice_envs.agents.credit.registry import CreditContext, check_env, factual_group_size, get_method, run_credit
from twice_envs.agents.credit.registry import methods as registered_methods
from twice_envs.agents.lab import toy
from twice_envs.agents.lab.plots import plot_bands
from twice_envs.agents.lab.policies import add_setting_args, lab_policy, setting_from_args, text_setting_from_args
from twice_envs.agents.lab.runners import lab_critic, lab_step_fns
from twice_envs.agents.lab.choice_lab import ChoiceLabSetting, choice_setting_from_args
from twice_envs.agents.lab.search_toy import SearchToySetting
from twice_envs.agents.lab.text_setting import TextLabSetting
from twice_envs.trajectory import atomic_write_text

#: The lab envs this bench trains on, each with the initial policy it builds from the bench's config
#: (policies with exact values and a ``policy_gradient``). A lab env joins with one entry.
LEARN_ENVS: dict[str, Callable] = {
    "SearchToy-v0": lambda c: lab_policy("SearchToy-v0", c.setting),
    "TextLab-v0": lambda c: lab_policy("TextLab-v0", text_setting=c.text_setting),
    "ChoiceLab-v0": lambda c: lab_policy("ChoiceLab-v0", choice_setting=c.choice_setting),
}
#: Resamples of the seeds for the curves' bands and the updates to the threshold.
CURVE_BOOT = 1000


@dataclass
class LearnConfig:
    """Sizes of ``twice bench learn`` (defaults: a few minutes on two shared cores with ``jobs=2``)."""

    env: str = "SearchToy-v0"
    """Lab env (a key of :data:`LEARN_ENVS`)."""
    setting: SearchToySetting = field(default_factory=SearchToySetting)
    """SearchToy's world and initial policy (SearchToy-v0)."""
    text_setting: TextLabSetting = field(default_factory=TextLabSetting)
    """TextLab's world, initial policy and key layout (TextLab-v0)."""
    choice_setting: ChoiceLabSetting = field(default_factory=ChoiceLabSetting)
    """ChoiceLab's world and policy (ChoiceLab-v0)."""
    methods: tuple = field(default_factory=lambda: registered_methods("learn"))
    """Credit methods to train (default: the registered methods that join this bench)."""
    seeds: int = 10
    """Reporting runs per method (seeds ``seed`` to ``seed + seeds - 1``)."""
    updates: int = 30
    """Policy-gradient updates per run."""
    groups: int = 8
    """GRPO groups per update."""
    group_size: int = 5
    """Episodes per group."""
    lr_grid: tuple = tuning.DEFAULT_GRID
    """Step sizes tuned per method (two or more); empty: no tuning, every method at ``lr``."""
    tune_seeds: int = 2
    """Tuning runs per step size (seeds from ``seed + TUNE_SEED_OFFSET``, apart from the reporting seeds)."""
    max_widen: int = tuning.DEFAULT_MAX_WIDEN
    """Step sizes the grid may gain beyond each end where a pick sits there."""
    lr: float = 1.0
    """The one step size every method shares when ``lr_grid`` is empty (and :func:`train_one`'s default)."""
    threshold: Optional[float] = None
    """The ``V(s0)`` whose first reach is counted; None: GRPO's final mean at its step size."""
    beta: float = 0.7
    """Auxiliary budget of Twice and CRR."""
    vine_k: int = 2
    """VinePPO rollouts per state (published: 2, at its published budget, :class:`~.vineppo.VineConfig`)."""
    warmup_updates: int = 3
    """Twice's predictor warm-up (branch probability ``warmup_q``)."""
    seed: int = 0
    """Base seed."""
    jobs: int = 1
    """Processes the runs spread over (each run is seeded on its own: the figures do not depend on it)."""

    def __post_init__(self) -> None:
        if self.env not in LEARN_ENVS:
            raise ValueError(f"bench learn env must be one of {tuple(LEARN_ENVS)}, got {self.env!r}")
        self.lr_grid = tuning.check_grid(self.lr_grid, "lr_grid") if len(self.lr_grid) else ()
        for name in ("seeds", "updates", "groups", "group_size", "tune_seeds", "jobs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_widen < 0:
            raise ValueError(f"max_widen must be >= 0, got {self.max_widen}")
        if not (np.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a finite number above 0, got {self.lr}")
        if not 0 <= self.seed or self.seeds > tuning.TUNE_SEED_OFFSET:
            raise ValueError(f"seed must be >= 0 and seeds <= {tuning.TUNE_SEED_OFFSET} (the tuning seeds follow)")


class RunTrace(NamedTuple):
    """One learning run, per update (``values`` has one more entry: before the first update)."""

    values: list
    """Exact ``V(s0)`` before and after every update."""
    aux: list
    """Auxiliary tokens generated."""
    policy: list
    """Tokens of the factual episodes."""
    accounted: list
    """Auxiliary tokens as the budget counts them (the generated ones for methods without a budget)."""
    warmup: list
    """Whether the update was a predictor warm-up (its branching not planned to the budget)."""
    target: list
    """The budget the step planned against: ``beta`` x the policy tokens of the batch it credited (a
    grown batch's included; ``beta`` x ``policy`` for steps that report none)."""
    generated: list
    """Auxiliary tokens of the budgeted rollouts (a grown batch's new episodes not included)."""


@contextmanager
def one_thread():
    """Torch on one thread inside (restored after): the lab's tensors are tiny, and more threads only add
    synchronisation, which on busy cores costs several times the work."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def train_one(method: str, seed: int, config: LearnConfig, *, lr: Optional[float] = None,
              twice_config: Optional[twice.TwiceConfig] = None) -> RunTrace:
    """One run of ``method`` at step size ``lr`` (default ``config.lr``; ``twice_config``: the twin-credit
    settings, default the published ones; ``beta`` and the warm-up always come from ``config``)."""
    check_env(method, config.env)
    with one_thread():
        return _train_one(method, seed, config, config.lr if lr is None else lr, twice_config)


def _train_one(method: str, seed: int, config: LearnConfig, step: float,
               twice_config: Optional[twice.TwiceConfig]) -> RunTrace:
    policy = LEARN_ENVS[config.env](config)
    credit_method = get_method(method)
    settings = credit_method.settings(twice_config, beta=config.beta, warmup_updates=config.warmup_updates,
                                      per_state=config.vine_k)
    rng = np.random.default_rng([seed, 7])
    state = None
    values, aux, ptoks, accounted, warm, target, generated = [policy.value], [], [], [], [], [], []
    group_size = factual_group_size(method, config.group_size)
    critic = lab_critic(method, policy)  # one per run, carried across its updates (None: not needed)
    for u in range(config.updates):
        eps, envs = toy.toy_rollouts(policy, config.groups, group_size, noise_seed=seed * 100_003 + u)
        ctx = CreditContext(policy=policy, rng=rng, update=u, noise_seed=seed * 100_003 + u, config=settings,
                            predictor_state=state, critic=critic, runners=lab_step_fns(envs))
        res = run_credit(credit_method, eps, ctx)
        state = res.predictor_state or state
        aux.append(res.aux_tokens)
        accounted.append(float(res.stats.get("aux_accounted", res.aux_tokens)))
        warm.append(bool(res.stats.get("warmup", False)))
        ptoks.append(sum(e.num_generated_tokens for e in eps))
        target.append(float(res.stats.get("aux_target", config.beta * ptoks[-1])))
        generated.append(float(res.stats.get("aux_generated", res.aux_tokens)))
        trained = res.episodes if res.episodes is not None else eps  # the batch grown by the step, if it grew one
        policy = policy.with_logits(policy.logits + step * policy.policy_gradient(trained, res.advantages))
        values.append(policy.value)
    return RunTrace(values, aux, ptoks, accounted, warm, target, generated)


class Run(NamedTuple):
    """One call of :func:`train_one` (what :func:`train_many` spreads over processes)."""

    method: str
    seed: int
    lr: float
    config: LearnConfig
    twice_config: Optional[twice.TwiceConfig] = None


def _train(run: Run) -> RunTrace:
    return train_one(run.method, run.seed, run.config, lr=run.lr, twice_config=run.twice_config)


def train_many(runs: Sequence[Run], jobs: int = 1, what: str = "training runs") -> list[RunTrace]:
    """:func:`train_one` of every run, in order: in this process, or with ``jobs > 1`` in up to that
    many spawned processes at once (each run is seeded on its own, so the traces are the same). Shows
    the runs done and the time left (:mod:`twice_envs.progress`), labelled ``what``."""
    with progress.Progress(what, len(runs), unit="runs") as bar:
        if jobs <= 1 or len(runs) <= 1:
            return _counted(map(_train, runs), bar)
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(jobs, len(runs)), mp_context=spawn) as pool:
            return _counted(pool.map(_train, runs), bar)


def _counted(traces, bar: progress.Progress) -> list[RunTrace]:
    """``traces`` as a list, counting each one done on ``bar`` as it arrives."""
    out = []
    for t in traces:
        out.append(t)
        bar.update()
    return out


def tune_runs(arms: dict, grid: Sequence[float], seeds: Sequence[int], max_widen: int, jobs: int = 1) -> dict:
    """Tune every arm, ``{key: (method, config, twice_config)}``, on ``grid`` with the tuning ``seeds``
    (:func:`~twice_envs.agents.bench.tuning.tune_all`); returns ``{key: Tuned}``."""

    def score_many(pairs: list) -> list:
        runs = [Run(arms[k][0], s, lr, arms[k][1], arms[k][2]) for k, lr in pairs for s in seeds]
        areas = [tuning.area(t.values) for t in train_many(runs, jobs, "tuning runs")]
        return [areas[i * len(seeds):(i + 1) * len(seeds)] for i in range(len(pairs))]

    return tuning.tune_all(score_many, list(arms), grid, max_widen)


def first_reach(curve: np.ndarray, target: float) -> Optional[int]:
    hit = np.flatnonzero(curve >= target - 1e-12)
    return int(hit[0]) if hit.size else None


def _token_figures(traces: Sequence[RunTrace]) -> dict:
    a_tok, p_tok, c_tok, t_tok, g_tok = (np.array([getattr(tr, k) for tr in traces])
                                         for k in ("aux", "policy", "accounted", "target", "generated"))
    # warm-up updates (Twice's predictor) branch every decision at a fixed q, ignoring the budget
    post = ~np.array([tr.warmup for tr in traces], dtype=bool)
    target = t_tok[post].sum()
    return {"aux": int(a_tok.sum()), "policy": int(p_tok.sum()), "aux_per_policy": float(a_tok.sum() / p_tok.sum()),
            # accounted as the budget counts them, and truly generated (NaN: every update a warm-up)
            "budget_ratio": float(c_tok[post].sum() / target) if target > 0 else float("nan"),
            "generated_ratio": float(g_tok[post].sum() / target) if target > 0 else float("nan")}


def _reach_difference(reach: list, base: list, value: Optional[int], base_value: Optional[int]) -> dict:
    """Updates to the threshold minus the reference's, over the same resamples of seeds."""
    both = [a - b for a, b in zip(reach, base) if a is not None and b is not None]
    ci = ([float(np.quantile(both, 0.025)), float(np.quantile(both, 0.975))] if both and len(both) == len(reach)
          else None)
    return {"value": None if value is None or base_value is None else value - base_value, "ci": ci,
            "both_reached_share": len(both) / len(reach)}


def run_learn(config: LearnConfig, *, log=lambda m: None) -> dict:
    """Tune every method's step size (unless ``lr_grid`` is empty), train every method at its own on
    every reporting seed; return curves, areas, CIs, updates to the threshold and paired differences."""
    for m in config.methods:
        check_env(m, config.env)  # before anything runs
    tuned = {}
    if config.lr_grid:
        seeds = tuning.tuning_seeds(config.seed, config.tune_seeds)
        log(f"tuning {len(config.methods)} methods on lr grid {', '.join(f'{x:g}' for x in config.lr_grid)} "
            f"with {len(seeds)} tuning seeds")
        tuned = tune_runs({m: (m, config, None) for m in config.methods}, config.lr_grid, seeds, config.max_widen,
                          config.jobs)
        for m, t in tuned.items():
            log(f"{m}: lr {t.lr:g} (tuning area {np.mean(t.scores[t.lr]):.3f})")
    lrs = {m: tuned[m].lr if tuned else config.lr for m in config.methods}
    seeds = [config.seed + s for s in range(config.seeds)]
    flat = train_many([Run(m, s, lrs[m], config) for m in config.methods for s in seeds], config.jobs, "reporting runs")
    traces = {m: flat[i * len(seeds):(i + 1) * len(seeds)] for i, m in enumerate(config.methods)}
    curves = {m: np.array([tr.values for tr in traces[m]]) for m in config.methods}
    areas = {m: [tuning.area(row) for row in c] for m, c in curves.items()}
    for m in config.methods:
        log(f"{m}: area {np.mean(areas[m]):.3f}, final V(s0) {curves[m][:, -1].mean():.3f} at lr {lrs[m]:g}")
    if config.threshold is not None:
        threshold, rule = float(config.threshold), "a fixed V(s0)"
    elif "grpo" in curves:
        threshold, rule = float(curves["grpo"][:, -1].mean()), f"GRPO's final mean V(s0) at its lr {lrs['grpo']:g}"
    else:
        threshold, rule = float("nan"), "none (no GRPO run and no fixed threshold)"
    draws = list(cs.resample_indices(config.seeds, CURVE_BOOT, seed=config.seed))  # shared: paired across methods
    reach = {m: [first_reach(c[idx].mean(axis=0), threshold) for idx in draws] for m, c in curves.items()}
    grpo_reach = first_reach(curves["grpo"].mean(axis=0), threshold) if "grpo" in curves else None
    out = {"config": asdict(config), "target": threshold, "threshold": {"value": threshold, "rule": rule},
           "measure": "area: the mean exact V(s0) over the updates (trapezoid area under the curve / updates)",
           "step_sizes": {"mode": "tuned" if tuned else "shared", "grid": list(config.lr_grid),
                          "rule": tuning.SELECTION_RULE if tuned else f"one shared lr {config.lr:g}, not tuned",
                          "tune_seeds": tuning.tuning_seeds(config.seed, config.tune_seeds) if tuned else [],
                          "reporting_seeds": seeds, "max_widen": config.max_widen, "chosen": lrs},
           "methods": {}}
    for m, c in curves.items():
        boots = np.array([c[idx].mean(axis=0) for idx in draws])
        reached = [r for r in reach[m] if r is not None]
        row = {
            "lr": lrs[m], "tuning": tuned[m].as_dict() if tuned else None,
            "curve": c.mean(axis=0).tolist(), "lo": np.quantile(boots, 0.025, axis=0).tolist(),
            "hi": np.quantile(boots, 0.975, axis=0).tolist(),
            "area": cs.bootstrap_ci(np.mean, np.array(areas[m]), seed=config.seed).as_dict(), "area_seeds": areas[m],
            "final": cs.bootstrap_ci(np.mean, c[:, -1], seed=config.seed).as_dict(),
            "updates_to_target": first_reach(c.mean(axis=0), threshold),
            "updates_to_target_ci": ([float(np.quantile(reached, 0.025)), float(np.quantile(reached, 0.975))]
                                     if len(reached) == len(reach[m]) else None),
            "reached_share": len(reached) / len(reach[m]),
            **_token_figures(traces[m]),
        }
        if "grpo" in curves:
            row["vs_grpo"] = {"area": tuning.paired_difference(areas[m], areas["grpo"]),
                              "updates_to_target": _reach_difference(reach[m], reach["grpo"], row["updates_to_target"],
                                                                     grpo_reach)}
        out["methods"][m] = row
    return out


def _ci(e: dict) -> str:
    return f"{e['value']:.3f} [{e['lo']:.3f}, {e['hi']:.3f}]"


def _vs_grpo(r: dict) -> tuple[str, str]:
    v = r.get("vs_grpo")
    if not v:
        return "", ""
    a = v["area"]
    area = (f"{a['mean']:+.3f} [{a['ci'][0]:+.3f}, {a['ci'][1]:+.3f}] "
            + ("excl. 0" if a["significant"] else "incl. 0")) if np.isfinite(a["ci"][0]) else f"{a['mean']:+.3f}"
    u = v["updates_to_target"]
    ups = "n/a" if u["value"] is None else (f"{u['value']:+d}" + (f" [{u['ci'][0]:+.0f}, {u['ci'][1]:+.0f}]" if u["ci"]
                                                                   else ""))
    return area, ups


def format_learn(res: dict) -> str:
    """The table: each method's step size, area, its paired difference from GRPO's, final value, updates
    to the threshold, tokens; then the tuning scores and any pick at an edge of the grid."""
    st, cfg = res["step_sizes"], res["config"]
    width = max(10, *(len(m) + 1 for m in res["methods"]))
    first = next(iter(res["methods"].values()))
    lines = [f"exact V(s0): initial {first['curve'][0]:.3f}; area = mean exact V(s0) over the {cfg['updates']} "
             f"updates (trapezoid); threshold {res['threshold']['value']:.3f} = {res['threshold']['rule']}"]
    if st["mode"] == "tuned":
        lines.append(f"step sizes: each method at its own, tuned on lr grid {', '.join(f'{x:g}' for x in st['grid'])} "
                     f"with {len(st['tune_seeds'])} tuning seeds ({st['tune_seeds'][0]}-{st['tune_seeds'][-1]}), "
                     f"reported on {len(st['reporting_seeds'])} other seeds; rule: {st['rule']}")
    else:
        lines.append(f"step size: one shared lr={cfg['lr']:g} for every method, not tuned: every difference below is "
                     "measured at one shared step size, so none is a method's win (a method with a larger update "
                     "gains from the step size alone)")
    lines.append(f"{'method':<{width}} {'lr':>6} {'area [95% CI]':>22} {'area - GRPO, paired [95% CI]':>32} "
                 f"{'final V(s0) [95% CI]':>22} {'updates to threshold [CI]':>26} {'- GRPO [CI]':>14} "
                 f"{'aux/policy tok':>15} {'accounted/budget':>17} {'generated/budget':>17}")
    for m, r in res["methods"].items():
        ut, ci = r["updates_to_target"], r["updates_to_target_ci"]
        reach = "never" if ut is None else (f"{ut}" + (f" [{ci[0]:.0f}, {ci[1]:.0f}]" if ci else
                                                         f" (reached in {100 * r['reached_share']:.0f}% of resamples)"))
        d_area, d_ups = _vs_grpo(r) if m != "grpo" else ("", "")
        lines.append(f"{m:<{width}} {r['lr']:>6g} {_ci(r['area']):>22} {d_area:>32} {_ci(r['final']):>22} "
                     f"{reach:>26} {d_ups:>14} {r['aux_per_policy']:>15.2f} {r['budget_ratio']:>17.3f} "
                     f"{r['generated_ratio']:>17.3f}")
    lines.append(f"(paired: the same {len(st['reporting_seeds'])} seeds and factual noise for every method; area - "
                 "GRPO: mean over seeds with a t interval; budget = beta x policy tokens, beta = "
                 f"{cfg['beta']}; Twice after its {cfg['warmup_updates']}-update predictor warm-up; accounted: each "
                 "branched decision charged its planned cost, as the budget counts; generated: tokens truly sampled)")
    if st["mode"] == "tuned":
        lines += format_tuning({m: r["tuning"] for m, r in res["methods"].items()}, width)
    return "\n".join(lines) + "\n"


def format_tuning(tunings: dict, width: int = 12, label: str = "method") -> list[str]:
    """The tuning table of ``{label: Tuned.as_dict()}`` (each step size's mean area over the tuning seeds,
    ``*`` the pick) and a line for each pick that sat at an end of the grid."""
    tried = sorted({float(x) for t in tunings.values() for x in t["tried"]})
    lines = ["tuning: mean area over the tuning seeds per lr (* the pick)",
             f"{label:<{width}} " + " ".join(f"{x:>9g}" for x in tried)]
    for m, t in tunings.items():
        cells = [(f"{t['mean_area'][f'{x:g}']:.3f}" + ("*" if x == t["lr"] else " ")) if f"{x:g}" in t["mean_area"]
                 else "-" for x in tried]
        lines.append(f"{m:<{width}} " + " ".join(f"{c:>9}" for c in cells))
    for m, t in tunings.items():
        line = tuning.describe_pick(m, tuning.Tuned(lr=t["lr"], grid=t["grid"], widened=t["widened"],
                                                    edge_of_grid=t["edge_of_grid"], at_edge=t["at_edge"]))
        if line:
            lines.append("edge: " + line)
    return lines


def write_learn(res: dict, out_dir: Path) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "learn.json", json.dumps(res, indent=1))
    n = len(next(iter(res["methods"].values()))["curve"])
    png = plot_bands(np.arange(n), {f"{m} (lr {r['lr']:g})": (r["curve"], r["lo"], r["hi"])
                                    for m, r in res["methods"].items()}, out_dir / "learn.png", hline=res["target"])
    return {"json": out_dir / "learn.json", "png": png}


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="twice bench learn", description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default=LearnConfig.env, choices=tuple(LEARN_ENVS))
    p.add_argument("--seeds", type=int, default=LearnConfig.seeds, help="reporting seeds per method")
    p.add_argument("--updates", type=int, default=LearnConfig.updates)
    p.add_argument("--groups", type=int, default=LearnConfig.groups)
    tuning.add_step_size_args(p, what="method", tune_seeds=LearnConfig.tune_seeds, max_widen=LearnConfig.max_widen,
                              lr=LearnConfig.lr)
    p.add_argument("--threshold", type=float, default=None,
                   help="V(s0) whose first reach is counted (default: GRPO's final mean at its step size)")
    p.add_argument("--beta", type=float, default=LearnConfig.beta)
    p.add_argument("--methods", nargs="+", default=list(registered_methods("learn")), choices=registered_methods())
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=2, help="processes the runs spread over (default 2)")
    p.add_argument("--out", default="runs/bench_learn")
    add_setting_args(p)
    progress.add_argument(p)
    a = p.parse_args(argv)
    progress.apply(a)
    if "grpo" not in a.methods:
        p.error("--methods must include grpo (the reference of the paired differences)")
    try:
        text_setting = text_setting_from_args(a) if a.env == "TextLab-v0" else TextLabSetting()
        choice_setting = choice_setting_from_args(a) if a.env == "ChoiceLab-v0" else ChoiceLabSetting()
        cfg = LearnConfig(env=a.env, setting=setting_from_args(a), text_setting=text_setting,
                          choice_setting=choice_setting,
                          methods=tuple(a.methods), seeds=a.seeds, updates=a.updates, groups=a.groups,
                          threshold=a.threshold, beta=a.beta, seed=a.seed, jobs=a.jobs,
                          **tuning.step_size_settings(a, LearnConfig.lr))
    except ValueError as exc:
        p.error(str(exc))
    t0 = time.time()
    res = run_learn(cfg, log=stderr_log("learn"))
    print(format_learn(res), end="")
    paths = write_learn(res, Path(a.out))
    print(f"written: {', '.join(str(v) for v in paths.values())} ({time.time() - t0:.0f} s)")
    return 0
