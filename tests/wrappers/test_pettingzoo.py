"""The PettingZoo view of a GRPO group and its twins: PettingZoo's own API and seed tests, group and twin semantics."""

from __future__ import annotations

import random
import warnings

import pytest

pytest.importorskip("pettingzoo")
from pettingzoo.test import parallel_api_test, parallel_seed_test  # noqa: E402

import twice_envs  # noqa: E402
from tests.wrappers.real_envs import REAL_ENVS, pick_action, require_env  # noqa: E402
from twice_envs import TwiceError  # noqa: E402
from twice_envs.wrappers.pettingzoo import GroupParallelEnv, parallel_env  # noqa: E402
from twice_envs.wrappers.twin import TwinEnv  # noqa: E402

TOY = ("CoinChain-v0", "CoinChainReplay-v0")


class _TwinsAtReset(GroupParallelEnv):
    """A group whose every reset also adds two twins of world_0 at turn 0 (so the API test sees twins)."""

    def reset(self, seed=None, options=None):
        obs, infos = super().reset(seed=seed, options=options)
        for action in ("left", "look"):
            agent, o, _, term, trunc, info = self.add_twin("world_0", 0, action)
            if not (term or trunc):
                obs[agent], infos[agent] = o, info
        return obs, infos


@pytest.mark.filterwarnings("ignore:GroupParallelEnv.*ignores reset options")
@pytest.mark.parametrize("env_id", TOY)
def test_parallel_api_test_group(env_id):
    parallel_api_test(parallel_env(env_id, 3), num_cycles=50)


