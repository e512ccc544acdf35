"""How strongly twins are coupled on a text game, for any policy (free text or choosing).

:func:`coupling_of` runs the measure the LLM audit runs (:mod:`~twice_envs.agents.lab.coupling`),
without the audit's credit rows: factual episodes of the game's held-out tasks, at every turn of the
first episode of each group one coupled twin (the alternative turn on branch 1, then the factual
keys) and one independent counterfactual (the alternative turn, then fresh noise), and the
estimated oracle ``V(s_t)`` from independent value rollouts of every state; then
:func:`~twice_envs.agents.lab.coupling.coupling_summary` (rho-bar, the oracle-free lower bound, tie
and self-twin shares, each with a 95% bootstrap CI over groups).
"""

from __future__ import annotations

import numpy as np

from twice_envs.agents import stats as cs
from twice_envs.agents.bench.heldout import GAMES, heldout_tasks
from twice_envs.agents.lab.coupling import coupling_summary
from twice_envs.agents.lab.oracle import value_requests, values
from twice_envs.agents.models.load import resolve_model_dir
from twice_envs.agents.models.recipes import play_settings
from twice_envs.agents.rollout.episodes import BranchRequest, branch_rollouts, rollout
from twice_envs.agents.sampling.policy import SamplingConfig
from twice_envs.keys import audit_seed


def played(env_id: str) -> dict:
    """How the game's start model plays it: ``GAMES[env_id]``'s held-out setting with the turn cap and history
    window of the model's transcripts (:func:`~twice_envs.agents.models.recipes.play_settings`)."""
    setting = GAMES[env_id]
    play = play_settings(setting.model, resolve_model_dir(setting.model), env_id, setting.max_turns)
    window = setting.window if setting.window is not None else play["window"]
    return {"setting": setting, "max_turns": play["max_turns"], "window": window}


def coupling_of(policy, env_id: str, *, groups: int = 6, group_size: int = 2, oracle_rollouts: int = 8,
                seed: int = 0, n_boot: int = 1000) -> dict:
    """The coupling figures of ``policy``'s twins on ``groups`` held-out tasks of ``env_id`` (see the module
    docstring); :func:`~twice_envs.agents.lab.coupling.coupling_summary`'s dict."""
    if min(groups, group_size, oracle_rollouts) < 1:
        raise ValueError(f"groups, group_size and oracle_rollouts must be >= 1, got {groups}, {group_size} and "
                         f"{oracle_rollouts}")
    how = played(env_id)
    setting = how["setting"]
    tasks, _, kwargs = heldout_tasks(env_id, groups, setting)
    sampling = SamplingConfig(max_new_tokens=setting.max_new_tokens)
    run = dict(sampling=sampling)
    eps = rollout(policy, env_id, tasks, group_size=group_size, env_kwargs=kwargs, noise_seed=seed,
                  max_turns=how["max_turns"], window=how["window"], **run)
    audited = [g * group_size for g in range(len(tasks))]
    decisions = [(i, t) for i in audited for t in range(len(eps[i].turns))]
    v = values(eps, audited, branch_rollouts(policy, eps, value_requests(audited, eps, oracle_rollouts, "oracle",
                                                                           seed), **run))
    coupled = branch_rollouts(policy, eps, [BranchRequest(i, t, branch=1) for i, t in decisions], **run)
    independent = branch_rollouts(policy, eps, [BranchRequest(i, t, branch=1, coupled=False,
                                                              noise_seed=audit_seed(seed, "crr", i, t))
                                                for i, t in decisions], **run)
    u = np.array([eps[i].utility for i, _ in decisions])
    idx = list(cs.resample_indices(len(u), n_boot, groups=[eps[i].group for i, _ in decisions], seed=seed))
    return coupling_summary(u, [w.utility for w in coupled], [w.utility for w in independent],
                            [v[i][t + 1] for i, t in decisions], [v[i][t] for i, t in decisions],
                            [w.self_twin for w in coupled], idx, oracle="estimated")
