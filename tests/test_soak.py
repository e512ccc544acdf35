"""Long runs stay flat: ``env.close()`` releases what an env holds, and a short soak
(``twice bench soak``) of each main env keeps open files, threads and memory flat."""

from __future__ import annotations

import gc
import json
import os
import weakref

import numpy as np
import pytest

import twice_envs
from twice_envs.soak import Driver, figures, main, open_fds, os_threads, run_soak, verdict

MAIN_ENVS = ["SearchQA-v0", "WebShop-v0", "ALFWorld-v0"]
ALL_ENVS = MAIN_ENVS + ["SearchToy-v0", "TextLab-v0", "CreditToy-v0"]


def _needs(env_id: str) -> None:
    if env_id.startswith("ALFWorld"):
        pytest.importorskip("alfworld")
        pytest.importorskip("fast_downward")


def _threads() -> tuple:
    import threading

    return threading.active_count(), os_threads()


def _episode(env_id: str, seed: int) -> None:
    """Make an env, play a few steps, fork it, step the fork, close both."""
    env = twice_envs.make(env_id)
    drive = Driver(np.random.default_rng(seed))
    obs, info = env.reset(seed=seed)
    for _ in range(4):
        obs, _, term, trunc, info = env.step(drive(env, obs, info))
        if term or trunc:
            break
    child = env.fork(env.turn)
    if not child.done:
        child.step(drive(child, child.trajectory.observations[-1], child.last_info))
    child.close()
    env.close()
    assert env.closed and child.closed


@pytest.mark.parametrize("env_id", ALL_ENVS)
def test_make_play_fork_close_leaves_no_open_files_or_threads(env_id):
    _needs(env_id)
    _episode(env_id, 0)  # the process-wide caches (corpus maps, indexes, engines) fill once
    gc.collect()
    fds, threads = open_fds(), _threads()
    for seed in range(1, 6):
        _episode(env_id, seed)
    gc.collect()
    assert open_fds() == fds
    assert _threads() == threads


def _journal_fds(path) -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(path)):
            out.append(target)
    return out


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="lists open files through /proc")
def test_searchqa_close_closes_the_journal_file(tmp_path):
    path = tmp_path / "tools.sqlite"
    env = twice_envs.make("SearchQA-v0", journal=str(path))
    env.reset(seed=0)
    env.step("<search> river port founder </search>")
    assert _journal_fds(path), "the search opened the journal file"
    child = env.fork(1)
    child.step("<search> copper bells village </search>")
    child.close()
    assert _journal_fds(path) == []
    # the parent goes on: it reads what the fork stored, and a new search opens the file again
    hits = env.resources.journal.hits
    env.step("<search> copper bells village </search>")
    assert env.resources.journal.hits == hits + 1
    env.step("<search> mountain lantern weaver </search>")
    assert _journal_fds(path)
    env.close()
    assert _journal_fds(path) == []
    assert env.resources is None and env.trajectory.num_turns == 3


@pytest.mark.parametrize("env_id", ["SearchQA-v0", "WebShop-v0"])
def test_a_closed_env_pins_no_shared_resources(env_id, tmp_path):
    """Once the process cache forgets them, the corpus maps, index and catalogue of a closed env are
    freed even while the env object lives on (its record stays readable)."""
    if env_id == "SearchQA-v0":
        from twice_envs.envs.searchqa.resources import clear as clear_cache

        env = twice_envs.make(env_id, journal=str(tmp_path / "own.sqlite"))  # resources of its own
    else:
        from twice_envs.envs.webshop.resources import clear_process_cache as clear_cache

        env = twice_envs.make(env_id, price_seed=424242)  # resources of its own
    env.reset(seed=3)
    held = weakref.ref(env.resources if env_id == "SearchQA-v0" else env.res)
    env.close()
    clear_cache()
    gc.collect()
    assert held() is None
    assert env.trajectory.num_turns == 0


def test_alfworld_close_gives_the_engine_back_and_drops_the_game():
    _needs("ALFWorld-v0")
    from twice_envs.envs.alfworld import engine as engine_mod

    env = twice_envs.make("ALFWorld-v0")
    env.reset(options={"index": 0})
    engine = env.engine
    child = env.fork(0)
    child.close()
    env.close()
    assert env.game is None
    with pytest.raises(RuntimeError):
        _ = env.engine
    assert not engine.poisoned and engine_mod.POOL.idle >= 2  # the env's and the fork's
    # closed envs give their engines back, so making more envs of that game creates none
    created = engine_mod.POOL.created
    for _ in range(5):
        e = twice_envs.make("ALFWorld-v0")
        e.reset(options={"index": 0})
        f = e.fork(0)
        f.close()
        e.close()
    assert engine_mod.POOL.created == created


