"""``twice rollout``: run a model on an env and save the episodes as JSON lines.

Each line is the env's trajectory record (so ``twice replay FILE`` re-runs and verifies
it) with the agent's record of the episode under the key ``"episode"`` (token ids,
log-probs, noise keys, entropies); :func:`load_episodes` reads them back.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Sequence

from twice_envs.agents.models.load import env_model, load_policy
from twice_envs.agents.models.recipes import (
    MODEL_NAMES,
    model_for_env,
    trained_env_kwargs,
    trained_window,
)
from twice_envs.agents.rollout.episodes import Task, rollout
from twice_envs.agents.sampling.devices import device_arg
from twice_envs.agents.sampling.policy import SamplingConfig
from twice_envs.agents.types import EpisodeRecord
from twice_envs.errors import TrajectoryFormatError
from twice_envs.play import parse_env_kwargs
from twice_envs.files import read_record_lines, write_record_lines


def episode_line(ep: EpisodeRecord) -> dict:
    """One JSON-lines entry: the trajectory record plus ``"episode"`` (the agent's record)."""
    if ep.trajectory is None:
        raise ValueError("the episode has no trajectory record")
    data = dict(ep.trajectory)
    agent = ep.to_json()
    agent.pop("trajectory", None)
    data["episode"] = agent
    return data


def save_episodes(path: str | Path, episodes: Sequence[EpisodeRecord]) -> None:
    """Write episodes as a record file (atomically: a header counting them, then one JSON line each),
    replayable with ``twice replay``."""
    write_record_lines(path, [json.dumps(episode_line(ep), ensure_ascii=False, allow_nan=False) for ep in episodes])


def load_episodes(path: str | Path) -> list[EpisodeRecord]:
    """Read episodes written by :func:`save_episodes`; a file cut short raises
    :class:`~twice_envs.errors.RecordCountError` naming it and both counts."""

    out = []
    for where, data in read_record_lines(path):
        if isinstance(data, TrajectoryFormatError):
            raise data
        try:
            agent = dict(data.pop("episode"))
        except (AttributeError, KeyError, TypeError) as exc:
            raise TrajectoryFormatError(f"{where}: not an episode line ({exc!r})") from None
        agent["trajectory"] = data
        out.append(EpisodeRecord.from_json(agent))
    return out


def model_help() -> str:
    """The ``--model`` help of the commands that play an env."""
    own = ", ".join(f"{e}: {model_for_env(e)}" for e in ("SearchQA-v0", "WebShop-v0", "ALFWorld-v0"))
    return (f"a shipped model ({', '.join(MODEL_NAMES)}) or a local Hugging Face model "
            f"directory (default: the env's own shipped start model; {own})")


def rollout_main(argv: Sequence[str]) -> int:
    """``twice rollout --env ID --model tiny --episodes N --out FILE``."""
    parser = argparse.ArgumentParser(prog="twice rollout", description="Run a model on an env and save the episodes.")
    parser.add_argument("--env", required=True, help="env id, e.g. SearchQA-v0")
    parser.add_argument("--model", default=None, help=model_help())
    parser.add_argument("--episodes", type=int, default=4, help="number of tasks (each run --group times)")
    parser.add_argument("--group", type=int, default=1, help="episodes per task (a GRPO group)")
    parser.add_argument("--out", required=True, help="output JSON lines file")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first task (tasks use seed, seed+1, ...)")
    parser.add_argument("--noise-seed", type=int, default=0, help="seed of the sampling noise")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--max-turns", type=int, default=None)
    parser.add_argument("--window", type=int, default=None,
                        help="turns of history in the model's context (default: the window a tiny model was "
                             "trained with, else the whole episode)")
    parser.add_argument("--env-kwargs", default=None,
                        help="JSON kwargs for the env (default: those a tiny model was trained with, e.g. "
                             "show_admissible for tiny-alfworld)")
    parser.add_argument("--greedy", action="store_true", help="argmax decoding")
    parser.add_argument("--device", default="cpu", type=device_arg, help="cpu (default), cuda, cuda:N or mps")
    parser.add_argument("--backend", default="hf", choices=("hf", "vllm"))
    parser.add_argument("--show", action="store_true", help="print each episode's turns")
    args = parser.parse_args(argv)

    args.model, model_dir = env_model(args.model, args.env)
    policy = load_policy(args.model, backend=args.backend, device=args.device)
    window = trained_window(model_dir) if args.window is None else args.window
    if args.env_kwargs is None:
        env_kwargs = trained_env_kwargs(model_dir, args.env)
    else:
        env_kwargs = parse_env_kwargs(parser, args.env_kwargs)
    sampling = SamplingConfig(temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens,
                              greedy=args.greedy)
    tasks = [Task(args.seed + i) for i in range(args.episodes)]
    t0 = time.perf_counter()
    episodes = rollout(policy, args.env, tasks, group_size=args.group, sampling=sampling, noise_seed=args.noise_seed,
                       max_turns=args.max_turns, env_kwargs=env_kwargs, window=window)
    secs = time.perf_counter() - t0
    save_episodes(args.out, episodes)
    n_tok = sum(e.num_generated_tokens for e in episodes)
    for i, ep in enumerate(episodes, 1):
        print(f"episode {i} (seed {ep.seed}, group {ep.group}): {len(ep.turns)} turns, {ep.num_generated_tokens} "
              f"tokens, utility {ep.utility:g}")
        if args.show:
            for t in ep.turns:
                print(f"  > {t.text!r}\n    {t.obs[:200]!r}")
    mean_u = sum(e.utility for e in episodes) / max(1, len(episodes))
    print(f"{len(episodes)} episodes, mean utility {mean_u:.3f}, {n_tok} tokens in {secs:.1f}s "
          f"({n_tok / max(secs, 1e-9):.1f} tokens/s); saved to {args.out} (check with: twice replay {args.out})",
          file=sys.stdout)
    return 0
