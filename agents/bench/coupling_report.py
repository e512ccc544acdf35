"""The coupling curve's table and plot (``twice bench coupling``'s output, from its JSON-ready result).

:func:`format_coupling` prints one row per point of the knob (rho-bar, wrong-sign rates, the gradient figures,
the learning gain of coupling with its paired CI, and the measured worth in budget multiples beside the
predicted ``1 / (1 - rho-bar)``), then the arms the knob cannot change and every arm's tuning.
:func:`plot_coupling` draws two panels: the gain against rho-bar with the predicted gain overlaid, and the
measured worth against rho-bar with the prediction's curve.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from twice_envs.agents.bench.learn import format_tuning
from twice_envs.agents.lab.plots import pyplot


def _ci(e: dict, scale: float = 1.0, fmt: str = ".3f") -> str:
    if not np.isfinite(e["value"]):
        return "n/a"
    return f"{e['value'] * scale:{fmt}} [{e['lo'] * scale:{fmt}}, {e['hi'] * scale:{fmt}}]"


def _paired(d: dict) -> str:
    if not np.isfinite(d["ci"][0]):
        return f"{d['mean']:+.4f}"
    return f"{d['mean']:+.4f} [{d['ci'][0]:+.4f}, {d['ci'][1]:+.4f}]" + ("*" if d["significant"] else "")


def multiple(x: float, measured: list) -> str:
    """A budget multiple, or the bound it stands for (``-inf``/``inf``: outside the measured budgets)."""
    if x == float("-inf"):
        return f"<{measured[0]:g}"
    if x == float("inf"):
        return f">{measured[1]:g}"
    return f"{x:.2f}"


def worth_cell(w: dict) -> str:
    m = w["measured"]
    return f"{multiple(w['value'], m)} [{multiple(w['lo'], m)}, {multiple(w['hi'], m)}]"


def predicted_cell(p: dict) -> str:
    if not p["determined"]:
        return f"{p['point']:.2f} (CI of rho-bar not above 0)"
    return f"{p['value']:.2f} [{p['lo']:.2f}, {p['hi']:.2f}]"


def format_coupling(res: dict) -> str:
    """The bench's text output (see the module)."""
    cfg, st = res["config"], res["step_sizes"]
    lines = [f"{res['env']}: coupling knob {res['knob']} at {len(res['points'])} points; budget beta = {cfg['beta']} "
             f"(accounted auxiliary tokens / policy tokens); {cfg['seeds']} reporting seeds x {cfg['updates']} "
             f"updates of {cfg['groups']} groups x {cfg['group_size']}; area = mean exact V(s0) over the updates",
             f"step sizes: each arm its own, tuned on lr grid {', '.join(f'{x:g}' for x in st['grid'])} with "
             f"{len(st['tune_seeds'])} tuning seeds apart from the reporting ones; rule: {st['rule']}",
             f"audit: one coupled twin and one independent counterfactual at every decision of {cfg['audit_groups']} "
             f"groups x 5 episodes of the initial policy; wrong-sign % over decisions with A* != 0; gradient: "
             f"{cfg['gradient_batches']} batches at the initial policy against the exact gradient",
             ""]
    head = (f"{'shuffle':>7} {'rho-bar [95% CI]':>22} {'wrong-sign % coupled':>21} {'independent':>20} "
            f"{'ratio':>20} {'grad cos':>22} {'grad error':>22} {'lr':>5} {'area [95% CI]':>22} "
            f"{'gain: - independent, paired':>34} {'- CRR, paired':>34} {'worth measured (x beta)':>26} "
            f"{'predicted 1/(1-rho)':>22}")
    lines.append(head)
    for p in res["points"]:
        a, g = p["audit"], p["gradient"]
        lines.append(f"{p['shuffle']:>7g} {_ci(a['rho_bar']):>22} {_ci(a['wrong_sign_coupled'], 100, '.1f'):>21} "
                     f"{_ci(a['wrong_sign_independent'], 100, '.1f'):>20} {_ci(a['wrong_sign_ratio'], 1, '.2f'):>20} "
                     f"{_ci(g['cosine']):>22} {_ci(g['error']):>22} {p['lr']:>5g} {_ci(p['area']):>22} "
                     f"{_paired(p['gain']):>34} {_paired(p['vs_crr']):>34} {worth_cell(p['worth_measured']):>26} "
                     f"{predicted_cell(p['worth_predicted']):>22}")
    m = res["points"][0]["worth_measured"]["measured"]
    lines += [f"(* paired 95% t interval excludes 0; worth: the budget multiple at which independent twins' area "
              f"matches the point's, interpolated in log budget between measured budgets; <{m[0]:g} or >{m[1]:g}: "
              "outside the budgets measured, a bound, not extrapolated)", "",
              f"arms the knob cannot change (run once, at shuffle {cfg['invariant_shuffle']:g}):",
              f"{'arm':<18} {'lr':>5} {'area [95% CI]':>22} {'final V(s0)':>12} {'aux/policy tok':>15} "
              f"{'accounted/budget':>17} {'grad cos':>22} {'grad error':>22}"]
    for k, r in res["arms"].items():
        if k.startswith("twice@"):
            continue
        g = res["gradients"].get(k)
        cells = (_ci(g["cosine"]), _ci(g["error"])) if g else ("", "")
        lines.append(f"{k:<18} {r['lr']:>5g} {_ci(r['area']):>22} {np.mean(r['final']):>12.3f} "
                     f"{r['aux_per_policy']:>15.2f} {r['accounted_per_budget']:>17.3f} {cells[0]:>22} {cells[1]:>22}")
    for k, g in res["gradients"].items():
        if k not in res["arms"]:
            lines.append(f"{k + ' (gradient only)':<18} {'':>5} {'':>22} {'':>12} {'':>15} {'':>17} "
                         f"{_ci(g['cosine']):>22} {_ci(g['error']):>22}")
    lines.append(f"{'coupled arms:':<18} " + "; ".join(
        f"{k} aux/policy {r['aux_per_policy']:.2f}, accounted/budget {r['accounted_per_budget']:.3f}"
        for k, r in res["arms"].items() if k.startswith("twice@")))
    lines += [""] + format_tuning({k: r["tuning"] for k, r in res["arms"].items()}, 18, "arm")
    return "\n".join(lines) + "\n"


