"""Write a new replayable env in 30 lines and check it against the contract.

    python examples/custom_env.py
"""

from __future__ import annotations

import twice_envs
from twice_envs import Protocol, TextEnv


class GuessNumber(TextEnv):
    """Guess a number in 1..limit; the env answers 'higher' or 'lower'."""

    version = "1"
    default_max_turns = 10

    def __init__(self, *, limit: int = 20, max_turns: int | None = None) -> None:
        super().__init__(max_turns=max_turns)
        self.limit = limit

    def protocol(self) -> Protocol:
        return Protocol(f"Guess my number between 1 and {self.limit}. Answer with a number.", stop=("\n",))

    def _reset(self, options: dict) -> tuple[str, dict]:
        self.secret = int(self.np_random.integers(1, self.limit + 1))  # env randomness: np_random only
        return self.protocol().instructions, {}

    def _step(self, action: str) -> tuple[str, float, bool, dict]:
        try:
            guess = int(action.strip())
        except ValueError:
            return f"{action.strip()[:30]!r} is not a number.", 0.0, False, {"invalid": True}
        if guess == self.secret:
            return "Correct!", 1.0, True, {}
        return ("higher" if guess < self.secret else "lower"), 0.0, False, {}

    # Optional: plain-data snapshots make forks O(1) instead of a replay.
    def _snapshot(self):
        return self.secret

    def _restore(self, state) -> None:
        self.secret = state


twice_envs.register("GuessNumber-v0", GuessNumber, description="guess a number", override=True)

if __name__ == "__main__":
    env = twice_envs.make("GuessNumber-v0", limit=50)
    obs, info = env.reset(seed=1)
    lo, hi = 1, 50
    while not env.done:  # binary search
        guess = (lo + hi) // 2
        obs, reward, terminated, truncated, info = env.step(str(guess))
        print(f"guess {guess}: {obs}")
        lo, hi = (guess + 1, hi) if obs == "higher" else (lo, guess - 1) if obs == "lower" else (lo, hi)
    branch = env.fork(1)  # the world after the first guess
    print("fork(1) is at turn", branch.turn, "with the same secret:", branch.secret == env.secret)
    report = twice_envs.check_env(env, extra_actions=[str(i) for i in range(1, 51)], subprocess_check=False)
    print(report)
