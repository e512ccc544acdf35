"""Fork, twin and restore over the wire: the same digests and noise keys as in-process, and every bad
request refused by name while the sessions go on."""

import copy

import pytest

pytest.importorskip("openenv")

import twice_envs  # noqa: E402
from tests.integrations.hubs.servers import ACTIONS, ENV_ID, Session, served  # noqa: E402
from twice_envs.core import twin_step  # noqa: E402
from twice_envs.integrations.openenv.client import TwiceEnvClient, export, fork, restore, twin  # noqa: E402
from twice_envs.trajectory import reset_digest, step_digest  # noqa: E402

SEED = 3


@pytest.fixture(scope="module")
def url():
    with served(max_sessions=8) as base:
        yield base


def _factual(turns: int):
    env = twice_envs.make(ENV_ID)
    env.reset(seed=SEED)
    for action in ACTIONS[:turns]:
        env.step(action)
    return env


def _play(client, turns: int) -> None:
    client.reset(seed=SEED)
    for action in ACTIONS[:turns]:
        client.step(action)


def test_fork_over_the_wire_is_the_in_process_fork(url):
    factual = _factual(3)
    with TwiceEnvClient(url).sync() as env:
        _play(env, 3)
        branch, first = fork(env, turn=2)
        expected = factual.fork(2)
        assert first.metadata["digest"] == expected.trajectory.digest and first.metadata["turn"] == 2
        assert first.observation.text == expected.trajectory.observations[-1]
        after = branch.step("search q7")
        assert after.metadata["digest"] == expected.step("search q7")[4]["digest"]
        assert after.metadata["noise_key"] == expected.noise_key().to_json()
        assert env.step("answer").metadata["digest"] == factual.step("answer")[4]["digest"]  # the parent goes on


def test_twin_over_the_wire_takes_its_action_on_a_branch_and_reports_the_factual_keys(url):
    factual = _factual(3)
    with TwiceEnvClient(url).sync() as env:
        _play(env, 3)
        twin_session, result = twin(env, "search q7", turn=1, branch=2)
        expected = factual.fork(1)
        _, (obs, reward, _, _, info) = twin_step(expected, "search q7", factual.noise_schedule, branch=2)
        assert result.observation.text == obs and result.reward == reward
        assert result.metadata["digest"] == info["digest"]
        assert result.metadata["noise_key"] == factual.noise_schedule.key(2).to_json()  # turn 2: the factual key
        assert twin_session.state().record["noise"] == expected.trajectory.to_json()["noise"]


def test_export_and_restore_on_a_restarted_server_give_the_same_episode(url):
    factual = _factual(3)
    with TwiceEnvClient(url).sync() as env:
        _play(env, 3)
        record = export(env)
    assert record == factual.trajectory.to_json()
    with served(max_sessions=2) as restarted, TwiceEnvClient(restarted).sync() as again:
        result = restore(again, record)
        assert result.metadata["digest"] == record["digests"][-1] and result.metadata["turn"] == 3
        assert again.step("answer").metadata["digest"] == factual.step("answer")[4]["digest"]


def _rechained(record: dict, **changes) -> dict:
    """``record`` with ``changes`` and a digest chain recomputed to match: only a check of the field finds it."""
    r = {**copy.deepcopy(record), **changes}
    digests = [reset_digest(r["env_id"], r["env_version"], r["kwargs"], r["seed"], r["options"], r["observations"][0])]
    for action, obs, reward in zip(r["actions"], r["observations"][1:], r["rewards"]):
        digests.append(step_digest(digests[-1], action, obs, reward))
    return {**r, "digests": digests}


def _error(reply: dict, *words: str) -> None:
    assert reply["type"] == "error", reply
    for word in words:
        assert word in reply["data"]["message"], (word, reply["data"])


def test_bad_extension_requests_are_refused_by_name_and_the_sessions_go_on(url):
    factual = _factual(3)
    with TwiceEnvClient(url).sync() as env, Session(url) as s:
        _play(env, 3)
        handle = env.state().session
        record = export(env)
        _error(s.reset(fork={"session": "nope", "turn": 1}), "unknown session 'nope'")
        _error(s.reset(fork={"session": handle, "turn": 9}), "fork refused", "turn must be in 0..3")
        _error(s.reset(fork={"session": handle, "trun": 1}), "unknown fork fields ['trun']")
        _error(s.reset(fork={"turn": 1}), "needs the 'session'")
        _error(s.reset(fork={"session": handle}, seed=1), "takes no seed or options")
        _error(s.reset(fork={"session": handle}, restore=record), "names fork and restore")
        _error(s.reset(twin={"session": handle, "turn": 1, "action": "search q7", "branch": 0}),
               "twin refused", "branch must be an int >= 1")
        _error(s.reset(twin={"session": handle, "turn": 1}), "twin needs the alternative 'action'")
        tampered = copy.deepcopy(record)
        tampered["observations"][2] = "a different page"
        _error(s.reset(restore=tampered), "restore refused", "turn 2")
        twice_envs.register("SearchToy-Copy-v0", twice_envs.spec(ENV_ID).entry_point, override=True)
        other = _rechained(record, env_id="SearchToy-Copy-v0")  # registered here, but not what the server runs
        _error(s.reset(restore=other), "restore refused", "env_id is 'SearchToy-Copy-v0'", f"runs {ENV_ID!r}")
        kwargs = _rechained(record, kwargs={**record["kwargs"], "max_turns": 4})
        _error(s.reset(restore=kwargs), "kwargs differ from this server's in ['max_turns']")
        broken = {k: v for k, v in record.items() if k != "digests"}
        _error(s.reset(restore=broken), "restore refused", "digests")
        # the session that got every error restores the real record, and the parent plays on
        restored = s.reset(restore=record)["data"]["metadata"]
        assert restored["digest"] == record["digests"][-1]
        assert env.step("answer").metadata["digest"] == factual.step("answer")[4]["digest"]
