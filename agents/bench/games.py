"""Text games on the CPU: evaluate the tiny game models, and ``twice bench games`` (RL methods compared).

:func:`evaluate_game` samples a policy (temperature 1, the standard rollout) on held-out
tasks: ALFWorld's ``valid_unseen`` games (layouts never seen in training) and WebShop's
``test`` goals, and reports success, the share of valid turns and both per task type.

``twice bench games`` trains GRPO, GRPO (2x), GiGPO, Twice and CRR (the registered methods that join
it; each samples its registered ``rollouts`` times the group size per task) from the same start model for N
updates on each env, several seeds each, and reports held-out success before and after
(95% Wilson intervals over all held-out episodes of a method), auxiliary tokens and seconds
per update, the invalid share of training turns, and the learning curves (PNG).

This module is the command line; the settings are :mod:`.games_config`, the runs :mod:`.games_runs`,
the paired comparisons and merging :mod:`.games_compare`, the text report :mod:`.games_report`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Optional, Sequence

from twice_envs import progress
from twice_envs.agents.bench.games_compare import merge_results
from twice_envs.agents.bench.games_config import GamesBenchConfig
from twice_envs.agents.bench.games_report import report
from twice_envs.agents.bench.games_runs import check_resumable, run_games_bench
from twice_envs.agents.bench.heldout import GAMES, evaluate_game
from twice_envs.agents.bench.output import write_json
from twice_envs.agents.credit.registry import methods as registered_methods
from twice_envs.agents.models.load import load_policy
from twice_envs.agents.sampling.choice import DEFAULT_SCORE, SCORES, choosing
from twice_envs.agents.sampling.devices import device_arg, torch_device
from twice_envs.agents.stats import paired_change
from twice_envs.agents.training.config import cpu_config
from twice_envs.play import parse_value
from twice_envs.trajectory import atomic_write_text


#: The noise seed of ``--eval-only`` evaluations: two runs on the same tasks draw the same noise keys,
#: so their episodes pair up (same game, same luck).
HELDOUT_NOISE_SEED = 10**6


def _eval_only(cfg: GamesBenchConfig, device: str, against: Optional[str]) -> int:
    """``--eval-only``: held-out figures of each env's start model, per task type, written to
    ``OUT/heldout.json``; with ``against`` (an earlier run's file), the paired change of success."""
    before = _read_heldout(against) if against else {}
    results = {}
    for env_id in cfg.envs:
        model = cfg.start_model(env_id)
        t0 = time.perf_counter()
        res = evaluate_game(choosing(load_policy(model, device=device), cfg.choose), env_id, samples=cfg.eval_samples or 4,
                            tasks=cfg.eval_tasks, noise_seed=HELDOUT_NOISE_SEED, setting=cfg.setting(env_id),
                            progress=f"{env_id} held-out")
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
    p.add_argument("--policy", choices=("generate", "choice"), default="generate",
                   help="generate: every turn written as text; choice: turns whose env lists its actions chosen "
                        "among them (the rest generated), each trained as one decision")
    p.add_argument("--score", choices=sorted(SCORES), default=DEFAULT_SCORE,
                   help=f"with --policy choice: the candidates' score (default {DEFAULT_SCORE})")
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
    progress.add_argument(p)
    a = p.parse_args(argv)
    progress.apply(a)
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
        choose=a.score if a.policy == "choice" else None,
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
