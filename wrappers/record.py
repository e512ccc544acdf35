"""Save finished episodes to a JSON lines file."""

from __future__ import annotations

import os
from typing import Any

from twice_envs.trajectory import Trajectory, save_trajectories
from twice_envs.wrappers.base import ForkableWrapper


class RecordEpisodes(ForkableWrapper):
    """Write each finished episode to ``path`` (a record file: a header counting them, one trajectory per line).

    The file holds the episodes this wrapper recorded, rewritten atomically after each
    one ends, so a crash never leaves a half-written line. Read it back with
    :func:`twice_envs.load_trajectories`; replay it with ``twice replay``.
    Forks are not recorded (wrap them explicitly if you want them).
    """

    def __init__(self, env: Any, path: str | os.PathLike) -> None:
        super().__init__(env)
        self.path = os.fspath(path)
        self.records: list[dict] = []

    def step(self, action: str):
        out = self.env.step(action)
        if out[2] or out[3]:
            if not out[4].get("episode_over"):
                self.records.append(Trajectory.from_json(self.env.trajectory.to_json()).to_json())
                save_trajectories(self.path, self.records)
        return out

    def _rewrap(self, env: Any) -> Any:
        return env
