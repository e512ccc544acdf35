"""Small envs used by the core tests (and an example of writing a TextEnv).

``CoinChain``: walk along a line to a hidden goal. Each move has a 20% chance of a
gust that pushes you one step further (env-side randomness, drawn from
``self.np_random``). Actions: ``left``, ``right``, ``look``; anything else is invalid.
"""

from __future__ import annotations

import twice_envs
from twice_envs import Protocol, TextEnv


class CoinChainReplayOnly(TextEnv):
    """CoinChain without snapshots: forks go through replay."""

    version = "1"
    default_max_turns = 12
    reset_options = ("goal",)

    def __init__(self, *, length: int = 6, max_turns: int | None = None, render_mode: str | None = None) -> None:
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        if length < 2:
            raise ValueError("length must be >= 2")
        self.length = length

    def protocol(self) -> Protocol:
        return Protocol(
            instructions="Walk to the coin. Actions: left, right, look.",
            stop=("\n",),
            action_format="left | right | look",
        )

    def _info(self) -> dict:
        return {"admissible_actions": ["left", "look", "right"], "position": self.pos}

    def _reset(self, options: dict) -> tuple[str, dict]:
        self.goal = int(options.get("goal", self.np_random.integers(1, self.length)))
        self.pos = 0
        return f"{self.protocol().instructions}\nYou are at 0. The line has {self.length} cells.", self._info()

    def _step(self, action: str) -> tuple[str, float, bool, dict]:
        a = action.strip().lower()
        if a not in ("left", "right", "look"):
            info = self._info()
            info["invalid"] = True
            shown = action.strip()[:40]
            return f"Unknown action {shown!r}. Try left, right or look.", 0.0, False, info
        if a == "look":
            hint = "warm" if abs(self.goal - self.pos) <= 1 else "cold"
            return f"You are at {self.pos}. It feels {hint}.", 0.0, False, self._info()
        move = 1 if a == "right" else -1
        if self.np_random.random() < 0.2:
            move *= 2
        self.pos = min(max(self.pos + move, 0), self.length - 1)
        if self.pos == self.goal:
            return f"You are at {self.pos}. You found the coin!", 1.0, True, self._info()
        return f"You are at {self.pos}.", 0.0, False, self._info()


class CoinChain(CoinChainReplayOnly):
    """CoinChain with snapshots (fast forks)."""

    def _snapshot(self):
        return (self.goal, self.pos)

    def _restore(self, state) -> None:
        self.goal, self.pos = state


class CoinChainAliasedRestore(CoinChain):
    """A subtly wrong CoinChain: ``_restore`` keeps the snapshot's list instead of copying it.

    The env counts its moves in a list (``look`` reports the count). ``_snapshot``
    copies the list, but ``_restore`` adopts the snapshot's own list, so stepping a
    fork appends to the parent's snapshot, and the next fork at that turn starts with
    moves that never happened. Each fork on its own looks right; only a check of the
    restored state against the state at snapshot time finds it. Not registered with
    the others (so suites over every registered id do not meet it); tests register it.
    """

    def _reset(self, options: dict) -> tuple[str, dict]:
        self.moves: list[str] = []
        return super()._reset(options)

    def _step(self, action: str) -> tuple[str, float, bool, dict]:
        obs, reward, terminated, info = super()._step(action)
        a = action.strip().lower()
        if a in ("left", "right"):
            self.moves.append(a)
        elif a == "look":
            obs += f" You have moved {len(self.moves)} times."
        return obs, reward, terminated, info

    def _snapshot(self):
        return (self.goal, self.pos, list(self.moves))

    def _restore(self, state) -> None:
        self.goal, self.pos, self.moves = state  # the bug: no list(...) copy


def register() -> None:
    twice_envs.register("CoinChain-v0", "tests.toy_envs:CoinChain", description="test env (snapshots)", override=True)
    twice_envs.register(
        "CoinChainReplay-v0", "tests.toy_envs:CoinChainReplayOnly", description="test env (replay forks)", override=True
    )


register()
