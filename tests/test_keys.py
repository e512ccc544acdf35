"""Seed derivation: one salt per purpose, every rule pinned to known values.

The values below are stored in records and recomputed elsewhere (a twin recomputes the
factual episode's seed, a replay recomputes a generated room), so a rule may never
change its output: each test pins a few values of each rule.
"""

from __future__ import annotations

import numpy as np
import pytest

from twice_envs import keys
from twice_envs.keys import (
    AUDIT_STREAMS,
    SEED_SALTS,
    UINT64_MAX,
    audit_seed,
    branch_plan_rng,
    credit_rng,
    derive_episode_seed,
    episode_noise_seed,
    independent_seed,
    lab_episode_seed,
    lab_independent_seed,
    lab_pair_seed,
    seed_sequence_uint64,
    stable_json_seed,
    stable_seed,
)


def test_salts_are_distinct_named_ints():
    assert len(set(SEED_SALTS.values())) == len(SEED_SALTS)
    assert all(isinstance(k, str) and isinstance(v, int) and 0 <= v <= UINT64_MAX for k, v in SEED_SALTS.items())
    assert SEED_SALTS == {"episode": 0x7457, "rollout": 0x52_4F_4C, "independent": 0x43_52_52, "branch_plan": 0x5457494E,
                          "audit": 0x41_55_44, "credit": 0xC4_ED_17}
    with pytest.raises(TypeError):
        SEED_SALTS["other"] = 1  # read-only: a new purpose is added in keys.py, with its own salt


@pytest.mark.parametrize("seed,salt,expected", [
    (0, 0, 18396215015849626295),
    (7, 3, 3240372377301481979),
    (UINT64_MAX, 12345, 5427737857964636375),
])
def test_derive_episode_seed_known_values(seed, salt, expected):
    assert derive_episode_seed(seed, salt) == expected
    assert seed_sequence_uint64([seed, salt, SEED_SALTS["episode"]]) == expected


@pytest.mark.parametrize("noise_seed,group,index,expected", [
    (0, 0, 0, 11692857990139139838),
    (7, 2, 5, 13791896903502050096),
    (-1, 1, 3, 16970539983459318871),  # a negative noise seed is folded into 64 bits
    (UINT64_MAX, 9, 0, 14807798893971338354),
])
def test_episode_noise_seed_known_values(noise_seed, group, index, expected):
    assert episode_noise_seed(noise_seed, group, index) == expected
    assert episode_noise_seed(noise_seed, np.int64(group), np.int64(index)) == expected  # numpy ints too


@pytest.mark.parametrize("noise_seed,episode,turn,branch,expected", [
    (0, 0, 0, 1, 17729941538671010228),
    (7, 4, 2, 3, 4012692112788982809),
    (-1, 1, 0, 2, 4284422582468679348),
])
def test_independent_seed_known_values(noise_seed, episode, turn, branch, expected):
    assert independent_seed(noise_seed, episode, turn, branch) == expected


@pytest.mark.parametrize("noise_seed,group,member,expected", [
    (0, 0, 0, 18396215015849626295),
    (0, 1, 2, 9185441972077787821),
    (11, 3, 4, 724081742665350128),
])
def test_lab_episode_seed_known_values(noise_seed, group, member, expected):
    assert lab_episode_seed(noise_seed, group, member) == expected
    assert lab_episode_seed(noise_seed, group, member) == derive_episode_seed(noise_seed, group * 100003 + member)


@pytest.mark.parametrize("noise_seed,stream,turn,expected", [
    (0, 1, 0, 10809314652303416102),
    (5, 7, 3, 6952293553814693700),
])
def test_lab_independent_seed_known_values(noise_seed, stream, turn, expected):
    assert lab_independent_seed(noise_seed, stream, turn) == expected


@pytest.mark.parametrize("noise_seed,pair,turn,expected", [
    (0, 1, 0, 4890093876272269194),
    (9, 2, 4, 10525363658017242871),
])
def test_lab_pair_seed_known_values(noise_seed, pair, turn, expected):
    assert lab_pair_seed(noise_seed, pair, turn) == expected


@pytest.mark.parametrize("noise_seed,ints,uniform", [
    (0, [4463580904616565646, 4310486032518862581, 2406231787315485470], 0.4638583971350463),
    (12345, [2993071302935980161, 2158082062555024415, 3380796637199323928], 0.9578971736825914),
    (-1, [1161029920211025097, 155321727532083254, 2250598302415821449], 0.4223349258003508),
])
def test_branch_plan_rng_known_draws(noise_seed, ints, uniform):
    rng = branch_plan_rng(noise_seed)
    assert rng.integers(0, 1 << 62, size=3).tolist() == ints
    assert rng.random() == uniform