def plot_coupling(res: dict, out: Path) -> Path:
    """Left: the gain of coupling (paired mean and 95% CI) against rho-bar (with its CI), the predicted gain
    overlaid (a triangle: a lower bound, the prediction beyond the budgets measured). Right: the measured worth
    in budget multiples against rho-bar (arrows: bounds), with the prediction ``1 / (1 - rho)``."""
    plt = pyplot()
    pts = res["points"]
    rho = np.array([p["audit"]["rho_bar"]["value"] for p in pts])
    rlo = rho - np.array([p["audit"]["rho_bar"]["lo"] for p in pts])
    rhi = np.array([p["audit"]["rho_bar"]["hi"] for p in pts]) - rho
    gain = np.array([p["gain"]["mean"] for p in pts])
    glo = np.array([p["gain"]["ci"][0] for p in pts])
    ghi = np.array([p["gain"]["ci"][1] for p in pts])
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax.errorbar(rho, gain, xerr=[rlo, rhi], yerr=[np.nan_to_num(gain - glo), np.nan_to_num(ghi - gain)], fmt="o",
                capsize=2, label="measured: Twice - independent twins (paired)")
    pred = np.array([p["gain_predicted"]["value"] for p in pts])
    bound = np.array([p["gain_predicted"]["lower_bound"] for p in pts])
    order = np.argsort(rho)
    ax.plot(rho[order], pred[order], color="tab:red", lw=1, ls="--", label="predicted by 1/(1 - rho-bar)")
    ax.scatter(rho[bound], pred[bound], marker="^", color="tab:red", zorder=3, label="prediction: lower bound")
    ax.axhline(0, color="gray", lw=0.6, ls=":")
    ax.set_xlabel("rho-bar")
    ax.set_ylabel("area gain at equal budget")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    grid = np.linspace(min(0.0, rho.min()), min(0.97, max(rho.max(), 0.5)), 100)
    bx.plot(grid, 1 / (1 - grid), color="tab:red", lw=1, ls="--", label="predicted 1/(1 - rho-bar)")
    m = pts[0]["worth_measured"]["measured"]
    for r, p in zip(rho, pts):
        w = p["worth_measured"]
        v = float(np.clip(w["value"], m[0], m[1]))
        lo, hi = float(np.clip(w["lo"], m[0], m[1])), float(np.clip(w["hi"], m[0], m[1]))
        marker = "v" if w["value"] == float("-inf") else "^" if w["value"] == float("inf") else "o"
        bx.errorbar([r], [v], yerr=[[v - lo], [hi - v]], fmt=marker, color="tab:blue", capsize=2)
    bx.axhspan(m[0], m[1], color="gray", alpha=0.08, label="budgets measured")
    bx.set_yscale("log")
    bx.set_xlabel("rho-bar")
    bx.set_ylabel("worth of coupling (x budget)")
    bx.legend(fontsize=7)
    bx.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
