"""The adapter inside NeMo Gym's own GymnasiumServer, served by uvicorn on 127.0.0.1 and driven over HTTP
with NeMo Gym's request and response models. Runs where nemo-gym is installed (tests/sidecar/nemo_gym.sh)."""

import socket
import threading
import time

import pytest

gym_server = pytest.importorskip("resources_servers.gymnasium", reason="needs nemo-gym (tests/sidecar/nemo_gym.sh)")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

from nemo_gym.base_resources_server import BaseResourcesServerConfig  # noqa: E402
from nemo_gym.config_types import BaseServerConfig  # noqa: E402
from nemo_gym.server_utils import ServerClient  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

import twice_envs  # noqa: E402
from twice_envs.integrations.nemo_gym import server_class  # noqa: E402

ENV_ID = "SearchToy-v0"
ACTIONS = ("search q1", "search q5", "search q2", "answer")
PARAMS = {"input": [{"role": "user", "content": "play"}]}


def response(text):
    """A NeMo Gym model response whose output message holds ``text``."""
    return {"id": "resp", "created_at": 0, "model": "scripted", "object": "response", "parallel_tool_calls": False,
            "tool_choice": "auto", "tools": [],
            "output": [{"type": "message", "id": "msg", "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": text, "annotations": []}]}]}


class Served:
    """A ``server_class(ENV_ID)`` instance behind uvicorn on a free 127.0.0.1 port."""

    def __init__(self):
        cls = server_class(ENV_ID)
        config = BaseResourcesServerConfig(host="127.0.0.1", port=0, entrypoint="app.py", name="twice", domain="other")
        client = ServerClient(head_server_config=BaseServerConfig(host="127.0.0.1", port=1),
                              global_config_dict=OmegaConf.create({}))
        self.server = cls(config=config, server_client=client)
        self.sessions = cls.sessions
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.uvicorn = uvicorn.Server(uvicorn.Config(self.server.setup_webserver(), host="127.0.0.1", port=self.port,
                                                     log_level="warning"))
        self.thread = threading.Thread(target=self.uvicorn.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.uvicorn.started:
            assert time.time() < deadline, "the server did not start"
            time.sleep(0.05)

    def client(self):
        return httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=30)

    def stop(self):
        self.uvicorn.should_exit = True
        self.thread.join(10)


@pytest.fixture
def served():
    s = Served()
    yield s
    s.stop()


def reset(c, **metadata):
    return c.post("/reset", json={"responses_create_params": PARAMS, **metadata})


def step(c, text):
    return c.post("/step", json={"responses_create_params": PARAMS, "response": response(text)})


def test_sessions_over_http_play_the_in_process_episode(served):
    expected = twice_envs.make(ENV_ID)
    first, _ = expected.reset(seed=7)
    with served.client() as a, served.client() as b:  # two cookie sessions
        for c in (a, b):
            r = reset(c, seed=7)
            assert r.status_code == 200 and r.json()["observation"] == first
            assert r.json()["info"]["digest"] == expected.trajectory.digests[0]
        assert len(served.sessions.envs) == 2
        for action in ACTIONS:
            obs, reward, terminated, truncated, info = expected.step(action)
            got, twin = step(a, action).json(), step(b, action).json()
            assert (got["observation"], got["reward"], got["terminated"], got["truncated"]) == (
                obs, float(reward), terminated, truncated)
            assert got["info"]["digest"] == twin["info"]["digest"] == info["digest"]
        assert served.sessions.envs == {}  # NeMo Gym closes a session whose episode ended
        late = step(a, "answer")
        assert late.status_code == 400 and "has no episode: send a reset first" in late.json()["detail"]


def test_a_restarted_server_restores_the_session_by_replay(served):
    with served.client() as c:
        reset(c, seed=3)
        for action in ACTIONS[:2]:
            step(c, action)
        (record,) = [served.sessions.export(sid) for sid in served.sessions.envs]
        before = step(c, ACTIONS[2]).json()
    restarted = Served()  # a new server process would start like this
    try:
        with restarted.client() as c:
            r = reset(c, restore=record)
            assert r.status_code == 200 and r.json()["info"]["turn"] == 2
            assert r.json()["info"]["digest"] == record["digests"][-1]
            assert step(c, ACTIONS[2]).json()["info"]["digest"] == before["info"]["digest"]
            tampered = dict(record, actions=["search q4"] + list(record["actions"][1:]))
            bad = reset(c, restore=tampered)
            assert bad.status_code == 400 and "turn" in bad.json()["detail"]
            assert step(c, ACTIONS[3]).status_code == 200  # the refused restore left the session as it was
    finally:
        restarted.stop()


@pytest.mark.parametrize("metadata, words", [({"seed": 1, "colour": "red"}, "unknown reset metadata ['colour']"),
                                             ({"seed": "x"}, "reset refused")])
def test_bad_resets_answer_400_naming_the_problem_and_the_server_goes_on(served, metadata, words):
    with served.client() as c:
        bad = reset(c, **metadata)
        assert bad.status_code == 400 and words in bad.json()["detail"]
        assert reset(c, seed=1).status_code == 200 and step(c, "search q1").status_code == 200
