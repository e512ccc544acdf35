"""The step-size tuning the learning benches share: the area, the pick and its tie rule, the widening."""

import numpy as np
import pytest

from twice_envs.agents.bench import tuning


def test_the_area_is_the_trapezoid_mean_of_the_curve():
    """Break: averaging the values after each update only -> 0.75 instead of 0.625."""
    assert tuning.area([0.5, 1.0]) == pytest.approx(0.75)
    assert tuning.area([0.0, 0.5, 1.0]) == pytest.approx(0.5)
    assert tuning.area([0.25, 0.25, 1.0]) == pytest.approx((0.25 + 0.25) / 4 + (0.25 + 1.0) / 4)
    with pytest.raises(ValueError, match="before and after one update"):
        tuning.area([0.5])


def test_the_pick_is_the_highest_mean_and_a_tie_goes_to_the_smaller_step_size():
    """Break: breaking ties by max() over step sizes -> 8 instead of 2; a tie tolerance of 0 -> 4 instead of 2."""
    assert tuning.pick({1.0: [0.5, 0.7], 2.0: [0.9, 0.7], 4.0: [0.6, 0.6]}) == 2.0
    assert tuning.pick({8.0: [0.8], 2.0: [0.8], 4.0: [0.7]}) == 2.0
    assert tuning.pick({1.0: [float("nan")], 2.0: [0.1]}) == 2.0
    # areas within TIE of the highest are tied: a few thousandths more area do not buy a larger step
    assert tuning.pick({1.0: [0.90], 2.0: [0.91 - tuning.TIE + 0.001], 4.0: [0.91]}) == 2.0
    assert tuning.pick({1.0: [0.90], 2.0: [0.91 - tuning.TIE - 0.001], 4.0: [0.91]}) == 4.0


def test_widening_steps_by_the_grid_s_ratio_at_the_end_where_the_pick_sits_up_to_its_bound():
    """Break: widening by a fixed factor 2 -> 8 after (0.5, 2) instead of 8 (ratio 4) and 1/8 below."""
    grid = (0.5, 2.0)
    assert tuning.next_step_size({0.5: [0.1], 2.0: [0.2]}, grid, 3) == 8.0
    assert tuning.next_step_size({0.5: [0.3], 2.0: [0.2]}, grid, 3) == 0.125
    assert tuning.next_step_size({0.5: [0.1], 2.0: [0.3], 8.0: [0.2]}, grid, 3) is None  # interior
    assert tuning.next_step_size({0.5: [0.1], 2.0: [0.2], 8.0: [0.3]}, grid, 1) is None  # bound reached

    def score(pairs):  # every key learns best at its own step size: a at 32, b at 0.01
        best = {"a": 32.0, "b": 0.01}
        return [[-abs(np.log(lr / best[k]))] for k, lr in pairs]

    out = tuning.tune_all(score, ["a", "b"], grid, max_widen=3)
    assert out["a"].lr == 32.0 and out["a"].widened == [8.0, 32.0, 128.0] and out["a"].edge_of_grid == "high"
    assert out["a"].at_edge is None
    assert out["b"].lr == 0.5 / 4 ** 3 and out["b"].at_edge == "low" and len(out["b"].widened) == 3
    assert "still at the low end" in tuning.describe_pick("b", out["b"])
    assert tuning.describe_pick("a", tuning.Tuned(lr=2.0, grid=[0.5, 2.0, 8.0])) is None


def test_grids_are_checked_and_tuning_seeds_stay_apart_from_reporting_seeds():
    assert tuning.check_grid([4, 1, 2]) == (1.0, 2.0, 4.0)
    assert tuning.parse_grid("0.5, 1,2") == (0.5, 1.0, 2.0)
    for bad, says in (([3.0], "needs two step sizes or more"), ([1.0, -1.0], "above 0"),
                      ([1.0, float("inf")], "finite"), (["a", 1], "must hold numbers")):
        with pytest.raises(ValueError, match=says):
            tuning.check_grid(bad, "lr_grid")
    assert min(tuning.tuning_seeds(5, 3)) == 5 + tuning.TUNE_SEED_OFFSET
