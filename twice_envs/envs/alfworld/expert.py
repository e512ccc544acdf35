"""ALFWorld's experts as scripted agents: the engine's planner, and ALFWorld's hand-coded expert.

:class:`ALFWorldExpert` (the planner, fast downward on ALFWorld's PDDL) is optimal and
solves every bundled game; :class:`HandcodedExpert` drives ``alfworld``'s own
``HandCodedTWAgent`` (the heuristic expert ALFWorld's DAgger training imitates), which
explores like a person would and does not always succeed.

    expert = ALFWorldExpert(timeout_s=20)
    obs, info = env.reset(seed=0)
    while not done:
        obs, reward, terminated, truncated, info = env.step(expert.act(env))

The expert keeps its own engine (never the env's), follows the env's history, and
plans from the current state: it replans only when the history leaves its plan. The
planner runs native code that cannot be interrupted, so each plan is bounded by
``timeout_s``; past it :class:`~twice_envs.envs.alfworld.engine.PlannerTimeout` is
raised and the stuck engine is abandoned, so a hanging planner never hangs the env.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from twice_envs.errors import TwiceError
from twice_envs.envs.alfworld import engine as _engine
from twice_envs.envs.alfworld.env import ALFWorldEnv, parse_action


def as_turn(command: str) -> str:
    """A command in the env's turn format (what a model imitating the expert should write)."""
    return f"<action>{command}</action>"


class ExpertError(TwiceError):
    """The expert cannot act (no plan from this state, or not an ALFWorld env)."""


class ALFWorldExpert:
    """Next command from the engine's planner for the state of an ALFWorld env.

    Args:
        timeout_s: wall-clock limit of one planner call.
    """

    def __init__(self, timeout_s: float = 20.0) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
        self.timeout_s = float(timeout_s)
        self._engine: Optional[_engine.Engine] = None
        self._history: list[str] = []
        self._plan: list[str] = []
        self.plans_made = 0

    def _base(self, env: Any) -> ALFWorldEnv:
        base = getattr(env, "unwrapped", env)
        if not isinstance(base, ALFWorldEnv) or base.game is None:
            raise ExpertError("the ALFWorld expert needs an ALFWorld env after reset()")
        return base

    def _sync(self, base: ALFWorldEnv) -> None:
        """Bring the expert's engine to the env's state (incrementally when the env moved on)."""
        game = base.game
        history = [parse_action(a) for a in base.trajectory.actions]
        fresh = self._engine is None or self._engine.key != game.key or history[: len(self._history)] != self._history
        if fresh:
            self.close()
            self._engine = _engine.POOL.acquire(game)
            self._engine.reset()
            self._history, self._plan = [], []
        engine = self._engine
        for command in history[len(self._history) :]:
            if self._plan and command == self._plan[0]:
                self._plan.pop(0)
            else:
                self._plan = []
            if command in engine.admissible:
                engine.step(command)
            self._history.append(command)

    def act(self, env: Any) -> str:
        """The planner's next command for ``env`` (an ALFWorld env or a wrapper of one)."""
        base = self._base(env)
        self._sync(base)
        engine = self._engine
        if engine.won:
            raise ExpertError(f"the goal of {base.game.name} already holds; there is nothing left to do")
        if not self._plan or self._plan[0] not in engine.admissible:
            try:
                self._plan = engine.plan(self.timeout_s)
            except _engine.PlannerTimeout:
                self._engine = None  # abandoned with its thread; never reused
                self._history, self._plan = [], []
                raise
            self.plans_made += 1
        if not self._plan:
            raise ExpertError(f"the planner found no plan from this state of {base.game.name}")
        return self._plan[0]

    def close(self) -> None:
        """Give the expert's engine back to the pool."""
        engine, self._engine = self._engine, None
        _engine.POOL.release(engine)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 -- interpreter shutdown
            pass


