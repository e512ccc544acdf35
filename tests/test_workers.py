"""preload_forkserver: workers forked by the server find the env's resources loaded."""

import json
import multiprocessing
import os
import sys

import pytest

import twice_envs
from twice_envs.errors import TwiceError
from twice_envs.workers import (
    ENV_VAR,
    HOOK_MODULE,
    forkserver_running,
    load_in_server,
    preload_forkserver,
    stop_forkserver,
)

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
    with pytest.raises(TwiceError, match="spec 0: env id 'Nope-v0' is not registered"):
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


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A module on the path that leaves a file behind if anything imports it."""
    marker = tmp_path / "imported"
    (tmp_path / "planted_preload_mod.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield marker
    sys.modules.pop("planted_preload_mod", None)


def test_preload_looks_ids_up_without_importing_their_module(fresh_server, planted):
    with pytest.raises(TwiceError, match=r"spec 0: env id 'planted_preload_mod:Planted-v0' names a module"):
        preload_forkserver(["planted_preload_mod:Planted-v0"])
    preload_forkserver(["planted_preload_mod:SearchQA-v0"])  # a registered name: its module is ignored
    assert json.loads(os.environ[ENV_VAR]) == {"envs": [["SearchQA-v0", {}]]}
    assert not planted.exists() and "planted_preload_mod" not in sys.modules


#: Values of the variable of every wrong shape: not JSON, other JSON types, a wrong ``envs``,
#: entries of wrong shapes, ids that are not registered or name a module, bad kwargs, deep nesting.
MALFORMED = [
    "{not json", "\x00\xff", "5", "null", "[]", '"SearchQA-v0"', '["SearchQA-v0"]', "{}", '{"envs": 5}',
    '{"envs": null}', '{"envs": "SearchQA-v0"}', '{"envs": {"SearchQA-v0": {}}}', '{"envs": [5]}',
    '{"envs": [null]}', '{"envs": [[]]}', '{"envs": [["SearchQA-v0"]]}', '{"envs": [["SearchQA-v0", {}, 3]]}',
    '{"envs": [[5, {}]]}', '{"envs": [["SearchQA-v0", 5]]}', '{"envs": [["SearchQA-v0", [1, 2]]]}',
    '{"envs": [{"id": "SearchQA-v0"}]}', '{"envs": [["Nope-v0", {}]]}', '{"envs": ["planted_preload_mod:Nope-v0"]}',
    '{"envs": [["planted_preload_mod:Planted-v0", {}]]}', '{"envs": [["SearchQA-v0", {"no_such_kwarg": 1}]]}',
    '{"envs": [["SearchQA-v0", {"topk": {"a": [[[]]]}}]]}', "[" * 100_000, '{"envs": ' + "[" * 100_000,
    '{"envs": [["SearchQA-v0", ' + "{" * 50_000 + "}" * 50_000 + "]]}",
]


@pytest.mark.parametrize("value", MALFORMED)
def test_the_hook_never_raises_and_reports_a_malformed_value(value, planted, capsys):
    done = load_in_server({ENV_VAR: value}, freeze=False)
    faults = [what for what, error in done if error is not None]
    assert faults, done
    assert f"the forkserver could not preload {faults[0]}" in capsys.readouterr().err
    assert not planted.exists() and "planted_preload_mod" not in sys.modules


def test_a_wrong_shaped_entry_does_not_stop_the_valid_ones(capsys):
    value = '{"envs": [["planted_preload_mod:X-v0", {}], 5, ["SearchQA-v0", {}]]}'
    done = load_in_server({ENV_VAR: value}, freeze=False)
    assert done[-1] == ("SearchQA-v0", None)
    assert [what for what, _ in done[:2]] == [f"${ENV_VAR} entry 0", f"${ENV_VAR} entry 1"]
    assert "names a module" in done[0][1]


def test_a_pool_still_works_after_a_bad_value(fresh_server, capfd):
    import os

    os.environ[ENV_VAR] = '{"envs": 5}'
    multiprocessing.set_forkserver_preload(["twice_envs", HOOK_MODULE])
    (r,) = _run(1)
    env = twice_envs.make("SearchQA-v0")
    assert r["obs"] == env.reset(seed=3)[0] and r["cached_before"] == 0
    assert f"${ENV_VAR} is not valid" in capfd.readouterr().err  # the server's own stderr
