"""Curve plots show every update from the first, whatever the smoothing window."""

from __future__ import annotations

import json

import numpy as np
import pytest

from twice_envs.agents.lab.plots import panel_points, plot_runs, smooth


def _run(tmp_path, n):
    rows = [{"update": u, "reward": float(u % 2), "time": 1.0 + u, "eval": {"em": 0.1 * u}} for u in range(1, n + 1)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_a_six_update_run_plots_every_update_from_the_first(tmp_path):
    rows = _run(tmp_path, 6)
    x, y = panel_points(rows, "reward", 5)
    assert list(x) == [1, 2, 3, 4, 5, 6]
    # trailing means over up to five updates: the first point is the first update itself
    assert y == pytest.approx([1.0, 0.5, 2 / 3, 0.5, 0.6, 0.4])
    x, y = panel_points(rows, "eval_em", 5)
    assert list(x) == [1, 2, 3, 4, 5, 6] and y == pytest.approx([0.1 * u for u in range(1, 7)])
    pytest.importorskip("matplotlib")
    assert plot_runs([tmp_path], tmp_path / "c.png").stat().st_size > 0


def test_a_run_shorter_than_the_window_is_shown_as_it_is():
    y = np.array([3.0, 1.0, 2.0])
    assert list(smooth(y, 5)) == [3.0, 1.0, 2.0]
    assert list(smooth(y, 1)) == [3.0, 1.0, 2.0]
