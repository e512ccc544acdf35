"""``twice bench overfit``: screen tasks for mixed outcomes, then train on exactly those."""

import numpy as np

from twice_envs.agents.bench.overfit import OverfitConfig, format_overfit, run_overfit, window_success


def test_the_window_rule_and_its_intervals():
    rows = [{"success": 0.5}, {"success": 0.25}]
    value, (lo, hi) = window_success(rows, "success", 4)  # 3 of 8
    assert value == 3 / 8 and lo < value < hi


def test_a_short_run_trains_on_the_screened_tasks_only(monkeypatch):
    from twice_envs.agents.training import trainer

    seen, real = [], trainer.make_tasks
    monkeypatch.setattr(trainer, "make_tasks", lambda idx, split, indexed: seen.append((list(idx), indexed)) or
                        real(idx, split, indexed))
    from twice_envs.agents.bench import overfit

    monkeypatch.setattr(overfit, "screen_tasks", lambda policy, cfg, n, g, noise_seed: np.array([1.0, 0.0, 0.5, 0.625]))
    res = run_overfit(OverfitConfig(env="SearchQA-v0", tasks=2, group_size=2, screen=4, updates=2, window=1))
    assert res["chosen"] == [2, 3]  # mixed outcomes first: the start success closest to 1/2
    assert seen and all(sorted(idx) == [2, 3] and indexed for idx, indexed in seen)  # exactly those tasks
    assert res["measure"] == "em" and len(res["curve"]) in (2,) and "rose significantly" in format_overfit(res)
