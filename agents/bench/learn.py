"""``twice bench learn``: lab policies (SearchToy or TextLab) trained with each credit method.

Every method starts from the same initial policy (:func:`~twice_envs.agents.lab.runner.lab_policy`:
SearchToy's tabular softmax, or TextLab's multi-line policy whose action logits are trained)
and samples the same factual batches' noise seeds; after every update the policy's
exact ``V(s0)`` is computed by dynamic programming, so a curve has no evaluation noise.
Advantages come from :func:`~twice_envs.agents.rollout.twins.credit_step` (the project's
estimators) with the lab's twin runners; Twice and CRR spend the same auxiliary budget
``beta`` x policy tokens, VinePPO its ``K`` rollouts per state. The update is the
policy's own score-function gradient, ``theta += lr policy.policy_gradient(episodes, A)``
(for the tabular softmax ``theta[s] += lr mean_episodes sum_t A_t (e_a - pi(s)) / T``).

Reported: mean curves with 95% bootstrap bands over seeds, each method's final value,
realised auxiliary tokens over ``beta`` x policy tokens (Twice: after its warm-up),
and the updates each method needs for its mean curve to reach GRPO's final mean value
(CI: bootstrap over seeds; ``None`` where it never does within the run).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import NamedTuple, Optional, Sequence

import numpy as np

from twice_envs.agents import stats as cs
from twice_envs.agents.credit import twice
from twice_envs.agents.credit.registry import check_env, get_method
from twice_envs.agents.credit.registry import methods as registered_methods
from twice_envs.agents.lab import toy
from twice_envs.agents.lab.plots import plot_bands
from twice_envs.agents.lab.runner import (
    add_setting_args,
    lab_critic,
    lab_policy,
    lab_step_fns,
    setting_from_args,
    text_setting_from_args,
)
from twice_envs.agents.lab.search_toy import SearchToySetting
from twice_envs.agents.lab.text_lab import TextLabSetting
from twice_envs.agents.rollout.twins import credit_step
from twice_envs.trajectory import atomic_write_text

#: The lab envs this bench trains on (policies with exact values and a ``policy_gradient``).
LEARN_ENVS = ("SearchToy-v0", "TextLab-v0")


@dataclass
class LearnConfig:
    """Sizes of ``twice bench learn`` (defaults: a few minutes on two shared cores)."""

    env: str = "SearchToy-v0"
    """Lab env (one of :data:`LEARN_ENVS`)."""
    setting: SearchToySetting = field(default_factory=SearchToySetting)
    """SearchToy's world and initial policy (SearchToy-v0)."""
    text_setting: TextLabSetting = field(default_factory=TextLabSetting)
    """TextLab's world, initial policy and key layout (TextLab-v0)."""
    methods: tuple = field(default_factory=lambda: registered_methods("learn"))
    """Credit methods to train (default: the registered methods that join this bench)."""
    seeds: int = 10
    """Independent runs per method."""
    updates: int = 30
    """Policy-gradient updates per run."""
    groups: int = 8
    """GRPO groups per update."""
    group_size: int = 5
    """Episodes per group."""
    lr: float = 1.0
    """Step size of the tabular policy gradient."""
    beta: float = 0.7
    """Auxiliary budget of Twice and CRR."""
    vine_k: int = 1
    """VinePPO rollouts per state (1: its cheapest form)."""
    warmup_updates: int = 3
    """Twice's predictor warm-up (branch probability ``warmup_q``)."""
    seed: int = 0
    """Base seed."""


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


