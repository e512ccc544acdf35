"""verifiers 0.4: ``load_environment`` over a twice env, played by verifiers' own rollout loop (its env,
agent, interception server and client) against a scripted chat model on 127.0.0.1."""

import asyncio
import runpy
from pathlib import Path

import pytest

pytest.importorskip("verifiers.v1")

import twice_envs  # noqa: E402
from tests.integrations.scripted_model import scripted_model  # noqa: E402
from twice_envs.errors import TwiceError  # noqa: E402
from twice_envs.integrations.verifiers_env import load_environment  # noqa: E402
from verifiers.v1.clients import ModelContext  # noqa: E402
from verifiers.v1.configs.client import EvalClientConfig  # noqa: E402


ENV_ID = "SearchToy-v0"
ACTIONS = ("search q1", "search q5", "search q2", "answer")


def _rollouts(env, url, task_index=0, n=2):
    ctx = ModelContext(client=EvalClientConfig(base_url=url, api_key_var="TWICE_TEST_MODEL_KEY"), model="scripted")
    task = list(env.taskset)[task_index]

    async def play():
        async with env.serving():
            return [await env.run_slot(slot, ctx) for slot in env.slots(task, n)]

    return asyncio.run(play())


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.setenv("TWICE_TEST_MODEL_KEY", "local")


def test_rollouts_through_verifiers_play_the_in_process_episode():
    env = load_environment(ENV_ID, num_tasks=3, start=4)
    with scripted_model(ACTIONS) as (url, requests):
        episodes = _rollouts(env, url, task_index=1)
    expected = twice_envs.make(ENV_ID)
    first, _ = expected.reset(seed=5)
    episode_return = sum(expected.step(a)[1] for a in ACTIONS)
    for episode in episodes:
        assert episode.ok, episode.errors
        (trace,) = episode.traces
        assert trace.info["seed"] == 5 and trace.info["turns"] == len(ACTIONS) and trace.info["terminated"]
        assert trace.info["digest"] == expected.trajectory.digest
        assert trace.rewards["episode_return"].score == episode_return
    # the model saw the first observation as the task's prompt, then each observation as a user turn
    opening = requests[0]["messages"]
    assert opening[0]["role"] == "system" and "search qJ | answer" in opening[0]["content"]
    assert opening[-1] == {"role": "user", "content": first}
    assert len(requests) == 2 * len(ACTIONS)


def test_the_verifiers_turn_limit_ends_the_episode_early():
    env = load_environment(ENV_ID, num_tasks=1, max_turns=2)
    with scripted_model(ACTIONS) as (url, _):
        (episode,) = _rollouts(env, url, n=1)
    (trace,) = episode.traces
    assert trace.info["turns"] == 2 and not trace.info["terminated"]


def test_bad_settings_are_named():
    with pytest.raises(TwiceError, match="unknown env id 'Nope-v0'"):
        load_environment("Nope-v0")
    with pytest.raises(TwiceError, match="unknown kwargs .bogus."):
        load_environment(ENV_ID, bogus=1)
    with pytest.raises(ValueError, match="num_tasks must be >= 1"):
        list(load_environment(ENV_ID, num_tasks=0).taskset)


def test_the_hubs_page_example_evaluates_a_model(capsys):
    example = Path(__file__).resolve().parents[2] / "examples" / "hubs" / "verifiers_eval.py"
    with scripted_model(ACTIONS) as (url, _):
        rows = runpy.run_path(str(example))["main"](["--base-url", url, "--api-key-var", "TWICE_TEST_MODEL_KEY",
                                                     "--tasks", "2", "--rollouts", "1"])
    assert [r["seed"] for r in rows] == [0, 1] and all(r["turns"] == len(ACTIONS) for r in rows)
    assert "'digest':" in capsys.readouterr().out
