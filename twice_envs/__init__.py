"""twice_envs: text environments that replay and fork exactly, for agents trained with twin credit.

    import twice_envs
    env = twice_envs.make("SearchQA-v0")
    obs, info = env.reset(seed=7)
    obs, reward, terminated, truncated, info = env.step("<search> who founded X </search>")
    branch = env.fork(1)
"""

from twice_envs.core import Protocol, TextEnv, TextSpace
from twice_envs.errors import (
    DataFormatError,
    EnvClosedError,
    MissingExtra,
    ReplayDivergence,
    TrajectoryFormatError,
    TwiceError,
)
from twice_envs.keys import NoiseKey, NoiseSchedule, derive_episode_seed
from twice_envs.registry import descriptions, make, make_vec, register, registry, spec
from twice_envs.replay import first_divergence, replay
from twice_envs.trajectory import Trajectory, iter_trajectories, load_trajectories, save_trajectories

from twice_envs import envs as _builtin_envs  # noqa: F401  (registers the built-in ids)
from twice_envs.check import check_env
from twice_envs.layout import check_layout

__version__ = "0.1.0"


__all__ = [
    "DataFormatError",
    "EnvClosedError",
    "MissingExtra",
    "NoiseKey",
    "NoiseSchedule",
    "Protocol",
    "ReplayDivergence",
    "TextEnv",
    "TextSpace",
    "Trajectory",
    "TrajectoryFormatError",
    "TwiceError",
    "check_env",
    "check_layout",
    "derive_episode_seed",
    "descriptions",
    "first_divergence",
    "iter_trajectories",
    "load_trajectories",
    "make",
    "make_vec",
    "register",
    "registry",
    "replay",
    "save_trajectories",
    "spec",
]
