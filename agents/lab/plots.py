"""Learning curves of several runs side by side (PNG, matplotlib's Agg backend).

``twice plot runs/grpo runs/twice --out curves.png`` reads each run's
``metrics.jsonl`` and draws reward, dev EM (where evaluated), auxiliary tokens per
policy token and seconds per update against the update number.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Sequence

import numpy as np

from twice_envs._deps import require


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    mpl = require("matplotlib", "plot", "plots")
    mpl.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def read_metrics(run: Path) -> list[dict]:
    path = Path(run) / "metrics.jsonl" if Path(run).is_dir() else Path(run)
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


def smooth(y: np.ndarray, k: int) -> np.ndarray:
    """Trailing mean over up to ``k`` updates, one value per update (the first ones average
    fewer); a run shorter than the window is shown as it is."""
    y = np.asarray(y, dtype=float)
    if k <= 1 or len(y) < k:
        return y
    c = np.cumsum(np.insert(y, 0, 0.0))
    i = np.arange(1, len(y) + 1)
    lo = np.maximum(i - k, 0)
    return (c[i] - c[lo]) / (i - lo)


def panel_points(rows: Sequence[dict], key: str, k: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """The ``(update, value)`` points a panel plots for ``key``: every update that has the value,
    from the first on (``eval_em``: the greedy evaluations, never smoothed)."""
    if key == "eval_em":
        pts = [(m["update"], m["eval"]["em"]) for m in rows if isinstance(m.get("eval"), dict)]
        k = 1
    else:
        pts = [(m["update"], m[key]) for m in rows if m.get(key) is not None]
    if not pts:
        return np.array([]), np.array([])
    x, y = np.array(pts, dtype=float).T
    return x, smooth(y, k)


PANELS = (("reward", "training reward"), ("eval_em", "dev EM (greedy)"), ("realised_beta", "aux / policy tokens"),
          ("time", "seconds per update"))


def plot_runs(runs: Sequence[Path], out: Path, *, labels: Sequence[str] | None = None, window: int = 5) -> Path:
    """One PNG with a panel per metric and a line per run (trailing means over ``window`` updates)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4 * len(PANELS), 3.2))
    for r, run in enumerate(runs):
        rows = read_metrics(run)
        label = labels[r] if labels else Path(run).name
        for ax, (key, title) in zip(axes, PANELS):
            x, y = panel_points(rows, key, window)
            if len(x):
                ax.plot(x, y, marker="o" if key == "eval_em" or len(x) < 20 else None, label=label)
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("update")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_main(argv: Sequence[str]) -> int:
    """``twice plot RUN [RUN ...] [--out FILE]``."""
    p = argparse.ArgumentParser(prog="twice plot", description="Learning curves of several runs side by side.")
    p.add_argument("runs", nargs="+", help="run directories (with metrics.jsonl)")
    p.add_argument("--out", default="curves.png")
    p.add_argument("--smooth", type=int, default=5, help="moving-average window")
    a = p.parse_args(argv)
    path = plot_runs([Path(r) for r in a.runs], Path(a.out), window=a.smooth)
    print(f"wrote {path}")
    return 0


def plot_credit_scatter(oracle, credit: dict, pairs: dict, rows: dict, out: Path, *, seed: int = 0) -> Path:
    """Credit against the exact advantage, one panel per method, with the ``J``-pair ceiling drawn
    as the band ``A* +- sqrt((|A*| - A*^2) / J)`` (the least spread any unbiased ``J``-pair credit
    with 0/1 outcomes can have) and the identity line. Points are jittered a little: credit
    values are often a few discrete levels."""
    plt = pyplot()
    oracle = np.asarray(oracle, dtype=float)
    rng = np.random.default_rng(seed)
    fig, axes = plt.subplots(1, len(credit), figsize=(3.3 * len(credit), 3.3), squeeze=False)
    grid = np.linspace(-1, 1, 201)
    for ax, (name, c) in zip(axes[0], credit.items()):
        c = np.asarray(c, dtype=float)
        ax.scatter(oracle, c + rng.normal(0, 0.02, c.size), s=4, alpha=0.25)
        ax.plot(grid, grid, color="k", lw=0.6, ls="--")
        j = pairs.get(name, 0)
        if j:
            sd = np.sqrt(np.clip(np.abs(grid) - grid**2, 0, None) / j)
            ax.plot(grid, grid + sd, color="tab:red", lw=0.8)
            ax.plot(grid, grid - sd, color="tab:red", lw=0.8)
        r = rows.get(name, {})
        title = f"{name}: r={r['pearson']['value']:.2f}" if "pearson" in r else name
        if "ceiling" in r:
            title += f" (ceiling {r['ceiling']['value']:.2f})"
        ax.set_title(title, fontsize=8)
        lim = max(0.05, float(np.max(np.abs(oracle), initial=0.0)) * 1.1)
        ax.set_xlim(-lim, lim)
        ax.set_xlabel("exact A*")
    axes[0][0].set_ylabel("credit")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def plot_bands(x, curves: dict, out: Path, *, ylabel: str = "exact V(s0)", hline: float | None = None) -> Path:
    """Mean curve with a shaded 95% band per method; ``curves[name] = (mean, lo, hi)``."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for name, (m, lo, hi) in curves.items():
        ax.plot(x, m, label=name)
        ax.fill_between(x, lo, hi, alpha=0.2)
    if hline is not None:
        ax.axhline(hline, color="gray", lw=0.6, ls=":")
    ax.set_xlabel("update")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
