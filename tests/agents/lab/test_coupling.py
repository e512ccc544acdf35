"""The coupling figures: the oracle-free lower bound, the budget multiple and the sentence the audits print."""

import io

import numpy as np
import pytest

from twice_envs.agents.lab import coupling


def _whole(n: int, boots: int = 5) -> list:
    """Resamples that each take every decision once (every CI collapses to the value)."""
    return [np.arange(n)] * boots


# U, the coupled twin's U' and the independent counterfactual's U' at four decisions
U = np.array([1.0, 0.0, 1.0, 1.0])
U_TWIN = np.array([0.0, 0.0, 1.0, 1.0])  # D coupled (1, 0, 0, 0): mean 1/4, Var 3/16
U_INDEP = np.array([0.0, 1.0, 1.0, 0.0])  # D independent (1, -1, 0, 1): mean 1/4, Var 11/16
V_AFTER = np.array([0.5, 0.5, 0.5, 0.5])
V_BEFORE = np.array([0.5, 0.5, 0.5, 0.5])


def test_lower_bound_and_budget_multiple_equal_a_hand_computation():
    assert coupling.lower_bound(U - U_TWIN, U - U_INDEP) == pytest.approx(1 - (3 / 16) / (11 / 16))  # 8/11
    assert np.isnan(coupling.lower_bound([1.0, -1.0], [0.0, 0.0]))  # no independent variance: undefined
    with pytest.raises(ValueError, match="same decisions"):
        coupling.lower_bound([0.0], [0.0, 1.0])
    # X = 1 / (1 - rho), the interval carried through; an end at rho >= 1 is infinite
    w = coupling.budget_multiple({"value": 0.5, "lo": 0.2, "hi": 0.75})
    assert (w["value"], w["lo"], w["hi"], w["determined"]) == (pytest.approx(2.0), pytest.approx(1.25),
                                                                pytest.approx(4.0), True)
    assert coupling.budget_multiple({"value": 0.9, "lo": 0.5, "hi": 1.0})["hi"] == float("inf")
    # an interval reaching 0 (or below, or undefined) gives no multiple
    for rho in ({"value": 0.1, "lo": -0.36, "hi": 0.47}, {"value": 0.2, "lo": 0.0, "hi": 0.4},
                {"value": float("nan"), "lo": float("nan"), "hi": float("nan")}):
        w = coupling.budget_multiple(rho)
        assert not w["determined"] and np.isnan(w["value"])


def test_summary_and_its_sentence_on_a_fixed_case():
    s = coupling.coupling_summary(U, U_TWIN, U_INDEP, V_AFTER, V_BEFORE, [False, True, True, False], _whole(4),
                                  oracle="exact")
    assert s["decisions"] == 4 and s["oracle"] == "exact"
    assert s["lower_bound"] == {"value": pytest.approx(8 / 11), "lo": pytest.approx(8 / 11),
                                "hi": pytest.approx(8 / 11)}
    assert s["var_d_coupled"]["value"] == pytest.approx(3 / 16)
    assert s["var_d_independent"]["value"] == pytest.approx(11 / 16)
    assert s["tie_share_coupled"]["value"] == pytest.approx(3 / 4)
    assert s["tie_share_independent"]["value"] == pytest.approx(1 / 4)
    assert s["self_twin_share"]["value"] == pytest.approx(1 / 2)
    # rho-bar: (U - 0.5, U' - 0.5) = (.5, -.5, .5, .5) . (-.5, -.5, .5, .5) / (4 x 0.25) = 0.5
    assert s["rho_bar"]["value"] == pytest.approx(0.5)
    assert s["worth"]["lower_bound"]["value"] == pytest.approx(11 / 3)
    assert s["worth"]["rho_bar"]["value"] == pytest.approx(2.0)
    assert s["line"] == ("coupling is worth about 3.67 [3.67, 3.67] times the budget of independent counterfactuals "
                         "here (X = 1/(1 - rho) at the oracle-free lower bound rho >= 0.727 [0.727, 0.727]; at "
                         "rho-bar (exact oracle) 0.5 [0.5, 0.5]: 2 [2, 2] times)")
    out = io.StringIO()
    coupling.write_coupling(out, s, "groups")
    text = out.getvalue()
    assert "oracle-free lower bound 1 - Var(D coupled) / Var(D independent): 0.727 [0.727, 0.727]" in text
    assert "ties (D = 0) %: coupled 75 [75, 75], independent 25 [25, 25]; self-twins % 50 [50, 50]" in text
    assert text.rstrip().endswith(s["line"])


def test_an_undetermined_bound_prints_no_multiple():
    s = coupling.coupling_summary(U, U_TWIN, U_INDEP, V_AFTER, V_BEFORE, [False] * 4, _whole(4), oracle="estimated")
    s["lower_bound"] = {"value": 0.1, "lo": -0.36, "hi": 0.47}
    s["worth"]["lower_bound"] = coupling.budget_multiple(s["lower_bound"])
    line = coupling.worth_line(s)
    assert line.startswith("coupling is undetermined here: the oracle-free lower bound 0.1 [-0.36, 0.47]")
    # a rho-bar from an estimated oracle gives no multiple on its own
    assert "worth about" not in line and "times" not in line
    assert line.endswith("(rho-bar (estimated oracle) 0.5 [0.5, 0.5] alone gives none: its oracle is estimated)")
    s["oracle"] = "exact"  # an exact rho-bar (the labs) does
    assert coupling.worth_line(s).endswith("(at rho-bar (exact oracle) 0.5 [0.5, 0.5]: 2 [2, 2] times)")
    s["rho_bar"] = {"value": 0.3, "lo": -0.1, "hi": 0.6}
    s["worth"]["rho_bar"] = coupling.budget_multiple(s["rho_bar"])
    assert "0.3 [-0.1, 0.6]: undetermined (its CI does not lie above 0)" in coupling.worth_line(s)


def test_a_bound_without_independent_variance_is_undetermined():
    # every outcome ties: neither difference varies, so the bound is undefined and no multiple is given
    s = coupling.coupling_summary(np.zeros(4), np.zeros(4), np.zeros(4), V_AFTER, V_BEFORE, [True] * 4, _whole(4),
                                  oracle="estimated")
    assert np.isnan(s["lower_bound"]["value"]) and not s["worth"]["lower_bound"]["determined"]
    assert s["line"].startswith("coupling is undetermined here: the oracle-free lower bound is undefined (the "
                                "independent differences do not vary), so it gives no budget multiple")
    assert s["tie_share_independent"]["value"] == 1.0 and s["self_twin_share"]["value"] == 1.0
