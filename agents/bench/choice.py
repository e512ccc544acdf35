"""``twice bench choice``: the choice policy against the free-text policy on the text games.

For each game (ALFWorld, WebShop) the game's start model plays the same held-out tasks with the
same noise seeds three ways: generating every turn as text, and choosing among the env's listed
actions (:class:`~twice_envs.agents.sampling.choice.ChoicePolicy`) with each candidate score
(``mean`` and ``sum`` of the candidate's token log-probabilities). It prints, per way, the decisions
(turns) per second of the rollout, the share of turns chosen, held-out success and the valid-turn
share, and the choice policy's decisions per second as a multiple of the free-text policy's.

``--coupling`` also measures how strongly twins are coupled in each mode
(:mod:`~twice_envs.agents.bench.choice_coupling`): rho-bar with the estimated oracle, the
oracle-free lower bound and the self-twin share, each with a 95% bootstrap CI over groups.
"""

from __future__ import annotations

import argparse
import time
from typing import Optional, Sequence

from twice_envs import progress
from twice_envs.agents.bench.choice_coupling import coupling_of, played
from twice_envs.agents.bench.heldout import GAMES, heldout_tasks, summarize
from twice_envs.agents.bench.output import write_json
from twice_envs.agents.lab.table2 import format_ci
from twice_envs.agents.models.load import load_policy
from twice_envs.agents.rollout import episodes as R
from twice_envs.agents.sampling.choice import DEFAULT_SCORE, SCORES, ChoicePolicy
from twice_envs.agents.sampling.policy import SamplingConfig

#: The free-text way's name in the tables.
FREE = "free text"


def policy_for(model: str, score: Optional[str]):
    """A fresh policy of ``model`` (its own prefix caches): free text for ``score`` None, else choosing."""
    base = load_policy(model)
    return base if score is None else ChoicePolicy(base, score=score)


