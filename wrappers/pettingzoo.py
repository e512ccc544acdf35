"""A PettingZoo ``ParallelEnv`` view of one GRPO group and its twins.

::

    from twice_envs.wrappers.pettingzoo import GroupParallelEnv
    group = GroupParallelEnv("ALFWorld-v0", group_size=4, max_twins=8)
    obs, infos = group.reset(seed=7)                 # agents world_0..world_3: one task, four worlds
    obs, rewards, terms, truncs, infos = group.step({a: policy(obs[a]) for a in group.agents})
    name, *first_step = group.add_twin("world_2", turn=1, action="go to desk 1")
    # from now on 'twin_0' is an agent too, stepping its own world in lockstep

**Agents.** ``world_0 .. world_{G-1}`` are ``G`` envs of one task: every reset gives
all of them the same ``seed`` and ``options``. ``world_0`` is exactly
``make(id).reset(seed=seed, options=options)``; ``world_i`` (``i >= 1``) adds
``options["noise_seed"] = derive_episode_seed(seed, i)``, so a keyed sampler draws a
different sample in each member, as a GRPO group needs (``distinct_noise=False``
gives every member the factual noise). ``twin_0 .. twin_{max_twins-1}`` are slots for
twins: :meth:`GroupParallelEnv.add_twin` forks an agent's world at a turn, takes an
alternative action there as branch ``k`` of that agent's noise schedule (see
:mod:`twice_envs.wrappers.twin`) and adds the twin as the next free ``twin_j`` agent.
Each agent steps its own world; nothing is shared between agents, so the view adds
no dynamics of its own.

**When it is useful.** When a group and its twins should move in lockstep through a
standard multi-agent API: one ``step`` call per turn, with every live member's
observation in one dict, which is what a batched LLM policy wants (one generation
call for the whole group and its twins, each prompt keyed by ``infos[a]["noise_key"]``);
and when multi-agent tooling (PettingZoo wrappers, loggers, evaluation loops) should
drive twice_envs episodes unchanged. It is *not* a model of interacting agents: the
worlds are independent, and for plain throughput over many tasks
:func:`twice_envs.make_vec` is the tool.

**Spaces.** Observations are strings; the action space of every agent is a text space
of at most ``max_action_length`` characters (the envs accept any string, and a
malformed one comes back flagged ``info["invalid"]``). Spaces are one object per
agent, created once.
"""

from __future__ import annotations

import warnings
from typing import Any, Optional


from twice_envs._deps import require
from twice_envs.core import BASE_OPTIONS, TextSpace, check_turn
from twice_envs.errors import TwiceError
from twice_envs.keys import check_seed, derive_episode_seed, draw_seed
from twice_envs.trajectory import Trajectory
from twice_envs.wrappers.twin import TwinEnv, twin

_pz = require("pettingzoo", "pettingzoo", "the PettingZoo view of groups")
ParallelEnv = _pz.ParallelEnv

__all__ = ["GroupParallelEnv", "parallel_env"]


