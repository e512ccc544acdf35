"""``twice bench coupling``: the coupling curve. What coupled twins are worth, against how coupled they are.

ChoiceLab's knob ``shuffle`` (:mod:`~twice_envs.agents.lab.choice_lab`) changes how much of the factual
episode's luck a coupled twin shares, and nothing else: the policy, its exact values and the law of every
factual episode are the same at every value. The bench sweeps it over ``shuffles`` (the *points*) and at each:

1. **rho-bar** with its 95% CI, and the **wrong-sign** rates of the raw twin credit ``U - U'`` of coupled
   twins and of independent counterfactuals against the exact ``A*``, with their ratio (one audit batch of the
   initial policy, :func:`~twice_envs.agents.bench.coupling_probe.pair_audit`);
2. the **sampled policy gradient** of coupled Twice against the exact gradient at the initial policy: cosine and
   relative error (:mod:`~twice_envs.agents.bench.coupling_probe`, which says exactly how both are computed);
3. the **learning gain** of coupling: Twice's area under the exact-value curve minus that of Twice with
   independent twins (the ``independent-twins`` ablation) at the same auxiliary budget ``beta``, paired seed by
   seed (the same factual noise seeds and tasks), mean with a 95% t interval; the same against CRR.

**Arms that the knob cannot change run once.** The knob only permutes which noise a candidate reads, and a
permutation of independent noise is independent noise of the same law; so every run whose draws after a branch
read fresh noise (independent twins at every budget, CRR's independent counterfactuals) has the same law at
every point. These arms run once, at ``invariant_shuffle``, and every point is compared with the same runs
(paired by seed: the seeds fix the tasks and the factual batches' noise keys). Only coupled Twice runs per point.

**Step sizes.** Every arm (coupled Twice at each point, independent twins at each budget, CRR) gets its own step
size, tuned on ``lr_grid`` with tuning seeds apart from the reporting seeds by
:func:`~twice_envs.agents.bench.tuning.tune_all` (its rule, and the widening of the grid where a pick sits at
an end); runs are :func:`~twice_envs.agents.bench.learn.train_one`, the learning bench's.

**The exchange rate.** Independent twins at the budgets ``beta x budgets`` give learning area against budget.
Coupled Twice's area at a point is placed on that curve (its running maximum over budgets, so that it rises):
the multiple ``b`` of ``beta`` at which independent twins would learn as coupled Twice does, by linear
interpolation of the area in ``log b`` between the two measured budgets around it. It is *measured worth* in
budget units, printed beside the published prediction ``1 / (1 - rho-bar)``. Where coupled Twice's area lies
below the smallest budget's area or above the largest's, no value is extrapolated: the worth is reported as a
bound (``< smallest`` or ``> largest`` budget measured). Its 95% CI comes from resampling seeds (the same
resamples for every arm), with ends that fall outside the measured budgets printed as bounds.

**Predicted gain** (the plot's overlay): the area independent twins reach at ``1 / (1 - rho-bar)`` times the
budget (interpolated on the same curve) minus their area at the budget: the gain that coupling would bring if it
were worth exactly its prediction; a prediction beyond the largest budget measured gives a lower bound.

**Sizes.** The defaults are smaller than ``twice bench learn``'s (8 reporting seeds x 20 updates against its
10 x 30; a grid 4, 8, 16 of ratio 2 with 2 tuning seeds) so that the 11 arms' tuning and reporting runs fit about
30 minutes on two cores; ``--quick`` is a tiny world for a smoke test. rho-bar's floor on ChoiceLab is about
0.23 (at ``shuffle`` 1): a coupled twin whose alternative is the factual turn is a self-twin (``U' = U``), one in
``options`` at the initial policy, and a twin's memory can meet the factual one's again and re-couple.

**Bad input** is refused before any learning run: a ``rho_range`` that the measured rho-bars do not reach
(within :data:`RHO_TOL`), naming the range reached; a grid of one step size; budgets without 1.

Outputs: the table on stdout, ``coupling.json`` and ``coupling.png`` in ``--out``; learning runs are kept in
``runs.jsonl`` there as they finish, so an interrupted run resumes where it stopped (a changed configuration
starts afresh).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from twice_envs import progress
from twice_envs.agents import stats as cs
from twice_envs.agents.bench import coupling_probe as probe
from twice_envs.agents.bench import learn, tuning
from twice_envs.agents.bench.coupling_report import format_coupling, plot_coupling
from twice_envs.agents.bench.output import stderr_log
from twice_envs.agents.credit import twice
from twice_envs.agents.credit.ablations import apply_ablations
from twice_envs.agents.lab.choice_lab import ChoiceLabSetting, choice_lab_policy
from twice_envs.agents.lab.coupling import budget_multiple
from twice_envs.envs.choicelab.env import ChoiceLabConfig
from twice_envs.trajectory import atomic_write_text

#: A requested rho-bar range counts as reached when the measured rho-bars come within this of both ends.
RHO_TOL = 0.05
#: Methods whose sampled gradients are measured beside the arms, as references (the knob changes neither).
REFERENCE_GRADIENTS = ("grpo", "exact-advantage")
#: The world ``--quick`` trains on (seconds).
QUICK_WORLD = ChoiceLabConfig(tasks=8, horizon=4, options=4, attributes=8, per_option=2)


@dataclass
class CouplingConfig:
    """Sizes of ``twice bench coupling`` (defaults: the reported run, under 30 minutes on two cores)."""

    shuffles: tuple = (0.0, 0.1, 0.2, 0.35, 0.6, 1.0)
    """ChoiceLab ``shuffle`` values, the points of the curve."""
    rho_range: Optional[tuple] = None
    """``(lo, hi)``: refuse unless the points' rho-bars reach both ends (within :data:`RHO_TOL`); None: no check."""
    world: ChoiceLabConfig = field(default_factory=ChoiceLabConfig)
    """ChoiceLab's world."""
    invariant_shuffle: float = 0.5
    """The ``shuffle`` at which the arms the knob cannot change run (independent twins, CRR)."""
    beta: float = 0.7
    """The auxiliary budget of coupled Twice, of the equal-budget independent twins and of CRR."""
    budgets: tuple = (0.5, 1.0, 2.0, 4.0)
    """Independent twins' budgets as multiples of ``beta`` (must hold 1, the equal budget)."""
    audit_groups: int = 24
    """Groups of 5 episodes of each point's pair audit."""
    gradient_batches: int = 12
    """Batches of the sampled-gradient measure per arm (after ``warmup_updates`` warm-up batches)."""
    seeds: int = 8
    """Reporting seeds per arm."""
    updates: int = 20
    """Updates per learning run."""
    groups: int = 8
    """Groups per update (the learning bench's batch)."""
    group_size: int = 5
    """Episodes per group."""
    lr_grid: tuple = (4.0, 8.0, 16.0)
    """Step sizes tuned per arm (two or more)."""
    tune_seeds: int = 2
    """Tuning runs per step size (seeds apart from the reporting ones)."""
    max_widen: int = 2
    """Step sizes the grid may gain beyond an end where a pick sits there."""
    warmup_updates: int = 3
    """Twice's predictor warm-up."""
    seed: int = 0
    """Base seed."""
    jobs: int = 2
    """Processes the learning runs spread over (the figures do not depend on it)."""

    def __post_init__(self) -> None:
        self.shuffles = tuple(float(s) for s in self.shuffles)
        if len(self.shuffles) < 2 or len(set(self.shuffles)) != len(self.shuffles):
            raise ValueError(f"shuffles needs two distinct values or more, got {list(self.shuffles)}")
        for s in (*self.shuffles, self.invariant_shuffle):
            if not 0 <= s <= 1:
                raise ValueError(f"every shuffle must lie in [0, 1], got {s}")
        self.lr_grid = tuning.check_grid(self.lr_grid, "lr_grid")
        self.budgets = tuple(sorted({float(b) for b in self.budgets}))
        if 1.0 not in self.budgets or len(self.budgets) < 2 or min(self.budgets) <= 0:
            raise ValueError(f"budgets must be multiples of beta above 0, two or more, including 1 (the equal "
                             f"budget), got {list(self.budgets)}")
        if self.rho_range is not None:
            lo, hi = (float(x) for x in self.rho_range)
            if not -1 <= lo < hi <= 1:
                raise ValueError(f"rho_range must be two numbers -1 <= lo < hi <= 1, got {list(self.rho_range)}")
            self.rho_range = (lo, hi)
        for name in ("audit_groups", "gradient_batches", "seeds", "updates", "groups", "group_size", "tune_seeds",
                     "jobs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.gradient_batches < 2:
            raise ValueError(f"gradient_batches must be >= 2 (a CI over batches), got {self.gradient_batches}")
        if not self.beta > 0 or self.max_widen < 0 or self.warmup_updates < 0 or self.seed < 0:
            raise ValueError(f"beta must be > 0 and max_widen, warmup_updates, seed >= 0; got beta={self.beta}, "
                             f"max_widen={self.max_widen}, warmup_updates={self.warmup_updates}, seed={self.seed}")
        if self.seeds > tuning.TUNE_SEED_OFFSET:
            raise ValueError(f"seeds must be at most {tuning.TUNE_SEED_OFFSET} (the tuning seeds follow)")
        ChoiceLabSetting(world=self.world)  # a world too large for its exact oracle is refused here


def quick_config(**overrides) -> CouplingConfig:
    """A configuration that runs in seconds (tests, ``--quick``)."""
    sizes = dict(shuffles=(0.0, 1.0), world=QUICK_WORLD, budgets=(1.0, 2.0), audit_groups=3, gradient_batches=2,
                 seeds=2, updates=2, groups=2, group_size=3, lr_grid=(4.0, 8.0), tune_seeds=1, max_widen=0,
                 warmup_updates=1, jobs=1)
    return CouplingConfig(**{**sizes, **overrides})


# --------------------------------------------------------------------------- arms and runs


def setting(config: CouplingConfig, shuffle: float) -> ChoiceLabSetting:
    return ChoiceLabSetting(world=config.world, shuffle=shuffle)


def coupled_arm(shuffle: float) -> str:
    return f"twice@{shuffle:g}"


def independent_arm(budget: float) -> str:
    return f"independent x{budget:g}"


def arms(config: CouplingConfig) -> dict:
    """``{name: (method, learn config, twice config)}``: coupled Twice at every point, then the knob-invariant
    arms (independent twins at every budget, CRR) at ``invariant_shuffle``."""
    def learn_config(shuffle: float, beta: float) -> learn.LearnConfig:
        return learn.LearnConfig(env="ChoiceLab-v0", choice_setting=setting(config, shuffle), methods=("twice",),
                                 lr_grid=(), seeds=config.seeds, updates=config.updates, groups=config.groups,
                                 group_size=config.group_size, beta=beta, warmup_updates=config.warmup_updates,
                                 seed=config.seed)

    independent = apply_ablations(twice.TwiceConfig(), ["independent-twins"])
    out = {coupled_arm(s): ("twice", learn_config(s, config.beta), None) for s in config.shuffles}
    for b in config.budgets:
        out[independent_arm(b)] = ("twice", learn_config(config.invariant_shuffle, config.beta * b), independent)
    out["crr"] = ("crr", learn_config(config.invariant_shuffle, config.beta), None)
    return out


def fingerprint(config: CouplingConfig) -> str:
    """What the kept runs depend on (everything but ``jobs`` and ``rho_range``)."""
    d = {k: v for k, v in asdict(config).items() if k not in ("jobs", "rho_range")}
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _train(run: learn.Run) -> learn.RunTrace:
    return learn.train_one(run.method, run.seed, run.config, lr=run.lr, twice_config=run.twice_config)


class RunStore:
    """Learning runs keyed by ``(arm, seed, lr)``, kept in a JSON-lines file as they finish (None: in memory)."""

    def __init__(self, path: Optional[Path], config: CouplingConfig):
        self.path, self.fp, self.traces = path, fingerprint(config), {}
        if path is not None and path.exists():
            for line in path.read_text().splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut short by an interruption
                if row.get("fp") == self.fp:
                    self.traces[tuple(row["key"])] = learn.RunTrace(**row["trace"])

    def run(self, todo: Sequence[tuple], table: dict, jobs: int, what: str) -> list:
        """The traces of ``todo`` (``(arm, seed, lr)`` each, ``table`` the arms), running those not kept yet."""
        keys = [(a, int(s), float(lr)) for a, s, lr in todo]
        missing = list(dict.fromkeys(k for k in keys if k not in self.traces))
        runs = {k: learn.Run(table[k[0]][0], k[1], k[2], table[k[0]][1], table[k[0]][2]) for k in missing}
        with progress.Progress(f"bench coupling: {what}", len(missing), unit="runs") as bar:
            if jobs <= 1 or len(missing) <= 1:
                for k in missing:
                    self._keep(k, _train(runs[k]))
                    bar.update()
            else:
                spawn = multiprocessing.get_context("spawn")
                with ProcessPoolExecutor(max_workers=min(jobs, len(missing)), mp_context=spawn) as pool:
                    futures = {pool.submit(_train, runs[k]): k for k in missing}
                    for f in as_completed(futures):
                        self._keep(futures[f], f.result())
                        bar.update()
        return [self.traces[k] for k in keys]

    def _keep(self, key: tuple, trace: learn.RunTrace) -> None:
        self.traces[key] = trace
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as fh:
                fh.write(json.dumps({"fp": self.fp, "key": list(key), "trace": trace._asdict()}) + "\n")


# --------------------------------------------------------------------------- the exchange rate


def _envelope(budgets: Sequence[float], areas: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(budgets)
    return np.log(np.asarray(budgets, dtype=np.float64)[order]), np.maximum.accumulate(np.asarray(areas)[order])


def budget_for_area(budgets: Sequence[float], areas: Sequence[float], target: float) -> float:
    """The budget multiple at which the area-against-budget curve (its running maximum) reaches ``target``, by
    linear interpolation in log budget; ``-inf`` below the smallest budget's area, ``inf`` above the largest's."""
    x, y = _envelope(budgets, areas)
    if target < y[0]:
        return float("-inf")
    if target > y[-1]:
        return float("inf")
    j = int(np.argmax(y >= target))
    if j == 0 or y[j] == y[j - 1]:
        return float(np.exp(x[j]))
    return float(np.exp(x[j - 1] + (target - y[j - 1]) / (y[j] - y[j - 1]) * (x[j] - x[j - 1])))


def area_at_budget(budgets: Sequence[float], areas: Sequence[float], budget: float) -> float:
    """The running-maximum curve's area at ``budget`` (interpolated in log budget; NaN outside the budgets)."""
    x, y = _envelope(budgets, areas)
    lb = np.log(budget) if budget > 0 else float("-inf")
    if not np.isfinite(lb) or lb < x[0] - 1e-12 or lb > x[-1] + 1e-12:
        return float("nan")
    return float(np.interp(lb, x, y))


def exchange_rate(coupled: Sequence[float], independent: dict, draws: Sequence[np.ndarray]) -> dict:
    """Coupled Twice's worth in budget multiples: ``coupled`` its areas by seed, ``independent`` ``{budget: areas by
    seed}`` (the same seeds), ``draws`` resamples of the seeds. ``value``/``lo``/``hi`` are multiples, ``-inf``
    meaning below the smallest budget measured and ``inf`` above the largest (bounds, never extrapolated)."""
    budgets = sorted(independent)
    c = np.asarray(coupled, dtype=np.float64)
    ind = np.array([independent[b] for b in budgets], dtype=np.float64)

    def rate(idx) -> float:
        return budget_for_area(budgets, ind[:, idx].mean(axis=1), float(c[idx].mean()))

    boots = np.array([rate(idx) for idx in draws])
    lo, hi = (float(np.quantile(boots, q, method="inverted_cdf")) for q in (0.025, 0.975))
    return {"value": rate(np.arange(len(c))), "lo": lo, "hi": hi, "measured": [min(budgets), max(budgets)]}


# --------------------------------------------------------------------------- the bench


class RhoRangeError(ValueError):
    """The knob values cannot reach the requested rho-bar range."""


def check_rho_range(rhos: Sequence[float], wanted: Optional[tuple]) -> None:
    """:class:`RhoRangeError` naming the range reached when the points' rho-bars do not reach ``wanted`` (within
    :data:`RHO_TOL` at both ends)."""
    if wanted is None:
        return
    lo, hi = min(rhos), max(rhos)
    if lo > wanted[0] + RHO_TOL or hi < wanted[1] - RHO_TOL:
        raise RhoRangeError(f"the shuffle values cannot reach the requested rho-bar range [{wanted[0]:g}, "
                            f"{wanted[1]:g}]: they reached [{lo:.3f}, {hi:.3f}] (ChoiceLab's shuffle spans rho-bar "
                            f"from about 0.95 at 0 to about 0.23 at 1; a point counts within {RHO_TOL} of an end)")


def audits(config: CouplingConfig, log) -> dict:
    """Each point's pair audit (:func:`~twice_envs.agents.bench.coupling_probe.pair_audit`), keyed by shuffle."""
    out = {}
    with progress.Progress("bench coupling: pair audits", len(config.shuffles), unit="points") as bar:
        for s in config.shuffles:
            out[s] = probe.pair_audit(setting(config, s), config.audit_groups, seed=config.seed)
            log(f"shuffle {s:g}: rho-bar {out[s]['rho_bar']['value']:.3f} [{out[s]['rho_bar']['lo']:.3f}, "
                f"{out[s]['rho_bar']['hi']:.3f}]")
            bar.update()
    return out


def gradients(config: CouplingConfig, table: dict) -> dict:
    """Cosine and error of every arm's sampled gradient at the initial policy, plus GRPO and Exact A* as
    references (the knob changes neither), keyed by arm."""
    exact = probe.exact_gradient(choice_lab_policy(setting(config, config.invariant_shuffle)))
    rows = {name: (m, c.choice_setting.shuffle, tc, c.beta) for name, (m, c, tc) in table.items()
            if not name.startswith("independent") or name == independent_arm(1.0)}
    rows.update({m: (m, config.invariant_shuffle, None, config.beta) for m in REFERENCE_GRADIENTS})
    out = {}
    with progress.Progress("bench coupling: gradients", len(rows), unit="arms") as bar:
        for name, (m, s, tc, beta) in rows.items():
            g = probe.sampled_gradients(m, setting(config, s), twice_config=tc, beta=beta,
                                        batches=config.gradient_batches, warmup=config.warmup_updates,
                                        groups=config.groups, group_size=config.group_size, seed=config.seed)
            out[name] = probe.gradient_figures(g, exact, seed=config.seed)
            bar.update()
    return out


def _token_ratio(traces: Sequence[learn.RunTrace]) -> dict:
    aux = sum(sum(t.aux) for t in traces)
    pol = sum(sum(t.policy) for t in traces)
    acc = sum(a for t in traces for a, w in zip(t.accounted, t.warmup) if not w)
    tgt = sum(a for t in traces for a, w in zip(t.target, t.warmup) if not w)
    return {"aux_per_policy": aux / pol if pol else float("nan"), "accounted_per_budget": acc / tgt if tgt else
            float("nan")}


def learning(config: CouplingConfig, table: dict, store: RunStore, log) -> dict:
    """Every arm's step size (tuned) and its areas on the reporting seeds: ``{arm: {"lr", "tuning", "areas",
    "final", tokens}}``."""
    tune = tuning.tuning_seeds(config.seed, config.tune_seeds)

    def score_many(pairs: list) -> list:
        traces = store.run([(k, s, lr) for k, lr in pairs for s in tune], table, config.jobs, "tuning runs")
        areas = [tuning.area(t.values) for t in traces]
        return [areas[i * len(tune):(i + 1) * len(tune)] for i in range(len(pairs))]

    tuned = tuning.tune_all(score_many, list(table), config.lr_grid, config.max_widen)
    log("step sizes: " + ", ".join(f"{k} {t.lr:g}" for k, t in tuned.items()))
    seeds = [config.seed + k for k in range(config.seeds)]
    traces = store.run([(k, s, tuned[k].lr) for k in table for s in seeds], table, config.jobs, "reporting runs")
    out = {}
    for i, k in enumerate(table):
        tr = traces[i * len(seeds):(i + 1) * len(seeds)]
        out[k] = {"lr": tuned[k].lr, "tuning": tuned[k].as_dict(), "areas": [tuning.area(t.values) for t in tr],
                  "final": [float(t.values[-1]) for t in tr], **_token_ratio(tr)}
        out[k]["area"] = cs.bootstrap_ci(np.mean, np.array(out[k]["areas"]), seed=config.seed).as_dict()
    return out


def run_coupling(config: CouplingConfig, *, out_dir: Optional[Path] = None, log=lambda m: None) -> dict:
    """The whole curve (see the module): audits first (refusing an unreachable ``rho_range``), then gradients,
    then learning; returns the JSON-ready result."""
    table = arms(config)
    audit = audits(config, log)
    check_rho_range([audit[s]["rho_bar"]["value"] for s in config.shuffles], config.rho_range)
    grads = gradients(config, table)
    store = RunStore(None if out_dir is None else Path(out_dir) / "runs.jsonl", config)
    learned = learning(config, table, store, log)
    draws = list(cs.resample_indices(config.seeds, 1000, seed=config.seed))
    independent = {b: learned[independent_arm(b)]["areas"] for b in config.budgets}
    ind_means = [float(np.mean(independent[b])) for b in config.budgets]
    base = learned[independent_arm(1.0)]
    points = []
    for s in config.shuffles:
        arm = learned[coupled_arm(s)]
        a = audit[s]
        predicted = budget_multiple(a["rho_bar"])
        x = 1.0 / (1.0 - a["rho_bar"]["value"]) if a["rho_bar"]["value"] < 1 else float("inf")
        area_pred = area_at_budget(config.budgets, ind_means, min(x, max(config.budgets)))
        points.append({
            "shuffle": s, "audit": a, "gradient": grads[coupled_arm(s)], "lr": arm["lr"], "area": arm["area"],
            "gain": tuning.paired_difference(arm["areas"], base["areas"]),
            "vs_crr": tuning.paired_difference(arm["areas"], learned["crr"]["areas"]),
            "worth_measured": exchange_rate(arm["areas"], independent, draws),
            "worth_predicted": {**predicted, "point": x},
            "gain_predicted": {"value": area_pred - ind_means[config.budgets.index(1.0)],
                               "lower_bound": bool(x > max(config.budgets))},
        })
        log(f"shuffle {s:g}: gain {points[-1]['gain']['mean']:+.4f}, worth {points[-1]['worth_measured']['value']:.3g}"
            f" (predicted {x:.3g})")
    return {"config": asdict(config), "env": "ChoiceLab-v0", "knob": "shuffle", "points": points,
            "arms": learned, "gradients": grads,
            "step_sizes": {"grid": list(config.lr_grid), "rule": tuning.SELECTION_RULE,
                           "tune_seeds": tuning.tuning_seeds(config.seed, config.tune_seeds),
                           "reporting_seeds": [config.seed + k for k in range(config.seeds)]},
            "measure": "area: the mean exact V(s0) over the updates (trapezoid area under the curve / updates)"}


def write_coupling(res: dict, out_dir: Path) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "coupling.json", json.dumps(res, indent=1, default=float))
    return {"json": out_dir / "coupling.json", "png": plot_coupling(res, out_dir / "coupling.png")}


def _floats(text: str, name: str) -> tuple:
    try:
        return tuple(float(v) for v in text.replace(" ", "").split(",") if v)
    except ValueError:
        raise ValueError(f"{name} must be comma-separated numbers, got {text!r}") from None


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="twice bench coupling", description=__doc__.split("\n\n")[0])
    d = CouplingConfig
    p.add_argument("--shuffles", default=None, help="ChoiceLab shuffle values, comma-separated (default "
                   f"{','.join(f'{s:g}' for s in d.shuffles)})")
    p.add_argument("--rho-range", nargs=2, type=float, default=None, metavar=("LO", "HI"),
                   help="refuse unless the points' rho-bars reach this range (checked before any learning run)")
    p.add_argument("--budgets", default=None, help="independent twins' budgets as multiples of beta, comma-separated, "
                   f"including 1 (default {','.join(f'{b:g}' for b in d.budgets)})")
    p.add_argument("--beta", type=float, default=d.beta)
    p.add_argument("--seeds", type=int, default=d.seeds, help="reporting seeds per arm")
    p.add_argument("--updates", type=int, default=d.updates)
    p.add_argument("--groups", type=int, default=d.groups)
    p.add_argument("--audit-groups", type=int, default=d.audit_groups)
    p.add_argument("--gradient-batches", type=int, default=d.gradient_batches)
    p.add_argument("--lr-grid", default=None, help="step sizes tuned per arm, comma-separated, two or more (default "
                   f"{','.join(f'{x:g}' for x in d.lr_grid)})")
    p.add_argument("--tune-seeds", type=int, default=d.tune_seeds)
    p.add_argument("--max-widen", type=int, default=d.max_widen)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=d.jobs, help="processes the learning runs spread over (default 2)")
    p.add_argument("--quick", action="store_true", help="a tiny world and sizes: seconds (a smoke test)")
    p.add_argument("--out", default="runs/bench_coupling")
    progress.add_argument(p)
    a = p.parse_args(argv)
    progress.apply(a)
    try:
        given = {"rho_range": tuple(a.rho_range) if a.rho_range else None}
        if a.shuffles:
            given["shuffles"] = _floats(a.shuffles, "--shuffles")
        if a.budgets:
            given["budgets"] = _floats(a.budgets, "--budgets")
        if a.lr_grid:
            given["lr_grid"] = tuning.parse_grid(a.lr_grid)
        if a.quick:
            cfg = quick_config(**given, seed=a.seed)
        else:
            cfg = CouplingConfig(**given, beta=a.beta, seeds=a.seeds, updates=a.updates, groups=a.groups,
                                 audit_groups=a.audit_groups, gradient_batches=a.gradient_batches,
                                 tune_seeds=a.tune_seeds, max_widen=a.max_widen, seed=a.seed, jobs=a.jobs)
    except ValueError as exc:
        p.error(str(exc))
    t0 = time.time()
    try:
        res = run_coupling(cfg, out_dir=Path(a.out), log=stderr_log("coupling"))
    except RhoRangeError as exc:  # found before any learning run
        p.exit(2, f"twice bench coupling: error: {exc}\n")
    print(format_coupling(res), end="")
    paths = write_coupling(res, Path(a.out))
    print(f"written: {', '.join(str(v) for v in paths.values())} ({time.time() - t0:.0f} s)")
    return 0
