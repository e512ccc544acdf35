"""Goals and splits do not depend on how the work is laid out: ``{"split", "index"}`` names the
same goal in every process, whatever the number of workers, the order they ask in, the hash
seed, or which process built the cache; the splits are disjoint and identical everywhere."""

from __future__ import annotations

import multiprocessing as mp
import os

import pytest

from twice_envs.envs.webshop import catalogue_gen

SPLITS = ("test", "eval", "train")


def _goals_of(kw: dict, asks: list[tuple[str, int]]) -> dict:
    """In one process: the goal each ``(split, index)`` names, the split ranges, and who asked."""
    import twice_envs

    env = twice_envs.make("WebShop-v0", **kw)
    named = {}
    for split, k in asks:
        _, info = env.reset(seed=k, options={"split": split, "index": k})
        g = env.goal
        named[(split, k)] = (info["goal"], g.asin, g.instruction_text, g.goal_options, g.price_upper)
    goals = env.res.goals
    ranges = {s: (goals.split_range(s).start, goals.split_range(s).stop) for s in SPLITS + ("all",)}
    return {"named": named, "ranges": ranges, "n": len(goals), "pid": os.getpid(),
            "hashseed": os.environ.get("PYTHONHASHSEED"), "hash": hash("webshop")}


def _asks(ranges: dict) -> list[tuple[str, int]]:
    """Every goal of the small splits and a spread of the train split."""
    out = []
    for s in SPLITS:
        lo, hi = ranges[s]
        ks = range(hi - lo) if s != "train" else range(0, hi - lo, max(1, (hi - lo) // 150))
        out += [(s, k) for k in ks]
    return out


def _in_pool(kw: dict, asks: list, workers: int, hashseed: str, reverse: bool) -> list[dict]:
    """Ask from ``workers`` spawned processes, each with its share (round robin), in either order."""
    shares = [asks[w::workers] for w in range(workers)]
    if reverse:
        shares = [list(reversed(s)) for s in reversed(shares)]
    old = os.environ.get("PYTHONHASHSEED")
    os.environ["PYTHONHASHSEED"] = hashseed  # spawned children start with it
    try:
        with mp.get_context("spawn").Pool(workers) as pool:
            return pool.starmap(_goals_of, [(kw, s) for s in shares])
    finally:
        if old is None:
            os.environ.pop("PYTHONHASHSEED", None)
        else:
            os.environ["PYTHONHASHSEED"] = old


def _check_layouts(kw: dict, reference: dict, layouts: list[tuple[int, str, bool]]) -> None:
    asks = _asks(reference["ranges"])
    want = reference["named"]
    assert set(want) == set(asks)
    hashes, pids = {reference["hash"]}, set()
    for workers, hashseed, reverse in layouts:
        parts = _in_pool(kw, asks, workers, hashseed, reverse)
        got = {}
        for part in parts:
            assert part["ranges"] == reference["ranges"] and part["n"] == reference["n"]
            assert part["hashseed"] == hashseed
            got.update(part["named"])
            hashes.add(part["hash"])
            pids.add(part["pid"])
        assert got == want, (workers, hashseed, reverse)
    assert len(hashes) > 1 and os.getpid() not in pids  # really other processes with other string hashes


def _check_splits(ref: dict) -> None:
    r = ref["ranges"]
    sets = {s: set(range(*r[s])) for s in SPLITS}
    assert not sets["test"] & sets["eval"] and not sets["test"] & sets["train"] and not sets["eval"] & sets["train"]
    assert sets["test"] | sets["eval"] | sets["train"] == set(range(*r["all"])) == set(range(ref["n"]))
    assert all(len(sets[s]) > 0 for s in SPLITS)
    # a goal index means one goal: the same (split, index) never names two goals, two never share one
    goal_ids = [v[0] for v in ref["named"].values()]
    assert len(goal_ids) == len(set(goal_ids))
    for (split, k), v in ref["named"].items():
        assert v[0] == r[split][0] + k


@pytest.fixture(scope="module")
def file_shop(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("layout")
    p_path, a_path = catalogue_gen.write(tmp / "data", 400, seed=5)
    return {"products_path": str(p_path), "attributes_path": str(a_path), "cache_root": str(tmp / "cache")}


def test_file_catalogue_goals_do_not_depend_on_the_process_layout(file_shop):
    # the first pool finds no cache: its three workers build it at once (one publishes, the
    # others keep theirs or load it); the rest load it
    probe = _goals_of(file_shop, [])
    assert os.listdir(file_shop["cache_root"])  # built by this process, the reference
    reference = _goals_of(file_shop, _asks(probe["ranges"]))
    _check_splits(reference)
    import shutil

    shutil.rmtree(file_shop["cache_root"])
    _check_layouts(file_shop, reference, [(3, "1", False), (2, "4242", True)])
    assert len(os.listdir(file_shop["cache_root"])) == 1  # one cache folder, whoever built it


def test_generated_catalogue_goals_do_not_depend_on_the_process_layout():
    kw = {"num_products": 200, "catalogue_seed": 3}
    probe = _goals_of(kw, [])
    reference = _goals_of(kw, _asks(probe["ranges"]))
    assert reference["n"] >= 2000 or reference["ranges"]["test"][1] > 0
    _check_splits(reference)
    _check_layouts(kw, reference, [(1, "7", True), (3, "99", False)])


def test_a_sampled_reset_is_the_same_in_every_layout(file_shop):
    # resets without a named goal draw from the env's own seeded generator: a seed names the
    # same goal everywhere too
    asks = [("train", k) for k in range(12)]
    here = _sampled(file_shop, [k for _, k in asks])
    old = os.environ.get("PYTHONHASHSEED")
    os.environ["PYTHONHASHSEED"] = "31337"
    try:
        with mp.get_context("spawn").Pool(2) as pool:
            shares = [[k for _, k in asks[1::2]], [k for _, k in asks[0::2]]]
            parts = pool.starmap(_sampled, [(file_shop, share) for share in shares])
    finally:
        if old is None:
            os.environ.pop("PYTHONHASHSEED", None)
        else:
            os.environ["PYTHONHASHSEED"] = old
    there = {}
    for p in parts:
        there.update(p)
    assert there == here


def _sampled(kw: dict, seeds: list[int]) -> dict:
    import twice_envs

    env = twice_envs.make("WebShop-v0", split="train", **kw)
    return {s: (env.reset(seed=s)[1]["goal"], env.goal.asin, env.goal.instruction_text) for s in seeds}
