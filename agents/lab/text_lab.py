"""TextLab's measurements: how its twins couple under each key layout, and the bias of ``ngram`` keys.

TextLab's policy (:mod:`twice_envs.agents.lab.text_policy`, set by
:class:`~twice_envs.agents.lab.text_setting.TextLabSetting`) writes multi-line turns whose exact
values are known. On it, :func:`key_layout_rho` gives the rho-bar of coupled twins per key layout
(and of independent twins), and :func:`ngram_bias` the total variation of ``ngram``-keyed sampling
from the exact trajectory law, beside the same figure for ``line`` keys; :func:`format_measurements`
prints both (``twice bench keys``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from twice_envs.agents import stats as cs
from twice_envs.agents.lab import toy
from twice_envs.agents.lab.text_policy import TextLabPolicy, text_lab_policy
from twice_envs.agents.lab.text_setting import TextLabSetting
from twice_envs.envs.searchtoy.env import transition
from twice_envs.noise import KEY_MODES


def _decisions(eps) -> list[tuple[int, int]]:
    return [(i, t) for i, e in enumerate(eps) for t in range(len(e.turns))]


def coupled_twin_run(policy: TextLabPolicy, groups: int, *, group_size: int = 5, seed: int = 0,
                     coupled: bool = True) -> dict:
    """Factual episodes and one twin per decision (coupled or independent), with exact values.

    Returns arrays over decisions: ``u`` (factual utility), ``u_twin``, ``v_state`` (``V(s_t)``),
    ``v_next`` (``V(s_{t+1})``), ``groups``, ``self_twin``; and ``episodes``, ``twins``.
    """
    eps, envs = toy.toy_rollouts(policy, groups, group_size, noise_seed=seed)
    index = _decisions(eps)
    tw = toy.toy_twins(policy, eps, envs, index, coupled=coupled, branch=1)
    v = np.concatenate([policy.episode_values([t.text for t in e.turns]) for e in eps])
    adv = np.concatenate(toy.exact_advantages(policy, eps))
    return {"u": np.array([eps[i].utility for i, _ in index]), "u_twin": np.array([w.utility for w in tw]),
            "v_state": v, "v_next": v + adv, "groups": np.array([eps[i].group for i, _ in index]),
            "self_twin": np.array([w.self_twin for w in tw]), "episodes": eps, "twins": tw, "index": index}


def key_layout_rho(setting: TextLabSetting = TextLabSetting(), groups: int = 120, seed: int = 0, *,
                   group_size: int = 5, n_boot: int = 1000) -> dict[str, dict]:
    """rho-bar (:func:`~twice_envs.agents.stats.per_decision_rho` with exact values) of coupled twins
    for every key layout, and of independent twins (``"independent"``, line keys).

    Every layout samples the same factual noise seeds; each decision of each factual
    episode gets one twin. Each entry: ``value``, ``lo``, ``hi`` (95% percentile bootstrap
    over groups), ``decisions``, ``self_twins`` (share of twins whose alternative turn
    repeated the factual text) and ``mean_tokens`` (per factual turn).
    """
    out: dict[str, dict] = {}
    runs = [(m, m, True) for m in KEY_MODES] + [("independent", "line", False)]
    for name, mode, coupled in runs:
        policy = text_lab_policy(replace(setting, key_mode=mode))
        r = coupled_twin_run(policy, groups, group_size=group_size, seed=seed, coupled=coupled)
        idx = list(cs.resample_indices(len(r["u"]), n_boot, groups=r["groups"], seed=seed))
        est = cs.bootstrap_ci(cs.per_decision_rho, r["u"], r["u_twin"], r["v_next"], r["v_state"], indices=idx)
        turns = [t for e in r["episodes"] for t in e.turns]
        out[name] = {**est.as_dict(), "decisions": len(r["u"]), "self_twins": float(r["self_twin"].mean()),
                     "mean_tokens": float(np.mean([len(t.token_ids) for t in turns]))}
    return out


def _tv(samples: Sequence[tuple], prob) -> float:
    """Total variation between the empirical law of ``samples`` and the exact law ``prob(x)``
    (the exact mass on values never sampled counts in full)."""
    counts = Counter(samples)
    p = np.array([prob(x) for x in counts])
    freq = np.array(list(counts.values())) / len(samples)
    return 0.5 * float(np.abs(freq - p).sum() + max(0.0, 1.0 - p.sum()))


def _summary(policy: TextLabPolicy, ep, summary: str) -> tuple:
    actions = tuple(policy.action_of_ids(t.token_ids) for t in ep.turns)
    if summary == "actions":
        return actions
    found = 0
    for a in actions:
        found = transition(policy.config, found, a)
    return (len(actions), found.bit_count())


def ngram_bias(setting: TextLabSetting = TextLabSetting(), groups: int = 120, seed: int = 0, *,
               group_size: int = 5, n_boot: int = 1000, summary: str = "outcome") -> dict[str, dict]:
    """Total variation between keyed sampling's trajectory law and the policy's exact law.

    ``summary`` is the trajectory summary compared: ``"outcome"`` (default: turns taken and
    facts found, whose exact law is :meth:`TextLabPolicy.outcome_law`) or ``"actions"`` (the
    episode's sequence of actions, exact probability by
    :meth:`TextLabPolicy.action_sequence_prob`; its support is so large that at lab sizes
    its TV is mostly finite-sample noise). The same factual seeds are sampled with ``ngram``
    keys and with ``line`` keys. Entries ``"ngram"``, ``"line"`` and ``"ngram - line"``:
    ``value``, ``lo``, ``hi`` (95% bootstrap over groups, the same resamples for both
    layouts, so the difference is paired) and, for the layouts, ``episodes``.

    How to read them: line keys never repeat within an episode, so line-keyed episodes
    are exact samples and their TV is pure finite-sample noise (it shrinks like
    ``1/sqrt(episodes)``, never to 0 at a finite size). ``ngram`` keys repeat whenever the
    last :data:`~twice_envs.noise.NGRAM` tokens repeat, so their samples are not the
    policy's; the excess ``ngram - line`` is the layout's bias, detected where its CI
    lies above 0. A TV recomputed on a bootstrap resample is shifted upward (resampling
    adds noise), so each interval is the bootstrap spread (2.5% and 97.5% quantiles)
    centred on the figure's own value rather than the raw quantiles; compare the two
    layouts, not either one with 0.
    """
    if summary not in ("actions", "outcome"):
        raise ValueError(f"summary must be 'actions' or 'outcome', got {summary!r}")
    res = {}
    for mode in ("ngram", "line"):
        policy = text_lab_policy(replace(setting, key_mode=mode))
        eps, _ = toy.toy_rollouts(policy, groups, group_size, noise_seed=seed)
        if summary == "actions":
            prob = policy.action_sequence_prob
        else:
            law = policy.outcome_law()
            prob = lambda x, law=law: law.get(x, 0.0)
        res[mode] = ([_summary(policy, e, summary) for e in eps], prob)
    g = np.array([e.group for e in eps])
    idx = list(cs.resample_indices(len(g), n_boot, groups=g, seed=seed))
    value = {m: _tv(s, prob) for m, (s, prob) in res.items()}
    boots = {m: np.array([_tv([s[j] for j in ix], prob) for ix in idx]) for m, (s, prob) in res.items()}
    value["ngram - line"], boots["ngram - line"] = value["ngram"] - value["line"], boots["ngram"] - boots["line"]
    out = {}
    for m, v in value.items():
        lo, mid, hi = np.quantile(boots[m], [0.025, 0.5, 0.975])
        out[m] = {"value": float(v), "lo": float(v - (mid - lo)), "hi": float(v + (hi - mid))}
        if m in res:
            out[m]["episodes"] = len(res[m][0])
    return out


def format_measurements(rho: dict, tv: dict, summary: str) -> str:
    """The two measurements as text (see :func:`key_layout_rho` and :func:`ngram_bias`)."""
    lines = ["rho-bar of coupled twins per key layout (exact values; 95% bootstrap CI over groups):"]
    for name, r in rho.items():
        lines.append(f"  {name:<12} {r['value']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}]  decisions {r['decisions']}, "
                     f"self-twins {100 * r['self_twins']:.1f}%, tokens per turn {r['mean_tokens']:.1f}")
    lines.append(f"total variation from the exact law of the trajectory summary '{summary}' (95% CI, centred):")
    for name, r in tv.items():
        lines.append(f"  {name:<12} {r['value']:.4f} [{r['lo']:.4f}, {r['hi']:.4f}]")
    return "\n".join(lines) + "\n"
