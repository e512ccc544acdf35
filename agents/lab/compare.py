"""Paired comparisons of Twice's credit with each baseline's, on the same decisions (both audits).

Each comparison is a paired difference ``Twice - baseline`` of the Pearson correlation with ``A*`` and of
the wrong-sign rate, with a bootstrap CI over the shared resamples: :func:`equal_token_comparisons` puts
Twice's diagnostic rows against each diagnostic baseline at no more auxiliary tokens (and says where the
tokens cannot match), :func:`budget_comparisons` puts Twice's update row against every other method run
at the same budget.
"""

from __future__ import annotations

from twice_envs.agents import stats as cs


def _paired_rows(name, base, oracle, credit, idx, threshold, **labels) -> list[dict]:
    """Paired differences ``name - base`` of Pearson and wrong-sign rate with bootstrap CIs."""
    ws = lambda x, a: cs.wrong_sign_rate(x, a, threshold)  # noqa: E731
    out = []
    for fig, stat in (("pearson", cs.pearson), ("wrong_sign", ws)):
        c = cs.compare(stat, (credit[name], oracle), (credit[base], oracle), indices=idx)
        row = {"twice": name, "baseline": base, "figure": fig, **labels, **c.as_dict()}
        if fig == "wrong_sign":
            ratio = lambda x, y, a: ws(x, a) / ws(y, a) if ws(y, a) > 0 else float("nan")  # noqa: E731
            row["ratio"] = cs.bootstrap_ci(ratio, credit[name], credit[base], oracle, indices=idx).as_dict()
        out.append(row)
    return out


def equal_token_comparisons(oracle, credit, aux, idx, threshold) -> list[dict]:
    """Twice's diagnostic credit (the most pairs within each baseline's auxiliary tokens) against each
    baseline: paired differences of Pearson and wrong-sign rate with bootstrap CIs.

    Each comparison says whether the tokens are matched: ``equal_tokens`` is False (and ``label``
    says how) when Twice spends auxiliary tokens the baseline does not (GRPO, GiGPO), or when even
    Twice's cheapest row spends more than the baseline."""
    twices = sorted((aux[n], n) for n in credit if n.startswith("twice J"))
    out = []
    for base in credit:
        if not base.startswith(("crr", "vineppo", "grpo", "gigpo")):
            continue
        within = [n for k, n in twices if k <= aux[base]]
        tw = (within or [twices[0][1]])[-1]
        if aux[base] == 0:
            label = "unequal: the baseline uses no auxiliary tokens"
        elif not within:
            label = "unequal: Twice's cheapest row spends more"
        else:
            label = "at no more auxiliary tokens"
        out += _paired_rows(tw, base, oracle, credit, idx, threshold, twice_tokens=int(aux[tw]),
                            baseline_tokens=int(aux[base]), equal_tokens=label.startswith("at"), label=label)
    return out


def budget_comparisons(oracle, credit, budget_rows: dict, idx, threshold) -> list[dict]:
    """Twice's update credit against every other method run at the same budget ``beta`` (CRR as
    published, its ablations): both spend ``beta`` x policy tokens in expectation."""
    out = []
    for base, st in budget_rows.items():
        if base == "twice":
            continue
        out += _paired_rows("twice", base, oracle, credit, idx, threshold,
                            twice_tokens=int(budget_rows["twice"]["aux_accounted"]),
                            baseline_tokens=int(st["aux_accounted"]), equal_tokens=True,
                            label="both at budget beta (accounted tokens)")
    return out