class GroupParallelEnv(ParallelEnv):
    """``G`` worlds of one task (and their twins) as agents of a PettingZoo ``ParallelEnv``.

    Args:
        env_id: a registered env id.
        group_size: number of worlds ``G`` (``>= 1``).
        max_twins: number of twin slots (``twin_0 ..``) in ``possible_agents``.
        max_action_length: the largest action the action spaces declare (sampling
            from a huge text space is slow; the envs themselves accept any string).
        distinct_noise: give world ``i >= 1`` its own noise seed (see the module docstring).
        render_mode: ``None`` or ``"ansi"`` (the last observation of each live agent).
        **kwargs: passed to ``twice_envs.make(env_id, ...)``.
    """

    metadata = {"name": "twice_envs_group_v0", "render_modes": ["ansi"], "is_parallelizable": True}

    def __init__(
        self,
        env_id: str,
        group_size: int,
        *,
        max_twins: int = 0,
        max_action_length: int = 1024,
        distinct_noise: bool = True,
        render_mode: Optional[str] = None,
        **kwargs: Any,
    ) -> None:
        from twice_envs.registry import make

        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"group_size must be a positive int, got {group_size!r}")
        if isinstance(max_twins, bool) or not isinstance(max_twins, int) or max_twins < 0:
            raise ValueError(f"max_twins must be a non-negative int, got {max_twins!r}")
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.env_id = env_id
        self.kwargs = dict(kwargs)
        self.group_size = group_size
        self.max_twins = max_twins
        self.distinct_noise = distinct_noise
        self.render_mode = render_mode
        self.world_agents = [f"world_{i}" for i in range(group_size)]
        self.twin_agents = [f"twin_{k}" for k in range(max_twins)]
        self.possible_agents = self.world_agents + self.twin_agents
        self.agents: list[str] = []
        # The worlds exist from the start, so a bad id or kwargs fails here, not in reset.
        self._group = [make(env_id, **kwargs) for _ in range(group_size)]
        self._worlds: dict[str, Any] = {}
        #: twin agent -> (agent it twins, branch turn, branch)
        self.twin_of: dict[str, tuple[str, int, int]] = {}
        self._branches: dict[tuple[int, int], int] = {}
        self._obs_spaces = {a: TextSpace() for a in self.possible_agents}
        self._act_spaces = {a: TextSpace(max_action_length) for a in self.possible_agents}
        #: the seed of the current episode (shared by every world)
        self.group_seed: Optional[int] = None

    # ------------------------------------------------------------ spaces
    def observation_space(self, agent: str) -> TextSpace:
        return self._obs_spaces[agent]

    def action_space(self, agent: str) -> TextSpace:
        return self._act_spaces[agent]

    # ------------------------------------------------------------ episode
    def reset(self, seed: Optional[int] = None, options: Optional[dict] = None) -> tuple[dict, dict]:
        """Reset every world with one seed and options; drop the twins."""
        options = self._forwarded_options(options)
        # One seed for the whole group: world_0's own rule (continue its generator once seeded).
        self.group_seed = draw_seed(self._group[0]._np_random) if seed is None else check_seed(seed)
        for w in self._worlds.values():
            if isinstance(w, TwinEnv):
                w.close()
        self._worlds, self.twin_of, self._branches = {}, {}, {}
        observations, infos = {}, {}
        for i, (agent, env) in enumerate(zip(self.world_agents, self._group)):
            opts = dict(options or {})
            if i > 0 and self.distinct_noise and "noise_seed" not in opts:
                opts["noise_seed"] = derive_episode_seed(self.group_seed, i)
            observations[agent], infos[agent] = env.reset(seed=self.group_seed, options=opts)
            self._worlds[agent] = env
        self.agents = list(self.world_agents)
        return observations, infos

    def _forwarded_options(self, options: Optional[dict]) -> Optional[dict]:
        """The options the worlds accept; other keys are dropped with a warning.

        PettingZoo's own API test resets with ``{"options": 1}`` to see that reset takes
        options. The envs themselves refuse unknown keys (a typo must not silently
        sample a random task), so this view keeps the keys the env declares in
        ``reset_options`` (and ``noise_seed``) and warns about the rest; an env that
        declares none gets every key.
        """
        accepted = self._group[0].reset_options
        if options is not None and not isinstance(options, dict):
            raise ValueError(f"reset options must be a dict (or None), got {type(options).__name__} {options!r:.80}")
        if not options or accepted is None:
            return options
        dropped = sorted(k for k in options if k not in accepted and k not in BASE_OPTIONS)
        if dropped:
            warnings.warn(
                f"GroupParallelEnv({self.env_id}) ignores reset options {dropped}: the env accepts "
                f"{', '.join([*accepted, *BASE_OPTIONS])}",
                stacklevel=3,
            )
        return {k: v for k, v in options.items() if k not in dropped}

    def step(self, actions: dict[str, str]) -> tuple[dict, dict, dict, dict, dict]:
        """Step every live agent's world with its action; finished agents leave ``agents``."""
        if not self._worlds:
            raise TwiceError("step() called before reset(); call reset(seed=...) first")
        unknown = [a for a in actions if a not in self.agents]
        if unknown:
            raise ValueError(f"actions for agents that are not live: {unknown}; live agents: {self.agents}")
        missing = [a for a in self.agents if a not in actions]
        if missing:
            raise ValueError(f"no action for live agents {missing}; give one action per agent in env.agents")
        obs, rewards, terms, truncs, infos = {}, {}, {}, {}, {}
        for agent in self.agents:
            o, r, te, tr, info = self._worlds[agent].step(actions[agent])
            obs[agent], rewards[agent], terms[agent], truncs[agent] = o, float(r), bool(te), bool(tr)
            infos[agent] = self._tag(agent, info)
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, infos

    def _tag(self, agent: str, info: dict) -> dict:
        if agent in self.twin_of:
            of, turn, branch = self.twin_of[agent]
            info = {**info, "twin_of": of, "branch_turn": turn, "branch": branch}
        return info

    # ------------------------------------------------------------ twins
    def add_twin(
        self, of: str, turn: int, action: str, *, branch: Optional[int] = None
    ) -> tuple[str, str, float, bool, bool, dict]:
        """Fork ``of``'s world at ``turn``, take ``action`` there as a twin, add it as an agent.

        ``of`` may be any agent of this episode, finished or not. ``branch`` defaults to
        the next unused branch of ``of``'s noise at ``turn``. Returns
        ``(agent, obs, reward, terminated, truncated, info)`` of the alternative action;
        the twin joins ``agents`` unless that action already ended its episode.
        """
        if of not in self._worlds:
            raise ValueError(f"unknown agent {of!r}: agents of this episode are {list(self._worlds)}")
        parent = self._worlds[of]
        turn = check_turn(turn, parent.trajectory.num_turns, f"{of}'s fork")
        free = [a for a in self.twin_agents if a not in self._worlds]
        if not free:
            raise TwiceError(
                f"all {self.max_twins} twin slots are used in this episode; "
                "create the group with a larger max_twins"
            )
        schedule = parent.noise_schedule
        key = (schedule.episode_seed, int(turn))
        if branch is None:
            branch = self._branches.get(key, 0) + 1
        forked = parent.fork(turn)
        twin_env = twin(forked, action, schedule, branch=branch)
        self._branches[key] = max(self._branches.get(key, 0), branch)
        agent = free[0]
        self._worlds[agent] = twin_env
        self.twin_of[agent] = (of, int(turn), int(branch))
        obs, reward, terminated, truncated, info = twin_env.first_step
        if not (terminated or truncated):
            self.agents.append(agent)
        return agent, obs, float(reward), bool(terminated), bool(truncated), self._tag(agent, info)

    # ------------------------------------------------------------ records
    def world(self, agent: str) -> Any:
        """The env an agent steps (a TextEnv, or a :class:`TwinEnv` for a twin)."""
        if agent not in self._worlds:
            raise ValueError(f"unknown agent {agent!r}: agents of this episode are {list(self._worlds)}")
        return self._worlds[agent]

    def trajectory(self, agent: str) -> Trajectory:
        """The live record of an agent's world."""
        return self.world(agent).trajectory

    def render(self) -> Optional[str]:
        if self.render_mode != "ansi":
            return None
        return "\n\n".join(f"[{a}]\n{self._worlds[a].trajectory.observations[-1]}" for a in self.agents)

    def close(self) -> None:
        for env in list(self._worlds.values()) + self._group:
            env.close()

    def __repr__(self) -> str:
        return f"GroupParallelEnv({self.env_id}, group_size={self.group_size}, max_twins={self.max_twins})"


def parallel_env(env_id: str, group_size: int, **kwargs: Any) -> GroupParallelEnv:
    """PettingZoo-style constructor: ``parallel_env("ALFWorld-v0", 4, max_twins=8)``."""
    return GroupParallelEnv(env_id, group_size, **kwargs)
