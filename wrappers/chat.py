"""Render an episode's history as chat messages for a model."""

from __future__ import annotations

from typing import Any, Optional

from twice_envs.trajectory import Trajectory
from twice_envs.wrappers.base import ForkableWrapper


def chat_messages(trajectory: Trajectory, system: Optional[str] = None) -> list[dict]:
    """``[system], user: obs_0, assistant: action_1, user: obs_1, ...``.

    The last message is the latest observation (a ``user`` message), ready for the
    model's next turn.
    """
    messages: list[dict] = []
    if system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": trajectory.observations[0]})
    for action, obs in zip(trajectory.actions, trajectory.observations[1:]):
        messages.append({"role": "assistant", "content": action})
        messages.append({"role": "user", "content": obs})
    return messages


class ChatView(ForkableWrapper):
    """Add ``info["messages"]``: the history so far as chat messages."""

    def __init__(self, env: Any, system: Optional[str] = None) -> None:
        super().__init__(env)
        self.system = system

    def messages(self) -> list[dict]:
        return chat_messages(self.env.trajectory, self.system)

    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        info["messages"] = self.messages()
        return obs, info

    def step(self, action: str):
        obs, reward, terminated, truncated, info = self.env.step(action)
        info["messages"] = self.messages()
        return obs, reward, terminated, truncated, info

    def _rewrap(self, env: Any) -> "ChatView":
        return ChatView(env, self.system)
