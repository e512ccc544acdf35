"""NeMo Gym's GymnasiumServer protocol over twice envs: seeded sessions, and restore by validated replay
(the server class itself, over HTTP, in test_nemo_gym_server.py, where nemo-gym installs: tests/sidecar/nemo_gym.sh)."""

import asyncio
import copy
import runpy
from pathlib import Path
from types import SimpleNamespace

import pytest

import twice_envs
from twice_envs.errors import MissingExtra
from twice_envs.integrations.nemo_gym import SessionError, TwiceGymSessions, action_text, server_class

ENV_ID = "SearchToy-v0"
ACTIONS = ("search q1", "search q5", "search q2", "answer")


def run(coro):
    return asyncio.run(coro)


def _response(text):
    """A NeMo Gym model response: a message output item holding output_text parts."""
    parts = [SimpleNamespace(type="output_text", text=text[:4]), SimpleNamespace(type="output_text", text=text[4:])]
    return SimpleNamespace(output=[SimpleNamespace(type="reasoning"), SimpleNamespace(type="message", content=parts)])


def test_sessions_play_the_in_process_episode_with_response_actions():
    sessions = TwiceGymSessions(ENV_ID)
    expected = twice_envs.make(ENV_ID)
    first, _ = expected.reset(seed=7)
    for session in ("a", "b"):  # the same seed, the same episode, in every session
        text, info = run(sessions.reset({"seed": 7}, session))
        assert text == first and info["digest"] == expected.trajectory.digests[0] and info["turn"] == 0
    for action in ACTIONS:
        obs, reward, terminated, truncated, info = expected.step(action)
        got, twin = run(sessions.step(_response(action), {}, "a")), run(sessions.step(action, {}, "b"))
        assert got[:4] == (obs, float(reward), terminated, truncated)
        assert got[4]["digest"] == twin[4]["digest"] == info["digest"]
    with pytest.raises(SessionError, match="the episode is over after 4 turns"):
        run(sessions.step("answer", {}, "a"))
    run(sessions.close_session("a"))
    run(sessions.close_session("a"))  # twice is fine
    with pytest.raises(SessionError, match="session 'a' has no episode"):
        run(sessions.step("answer", {}, "a"))


def test_restore_replays_the_record_on_another_server_and_goes_on_identically():
    crashed = TwiceGymSessions(ENV_ID)
    run(crashed.reset({"seed": 3}, "s"))
    for action in ACTIONS[:2]:
        run(crashed.step(action, {}, "s"))
    record = crashed.export("s")
    restarted = TwiceGymSessions(ENV_ID)  # a new server process
    text, info = run(restarted.reset({"restore": record}, "s2"))
    assert info["digest"] == record["digests"][-1] and info["turn"] == 2 and text == record["observations"][-1]
    after = [run(s.step(ACTIONS[2], {}, sid))[4]["digest"] for s, sid in ((crashed, "s"), (restarted, "s2"))]
    assert after[0] == after[1]


def test_bad_resets_are_refused_by_name_and_the_session_goes_on():
    sessions = TwiceGymSessions(ENV_ID)
    run(sessions.reset({"seed": 3}, "s"))
    run(sessions.step("search q1", {}, "s"))
    record = sessions.export("s")
    tampered = copy.deepcopy(record)
    tampered["actions"][0] = "search q7"
    with pytest.raises(Exception, match="digest chain is broken at turn 1"):
        run(sessions.reset({"restore": tampered}, "t"))
    other = copy.deepcopy(record)
    other["env_id"] = "SearchQA-v0"
    with pytest.raises(Exception, match="the record's env_id is 'SearchQA-v0'"):
        run(sessions.reset({"restore": other}, "t"))
    with pytest.raises(SessionError, match=r"unknown reset metadata \['sed'\]"):
        run(sessions.reset({"sed": 3}, "s"))
    with pytest.raises(SessionError, match="takes no seed or options"):
        run(sessions.reset({"restore": record, "seed": 1}, "s"))
    with pytest.raises(SessionError, match="missing session id"):
        run(sessions.reset({"seed": 1}))
    with pytest.raises(SessionError, match="reset refused"):
        run(sessions.reset({"seed": -1}, "s"))
    assert run(sessions.step("search q2", {}, "s"))[4]["turn"] == 2  # the session went on
    with pytest.raises(SessionError, match="must be text or a model response"):
        action_text(42)


def test_the_server_class_needs_nemo_gym():
    try:
        import resources_servers.gymnasium  # noqa: F401
    except ImportError:
        with pytest.raises(MissingExtra, match="nemo-gym"):
            server_class(ENV_ID)
        return
    cls = server_class(ENV_ID)  # pragma: no cover -- where nemo-gym installs
    assert run(cls.sessions.reset({"seed": 1}, "x"))[1]["turn"] == 0


def test_the_hubs_page_example_restores_a_session(capsys):
    example = Path(__file__).resolve().parents[2] / "examples" / "hubs" / "nemo_gym_sessions.py"
    out = runpy.run_path(str(example))["main"]()
    assert out == {"same": True, "turn": 3}
    assert "with the same digest: True" in capsys.readouterr().out
