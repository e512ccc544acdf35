"""Episodes as the flat prompt/response rows that verl and TRL train on.

Both trainers see one row per episode: the first prompt, then one *response* that
holds every generated turn and every observation after it. Generated tokens have
mask 1 and carry the turn's advantage; observation tokens have mask 0 and advantage 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from twice_envs.agents.rollout.context import pack_episode
from twice_envs.agents.types import EpisodeRecord


@dataclass
class ResponseRow:
    """One episode as a trainer row.

    Attributes:
        prompt_ids: the first prompt's tokens.
        response_ids: generated turns and observations after the prompt, in order.
        mask: 1 on generated tokens, 0 on observation tokens.
        logprobs: the sampling log-prob of each generated token (0 on observations).
        turn_of_token: the turn index of each generated token (-1 on observations).
    """

    prompt_ids: list[int]
    response_ids: list[int]
    mask: list[int]
    logprobs: list[float]
    turn_of_token: list[int]


def response_row(episode: EpisodeRecord) -> ResponseRow:
    """The episode's prompt and response (see :func:`~twice_envs.agents.rollout.context.pack_episode`)."""
    ids, mask, old, turn_of = pack_episode(episode)
    n = len(episode.prompt_ids)
    return ResponseRow(list(ids[:n]), list(ids[n:]), list(mask[n:]), list(old[n:]), list(turn_of[n:]))


def token_advantages(turn_of_token: Sequence[int], per_turn: Sequence[float]) -> list[float]:
    """Each generated token gets its turn's advantage; observation tokens (turn -1) get 0."""
    a = np.asarray(per_turn, dtype=np.float64)
    return [float(a[t]) if t >= 0 else 0.0 for t in turn_of_token]
