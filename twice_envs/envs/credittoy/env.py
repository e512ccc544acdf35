"""CreditToy-v0: the smallest env of the credit lab, with exact values.

Three turns; each turn the agent picks one of four actions ``0 1 2 3``. Action ``a`` at
turn ``t`` scores ``SCORES[t][a]`` points; the episode's utility (its only reward, paid
at the last turn) is 1 when the points reach ``THRESHOLD`` and 0 otherwise. After each
action the env shows *evidence*: a red light for actions 0-1 and a green light for
2-3, so two different actions often get the same observation (same-evidence twins).

Everything is small enough to enumerate, so ``V(s)`` and ``A(s, a)`` are exact for any
policy over the actions (:mod:`twice_envs.agents.lab.toy` holds such a policy).
"""

from __future__ import annotations

from typing import Optional, Sequence

from twice_envs.core import Protocol, TextEnv

TOY_ID = "CreditToy-v0"
NUM_ACTIONS = 4
NUM_TURNS = 3
SCORES = ((0, 2, 1, 0), (1, 0, 2, 0), (0, 1, 0, 2))
THRESHOLD = 3
EVIDENCE = ("red", "red", "green", "green")
#: History entry for an invalid action (a wasted turn that scores nothing).
INVALID = -1


def utility_of(history: Sequence[int]) -> float:
    """1.0 when the actions' points reach ``THRESHOLD``."""
    points = sum(SCORES[t][a] for t, a in enumerate(history) if a != INVALID)
    return 1.0 if points >= THRESHOLD else 0.0


class CreditToyEnv(TextEnv):
    """Three choices of one of four actions; utility 1 for enough points (see the module)."""

    version = "1"
    default_max_turns = NUM_TURNS

    def __init__(self, *, max_turns: Optional[int] = None, render_mode: Optional[str] = None) -> None:
        super().__init__(max_turns=max_turns, render_mode=render_mode)

    def protocol(self) -> Protocol:
        return Protocol(
            instructions=f"Pick an action 0-{NUM_ACTIONS - 1} on each of {NUM_TURNS} turns; collect enough points.",
            stop=("\n",),
            action_format="0 | 1 | 2 | 3",
        )

    def _info(self) -> dict:
        return {"admissible_actions": [str(a) for a in range(NUM_ACTIONS)], "history": list(self.history)}

    def _reset(self, options: dict) -> tuple[str, dict]:
        self.history: list[int] = []
        return self.protocol().instructions, self._info()

    def _step(self, action: str) -> tuple[str, float, bool, dict]:
        text = action.strip()
        invalid = text not in {str(a) for a in range(NUM_ACTIONS)}
        a = INVALID if invalid else int(text)
        self.history.append(a)
        done = len(self.history) >= NUM_TURNS
        reward = utility_of(self.history) if done else 0.0
        info = self._info()
        if invalid:
            info["invalid"] = True
            obs = f"Invalid action {text[:20]!r}: answer with one digit 0-{NUM_ACTIONS - 1}. Turn wasted."
        else:
            obs = f"A {EVIDENCE[a]} light."
        return obs, reward, done, info

    def _snapshot(self):
        return tuple(self.history)

    def _restore(self, state) -> None:
        self.history = list(state)
