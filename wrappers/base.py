"""The base of forkable wrappers, and ``fork`` as a function."""

from __future__ import annotations

from typing import Any, Optional

import gymnasium

from twice_envs.core import Protocol, TextEnv
from twice_envs.keys import NoiseSchedule
from twice_envs.trajectory import Trajectory


def unwrap(env: Any) -> TextEnv:
    """The innermost :class:`TextEnv` under any gymnasium wrappers (``env.unwrapped``, type-checked)."""
    inner = getattr(env, "unwrapped", env)
    if not isinstance(inner, TextEnv):
        raise TypeError(f"expected a twice_envs TextEnv (or a wrapper of one), got {type(inner).__name__}")
    return inner


def fork(env: Any, turn: Optional[int] = None) -> Any:
    """``env.fork(turn)`` for an env or any forkable wrapper of one."""
    return env.fork(turn)


class ForkableWrapper(gymnasium.Wrapper):
    """A gymnasium wrapper that keeps the replay API of the env it wraps.

    Subclasses that hold configuration override :meth:`_rewrap` so a fork is
    wrapped the same way.
    """

    def __init__(self, env: Any) -> None:
        super().__init__(env)

    @property
    def trajectory(self) -> Trajectory:
        return self.env.trajectory

    @property
    def turn(self) -> int:
        return self.env.turn

    @property
    def noise_schedule(self) -> NoiseSchedule:
        return self.env.noise_schedule

    def set_noise_schedule(self, schedule: Any) -> None:
        self.env.set_noise_schedule(schedule)

    def protocol(self) -> Protocol:
        return self.env.protocol()

    @property
    def last_info(self) -> dict:
        return self.env.last_info

    @property
    def done(self) -> bool:
        return self.env.done

    def noise_key(self) -> Any:
        return self.env.noise_key()

    def fork(self, turn: Optional[int] = None) -> Any:
        return self._rewrap(self.env.fork(turn))

    def _rewrap(self, env: Any) -> Any:
        return type(self)(env)
