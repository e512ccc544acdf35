"""Hand-made episodes for the explorer's tests: a factual episode and its coupled twin, built token by token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from twice_envs.agents.types import EpisodeRecord, TurnRecord
from twice_envs.agents.records import batch_lines, write_lines
from twice_envs.keys import NoiseKey
from twice_envs.noise import KeyState

SEED = 12345
#: One id per distinct token text.
VOCAB: dict[str, int] = {}


def token_id(text: str) -> int:
    return VOCAB.setdefault(text, 100 + len(VOCAB))


def turn(tokens: list[str], turn_index: int, branch: int = 0, obs: str = "", reward: float = 0.0) -> TurnRecord:
    """A turn of ``tokens`` with the keys :class:`~twice_envs.noise.KeyState` gives them (line mode)."""
    key = NoiseKey(SEED, turn_index, branch)
    state = KeyState(key)
    keys = []
    for text in tokens:
        keys.append(list(state.row()[2:]))
        state.advance(token_id(text), "\n" in text)
    return TurnRecord([token_id(t) for t in tokens], [-0.5] * len(tokens), "".join(tokens), key, obs=obs,
                      reward=reward, token_texts=list(tokens), token_keys=keys)


def resync_pair(text: str = "a question", obs: Optional[str] = None) -> tuple[EpisodeRecord, EpisodeRecord]:
    """A factual episode of two turns and a coupled twin of turn 0 whose alternative turn is one line longer.

    In turn 1 both read the factual keys: their first lines differ (the contexts differ), and from line 1
    on they emit the same tokens under the same keys, so the twin re-synchronises at line 1."""
    factual = EpisodeRecord("SearchQA-v0", 7, {"split": "dev", "index": 3}, group=0,
                            turns=[turn(["a", "\n", "b", "\n"], 0, obs=obs if obs is not None else "seen b"),
                                   turn(["c", " d", "\n", "e", " f", "\n"], 1, obs="", reward=1.0)],
                            utility=1.0, terminated=True, info={"task_id": "dev_3", "question": text})
    factual.credit = {"twice": [0.25, 0.5], "grpo": [0.8, 0.8]}
    factual.coins = [{"q": 0.5, "B": True, "A_hat": 0.5}, {"q": 0.25, "B": False, "A_hat": 0.0}]
    twin = EpisodeRecord("SearchQA-v0", 7, {"split": "dev", "index": 3}, group=0,
                         turns=[turn(["a", "\n", "x", "\n", "b", "\n"], 0, branch=1, obs="seen x"),
                                turn(["z", "\n", "e", " f", "\n"], 1, obs="", reward=0.0)],
                         utility=0.0, terminated=True, twin_of=(0, 0), branch=1, coupled=True, evidence_coin=True)
    return factual, twin


def lone_episode(group: int = 1, utility: float = 0.0) -> EpisodeRecord:
    """A factual episode with no twin."""
    return EpisodeRecord("WebShop-v0", 3, {}, group=group, utility=utility, terminated=True,
                         turns=[turn(["search", " [", "shoes", "]"], 0, obs="results")],
                         info={"instruction": "find red shoes"})


def write_records(path: Path, factual: list, twins: list = (), extra_lines: list = ()) -> Path:
    """A record file of one batch (factual episodes, then twins), then any raw ``extra_lines``."""
    lines = batch_lines(factual, twins) + list(extra_lines)
    return write_lines(path, lines)


def damaged_lines() -> list[str]:
    """Lines a damaged file may hold: broken JSON, an episode with the wrong shape, an unknown object."""
    return ['{"episode": {"env_id": "x", "seed"', json.dumps({"episode": {"env_id": "x", "seed": 1, "options": {},
                                                                           "turns": "not a list"}}),
            json.dumps({"hello": "world"})]
