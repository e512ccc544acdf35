"""The coupling curve's measures at a fixed policy (no training): how coupled the twins are, how often their
credit has the wrong sign, and how well each method's sampled policy gradient points.

Every measure is taken at ChoiceLab's initial policy (every attribute weight 0, uniform over the offers) of a
setting, so it needs no training and depends on the coupling knob alone.

* :func:`pair_audit`: ``groups x group_size`` factual episodes; at every decision one coupled twin (the
  alternative turn, then the factual episode's noise) and one independent counterfactual (the alternative turn,
  then fresh noise). Returns :func:`~twice_envs.agents.lab.coupling.coupling_summary` (rho-bar with the exact
  oracle, the oracle-free lower bound, tie and self-twin shares) and the **wrong-sign** figures of the raw
  per-decision credit ``D = U - U'`` of each kind of pair (Twice's twin credit: a coupled pair; CRR's: an
  independent one) against the exact ``A*``, over every decision whose ``A*`` is not 0 (ChoiceLab's advantages
  are at most ``1 / horizon`` in size, below the audits' 0.05 threshold, so no threshold is applied); zero credit
  is never wrong. ``wrong_sign_ratio`` is coupled over independent. Each figure has a 95% percentile bootstrap
  CI over groups, the same resamples for every figure.
* :func:`exact_gradient`: the exact policy gradient of the lab's value ``mean_k V[k, 0]`` (the mean over tasks
  of the value at the first choice) with respect to the attribute weights ``theta``. The policy at choice
  ``t`` of task ``k`` depends on ``(k, t)`` only, and so does the exact advantage
  ``A*[k, t, a] = Q[k, t, a] - V[k, t]`` (the dynamic programme of
  :class:`~twice_envs.agents.lab.choice_lab.ChoiceLabPolicy`), so the policy-gradient theorem gives exactly
  ``g* = (1 / tasks) sum_k sum_t sum_a pi[k, t, a] A*[k, t, a] (phi[k, t, a] - sum_b pi[k, t, b] phi[k, t, b])
  / temperature``, with ``phi`` the items' attribute vectors: no sampling at all.
* :func:`sampled_gradients`: a method's sampled gradient on ``batches`` fresh factual batches of the fixed
  policy (the learning bench's batch size), each ``policy.policy_gradient(batch, A)`` with the method's
  per-turn advantages ``A`` at the budget ``beta`` (Twice's predictor warmed up on ``warmup`` batches first,
  whose gradients are not used, as in a learning run); the policy is never updated.
* :func:`gradient_figures`: ``cosine``, the mean over batches of ``cos(g_b, g*)``; ``error``, the relative
  squared error after the best single scale, ``min_c mean_b |c g_b - g*|^2 / |g*|^2`` (a method's advantages
  have their own units and the tuned step size absorbs one scale; ``c >= 0``, a step size), which is
  ``1 - max(0, <mean g_b, g*>)^2 / (mean_b |g_b|^2 |g*|^2)``: 0 for a gradient that always points exactly along
  ``g*``, 1 for one that carries nothing of it or points against it on average (bias and batch-to-batch noise
  both count). Each with a 95% bootstrap CI over batches.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from twice_envs.agents import stats as cs
from twice_envs.agents.credit import twice
from twice_envs.agents.credit.registry import CreditContext, factual_group_size, get_method, run_credit
from twice_envs.agents.lab import toy
from twice_envs.agents.lab.choice_lab import ChoiceLabPolicy, ChoiceLabSetting, choice_lab_policy
from twice_envs.agents.lab.coupling import coupling_summary
from twice_envs.agents.lab.runner import lab_step_fns
from twice_envs.envs.choicelab.env import world

#: Seeds of the gradient batches start here (apart from the learning runs' and the audits' noise seeds).
GRADIENT_SEED_OFFSET = 5_000_000
#: ``|A*|`` below this counts as zero (a decision whose credit has no right sign).
NONZERO = 1e-12


def pair_audit(setting: ChoiceLabSetting, groups: int, *, group_size: int = 5, seed: int = 0,
               n_boot: int = 1000) -> dict:
    """The coupling summary and the wrong-sign figures of one coupled twin and one independent counterfactual at
    every decision of the setting's initial policy (see the module); JSON-ready."""
    policy = choice_lab_policy(setting)
    eps, envs = toy.toy_rollouts(policy, groups, group_size, noise_seed=seed)
    index = [(i, t) for i, e in enumerate(eps) for t in range(len(e.turns))]
    coupled = toy.toy_twins(policy, eps, envs, index, coupled=True, branch=1)
    independent = toy.toy_twins(policy, eps, envs, index, coupled=False, branch=1, fresh_salt=7)
    v = np.concatenate([policy.episode_values([t.text for t in e.turns]) for e in eps])
    adv = np.concatenate(toy.exact_advantages(policy, eps))
    u = np.array([eps[i].utility for i, _ in index])
    uc = np.array([w.utility for w in coupled])
    ui = np.array([w.utility for w in independent])
    idx = list(cs.resample_indices(len(u), n_boot, groups=[eps[i].group for i, _ in index], seed=seed))
    out = coupling_summary(u, uc, ui, v + adv, v, [w.self_twin for w in coupled], idx, oracle="exact")
    out.update(wrong_sign_figures(u - uc, u - ui, adv, idx))
    return out


