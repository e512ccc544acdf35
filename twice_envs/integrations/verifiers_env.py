"""A twice env as a verifiers environment (``pip install 'twice-envs[verifiers]'``; checked with verifiers 0.4).

    from twice_envs.integrations.verifiers_env import load_environment
    env = load_environment(env_id="SearchQA-v0", num_tasks=64, reward="cost_f1")   # a verifiers.v1.Env

The pieces are verifiers' own: a :class:`TwiceTaskset` whose tasks are episode starts (a reset seed
and options; the prompt is the env's first observation, so every rollout of a task plays the same
episode start), a multi-turn :class:`TwiceVerifiersEnv` whose ``run`` plays one episode with the
player agent as the speaker (each reply is one action; each observation is the next user turn; the
episode's end ends the exchange), and a :class:`TwiceChatHarness`, a tool-less chat loop run in this
process through verifiers' interception endpoint (nothing is installed or launched per rollout).
Each trace records the episode's return as the reward ``episode_return`` and carries the seed, the
turn count and the digest chain head in ``trace.info``, so any rollout can be replayed exactly.
"""

from __future__ import annotations

import sys
from typing import Any, Iterator, Optional

import twice_envs
from twice_envs._deps import require

vf = require("verifiers.v1", "verifiers", "the verifiers integration")
httpx = require("httpx", "verifiers", "the verifiers integration")
_runtimes = require("verifiers.v1.runtimes", "verifiers", "the verifiers integration")
_messages = require("verifiers.v1.dialects.chat", "verifiers", "the verifiers integration")

#: The plugin id verifiers loads the taskset, env and harness by: verifiers imports plugins by a
#: top-level module name, so this module is known under that name too.
PLUGIN_ID = "twice_envs_verifiers"
sys.modules.setdefault(PLUGIN_ID, sys.modules[__name__])

__all__ = ["TwiceTasksetConfig", "TwiceTaskData", "TwiceTask", "TwiceTaskset", "TwiceEnvConfig",
           "TwiceVerifiersEnv", "TwiceChatHarnessConfig", "TwiceChatHarness", "load_environment"]


class TwiceTasksetConfig(vf.TasksetConfig):
    """Which episode starts the taskset holds: seeds ``start .. start+num_tasks-1`` of ``env_id``."""

    env_id: str = "SearchToy-v0"
    """A registered env id."""
    env_kwargs: dict = {}
    """Keyword arguments for ``twice_envs.make``."""
    num_tasks: int = 100
    """How many episode starts."""
    start: int = 0
    """The first reset seed."""
    split: Optional[str] = None
    """A task split (``{"split": split, "index": seed}`` reset options), for envs that have splits."""


class TwiceTaskData(vf.TaskData):
    info: dict
    """The env id, reset seed and options the env reproduces the episode from."""


class TwiceTask(vf.Task[TwiceTaskData, vf.State, vf.TaskConfig]):
    pass


class TwiceTaskset(vf.Taskset[TwiceTask, TwiceTasksetConfig]):
    """Episode starts of one env: each task's prompt is the first observation of its seed."""

    def load(self) -> Iterator[TwiceTask]:
        cfg = self.config
        if cfg.num_tasks < 1 or cfg.start < 0:
            raise ValueError(f"num_tasks must be >= 1 and start >= 0, got {cfg.num_tasks} and {cfg.start}")
        env = twice_envs.make(cfg.env_id, **cfg.env_kwargs)
        try:
            protocol = env.protocol()
            for seed in range(cfg.start, cfg.start + cfg.num_tasks):
                options = {"split": cfg.split, "index": seed} if cfg.split is not None else {}
                text, _ = env.reset(seed=seed, options=options or None)
                info = {"env_id": cfg.env_id, "env_kwargs": dict(cfg.env_kwargs), "seed": seed, "options": options}
                data = TwiceTaskData(name=f"{cfg.env_id}#{seed}", prompt=text,
                                     system_prompt=f"Reply with one action: {protocol.action_format}", info=info)
                yield TwiceTask(data, cfg.task)
        finally:
            env.close()


class TwiceChatHarnessConfig(vf.HarnessConfig):
    pass


class TwiceChatHarness(vf.Harness[TwiceChatHarnessConfig]):
    """A tool-less chat loop in this process: one model call per segment, through the interception endpoint."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx: Any, trace: Any, runtime: Any, endpoint: str, secret: str, mcp_urls: dict,
                     data: Any, tool_interception_url: Optional[str] = None) -> Any:
        system_prompt, prompt = self.resolve_prompt(data)
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        elif prompt is not None:
            messages += [_messages.message_to_wire(m) for m in prompt if getattr(m, "role", None) != "system"
                         or not system_prompt]
        async with httpx.AsyncClient(timeout=None) as client:
            reply = await client.post(f"{endpoint.rstrip('/')}/chat/completions",
                                      headers={"Authorization": f"Bearer {secret}"},
                                      json={"model": ctx.model, "messages": messages})
        return _runtimes.ProgramResult(exit_code=0 if reply.is_success else 1, stdout="",
                                       stderr="" if reply.is_success else reply.text[:2000])


class TwiceEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig(runtime=_runtimes.SubprocessConfig())


class TwiceVerifiersEnv(vf.Env[TwiceEnvConfig]):
    """One episode per rollout: the player's replies are the actions, the observations its user turns."""

    async def run(self, task: TwiceTask, agents: Any) -> None:
        info = task.data.info
        env = twice_envs.make(info["env_id"], **info["env_kwargs"])
        env.reset(seed=info["seed"], options=info["options"] or None)
        episode_return = 0.0
        try:
            async with agents.player.interaction(task) as interaction:
                segment = await interaction.turn()  # the task's prompt is the first observation
                while not segment.terminated:
                    text, reward, _, _, _ = env.step(segment.last_reply)
                    episode_return += float(reward)
                    if env.done:
                        break
                    segment = await interaction.turn(text)
            traj = env.trajectory
            trace = interaction.trace
            trace.record_reward("episode_return", episode_return, 1.0)
            trace.info.update(seed=traj.seed, turns=traj.num_turns, digest=traj.digest,
                              terminated=bool(traj.terminated), truncated=bool(traj.truncated))
        finally:
            env.close()


def load_environment(env_id: str = "SearchToy-v0", *, num_tasks: int = 100, start: int = 0,
                     split: Optional[str] = None, max_turns: Optional[int] = None, **env_kwargs: Any) -> Any:
    """A verifiers multi-turn environment over ``env_id`` (``env_kwargs`` go to ``twice_envs.make``).

    The env is made once here, so an unknown id or kwarg fails at once. ``max_turns`` caps the
    player's model turns per rollout (verifiers' own limit; the env's own limit applies too).
    """
    twice_envs.make(env_id, **env_kwargs).close()
    taskset = TwiceTasksetConfig(id=PLUGIN_ID, env_id=env_id, env_kwargs=env_kwargs, num_tasks=num_tasks,
                                 start=start, split=split)
    player = vf.AgentConfig(runtime=_runtimes.SubprocessConfig(), max_turns=max_turns)
    return TwiceVerifiersEnv(TwiceEnvConfig(taskset=taskset, player=player))