class HandcodedExpert:
    """ALFWorld's hand-coded expert (``alfworld.agents.expert.HandCodedTWAgent``) on its own engine.

    It watches every step of the env (as ALFWorld's expert wrapper does) and suggests
    the next command; a suggestion that is not admissible becomes "look", as in
    ALFWorld. Its random tie-breaks draw from a generator seeded with ``seed`` and the
    env's reset seed, so it is deterministic.

    Args:
        seed: seed of its tie-breaks.
        max_steps: steps after which ALFWorld's expert gives up (raises ExpertError).
    """

    def __init__(self, seed: int = 0, max_steps: int = 200) -> None:
        self.seed = int(seed)
        self.max_steps = int(max_steps)
        self._engine: Optional[_engine.Engine] = None
        self._agent: Any = None
        self._episode: Optional[tuple] = None
        self._history: list[str] = []
        self._next = "look"
        self._rng: Any = None

    def _traj_file(self, game: Any) -> str:
        """A folder holding the ``traj_data.json`` ALFWorld's expert reads its task from."""
        import json
        import os

        from twice_envs._cache import cache_dir, discard
        from twice_envs.trajectory import atomic_write_text

        if game.path and os.path.isfile(os.path.join(os.path.dirname(game.path), "traj_data.json")):
            return game.path
        params = dict(game.pddl_params)
        if not params:
            raise ExpertError(f"game {game.name} has no ALFWorld task parameters (pddl_params) for the hand-coded expert")
        folder = cache_dir("alfworld", "traj", game.key[:24])
        target = folder / "traj_data.json"
        text = json.dumps({"task_type": game.task_type, "pddl_params": params})
        if not (target.is_file() and target.read_bytes() == text.encode()):  # checked in full: a few hundred bytes
            if os.path.lexists(target) and not target.is_file():
                discard(target)
            atomic_write_text(target, text)
        return str(folder / "game.tw-pddl")

    def _call(self, fn: Callable[[], Any]) -> Any:
        """Run the agent with its module's ``random`` bound to our seeded generator."""
        from alfworld.agents.expert import handcoded_expert

        saved = handcoded_expert.random
        handcoded_expert.random = self._rng
        try:
            return fn()
        finally:
            handcoded_expert.random = saved

    def _restart(self, base: ALFWorldEnv) -> None:
        import random

        from alfworld.agents.expert import HandCodedTWAgent

        game = base.game
        if self._engine is None:
            self._engine = _engine.Engine(facts=True)
        if self._engine.key != game.key:
            self._engine.load(game)
        self._engine.reset()
        self._rng = random.Random(f"{self.seed}/{base.trajectory.seed}/{game.key}")
        self._agent = HandCodedTWAgent(max_steps=self.max_steps)
        self._agent.reset(self._traj_file(game))
        self._call(lambda: self._agent.observe(self._engine.state["feedback"]))
        self._history, self._next = [], "look"
        self._episode = (game.key, base.trajectory.seed, base.trajectory.digests[0])

    def act(self, env: Any) -> str:
        """ALFWorld's hand-coded expert's next command for ``env``."""
        from alfworld.agents.expert import HandCodedAgentFailed, HandCodedAgentTimeout

        base = ALFWorldExpert._base(self, env)  # type: ignore[arg-type]
        history = [parse_action(a) for a in base.trajectory.actions]
        episode = (base.game.key, base.trajectory.seed, base.trajectory.digests[0])
        if self._episode != episode or history[: len(self._history)] != self._history:
            self._restart(base)
        engine = self._engine
        for command in history[len(self._history) :]:
            engine.step(command)
            state = engine.state
            try:
                suggestion = self._call(lambda: self._agent.act(state, 0, state["won"], command))
            except (HandCodedAgentTimeout, HandCodedAgentFailed) as exc:
                raise ExpertError(f"ALFWorld's hand-coded expert gave up on {base.game.name} ({type(exc).__name__})") from None
            self._next = suggestion if suggestion in engine.admissible else "look"
            self._history.append(command)
        return self._next


def solve(env: Any, *, seed: int = 0, options: Optional[dict] = None, expert: Any = None) -> bool:
    """Reset ``env`` and play ``expert`` (default: the planner) until the episode ends; returns whether it won."""
    expert = expert or ALFWorldExpert()
    _, info = env.reset(seed=seed, options=options)
    while True:
        _, _, terminated, truncated, info = env.step(expert.act(env))
        if terminated or truncated:
            return bool(info.get("won"))
