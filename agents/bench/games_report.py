"""The text report of ``twice bench games``: a table per env, the ordering, the paired differences and
whether the intervals can tell apart a 5-point difference."""

from __future__ import annotations

import math

import numpy as np

from twice_envs.agents.stats import episodes_for_difference, pairs_resolution


def ordering(success: dict) -> str:
    """Methods from best to worst success, ``=`` between equal figures (``twice > crr = grpo``)."""
    order = sorted(success, key=lambda m: -success[m])
    out = order[0]
    for a, b in zip(order, order[1:]):
        out += (" = " if abs(success[a] - success[b]) < 1e-12 else " > ") + b
    return out


def lr_label(results: dict, methods: dict) -> str:
    """How the methods' learning rates compare: ``at one shared learning rate lr=...`` (the bench trains
    every method at ``--lr``, untuned), the rates if they differ, or that none was recorded."""
    default = (results.get("config") or {}).get("lr")
    lrs = {m: x.get("lr", default) for m, x in methods.items()}
    if any(v is None for v in lrs.values()):
        return "at learning rates not recorded"
    if len(set(lrs.values())) == 1:
        return f"at one shared learning rate lr={next(iter(lrs.values())):g}"
    return "at learning rates " + ", ".join(f"{m} {v:g}" for m, v in lrs.items())


def report(results: dict) -> str:
    """The results as text: a table per env, the ordering, and whether the intervals separate 5 points.
    Every comparison names the learning rates it was measured at: at one shared learning rate, untuned,
    a difference is not a method's win (a method whose update is larger gains from the rate alone)."""
    lines = []
    for env_id, r in results["envs"].items():
        shared = lr_label(results, r["methods"])
        b = r["before"]["all"]
        choose = (results.get("config") or {}).get("choose")
        mode = f", choosing among listed actions by {choose}" if choose else ""
        lines.append(f"{env_id} (start model {r['model']}{mode}): before {b['success']:.3f} "
                     f"[{b['success_ci'][0]:.3f}, {b['success_ci'][1]:.3f}] n={b['episodes']}, "
                     f"valid {b['valid_share']:.3f}, "
                     f"reward {b.get('mean_reward', float('nan')):.3f}")
        lines.append(f"  {'method':<7} {'after':>6} {'95% CI':>15} {'n':>5} {'change (paired) [95% CI]':>26} "
                     f"{'aux tok/upd':>11} {'s/upd':>6} {'train invalid':>13} {'mixed groups':>12} {'valid after':>11} "
                     f"{'reward after':>12}")
        ms = r["methods"]
        for m, x in ms.items():
            reward = x.get("eval_mean_reward", float("nan"))
            ch = x.get("change_ci", [float("nan")] * 2)
            change = f"{x.get('change', float('nan')):+.3f} [{ch[0]:+.3f}, {ch[1]:+.3f}]"
            lines.append(f"  {m:<7} {x['success']:6.3f} [{x['success_ci'][0]:.3f}, {x['success_ci'][1]:.3f}] "
                         f"{x['episodes']:5d} {change:>26} {x['aux_tokens_per_update']:11.0f} "
                         f"{x['seconds_per_update']:6.1f} "
                         f"{x['train_invalid_share']:13.3f} {x.get('train_mixed_groups', float('nan')):12.3f} "
                         f"{x.get('eval_valid_share', float('nan')):11.3f} {reward:12.3f}")
        for m, x in ms.items():
            if len(x.get("curve", ())) > 1:  # evaluated while training (--eval-every)
                lines.append(f"  {m} held-out by update, change (paired) [95% CI]: " + ", ".join(
                    f"{c['update']}: {c['change']:+.3f} [{c['change_ci'][0]:+.3f}, {c['change_ci'][1]:+.3f}]"
                    for c in x["curve"]))
        if ms:
            lines.append("  ordering: " + ordering({m: x["success"] for m, x in ms.items()}) + f" ({shared}, not "
                         "tuned per method: an order here is not a method's win)")
            better = [m for m, x in ms.items() if x.get("improves")]
            lines.append(f"  improve on the start model (paired interval above 0): {', '.join(better) or 'none'} "
                         f"of {len(ms)}")
            pairs = r.get("pairs") or {}
            if pairs:
                lines.append(f"  paired differences between methods (same tasks and noise) {shared}, 95% CI:")
                for name, x in pairs.items():
                    ci = x["change_ci"]
                    sig = "significant" if ci[0] > 0 or ci[1] < 0 else "not significant"
                    lines.append(f"    {name}: {x['change']:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}] {sig}")
                half, n, need = pairs_resolution(pairs)
                verdict = "can" if half <= 0.05 else "cannot"
                lines.append(f"  the widest paired interval between two methods has half-width {half:.3f}: "
                             f"it {verdict} "
                             f"tell apart a 5-point difference (every pair would need about {need} held-out episodes "
                             f"per method at the observed spread; here {n})")
            train_pairs = r.get("train_pairs") or {}
            if train_pairs:
                lines.append("  paired training differences (updates that sampled the same tasks with the same luck; "
                             f"t interval over them) {shared}, 95% CI:")
                for name, x in train_pairs.items():
                    sig = "significant" if x["significant"] else "not significant"
                    lines.append(f"    {name}: {x['measure']} {x['mean']:+.3f} "
                                 f"[{x['ci'][0]:+.3f}, {x['ci'][1]:+.3f}] over "
                                 f"{x['n']} updates ({x['updates'][0]}-{x['updates'][1]}) {sig}")
            if not pairs:
                n = min(x["episodes"] for x in ms.values())
                p = float(np.mean([x["success"] for x in ms.values()]))
                # the same floor as episodes_for_difference: near 0 or 1 the normal approximation says too little
                q = min(max(p, 0.05), 0.95)
                half = 1.96 * math.sqrt(2 * q * (1 - q) / max(n, 1))
                need = episodes_for_difference(p)
                verdict = "can" if half <= 0.05 else "cannot"
                lines.append(f"  a 95% interval of a difference between two methods has half-width {half:.3f}: it "
                             f"{verdict} tell apart a 5-point difference (that needs about {need} held-out episodes "
                             f"per method at success {p:.2f}; here {n})")
    return "\n".join(lines)
