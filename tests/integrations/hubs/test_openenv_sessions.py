"""Session slots and access: a dropped or silent client frees its slot, and a token guards the server."""

import subprocess
import sys
import time

import pytest

pytest.importorskip("openenv")

import requests  # noqa: E402
from websockets.exceptions import ConnectionClosed, InvalidStatus  # noqa: E402

from tests.integrations.hubs.servers import ENV_ID, Session, served, ws_url  # noqa: E402
from twice_envs.integrations.openenv.client import TwiceEnvClient  # noqa: E402
from twice_envs.integrations.openenv.guard import IDLE_CLOSE_CODE  # noqa: E402
from twice_envs.integrations.openenv.server import ServeConfig, ServeConfigError, build_app  # noqa: E402

#: A client in its own process: it opens a session, starts an episode, says so, and waits to be killed.
CLIENT = """
import sys, time
from websockets.sync.client import connect
ws = connect(sys.argv[1])
ws.send('{"type": "reset", "data": {"seed": 1}}')
ws.recv()
print("ready", flush=True)
time.sleep(120)
"""


def _full(url: str) -> bool:
    """Whether a new session is refused for capacity (a free slot starts the episode instead)."""
    with Session(url) as s:
        try:
            reply = s.reset(seed=2)
        except ConnectionClosed:
            return True
    return reply["type"] == "error" and reply["data"]["code"] == "CAPACITY_REACHED"


def _until_free(url: str, within: float) -> float:
    start = time.monotonic()
    while _full(url):
        assert time.monotonic() - start < within, f"the slot was not freed within {within} s"
        time.sleep(0.1)
    return time.monotonic() - start


def test_a_killed_client_frees_its_slot():
    with served(max_sessions=1, session_timeout=600) as url:
        client = subprocess.Popen([sys.executable, "-c", CLIENT, ws_url(url)], stdout=subprocess.PIPE, text=True)
        try:
            assert client.stdout.readline().strip() == "ready"
            assert _full(url)  # the one slot is held
        finally:
            client.kill()  # no close frame: the process is gone
            client.wait(10)
        assert _until_free(url, within=10) < 10


def test_a_silent_client_is_closed_after_the_session_timeout_and_its_slot_freed():
    with served(max_sessions=1, session_timeout=1.0) as url:
        with Session(url) as silent:
            silent.reset(seed=1)
            assert _full(url)
            _until_free(url, within=5)
            with pytest.raises(ConnectionClosed) as closed:
                silent.reset(seed=1)
            assert closed.value.rcvd.code == IDLE_CLOSE_CODE and "idle for 1 s" in closed.value.rcvd.reason


def test_a_token_is_required_for_any_address_off_the_loopback():
    for host in ("0.0.0.0", "192.0.2.1", "::", "example.org"):
        with pytest.raises(ServeConfigError, match=f"host {host!r} is reachable from other machines.*--token"):
            build_app(ServeConfig(ENV_ID, host=host))
        ServeConfig(ENV_ID, host=host, token="a-long-secret").check()  # checked only: nothing is bound
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        ServeConfig(ENV_ID, host=host).check()
    with pytest.raises(ServeConfigError, match="at least 8 characters"):
        ServeConfig(ENV_ID, token="short").check()


def test_with_a_token_every_request_but_health_must_carry_it():
    token = "s3cret-token-for-tests"
    with served(token=token) as url:
        assert requests.get(f"{url}/health", timeout=10).status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong-token"}, {"Authorization": token}):
            reply = requests.get(f"{url}/schema", headers=headers, timeout=10)
            assert reply.status_code == 401 and "bearer token" in reply.json()["detail"]
            with pytest.raises(InvalidStatus) as refused:
                Session(url, additional_headers=headers)
            assert refused.value.response.status_code == 401
        assert requests.get(f"{url}/schema", headers={"Authorization": f"Bearer {token}"}, timeout=10).ok
        with TwiceEnvClient(url, token=token).sync() as client:
            assert client.reset(seed=4).metadata["seed"] == 4
