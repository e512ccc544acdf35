"""preload_forkserver: workers forked by the server find the env's resources loaded."""

import multiprocessing
import sys

import pytest

import twice_envs
from twice_envs.errors import TwiceError
from twice_envs.workers import ENV_VAR, forkserver_running, load_in_server, preload_forkserver, stop_forkserver

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the forkserver start method is Linux-only here")


def _probe(conn, env_id: str) -> None:
    """In a forked worker: were the env's resources cached before make(), and what does an episode give?"""
    import gc

    from twice_envs.envs.searchqa import resources

    cached_before = len(resources._CACHE)
    env = twice_envs.make(env_id)
    obs, _ = env.reset(seed=3)
    obs2, *_ = env.step("<search> capital of france </search>")
    conn.send({"cached_before": cached_before, "frozen": gc.get_freeze_count(), "obs": obs, "obs2": obs2,
               "same_resources": env.resources is resources._CACHE.get(next(iter(resources._CACHE), None))})
    env.close()


def _run(n: int = 2) -> list:
    ctx = multiprocessing.get_context("forkserver")
    out = []
    for _ in range(n):
        a, b = ctx.Pipe()
        p = ctx.Process(target=_probe, args=(b, "SearchQA-v0"))
        p.start()
        out.append(a.recv())
        p.join(30)
    return out


@pytest.fixture
def fresh_server():
    import os

    saved_env = os.environ.pop(ENV_VAR, None)
    saved = list(multiprocessing.forkserver._forkserver._preload_modules)
    yield
    if forkserver_running():
        stop_forkserver()
    multiprocessing.set_forkserver_preload(saved)
    os.environ.pop(ENV_VAR, None)
    if saved_env is not None:
        os.environ[ENV_VAR] = saved_env


def test_workers_forked_from_a_preloaded_server_share_its_resources(fresh_server):
    preload_forkserver(["SearchQA-v0"])
    assert forkserver_running() is False  # starts with the first worker
    reports = _run(2)
    env = twice_envs.make("SearchQA-v0")
    obs, _ = env.reset(seed=3)
    obs2, *_ = env.step("<search> capital of france </search>")
    for r in reports:
        assert r["cached_before"] == 1  # loaded by the server, before this worker's make()
        assert r["same_resources"]
        assert r["frozen"] > 1000  # the server froze its heap
        assert (r["obs"], r["obs2"]) == (obs, obs2)  # the same episode as in this process


def test_a_plain_forkserver_worker_loads_the_env_itself(fresh_server):
    stop_forkserver() if forkserver_running() else None
    multiprocessing.set_forkserver_preload([])
    (r,) = _run(1)
    assert r["cached_before"] == 0 and r["frozen"] == 0


def test_preload_refuses_bad_specs(fresh_server):
    with pytest.raises(TwiceError, match="'Nope-v0', which is not a registered env id"):
        preload_forkserver(["Nope-v0"])
    with pytest.raises(TwiceError, match=r"kwargs of spec 0 \(SearchQA-v0\) must be JSON values"):
        preload_forkserver([("SearchQA-v0", {"corpus": object()})])
    with pytest.raises(TwiceError, match="spec 1 must be an env id or"):
        preload_forkserver(["SearchQA-v0", 7])
    with pytest.raises(TwiceError, match="spec 0 must be an env id or"):
        preload_forkserver([("SearchQA-v0",)])


def test_restart_false_refuses_a_running_server(fresh_server):
    preload_forkserver(["SearchQA-v0"])
    _run(1)
    assert forkserver_running()
    with pytest.raises(TwiceError, match="already running"):
        preload_forkserver(["SearchQA-v0"], restart=False)
    preload_forkserver(["WebShop-v0"])  # restart=True stops it; the next worker starts a new server
    assert not forkserver_running()


def test_a_spec_that_fails_in_the_server_is_reported_and_the_server_goes_on(capsys):
    env = {ENV_VAR: '{"envs": [["SearchQA-v0", {"corpus": "/nonexistent/corpus.jsonl"}], ["SearchQA-v0", {}]]}'}
    done = load_in_server(env, freeze=False)
    assert done[0][0] == "SearchQA-v0" and "needs question files" in done[0][1]
    assert done[1] == ("SearchQA-v0", None)
    assert "could not preload SearchQA-v0" in capsys.readouterr().err
    assert load_in_server({ENV_VAR: "{not json"}, freeze=False)[0][1].startswith(f"${ENV_VAR} is not valid")


def test_an_async_vector_env_forks_its_workers_from_the_preloaded_server(fresh_server):
    preload_forkserver(["SearchQA-v0"])
    vec = twice_envs.make_vec("SearchQA-v0", 2, vectorization_mode="async", context="forkserver")
    try:
        obs, _ = vec.reset(seed=[1, 2])
    finally:
        vec.close()
    assert forkserver_running()  # the workers came from the server
    for seed, o in zip((1, 2), obs):
        assert o == twice_envs.make("SearchQA-v0").reset(seed=seed)[0]