def speed_rows(env_id: str, ways: Sequence[Optional[str]], tasks: int, group: int, seed: int, rounds: int,
               bar) -> list[dict]:
    """Every way of playing ``env_id``'s held-out tasks: decisions per second and held-out figures.

    The tasks are played in ``rounds`` consecutive slices, each slice by every way in turn (each way keeps
    one policy and its caches throughout), so that a change in the machine's load falls on every way alike.
    Every way plays each task with the same noise seeds (slice ``s`` on noise seed ``seed + s``)."""
    how = played(env_id)
    setting = how["setting"]
    task_list, types, kwargs = heldout_tasks(env_id, tasks, setting)
    sampling = SamplingConfig(max_new_tokens=setting.max_new_tokens)
    policies = {w: policy_for(setting.model, w) for w in ways}
    eps: dict = {w: [] for w in ways}
    seconds = dict.fromkeys(ways, 0.0)
    gen_seconds = dict.fromkeys(ways, 0.0)
    size = -(-len(task_list) // max(1, min(rounds, len(task_list))))
    for s, start in enumerate(range(0, len(task_list), size)):
        part = task_list[start: start + size]
        for w in ways:
            R.TIMING.update(env_seconds=0.0, generate_seconds=0.0)
            t0 = time.perf_counter()
            got = R.rollout(policies[w], env_id, part, group_size=group, sampling=sampling, env_kwargs=kwargs,
                            noise_seed=seed + s, max_turns=how["max_turns"], window=how["window"])
            seconds[w] += time.perf_counter() - t0
            gen_seconds[w] += R.TIMING["generate_seconds"]
            eps[w] += got
            bar.update()
    rows = []
    for w in ways:
        turns = [t for e in eps[w] for t in e.turns]
        figures = summarize(env_id, eps[w], types, group)["all"]
        rows.append({"way": FREE if w is None else f"choice ({w})", "score": w, "episodes": len(eps[w]),
                     "max_turns": how["max_turns"], "decisions": len(turns), "seconds": seconds[w],
                     "decisions_per_s": len(turns) / seconds[w], "generate_seconds": gen_seconds[w],
                     "chosen_share": sum(t.choice is not None for t in turns) / max(1, len(turns)),
                     "success": figures["success"], "success_ci": figures["success_ci"],
                     "valid_share": figures["valid_share"]})
    return rows


def write_speed(env_id: str, rows: list[dict]) -> None:
    free = next(r for r in rows if r["score"] is None)
    print(f"{env_id} ({GAMES[env_id].model}), {free['episodes']} held-out episodes per way, at most "
          f"{free['max_turns'] or 'the env limit of'} turns each:")
    print(f"  {'way':<15} {'decisions':>9} {'seconds':>8} {'decisions/s':>11} {'x free':>7} {'chosen':>7} "
          f"{'success [95% CI]':>22} {'valid':>6}")
    for r in rows:
        ci = f"{r['success']:.2f} [{r['success_ci'][0]:.2f}, {r['success_ci'][1]:.2f}]"
        print(f"  {r['way']:<15} {r['decisions']:>9} {r['seconds']:>8.1f} {r['decisions_per_s']:>11.2f} "
              f"{r['decisions_per_s'] / free['decisions_per_s']:>7.2f} {r['chosen_share']:>7.2f} {ci:>22} "
              f"{r['valid_share']:>6.2f}")


def write_coupling_rows(env_id: str, rows: list[dict]) -> None:
    print(f"{env_id}: twin coupling (one coupled twin and one independent counterfactual per decision, "
          "estimated oracle, 95% CIs over groups):")
    for r in rows:
        s = r["summary"]
        print(f"  {r['way']:<15} {r['decisions']:>4} decisions  rho-bar {format_ci(s['rho_bar']):<22} "
              f"lower bound {format_ci(s['lower_bound']):<22} self-twins {format_ci(s['self_twin_share'])}")


def main(argv: Sequence[str]) -> int:
    """Decisions per second (and held-out success) of the choice policy against the free-text policy."""
    p = argparse.ArgumentParser(prog="twice bench choice", description=main.__doc__)
    p.add_argument("--envs", default=",".join(GAMES), help="comma-separated games (default: %(default)s)")
    p.add_argument("--tasks", type=int, default=16, help="held-out tasks per game")
    p.add_argument("--group", type=int, default=2, help="episodes per task")
    p.add_argument("--scores", default=",".join(SCORES), help=f"candidate scores to run (of {sorted(SCORES)})")
    p.add_argument("--seed", type=int, default=0, help="noise seed (the same for every way)")
    p.add_argument("--rounds", type=int, default=4, help="slices of the tasks, each played by every way in turn")
    p.add_argument("--coupling", action="store_true", help="also measure rho-bar of twins in each mode")
    p.add_argument("--coupling-groups", type=int, default=6, help="task groups of the coupling measurement")
    p.add_argument("--oracle-rollouts", type=int, default=8, help="value rollouts per state of the oracle")
    p.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples")
    p.add_argument("--quick", action="store_true", help="2 tasks x 1 episode, at most 2 coupling groups, 2 oracle rollouts, 100 resamples")
    p.add_argument("--out", default=None, help="also write the figures to OUT/choice.json")
    progress.add_argument(p)
    args = p.parse_args(argv)
    progress.apply(args)
    envs = [e for e in args.envs.split(",") if e]
    scores = [s for s in args.scores.split(",") if s]
    for name, values, known in (("--envs", envs, GAMES), ("--scores", scores, SCORES)):
        bad = [v for v in values if v not in known]
        if bad or not values:
            p.error(f"{name}: unknown {bad or 'none given'}; choose from {sorted(known)}")
    for name in ("tasks", "group", "rounds", "coupling_groups", "oracle_rollouts", "n_boot"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.quick:
        args.tasks, args.group, args.oracle_rollouts, args.n_boot = 2, 1, 2, 100
        args.coupling_groups = min(args.coupling_groups, 2)
    ways: list[Optional[str]] = [None] + scores
    result: dict = {"speed": {}, "coupling": {}}
    steps = len(envs) * len(ways) * min(args.rounds, args.tasks) + (2 * len(envs) if args.coupling else 0)
    with progress.Progress("bench choice", steps, unit="runs") as bar:
        for env_id in envs:
            rows = speed_rows(env_id, ways, args.tasks, args.group, args.seed, args.rounds, bar)
            result["speed"][env_id] = rows
            write_speed(env_id, rows)
        for env_id in envs if args.coupling else ():
            setting = GAMES[env_id]
            rows = []
            for score in (None, DEFAULT_SCORE):
                summary = coupling_of(policy_for(setting.model, score), env_id, groups=args.coupling_groups,
                                      oracle_rollouts=args.oracle_rollouts, seed=args.seed, n_boot=args.n_boot)
                rows.append({"way": FREE if score is None else f"choice ({score})", "score": score,
                             "decisions": summary["decisions"], "summary": summary})
                bar.update()
            result["coupling"][env_id] = rows
            write_coupling_rows(env_id, rows)
    if args.out:
        write_json(args.out, "choice.json", result)
    return 0
