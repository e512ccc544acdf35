"""A throwaway tiny model for the agent tests, built once per test session by the build-tiny code path."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import tests.toy_envs  # noqa: F401  (registers CoinChain-v0)
from twice_envs.agents.models.load import build_tiny
from twice_envs.agents.models.recipes import TinyModelConfig

#: Small enough to build in a few seconds on 2 cores; trained on CoinChain transcripts.
TEST_CONFIG = TinyModelConfig(
    envs=("CoinChain-v0",), episodes_per_env=40, max_turns=6, vocab_size=320, hidden_size=48, num_layers=2,
    num_heads=2, num_kv_heads=1, intermediate_size=96, max_len=256, steps=40, batch_size=8, lr=1e-2, seed=0, threads=1,
)


@functools.lru_cache(maxsize=1)
def tiny_dir() -> Path:
    root = Path(tempfile.mkdtemp(prefix="twice-test-tiny-"))
    return build_tiny(root / "tiny", TEST_CONFIG, progress=False, recipe="test")


@functools.lru_cache(maxsize=1)
def tiny_policy():
    from twice_envs.agents.sampling.policy import HFPolicy

    return HFPolicy.from_pretrained(tiny_dir())