@pytest.mark.parametrize("parts,expected", [
    (("room", "kitchen_1", 0), 1046000307544553838),
    (("pick_and_place_simple-Apple-None-CounterTop-1", 2), 17067233859286141655),
    ((), 1449310910991872227),
])
def test_stable_seed_known_values(parts, expected):
    assert stable_seed(*parts) == expected


@pytest.mark.parametrize("parts,expected", [
    ((0, "uid-a", 0, 0), 695504451770291632),
    ((7, "abc", 3, 12), 2131022440979579544),
    ((), 912589757505950543),
])
def test_stable_json_seed_known_values(parts, expected):
    assert stable_json_seed(*parts) == expected


def test_string_rules_differ_in_framing():
    # "/"-joined parts can meet; the JSON-framed rule keeps every list of parts apart
    assert stable_seed("a/b", "c") == stable_seed("a", "b/c")
    assert stable_json_seed("a/b", "c") != stable_json_seed("a", "b/c")
    assert stable_seed(1, "x") == stable_seed("1", "x")  # parts are read as text


def test_purposes_never_share_a_seed():
    """The same numbers under two purposes give two unrelated seeds."""
    seeds = {
        derive_episode_seed(3, 4),
        seed_sequence_uint64([3, 4, 0]),
        episode_noise_seed(3, 4, 0),
        independent_seed(3, 4, 0, 0),
    }
    assert len(seeds) == 4


def test_out_of_range_inputs():
    with pytest.raises(ValueError):
        derive_episode_seed(1 << 64)
    with pytest.raises(ValueError):
        lab_episode_seed(-1, 0, 0)
    with pytest.raises(ValueError):
        episode_noise_seed(0, -1, 0)  # SeedSequence refuses negative entropy


@pytest.mark.parametrize("args,expected", [
    ((0, "oracle", 0, 0, 0), 10117907778100518120),
    ((0, "crr", 0, 0, 0), 8078868031735835493),
    ((7, "vineppo", 3, 2, 1), 9487113138648708548),
    (((1 << 40) + 5, "twice-pairs", 1, 0, 63), 9420968125932332041),
])
def test_audit_seed_known_values(args, expected):
    assert audit_seed(*args) == expected


def test_audit_streams_never_alias():
    """Every stream has its own number, every argument its own place: no two argument lists meet,
    whether they differ in the stream, in the numbers or only in where a number sits."""
    assert len(set(AUDIT_STREAMS.values())) == len(AUDIT_STREAMS)
    assert {"oracle", "vineppo", "twice-pairs", "crr", "twice-train", "coins"} <= set(AUDIT_STREAMS)
    seeds = [audit_seed(s, name, i, t, m) for s in (0, 1, 1 << 32) for name in AUDIT_STREAMS
             for i in range(3) for t in range(3) for m in range(3)]
    assert len(set(seeds)) == len(seeds)
    # the seed's high word and the stream's number sit in fixed places
    assert audit_seed(1 << 32, "oracle") != audit_seed(0, "oracle", 1)
    assert audit_seed(0, "oracle", 0, 0, AUDIT_STREAMS["crr"]) != audit_seed(0, "crr")
    assert audit_seed(3, "oracle", 4, 0, 0) not in {independent_seed(3, 4, 0, 0), derive_episode_seed(3, 4)}
    for bad in ((0, "nope"), (-1, "oracle"), (0, "oracle", 1 << 32), (0, "oracle", 0, -1), (0, "oracle", 0, 0, 1.0)):
        with pytest.raises(ValueError):
            audit_seed(*bad)
    with pytest.raises(TypeError):
        AUDIT_STREAMS["other"] = 9  # read-only


def test_every_rule_is_exported():
    for name in ("episode_noise_seed", "independent_seed", "lab_episode_seed", "lab_independent_seed",
                 "lab_pair_seed", "branch_plan_rng", "credit_rng", "stable_seed", "stable_json_seed", "SEED_SALTS",
                 "audit_seed", "AUDIT_STREAMS"):
        assert name in keys.__all__


def test_credit_rng_known_draws():
    # the coins of the runs measured in the docs: the rule may not change its output
    assert np.allclose(credit_rng(11, 3).random(3), [0.9342522952166165, 0.3815350181750258, 0.5123038421627022],
                       rtol=0, atol=1e-15)
