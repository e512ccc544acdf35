"""The published credit table: which row scores each method, the tables' labels, the raw group credit."""

import io

import numpy as np
import pytest

from twice_envs.agents.credit.gigpo import GiGPOConfig, gigpo_credit
from twice_envs.agents.lab import table2
from twice_envs.agents.lab.scoring import row_stats
from twice_envs.agents.types import EpisodeRecord, TurnRecord


def _rows(oracle, credit, aux=None):
    idx = [np.arange(len(oracle))] * 3  # every resample is the whole sample: each CI collapses to its value
    return [row_stats(n, c, oracle, credit["grpo"], 0, (aux or {}).get(n, 0), idx, 0.05) for n, c in credit.items()]


def test_published_table_takes_each_methods_raw_row():
    names = ["grpo", "grpo 2G", "gigpo", "twice J1", "twice J2", "crr J1", "vineppo K1", "twice", "crr", "vineppo"]
    table = {e["method"]: e for e in table2.published_table(names)}
    assert list(table) == ["grpo", "grpo-2x", "gigpo", "vineppo", "crr", "twice"]
    assert {m: e["row"] for m, e in table.items()} == {
        "grpo": "grpo", "grpo-2x": "grpo 2G", "gigpo": "gigpo", "vineppo": None, "crr": "crr J1", "twice": "twice J1"}
    assert table["vineppo"]["missing"] == "vineppo K2" and table["twice"]["display"] == "Twice"
    # GiGPO's credit before its groups' standard deviations divide it, where the audit has that row
    assert {e["method"]: e["row"] for e in table2.published_table(names + ["gigpo raw"])}["gigpo"] == "gigpo raw"


def test_headline_table_is_the_raw_credit_and_update_credit_is_supplementary():
    oracle = np.array([0.5, -0.5, 0.3, 0.2])
    credit = {
        "grpo": np.array([0.4, 0.4, -0.6, -0.2]),  # wrong at decisions 1, 2, 3
        "twice J1": np.array([1.0, -1.0, 0.0, 1.0]),  # one coupled twin: a tie at decision 2, never wrong
        "twice J2": np.array([0.5, -1.0, 0.0, 0.5]),
        "twice": np.array([-1.0, 1.0, -1.0, 0.0]),  # the update's advantage: the opposite sign
    }
    rows = _rows(oracle, credit, {"twice J1": 30, "twice J2": 60, "twice": 10})
    table = table2.mark_tables(rows, ["grpo", "twice J1", "twice J2"])
    assert {r["method"]: r["table"] for r in rows} == {"grpo": "published", "twice J1": "published",
                                                       "twice J2": "diagnostic", "twice": "update"}
    assert next(r for r in rows if r["method"] == "twice J1")["published_as"] == ["twice"]
    out = io.StringIO()
    table2.write_tables(out, rows, table, policy_tokens=20, name_width=10)
    text = out.getvalue()
    lines = text.splitlines()
    assert lines[0].startswith("published credit table (Table 2): each method's raw per-decision credit")
    # Twice: the one-twin row (tokens 1 + 30 / 20), wrong-sign 0 %, zero 25 %, non-zero wrong 0 %
    twice = next(ln for ln in lines if ln.startswith("Twice "))
    assert twice.split()[:5] == ["Twice", "twice", "J1", "2.50x", "0"]
    assert "25 [25, 25]" in twice and twice.count("0 [0, 0]") == 2
    grpo = next(ln for ln in lines if ln.startswith("GRPO "))
    assert "75 [75, 75]" in grpo and "1.00x" in grpo  # wrong at three of four; no zeros, so 75 % of non-zero too
    assert "VinePPO      not in this run (needs the row 'vineppo K2')" in text
    # the update credit comes after, labelled supplementary, with its own wrong-sign rate (3 of 4: one zero)
    sup = text.index("supplementary: update credit")
    assert text.index("diagnostic: more pairs") < sup < text.index("\ntwice  ")
    update = next(ln for ln in lines if ln.startswith("twice  "))
    assert update.split()[2:4] == ["75", "[75,"] and "25 [25, 25]" in update and "100 [100, 100]" in update


def test_enlarged_group_credit_is_u_minus_the_mean_over_both_sets():
    # group 0: U (1, 0) and extra (1, 1) -> mean 3/4; group 1: U (0, 0) and extra (1, 0) -> mean 1/4
    c = table2.enlarged_group_credit([1.0, 0.0, 0.0, 0.0], [0, 0, 1, 1], [1.0, 1.0, 1.0, 0.0], [0, 0, 1, 1],
                                     [0, 0, 1, 2])
    np.testing.assert_allclose(c, [0.25, 0.25, -0.75, -0.25])


def _episode(group, utility, obs):
    turns = [TurnRecord([1], [0.0], a, (0, t, 0, 0, 0), obs=o) for t, (a, o) in enumerate(obs)]
    return EpisodeRecord("SearchQA-v0", 0, {}, group=group, turns=turns, utility=utility)


def test_gigpo_raw_is_centred_only_where_the_reference_divides_by_the_std():
    eps = [_episode(0, 1.0, [("a", "x"), ("b", "y")]), _episode(0, 0.0, [("a", "x"), ("c", "z")]),
           _episode(0, 0.0, [("d", "w")])]
    decisions = [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)]
    raw = table2.gigpo_raw(eps, "SearchQA-v0", decisions)  # the reference divides by the groups' std here
    centred = gigpo_credit(eps, GiGPOConfig(mode="mean_norm", invalid_penalty=0.0))
    scaled = gigpo_credit(eps, GiGPOConfig(mode="mean_std_norm", invalid_penalty=0.0))
    np.testing.assert_allclose(raw, [centred[i][t] for i, t in decisions])
    assert not np.allclose(raw, [scaled[i][t] for i, t in decisions])
    assert table2.gigpo_raw(eps, "SearchToy-v0", decisions) is None  # centred only already: the gigpo row is raw