def wrong_sign_figures(d_coupled, d_independent, oracle, indices) -> dict:
    """``wrong_sign_coupled``, ``wrong_sign_independent`` (share of the decisions with ``A* != 0`` whose credit has
    strictly the opposite sign), ``wrong_sign_ratio`` (coupled / independent) and the zero-credit shares of both,
    each ``{"value", "lo", "hi"}`` over the bootstrap ``indices``."""
    dc, di, a = (np.asarray(x, dtype=np.float64) for x in (d_coupled, d_independent, oracle))

    def rate(d, o) -> float:
        return cs.wrong_sign_rate(d, o, threshold=NONZERO)

    def ratio(x, y, o) -> float:
        base = rate(y, o)
        return rate(x, o) / base if base > 0 else float("nan")

    def zero(d) -> float:
        return float(np.mean(d == 0)) if len(d) else float("nan")

    def ci(stat, *arrays) -> dict:
        return cs.bootstrap_ci(stat, *arrays, indices=indices).as_dict()

    return {"wrong_sign_coupled": ci(rate, dc, a), "wrong_sign_independent": ci(rate, di, a),
            "wrong_sign_ratio": ci(ratio, dc, di, a), "zero_credit_coupled": ci(zero, dc),
            "zero_credit_independent": ci(zero, di)}


def exact_gradient(policy: ChoiceLabPolicy) -> np.ndarray:
    """The exact gradient of ``policy.value`` with respect to its attribute weights (see the module)."""
    V, Q = policy.values
    pi = policy.table  # (tasks, horizon, options)
    adv = Q - V[:, :-1, None]
    phi = world(policy.config).features  # (tasks, horizon, options, attributes)
    score = phi - np.einsum("kto,ktoi->kti", pi, phi)[:, :, None, :]
    return np.einsum("kto,kto,ktoi->i", pi, adv, score) / policy.setting.temperature / pi.shape[0]


def sampled_gradients(method: str, setting: ChoiceLabSetting, *, twice_config: Optional[twice.TwiceConfig] = None,
                      beta: float, batches: int, warmup: int, groups: int, group_size: int,
                      seed: int = 0) -> np.ndarray:
    """``(batches, attributes)``: the method's sampled policy gradient on fresh batches of the setting's initial
    policy, never updated (see the module); ``twice_config``: the twin settings (default the published ones)."""
    policy = choice_lab_policy(setting)
    credit_method = get_method(method)
    settings = credit_method.settings(twice_config, beta=beta, warmup_updates=warmup, per_state=1)
    rng = np.random.default_rng([seed, 11])
    state, grads = None, []
    size = factual_group_size(method, group_size)
    for u in range(warmup + batches):
        noise = (GRADIENT_SEED_OFFSET + seed) * 100_003 + u
        eps, envs = toy.toy_rollouts(policy, groups, size, noise_seed=noise)
        res = run_credit(credit_method, eps, CreditContext(policy=policy, rng=rng, update=u, noise_seed=noise,
                                                           config=settings, predictor_state=state,
                                                           runners=lab_step_fns(envs)))
        state = res.predictor_state or state
        if u >= warmup:
            grads.append(policy.policy_gradient(res.episodes if res.episodes is not None else eps, res.advantages))
    return np.array(grads)


def _cosine(g: np.ndarray, exact: np.ndarray) -> float:
    norms = np.linalg.norm(g, axis=1) * np.linalg.norm(exact)
    return float(np.mean(np.where(norms > 0, g @ exact / np.where(norms > 0, norms, 1), 0.0)))


def _error(g: np.ndarray, exact: np.ndarray) -> float:
    power = float(np.mean(np.sum(g * g, axis=1))) * float(exact @ exact)
    along = max(0.0, float(g.mean(axis=0) @ exact))  # the scale is a step size: never negative
    return 1.0 - along**2 / power if power > 0 else float("nan")


def gradient_figures(grads: np.ndarray, exact: np.ndarray, *, n_boot: int = 1000, seed: int = 0) -> dict:
    """``cosine`` and ``error`` of sampled gradients against the exact one (see the module), each with a 95%
    bootstrap CI over the batches, and ``batches``."""
    g = np.asarray(grads, dtype=np.float64)
    idx = list(cs.resample_indices(len(g), n_boot, seed=seed))
    return {"cosine": cs.bootstrap_ci(lambda x: _cosine(x, exact), g, indices=idx).as_dict(),
            "error": cs.bootstrap_ci(lambda x: _error(x, exact), g, indices=idx).as_dict(), "batches": len(g)}