@pytest.mark.parametrize("env_id", TOY)
def test_parallel_api_test_with_twins(env_id):
    env = _TwinsAtReset(env_id, 2, max_twins=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every slot is used, so no PettingZoo warning is expected
        warnings.filterwarnings("ignore", message=r"GroupParallelEnv\(.*\) ignores reset options \['options'\]")
        parallel_api_test(env, num_cycles=50)


@pytest.mark.parametrize("env_id", TOY)
def test_parallel_seed_test(env_id):
    parallel_seed_test(lambda: GroupParallelEnv(env_id, 3), num_cycles=20)
    parallel_seed_test(lambda: _TwinsAtReset(env_id, 2, max_twins=2), num_cycles=20)


def test_group_members_share_the_task_and_world_0_is_the_plain_episode():
    group = GroupParallelEnv("CoinChain-v0", 4)
    obs, infos = group.reset(seed=11)
    assert set(obs) == set(group.agents) == {f"world_{i}" for i in range(4)}
    assert len(set(obs.values())) == 1
    assert {group.trajectory(a).seed for a in group.agents} == {11}
    plain = twice_envs.make("CoinChain-v0")
    plain.reset(seed=11)
    assert group.trajectory("world_0").digests == plain.trajectory.digests
    # distinct noise per member: a keyed sampler draws a different sample in each world
    seeds = [infos[a]["noise_key"].episode_seed for a in group.agents]
    assert len(set(seeds)) == 4 and seeds[0] == plain.noise_key().episode_seed
    same = GroupParallelEnv("CoinChain-v0", 3, distinct_noise=False)
    _, infos = same.reset(seed=11)
    assert len({infos[a]["noise_key"] for a in same.agents}) == 1


def test_each_agent_steps_its_own_world():
    group = GroupParallelEnv("CoinChain-v0", 2)
    group.reset(seed=3, options={"goal": 5})
    obs, *_ = group.step({"world_0": "right", "world_1": "look"})
    assert group.trajectory("world_0").actions == ["right"]
    assert group.trajectory("world_1").actions == ["look"]
    assert obs["world_1"].startswith("You are at 0")


def test_twins_read_the_factual_noise_and_self_twin_is_exact():
    group = GroupParallelEnv("CoinChain-v0", 2, max_twins=3)
    group.reset(seed=21, options={"goal": 5})
    for _ in range(3):
        group.step({"world_0": "right", "world_1": "look"})
    factual = group.trajectory("world_0")
    schedule = group.world("world_0").noise_schedule

    agent, obs, _, _, _, info = group.add_twin("world_0", 1, "look")
    assert agent == "twin_0" and agent in group.agents
    assert info["twin_of"] == "world_0" and info["branch_turn"] == 1 and info["branch"] == 1
    assert isinstance(group.world(agent), TwinEnv)
    assert group.world(agent).alternative_key == schedule.key(1)._replace(branch=1)
    assert info["noise_key"] == schedule.key(2)  # after the branch: the factual key
    assert group.trajectory(agent).digests[:2] == factual.digests[:2]

    # a second twin at the same turn gets the next branch; a self-twin reproduces the factual turn
    agent2, _, _, _, _, info2 = group.add_twin("world_0", 1, factual.actions[1])
    assert agent2 == "twin_1" and info2["branch"] == 2
    assert group.trajectory(agent2).digests == factual.digests[:3]

    *_, infos = group.step({a: "right" for a in group.agents})
    assert infos["twin_0"]["noise_key"] == schedule.key(3)
    assert infos["twin_1"]["noise_key"] == schedule.key(3)
    assert group.trajectory("world_0").num_turns == 4 and group.trajectory("twin_0").num_turns == 3


def test_twin_of_a_finished_agent_and_bad_input():
    group = GroupParallelEnv("CoinChain-v0", 1, max_twins=1)
    with pytest.raises(TwiceError, match="before reset"):
        group.step({"world_0": "left"})
    group.reset(seed=0, options={"goal": 1})
    with pytest.raises(ValueError, match="no action for live agents"):
        group.step({})
    with pytest.raises(ValueError, match="not live"):
        group.step({"world_0": "left", "twin_0": "left"})
    for _ in range(12):
        pos = group.world("world_0").last_info["position"]
        *_, terms, truncs, _ = group.step({"world_0": "right" if pos < 1 else "left"})
        if terms["world_0"] or truncs["world_0"]:
            break
    assert group.agents == []
    agent, *_ = group.add_twin("world_0", 0, "look")
    assert group.agents == [agent]
    with pytest.raises(TwiceError, match="twin slots are used"):
        group.add_twin("world_0", 0, "left")
    with pytest.raises(ValueError, match="unknown agent"):
        group.add_twin("world_9", 0, "left")
    with pytest.raises(ValueError, match=r"world_0's fork\(99\) is outside this episode"):
        group.add_twin("world_0", 99, "left")
    with pytest.raises(ValueError, match="group_size"):
        GroupParallelEnv("CoinChain-v0", 0)
    with pytest.raises(TwiceError, match="unknown env id"):
        GroupParallelEnv("NoSuchEnv-v0", 2)
    # a reset drops the twins
    group.reset(seed=1)
    assert group.agents == ["world_0"] and group.twin_of == {}


def test_render_ansi():
    group = GroupParallelEnv("CoinChain-v0", 2, render_mode="ansi")
    group.reset(seed=0)
    text = group.render()
    assert "[world_0]" in text and "[world_1]" in text


@pytest.mark.slow
@pytest.mark.parametrize("env_id", list(REAL_ENVS))
def test_real_envs_pass_pettingzoo_tests(env_id):
    require_env(env_id)
    # PettingZoo's API test resets with {"options": 1}: the view drops that key, with a warning
    with pytest.warns(UserWarning, match=r"ignores reset options \['options'\]"):
        parallel_api_test(GroupParallelEnv(env_id, 2, max_action_length=64), num_cycles=3)
    parallel_seed_test(lambda: GroupParallelEnv(env_id, 2, max_action_length=64), num_cycles=2)
    group = GroupParallelEnv(env_id, 2, max_twins=1)
    obs, infos = group.reset(seed=5)
    assert obs["world_0"] == obs["world_1"]
    rng = random.Random(0)
    group.step({a: pick_action(infos[a], rng) for a in group.agents})
    factual = group.trajectory("world_0")
    agent, *_ = group.add_twin("world_0", 0, factual.actions[0])  # self-twin: exactly the factual turn
    assert group.trajectory(agent).digests == factual.digests[:2]
    group.close()


def test_group_forwards_known_reset_options_and_drops_others_with_a_warning():
    group = GroupParallelEnv("CoinChain-v0", 2)
    with pytest.warns(UserWarning, match=r"ignores reset options \['bogus', 'options'\]: the env accepts goal, noise_seed"):
        obs, _ = group.reset(seed=1, options={"goal": 4, "options": 1, "bogus": 2})
    assert all(group.world(a).trajectory.options.get("goal") == 4 for a in group.agents)
    assert all("options" not in group.world(a).trajectory.options for a in group.agents)
    with pytest.raises(ValueError, match="reset options must be a dict"):
        group.reset(seed=1, options="notadict")
    # the env alone still refuses a key it does not know
    with pytest.raises(ValueError, match="unknown CoinChain reset options"):
        twice_envs.make("CoinChain-v0").reset(seed=1, options={"options": 1})


def test_unseeded_group_reset_continues_world_0s_generator():
    seeds = []
    for _ in range(2):
        group = GroupParallelEnv("CoinChain-v0", 2)
        group.reset(seed=42)
        seeds.append([group.reset()[1]["world_0"]["noise_key"].episode_seed for _ in range(3)])
    assert seeds[0] == seeds[1] and len(set(seeds[0])) == 3
