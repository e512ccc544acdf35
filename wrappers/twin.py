"""Twins: the same world, a different choice, the same luck afterwards.

``twin(env, action, noise_keys)`` takes an env positioned at turn ``t`` (usually
``factual.fork(t)``), binds the factual episode's noise schedule with the alternative
turn on branch ``k``, and steps the alternative action. From then on every
``info["noise_key"]`` equals the factual episode's key for the same turn, so an
agent that samples with the reported keys reads the factual noise.

Pass the factual ``episode_seed`` (or its :class:`NoiseSchedule`) for a coupled twin,
or a fresh seed for an independent counterfactual (the CRR baseline).
"""

from __future__ import annotations

from typing import Any

from twice_envs.core import twin_step
from twice_envs.keys import NoiseKey, NoiseSchedule
from twice_envs.wrappers.base import ForkableWrapper


class TwinEnv(ForkableWrapper):
    """An env that has taken an alternative action at ``branch_turn``.

    Attributes:
        branch_turn: the turn the alternative was taken at.
        branch: the branch number of the alternative turn (``>= 1``).
        alternative_key: the key base the agent used to sample the alternative.
        first_step: the 5-tuple returned by the alternative action.
    """

    def __init__(self, env: Any, action: str, noise_keys: NoiseSchedule | int | dict, *, branch: int = 1) -> None:
        super().__init__(env)
        self.factual_schedule = NoiseSchedule.coerce(noise_keys)
        self.branch_turn = env.turn
        self.branch = branch
        self.alternative_key: NoiseKey
        self.alternative_key, self.first_step = twin_step(env, action, self.factual_schedule, branch=branch)

    def _rewrap(self, env: Any) -> Any:
        return env


def twin(env: Any, action: str, noise_keys: NoiseSchedule | int | dict, *, branch: int = 1) -> TwinEnv:
    """Take ``action`` on ``env`` (at turn ``t``) as branch ``branch`` of ``noise_keys``.

    Returns the :class:`TwinEnv`; its ``first_step`` holds what the alternative
    action returned.
    """
    return TwinEnv(env, action, noise_keys, branch=branch)