def train_one(method: str, seed: int, config: LearnConfig, *,
              twice_config: Optional[twice.TwiceConfig] = None) -> RunTrace:
    """One run of ``method`` (``twice_config``: the twin-credit settings, default the published ones;
    ``beta`` and the warm-up always come from ``config``)."""
    if config.env not in LEARN_ENVS:
        raise ValueError(f"bench learn env must be one of {LEARN_ENVS}, got {config.env!r}")
    check_env(method, config.env)
    policy = lab_policy(config.env, config.setting, config.text_setting)
    tcfg = replace(twice_config or twice.TwiceConfig(), beta=config.beta, warmup_updates=config.warmup_updates)
    rng = np.random.default_rng([seed, 7])
    state = None
    values, aux, ptoks, accounted, warm, target, generated = [policy.value], [], [], [], [], [], []
    group_size = config.group_size * get_method(method).rollouts
    critic = lab_critic(method, policy)  # one per run, carried across its updates (None: not needed)
    for u in range(config.updates):
        eps, envs = toy.toy_rollouts(policy, config.groups, group_size, noise_seed=seed * 100_003 + u)
        res = credit_step(method, policy, eps, config=tcfg, sampling=None, rng=rng, update=u,
                          noise_seed=seed * 100_003 + u, predictor_state=state, vine_k=config.vine_k, critic=critic,
                          **lab_step_fns(envs))
        state = res.predictor_state or state
        aux.append(res.aux_tokens)
        accounted.append(float(res.stats.get("aux_accounted", res.aux_tokens)))
        warm.append(bool(res.stats.get("warmup", False)))
        ptoks.append(sum(e.num_generated_tokens for e in eps))
        target.append(float(res.stats.get("aux_target", config.beta * ptoks[-1])))
        generated.append(float(res.stats.get("aux_generated", res.aux_tokens)))
        trained = res.episodes if res.episodes is not None else eps  # the batch grown by the step, if it grew one
        policy = policy.with_logits(policy.logits + config.lr * policy.policy_gradient(trained, res.advantages))
        values.append(policy.value)
    return RunTrace(values, aux, ptoks, accounted, warm, target, generated)


def first_reach(curve: np.ndarray, target: float) -> Optional[int]:
    hit = np.flatnonzero(curve >= target - 1e-12)
    return int(hit[0]) if hit.size else None


def run_learn(config: LearnConfig, *, log=lambda m: None) -> dict:
    """Train every method on every seed; return curves, CIs and updates-to-target."""
    curves, tokens = {}, {}
    for m in config.methods:
        traces = [train_one(m, config.seed + s, config) for s in range(config.seeds)]
        curves[m] = np.array([tr.values for tr in traces])
        a_tok, p_tok, c_tok, t_tok, g_tok = (np.array([getattr(tr, k) for tr in traces])
                                             for k in ("aux", "policy", "accounted", "target", "generated"))
        # warm-up updates (Twice's predictor) branch every decision at a fixed q, ignoring the budget
        post = ~np.array([tr.warmup for tr in traces], dtype=bool)
        target = t_tok[post].sum()
        tokens[m] = {"aux": int(a_tok.sum()), "policy": int(p_tok.sum()),
                     "aux_per_policy": float(a_tok.sum() / p_tok.sum()),
                     # accounted as the budget counts them, and truly generated (NaN: every update a warm-up)
                     "budget_ratio": float(c_tok[post].sum() / target) if target > 0 else float("nan"),
                     "generated_ratio": float(g_tok[post].sum() / target) if target > 0 else float("nan")}
        log(f"{m}: final V(s0) {curves[m][:, -1].mean():.3f}")
    target = float(curves["grpo"][:, -1].mean()) if "grpo" in curves else float("nan")
    rng = np.random.default_rng(config.seed)
    out = {"config": asdict(config), "target": target, "methods": {}}
    for m, c in curves.items():
        mean = c.mean(axis=0)
        boots = np.array([c[rng.integers(0, len(c), len(c))].mean(axis=0) for _ in range(1000)])
        lo, hi = np.quantile(boots, 0.025, axis=0), np.quantile(boots, 0.975, axis=0)
        reach = [first_reach(b, target) for b in boots]
        reached = [r for r in reach if r is not None]
        out["methods"][m] = {
            "curve": mean.tolist(), "lo": lo.tolist(), "hi": hi.tolist(),
            "final": cs.bootstrap_ci(np.mean, c[:, -1], seed=config.seed).as_dict(),
            "updates_to_target": first_reach(mean, target),
            "updates_to_target_ci": ([float(np.quantile(reached, 0.025)), float(np.quantile(reached, 0.975))]
                                     if len(reached) == len(reach) else None),
            "reached_share": len(reached) / len(reach),
            **tokens[m],
        }
    return out


