"""``twice serve`` through OpenEnv: seeds honoured in every session, concurrent sessions, bad input answered
with clear errors while the session (and every other session) goes on. Real servers on 127.0.0.1."""

import json
import threading

import pytest

pytest.importorskip("openenv")

import requests  # noqa: E402

from tests.integrations.hubs.servers import ACTIONS, ENV_ID, Session, in_process, served  # noqa: E402
from twice_envs.integrations.openenv.client import TwiceEnvClient  # noqa: E402


@pytest.fixture(scope="module")
def url():
    with served(max_sessions=8) as base:
        yield base


def test_the_same_seed_gives_the_same_first_observation_in_every_session(url):
    obs, digests = in_process(7)
    with Session(url) as a, Session(url) as b:  # two sessions open at once
        first_a, first_b = a.reset(seed=7)["data"], b.reset(seed=7)["data"]
    with TwiceEnvClient(url).sync() as client:  # a later session, through OpenEnv's own client
        first_c = client.reset(seed=7)
    http = requests.post(f"{url}/reset", json={"seed": 7}, timeout=10).json()
    for data in (first_a, first_b, http):
        assert data["observation"]["text"] == obs and data["metadata"]["digest"] == digests[0]
        assert data["metadata"]["seed"] == 7 and data["metadata"]["noise_key"][1:] == [0, 0, 0, 0]
    assert first_c.observation.text == obs and first_c.metadata["digest"] == digests[0]
    with Session(url) as d:
        assert d.reset(seed=8)["data"]["metadata"]["digest"] != digests[0]


def test_an_unseeded_reset_reports_the_seed_that_replays_it(url):
    with Session(url) as a:
        first = a.reset()["data"]["metadata"]
    with Session(url) as b:
        again = b.reset(seed=first["seed"])["data"]["metadata"]
    assert again["digest"] == first["digest"] and again["noise_key"] == first["noise_key"]


def test_concurrent_sessions_play_their_own_episodes_exactly(url):
    seeds = range(8)
    got: dict[int, list] = {}

    def play(seed: int) -> None:
        with TwiceEnvClient(url).sync() as client:
            chain = [client.reset(seed=seed).metadata["digest"]]
            for action in ACTIONS:
                chain.append(client.step(action).metadata["digest"])
            got[seed] = chain

    threads = [threading.Thread(target=play, args=(s,)) for s in seeds]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got == {s: in_process(s)[1] for s in seeds}


def _error(reply: dict, code: str, *words: str) -> None:
    assert reply["type"] == "error", reply
    data = reply["data"]
    assert data["code"] == code, data
    text = json.dumps(data)
    for word in words:
        assert word in text, (word, data)


def test_bad_input_gets_a_clear_error_and_the_session_goes_on(url):
    with Session(url) as s, Session(url) as bystander:
        bystander_chain = [bystander.reset(seed=5)["data"]["metadata"]["digest"]]
        _error(s.step("search q1"), "EXECUTION_ERROR", "step before reset")
        _error(s.ask("{not json"), "INVALID_JSON", "Invalid JSON")
        _error(s.ask("[1, 2]"), "INVALID_JSON", "JSON object", "list")
        _error(s.ask(b"\x00binary"), "INVALID_JSON", "binary frames")
        _error(s.ask("x" * ((1 << 20) + 1)), "REQUEST_TOO_LARGE", "1048577 bytes", "1048576")
        _error(s.ask({"type": "launch"}), "UNKNOWN_TYPE", "launch")
        _error(s.ask({"type": "step", "data": {"txt": "search q1"}}), "VALIDATION_ERROR", "txt")
        _error(s.reset(seed=-1), "EXECUTION_ERROR", "seed must be an int")
        _error(s.reset(seed="7"), "EXECUTION_ERROR", "seed must be an int")
        _error(s.reset(seed=7, sead=8), "EXECUTION_ERROR", "unknown reset fields ['sead']")
        _error(s.reset(seed=7, options=[1]), "EXECUTION_ERROR", "options must be a dict")
        for action in ACTIONS[:2]:
            bystander_chain.append(bystander.step(action)["data"]["metadata"]["digest"])
        # the same session still plays the exact episode
        chain = [s.reset(seed=3)["data"]["metadata"]["digest"]]
        for action in ACTIONS:
            reply = s.step(action)
            chain.append(reply["data"]["metadata"]["digest"])
        assert reply["data"]["done"] is True and chain == in_process(3)[1]
        _error(s.step("answer"), "EXECUTION_ERROR", "episode is over", "terminated after 4 turns")
        assert s.reset(seed=3)["data"]["metadata"]["digest"] == chain[0]
        for action in ACTIONS[2:]:
            bystander_chain.append(bystander.step(action)["data"]["metadata"]["digest"])
    assert bystander_chain == in_process(5)[1]


def test_a_bad_action_text_is_the_envs_to_answer(url):
    with TwiceEnvClient(url).sync() as client:
        client.reset(seed=1)
        result = client.step("fly to the moon")
        assert result.metadata["info"]["invalid"] is True and "Invalid action" in result.observation.text
        assert result.metadata["turn"] == 1 and not result.done


def test_http_requests_get_clear_errors(url):
    step = requests.post(f"{url}/step", json={"action": {"text": "search q1"}}, timeout=10)
    assert step.status_code == 400 and "step before reset" in step.json()["detail"]
    big = requests.post(f"{url}/reset", data=b"{" + b" " * (1 << 20) + b"}",
                        headers={"content-type": "application/json"}, timeout=10)
    assert big.status_code == 413 and "1048576 bytes" in big.json()["detail"]
    bad = requests.post(f"{url}/reset", json={"seed": 2**64}, timeout=10)
    assert bad.status_code == 400 and "seed must be an int in 0..2**64-1" in bad.json()["detail"]
    state = requests.get(f"{url}/state", timeout=10).json()
    assert state["env_id"] == ENV_ID and state["seed"] is None
    assert requests.get(f"{url}/metadata", timeout=10).json()["name"] == ENV_ID
