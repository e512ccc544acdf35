"""Held-out evaluation of a text-game policy: success, valid turns and both per task type.

:func:`evaluate_game` samples a policy (temperature 1, the standard rollout) on held-out
tasks: ALFWorld's ``valid_unseen`` games (layouts never seen in training) and WebShop's
``test`` goals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

import twice_envs
from twice_envs.agents.rollout.episodes import Task, rollout
from twice_envs.agents.sampling.policy import SamplingConfig
from twice_envs.agents.stats import wilson
from twice_envs.envs.alfworld import generator
from twice_envs.progress import Progress


@dataclass(frozen=True)
class GameSetting:
    """How one text game is played by its tiny model."""

    model: str
    """Start model (a name of :func:`~twice_envs.agents.models.load.resolve_model_dir` or a folder)."""
    env_kwargs: dict = field(default_factory=dict)
    """Keyword arguments of ``twice_envs.make`` (the model was trained with the same)."""
    heldout_kwargs: dict = field(default_factory=dict)
    """Extra ``make`` kwargs of the held-out env (ALFWorld: its split)."""
    heldout_split: Optional[str] = None
    """Reset-option split of held-out tasks (WebShop goals), None where the kwargs pick them."""
    max_turns: Optional[int] = 12
    """Turn cap of an episode, None for the env's own limit (a tiny start model is played with the cap
    :func:`~twice_envs.agents.models.recipes.play_max_turns` gives instead)."""
    max_new_tokens: int = 32
    """Tokens per turn at most (an action is under 20 tokens)."""
    window: Optional[int] = None
    """Turns of history in the model's context (None: the window the start model was trained with,
    :func:`~twice_envs.agents.models.recipes.trained_window`; whole episodes if it had none)."""
    bench_eval: tuple[Optional[int], int] = (None, 4)
    """``(held-out tasks, episodes per task)`` of each evaluation in ``twice bench games``, each used
    where the command line does not set it (None tasks: the whole held-out set). Sized for two CPU cores: the
    bench evaluates the start model and every method after training, 13 evaluations in all."""
    heldout_games: int = 0
    """ALFWorld: generated ``valid_unseen`` games per task type and unseen room layout to evaluate on
    (0: the 8 bundled ones). More games narrow the intervals and make per-type figures less a
    matter of one room."""


GAMES: dict[str, GameSetting] = {
    "ALFWorld-v0": GameSetting("tiny-alfworld", {"show_admissible": True}, {"split": "valid_unseen"}, None, 12, 24,
                               bench_eval=(16, 1), heldout_games=4),
    "WebShop-v0": GameSetting("tiny-webshop", {"show_admissible": True}, {}, "test", 6, 48, bench_eval=(80, 1)),
}


def heldout_tasks(env_id: str, n: Optional[int] = None,
                  setting: Optional[GameSetting] = None) -> tuple[list, list[str], dict]:
    """``(tasks, task types, env kwargs)`` of the held-out set of ``env_id`` (``n`` tasks: WebShop's first
    ``n`` test goals (default 100), ``n`` ALFWorld games spread over the sorted list (default all)),
    played as ``setting`` says (default: ``GAMES[env_id]``)."""

    setting = setting or GAMES[env_id]
    kwargs = {**setting.env_kwargs, **setting.heldout_kwargs}
    if setting.heldout_games and env_id.startswith("ALFWorld"):
        kwargs["data_dir"] = str(generator.generated_collection(kwargs.get("split", "valid_unseen"), setting.heldout_games))
    env = twice_envs.make(env_id, **kwargs).unwrapped
    if env_id.startswith("ALFWorld"):
        # games are sorted by task type: a subset is spread over the list so that it keeps every type
        picks = sorted({int(round(x)) for x in np.linspace(0, len(env.games) - 1, min(n or len(env.games), len(env.games)))})
        return [Task(0, {"index": i}) for i in picks], [env.games[i].split("-")[0] for i in picks], kwargs
    goals = env.res.goals
    split = goals.split_range(setting.heldout_split)
    tasks, types = [], []
    for i in range(min(n or 100, len(split))):
        tasks.append(Task(0, {"split": setting.heldout_split, "index": i}))
        types.append(str(goals[split.start + i].category or "all"))
    return tasks, types, kwargs


def success_of(env_id: str, ep) -> bool:
    """ALFWorld: the goal holds; WebShop: the purchase scores 1 (WebShop's success rate)."""
    return ep.utility >= 1.0 - 1e-9


def summarize(env_id: str, episodes, types: Sequence[str], samples: int) -> dict:
    """Success, valid-turn share and per-type figures of held-out episodes (``samples`` per task, in task order)."""
    rows = {"all": [0, 0, 0, 0, 0.0]}  # episodes, successes, turns, invalid turns, reward
    for k, ep in enumerate(episodes):
        kind = types[k // samples]
        for key in ("all", kind):
            r = rows.setdefault(key, [0, 0, 0, 0, 0.0])
            r[0] += 1
            r[1] += int(success_of(env_id, ep))
            r[2] += len(ep.turns)
            r[3] += sum(t.invalid for t in ep.turns)
            r[4] += ep.utility
    out = {}
    for key, (n, s, turns, bad, reward) in rows.items():
        lo, hi = wilson(s, n)
        out[key] = {"episodes": n, "success": s / max(n, 1), "success_ci": [lo, hi], "turns": turns,
                    "valid_share": 1 - bad / max(turns, 1), "mean_reward": reward / max(n, 1)}
    out["all"]["outcomes"] = [int(success_of(env_id, ep)) for ep in episodes]
    return out


def evaluate_game(policy, env_id: str, *, samples: int = 4, tasks: Optional[int] = None, noise_seed: int = 0,
                  temperature: float = 1.0, setting: Optional[GameSetting] = None,
                  progress: Optional[str] = None) -> dict:
    """Held-out figures of ``policy`` on ``env_id``: ``samples`` episodes per held-out task at ``temperature``.

    ``progress``: the name of the progress line of the episodes (:class:`~twice_envs.progress.Progress`,
    shown on a terminal only), or None for none."""

    setting = setting or GAMES[env_id]
    task_list, types, kwargs = heldout_tasks(env_id, tasks, setting)
    sampling = SamplingConfig(temperature=temperature, max_new_tokens=setting.max_new_tokens)
    with Progress(progress or "", len(task_list) * samples, show=False if progress is None else None) as bar:
        eps = rollout(policy, env_id, task_list, group_size=samples, sampling=sampling, env_kwargs=kwargs,
                      noise_seed=noise_seed, max_turns=setting.max_turns, window=setting.window,
                      progress=lambda done: bar.update(done - bar.done))
    return summarize(env_id, eps, types, samples)