def format_learn(res: dict) -> str:
    width = max(10, *(len(m) + 1 for m in res["methods"]))
    lines = [f"exact V(s0): initial {res['methods'][next(iter(res['methods']))]['curve'][0]:.3f}; "
             f"target = GRPO's final mean {res['target']:.3f}",
             f"{'method':<{width}} {'final V(s0) [95% CI]':>24} {'updates to target [CI]':>26} {'aux/policy tok':>15} "
             f"{'accounted/budget':>17} {'generated/budget':>17}"]
    for m, r in res["methods"].items():
        f = r["final"]
        ut = r["updates_to_target"]
        ci = r["updates_to_target_ci"]
        reach = "never" if ut is None else (f"{ut}" + (f" [{ci[0]:.0f}, {ci[1]:.0f}]" if ci else
                                                         f" (reached in {100 * r['reached_share']:.0f}% of resamples)"))
        lines.append(f"{m:<{width}} {f['value']:>8.3f} [{f['lo']:.3f}, {f['hi']:.3f}] {reach:>26} "
                     f"{r['aux_per_policy']:>15.2f} {r['budget_ratio']:>17.3f} {r['generated_ratio']:>17.3f}")
    lines.append(f"(budget = beta x policy tokens, beta = {res['config']['beta']}; Twice after its "
                 f"{res['config']['warmup_updates']}-update predictor warm-up; accounted: each branched decision "
                 "charged its planned cost, as the budget counts; generated: tokens truly sampled)")
    return "\n".join(lines) + "\n"


def write_learn(res: dict, out_dir: Path) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "learn.json", json.dumps(res, indent=1))
    n = len(next(iter(res["methods"].values()))["curve"])
    png = plot_bands(np.arange(n), {m: (r["curve"], r["lo"], r["hi"]) for m, r in res["methods"].items()},
                     out_dir / "learn.png", hline=res["target"])
    return {"json": out_dir / "learn.json", "png": png}


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="twice bench learn", description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default=LearnConfig.env, choices=LEARN_ENVS)
    p.add_argument("--seeds", type=int, default=LearnConfig.seeds)
    p.add_argument("--updates", type=int, default=LearnConfig.updates)
    p.add_argument("--groups", type=int, default=LearnConfig.groups)
    p.add_argument("--lr", type=float, default=LearnConfig.lr)
    p.add_argument("--beta", type=float, default=LearnConfig.beta)
    p.add_argument("--methods", nargs="+", default=list(registered_methods("learn")), choices=registered_methods())
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/bench_learn")
    add_setting_args(p)
    a = p.parse_args(argv)
    if "grpo" not in a.methods:
        p.error("--methods must include grpo (its final value is the target)")
    try:
        text_setting = text_setting_from_args(a) if a.env == "TextLab-v0" else TextLabSetting()
    except ValueError as exc:
        p.error(str(exc))
    cfg = LearnConfig(env=a.env, setting=setting_from_args(a), text_setting=text_setting, methods=tuple(a.methods),
                      seeds=a.seeds, updates=a.updates, groups=a.groups, lr=a.lr, beta=a.beta, seed=a.seed)
    t0 = time.time()
    res = run_learn(cfg, log=lambda m: print(f"[bench learn {time.time() - t0:5.0f}s] {m}", file=sys.stderr, flush=True))
    print(format_learn(res), end="")
    paths = write_learn(res, Path(a.out))
    print("written: " + ", ".join(str(v) for v in paths.values()))
    return 0