# ---------------------------------------------------------------------- the soak
def test_figures_and_verdict_from_samples():
    def point(step, rss, fds=7, threads=1):
        return {"step": step, "seconds": 0.0, "rss_bytes": rss, "fds": fds, "threads": threads,
                "os_threads": threads + 1}

    pts = [point(0, 50e6), point(100, 100e6), point(200, 101e6), point(300, 102e6, fds=8)]
    fig = figures(pts, warmup=100)
    assert fig["rss_warm_mb"] == 100 and fig["rss_end_mb"] == 102
    assert fig["rss_growth_pct"] == pytest.approx(2.0) and fig["rss_mb_per_1000_steps"] == pytest.approx(10.0)
    assert fig["rss_slope_mb_per_1000_steps"] == pytest.approx(10.0)
    assert not fig["fds_flat"] and fig["threads_flat"]
    assert verdict(fig, 5.0) == {"rss": True, "fds": False, "threads": True, "os_threads": True}
    assert verdict(fig, 1.0)["rss"] is False
    assert "journal_growth_mb" not in fig  # samples without journal figures
    # the journals' memory layers grew by 1.5 MB of the 2 MB: 0.5 MB (0.5%) beside them
    for p, j in zip(pts, (0, 1e6, 2e6, 2.5e6)):
        p["journal_bytes"] = j
    fig = figures(pts, warmup=100)
    assert fig["journal_growth_mb"] == pytest.approx(1.5) and fig["rss_growth_beside_journals_mb"] == pytest.approx(0.5)
    assert fig["rss_growth_beside_journals_pct"] == pytest.approx(0.5)
    assert verdict(fig, 1.0)["rss"] is False  # the verdict counts the whole RSS


def test_cli_writes_the_json_and_prints_the_verdict(tmp_path, capsys):
    out = tmp_path / "soak.json"
    rc = main(["--env", "SearchToy-v0", "--steps", "300", "--samples", "3", "--fork-every", "10", "--json", str(out)])
    text = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert "verdict:" in text and "RSS" in text
    assert all("journal_bytes" in p for p in data["samples"])
    # the process's tool journals (SearchToy opens none; earlier tests' SearchQA envs may have)
    assert ("the journals' memory layers grew by" in text) == bool(data["journals"])
    assert data["steps"] == 300 and data["forks"] == 30 and len(data["samples"]) == 5
    assert rc == (0 if all(data["verdict"].values()) else 1)
    from twice_envs.cli import BENCHES

    assert BENCHES["soak"] == "twice_envs.soak:main"


def test_run_soak_samples_every_mark_with_or_without_a_warm_up():
    no_warmup = run_soak("SearchToy-v0", 200, warmup=0, samples=4, fork_every=0)
    assert [p["step"] for p in no_warmup["samples"]] == [0, 50, 100, 150, 200] and no_warmup["forks"] == 0
    short = run_soak("SearchToy-v0", 7, warmup=2, samples=20, fork_every=3)
    assert [p["step"] for p in short["samples"]] == [0, 2, 3, 4, 5, 6, 7] and short["forks"] == 2
    with pytest.raises(ValueError):
        run_soak("SearchToy-v0", 10, warmup=10)


#: RSS growth allowed after the warm-up, in %. Measured on the 2-core machine shared with other
#: jobs (5,000 steps, warm-up 1,000, three seeds; ALFWorld as below): WebShop moved at most
#: 0.07 MB (0.1%); SearchQA grew 0.30-0.35 MB (0.45%), its journal's memory layer filling with
#: new searches (about 0.08 MB per 1,000 steps, bounded by the layer's byte cap); ALFWorld's
#: samples moved up to 1.2 MB (1.1% of 109 MB) between neighbours over 20,000 steps, as the
#: allocator reuses freed blocks (its 2,000-step run below grew 0.04 MB). 2.5% is about twice the
#: largest of these, and it still catches a leak of 0.5 KB a step over the 4,000 steps after
#: SearchQA's and WebShop's warm-up (1.8 KB a step over ALFWorld's 1,500): an observation or a
#: trajectory kept per step, an engine or a file kept per fork.
MAX_GROWTH_PCT = 2.5


@pytest.mark.slow
@pytest.mark.parametrize("env_id", MAIN_ENVS)
def test_short_soak_is_flat(env_id):
    _needs(env_id)
    if env_id == "ALFWorld-v0":
        # ALFWorld's process caches fill as games load (about 3 MB per game, 22 bundled games:
        # 66 MB over the first ~4,000 steps of a soak). Loading every game once first (11 s on
        # the machine above) makes the warm-up cover that; then 2,000 steps, not 5,000: a step
        # with its share of forks costs 5-8 ms there, so 2,000 steps take 10-16 s.
        env = twice_envs.make(env_id)
        for index in range(len(env.games)):
            env.reset(options={"index": index})
        env.close()
        steps, warmup = 2_000, 500
    else:
        steps, warmup = 5_000, 1_000  # 1-2 s each on the machine above
    result = run_soak(env_id, steps, warmup=warmup, samples=8, seed=0)
    summary = {k: v for k, v in result.items() if k != "samples"}
    assert result["forks"] == steps // 25 and result["episodes"] > 1, summary
    assert result["fds_flat"] and result["threads_flat"], summary
    if "os_threads_flat" in result:
        assert result["os_threads_flat"], summary
    assert result["rss_growth_pct"] <= MAX_GROWTH_PCT, summary


def test_cli_progress_lines_follow_the_progress_rule(tmp_path, capsys):
    """Break: the log printing whatever the rule says -> lines under --no-progress."""
    from twice_envs import progress

    args = ["--env", "SearchToy-v0", "--steps", "100", "--samples", "2", "--fork-every", "0"]
    try:
        progress.set_enabled(True)
        main(args)
        assert "[bench soak" in capsys.readouterr().err
        main(args + ["--no-progress"])
        assert "[bench soak" not in capsys.readouterr().err
    finally:
        progress.set_enabled(None)
