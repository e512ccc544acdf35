"""The LLM audit's oracle: ``V(s_t)`` of every audited state from independent rollouts, and its standard error.

The oracle advantage of a decision is ``A* = V(s_{t+1}) - V(s_t)``; each ``V`` is the mean utility of
``n`` independent rollouts from the state (:func:`value_requests` asks for them, each on its own
:func:`~twice_envs.keys.audit_seed`), and ``V(s_T) = U`` at the end. The squared standard error of
each ``V`` is the sample variance of its rollouts over their number (:func:`value_variances`);
VinePPO's value rollouts are read the same way.
"""

from __future__ import annotations

import numpy as np

from twice_envs.agents.rollout.episodes import BranchRequest
from twice_envs.keys import audit_seed


def value_requests(audited, eps, n_rollouts, stream, noise_seed):
    """``n_rollouts`` independent rollouts from every state of every audited episode, rollout ``m``
    of state ``(i, t)`` on :func:`~twice_envs.keys.audit_seed` ``(noise_seed, stream, i, t, m)``."""
    return [BranchRequest(i, t, branch=1 + m, coupled=False, noise_seed=audit_seed(noise_seed, stream, i, t, m))
            for i in audited for t in range(len(eps[i].turns)) for m in range(n_rollouts)]


def state_utilities(eps, audited, recs):
    """The utilities of the value rollouts of every state ``(i, t)``, in request order."""
    out = {(i, t): [] for i in audited for t in range(len(eps[i].turns))}
    for r in recs:
        out[tuple(r.twin_of)].append(r.utility)
    return out


def values(eps, audited, recs, n_rollouts=None):
    """``V(s_0..s_T)`` per audited episode from value rollouts (the first ``n_rollouts`` per state)."""
    sums = state_utilities(eps, audited, recs)
    out = {}
    for i in audited:
        v = [float(np.mean(sums[(i, t)][:n_rollouts])) for t in range(len(eps[i].turns))] + [eps[i].utility]
        out[i] = np.array(v)
    return out


def value_variances(eps, audited, recs):
    """The squared standard error of ``V(s_0..s_T)`` per audited episode: the sample variance
    (``ddof = 1``) of each state's rollouts over their number, NaN with fewer than two, and 0 for
    the terminal ``V(s_T) = U``."""
    sums = state_utilities(eps, audited, recs)
    out = {}
    for i in audited:
        u = [np.asarray(sums[(i, t)], float) for t in range(len(eps[i].turns))]
        out[i] = np.array([float(np.var(x, ddof=1)) / len(x) if len(x) > 1 else float("nan") for x in u] + [0.0])
    return out
