"""Wrappers for twice_envs envs, each doing one job.

* :func:`fork` -- an independent copy of an env at a turn.
* :func:`twin` / :class:`TwinEnv` -- take an alternative action and read the factual noise afterwards.
* :class:`TurnLimit` -- truncate after a number of turns.
* :class:`RecordEpisodes` -- save finished episodes as JSON lines.
* :class:`ChatView` -- render the history as chat messages for a model.

Wrappers forward the replay API (``trajectory``, ``fork``, ``noise_schedule``,
``protocol``) explicitly, never by attribute magic.
"""

from twice_envs.wrappers.base import ForkableWrapper, fork, unwrap
from twice_envs.wrappers.chat import ChatView, chat_messages
from twice_envs.wrappers.record import RecordEpisodes
from twice_envs.wrappers.turn_limit import TurnLimit
from twice_envs.wrappers.twin import TwinEnv, twin

__all__ = [
    "ChatView",
    "ForkableWrapper",
    "RecordEpisodes",
    "TurnLimit",
    "TwinEnv",
    "chat_messages",
    "fork",
    "twin",
    "unwrap",
]
