"""Tasks of a run and the greedy evaluation on a held-out split (EM with its interval, F1, per dataset)."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

import twice_envs
from twice_envs.agents.rollout.episodes import Task, rollout
from twice_envs.agents.stats import wilson
from twice_envs.agents.training.config import TrainConfig, sampling_config
from twice_envs.agents.types import measure_means


def split_size(env_id: str, env_kwargs: dict, split: str) -> Optional[int]:
    """Number of tasks in ``split`` when the env exposes it (SearchQA), else None."""
    env = twice_envs.make(env_id, **env_kwargs)
    res = getattr(env.unwrapped, "resources", None)
    qs = getattr(res, "questions", None)
    return len(qs[split]) if qs is not None and split in qs else None


def indexed_split_size(config, split: str) -> Optional[int]:
    """Number of tasks in ``split`` when ``config`` (a :class:`TrainConfig` or any config with ``env``,
    ``env_kwargs`` and ``indexed_tasks``) names tasks by split and index and the env exposes its splits;
    None when tasks are named by seed only."""
    return split_size(config.env, config.env_kwargs, split) if config.indexed_tasks else None


def make_tasks(indices: Sequence[int], split: str, indexed: bool) -> list:
    """Tasks named by ``{"split", "index"}`` reset options where the env has splits, else by seed only."""
    return [Task(int(i), {"split": split, "index": int(i)} if indexed else {}) for i in indices]


def evaluate(policy, config: TrainConfig, *, questions: Optional[int] = None, split: Optional[str] = None) -> dict:
    """Greedy decoding on the dev split: EM and F1 overall and per dataset."""
    split = split or config.dev_split
    n = questions if questions is not None else config.eval_questions
    size = indexed_split_size(config, split)
    n = min(n, size) if size else n
    tasks = make_tasks(range(n), split, size is not None)
    eps = rollout(policy, config.env, tasks, group_size=1, sampling=sampling_config(config, greedy=True),
                  env_kwargs=config.env_kwargs, noise_seed=12345, max_turns=config.max_turns, window=config.window)
    return summarize_eval(eps)


def _dataset_of(ep) -> str:
    d = ep.info.get("dataset")
    if d:
        return str(d)
    tid = str(ep.info.get("task_id", ""))
    return tid.split("_")[0] if "_" in tid else ep.env_id


def summarize_eval(episodes) -> dict:
    """EM (with its 95% Wilson interval), F1 and the count of ``episodes``, overall and per dataset, and
    the mean of each of the env's own measures, the headline one named by ``measure``;
    ``outcomes`` holds each episode's EM in order, so that two evaluations on the same questions
    pair up."""
    def em(ep):
        return float(ep.info.get("em", ep.utility > 0))

    def f1(ep):
        return float(ep.info.get("f1", em(ep)))

    ems = [em(e) for e in episodes]
    out = {"em": float(np.mean(ems)), "em_ci": list(wilson(sum(ems), len(ems))),
           "f1": float(np.mean([f1(e) for e in episodes])), "n": len(episodes), "outcomes": ems, "per_dataset": {}}
    # the env's own measures, headline first (EM for SearchQA, success for the games)
    means = measure_means(episodes)
    out.update(means)
    out["measure"], out["measures"] = next(iter(means), "em"), list(means)
    for name in sorted({_dataset_of(e) for e in episodes}):
        sel = [e for e in episodes if _dataset_of(e) == name]
        out["per_dataset"][name] = {"em": float(np.mean([em(e) for e in sel])), "f1": float(np.mean([f1(e) for e in sel])),
                                    "n": len(sel)}
    return out
