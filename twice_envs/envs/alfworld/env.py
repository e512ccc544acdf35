"""ALFWorld-v0: household tasks in ALFWorld's real text engine, seeded and forkable.

    env = twice_envs.make("ALFWorld-v0")                       # bundled games
    env = twice_envs.make("ALFWorld-v0", data_dir="$ALFWORLD_DATA", split="valid_seen")
    obs, info = env.reset(seed=3)                              # or options={"index": 5} / {"game": name}
    obs, reward, terminated, truncated, info = env.step("<action>go to fridge 1</action>")

Observations are the engine's own text (the first one ends with the task sentence);
``info["admissible_actions"]`` lists the commands that do something (sorted),
``info["won"]`` says whether the goal holds. The reward is ``reward_scale`` on the
winning step and 0 otherwise. A command that is not admissible changes nothing: the
engine answers "Nothing happens." and ``info["invalid"]`` is True.

The engine's state is native and cannot be copied, so forks replay the actions; the
loaded games and idle engines are pooled per process (see ``engine.py``), so a fork
only resets an engine and re-applies the actions.
"""

from __future__ import annotations

import difflib
import re
import weakref
from typing import Optional, Sequence, Union

from twice_envs.core import Protocol, TextEnv
from twice_envs.errors import DataFormatError, TwiceError
from twice_envs.envs.admissible import with_actions
from twice_envs.envs.alfworld import engine as _engine
from twice_envs.envs.alfworld.games import GameEntry, check_data_dir, list_games, load_game
from twice_envs.envs.alfworld.tasks import resolve_task_types

INSTRUCTIONS = (
    "You are in a household. Complete the task given at the end of the first observation by typing "
    "one text command per turn inside <action>...</action>, e.g. <action>go to countertop 1</action>. "
    "Commands: look, inventory, go to (receptacle), open (receptacle), close (receptacle), "
    "take (object) from (receptacle), move (object) to (receptacle), examine (something), use (object), "
    "heat (object) with (receptacle), clean (object) with (receptacle), cool (object) with (receptacle). "
    "A command that does not apply gets \"Nothing happens.\""
)

_ACTION_TAG = re.compile(r"<action>(.*?)(?:</action>|$)", re.IGNORECASE | re.DOTALL)
_SPACES = re.compile(r"\s+")
#: Longest command passed on (admissible commands are far shorter).
MAX_COMMAND_CHARS = 300
_OPTIONS = ("index", "game")


def parse_action(turn: str) -> str:
    """The command in a model's turn: the first ``<action>`` tag's text, else the whole turn.

    Lower-cased, whitespace collapsed, a trailing period dropped (the engine's
    commands are lower-case words separated by single spaces).
    """
    match = _ACTION_TAG.search(turn)
    text = match.group(1) if match else turn
    text = _SPACES.sub(" ", text[: MAX_COMMAND_CHARS * 4]).strip().lower().rstrip(".").strip()
    return text[:MAX_COMMAND_CHARS]


def _release(holder: list) -> None:
    engine = holder[0]
    holder[0] = None
    _engine.POOL.release(engine)


class ALFWorldEnv(TextEnv):
    """The ALFWorld text env over a sorted collection of games (see the module docstring).

    Args:
        data_dir: None for the bundled games; else a folder of real ALFWorld data
            (``"$ALFWORLD_DATA"`` is expanded from the environment). An empty string is
            refused (``ValueError``), never read as the current folder.
        split: ``train``, ``valid_seen`` or ``valid_unseen``.
        task_types: task-type names or ALFWorld ids 1-6 (None: all six).
        reward_scale: reward of the winning step (e.g. 10 as some trainers use).
        max_turns: turns before truncation (default 50).
        show_admissible: end every observation with the admissible commands
            ("Admissible actions: ..."), so an agent reads them from its context (the
            tiny game models do); False keeps the engine's own text.
        show_task: repeat the task sentence ("Your task is to: ...") in every observation after
            the first (before the admissible commands), so the task stays next to the decision
            however long the episode; False: only the first observation holds it, as in ALFWorld.
    """

    version = "1"
    default_max_turns = 50
    reset_options = _OPTIONS

    def __init__(
        self,
        *,
        data_dir: Optional[str] = None,
        split: str = "train",
        task_types: Union[None, str, int, Sequence[Union[str, int]]] = None,
        reward_scale: float = 1.0,
        max_turns: Optional[int] = None,
        show_admissible: bool = False,
        show_task: bool = False,
        render_mode: Optional[str] = None,
    ) -> None:
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        data_dir = check_data_dir(data_dir)  # "" would name the current folder: refused
        if isinstance(reward_scale, bool) or not isinstance(reward_scale, (int, float)) or not reward_scale > 0:
            raise ValueError(f"reward_scale must be a positive number, got {reward_scale!r}")
        self.reward_scale = float(reward_scale)
        for name, flag in (("show_admissible", show_admissible), ("show_task", show_task)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name} must be True or False, got {flag!r}")
        self.show_admissible = show_admissible
        self.show_task = show_task
        self.split = split
        self.task_types = resolve_task_types(task_types)
        # Listing first: importing alfworld sets $ALFWORLD_DATA to a default when it is unset.
        self._entries: list[GameEntry] = list_games(data_dir, split, self.task_types)
        _engine._modules()  # the missing-extra error comes here, at make time
        self._names = {e.name: i for i, e in enumerate(self._entries)}
        self._holder: list = [None]
        self._finalizer = weakref.finalize(self, _release, self._holder)
        self.game = None

    # ------------------------------------------------------------------ identity
    @property
    def games(self) -> list[str]:
        """Names of the games, in the sorted order ``options={"index": i}`` refers to."""
        return [e.name for e in self._entries]

    @property
    def engine(self) -> "_engine.Engine":
        """The engine this env is playing on (after reset)."""
        if self._holder[0] is None:
            raise RuntimeError("no game loaded: call reset() first")
        return self._holder[0]

    def protocol(self) -> Protocol:
        return Protocol(instructions=INSTRUCTIONS, stop=("</action>",), action_format="<action>COMMAND</action>")

    # ------------------------------------------------------------------ episode
    def _choose(self, options: dict) -> int:
        if "index" in options and "game" in options:
            raise ValueError("give either options['index'] or options['game'], not both")
        if "game" in options:
            name = options["game"]
            if name not in self._names:
                close = difflib.get_close_matches(str(name), list(self._names), n=3)
                hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
                raise ValueError(f"no game {name!r} in this collection ({len(self._entries)} games).{hint} See env.games")
            return self._names[name]
        if "index" in options:
            index = options["index"]
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(self._entries):
                raise ValueError(f"options['index'] must be an int in 0..{len(self._entries) - 1}, got {index!r}")
            return index
        return int(self.np_random.integers(len(self._entries)))

    def measures(self, info: dict, total_reward: float) -> dict[str, float]:
        """Success: the goal holds at the end."""
        return {"success": float(bool(info.get("won", False)))}

    def _reset(self, options: dict) -> tuple[str, dict]:
        entry = self._entries[self._choose(options)]
        game = load_game(entry)
        held = self._holder[0]
        try:
            if held is None or held.key != game.key:
                self._holder[0] = None
                _engine.POOL.release(held)
                self._holder[0] = _engine.POOL.acquire(game)
            engine = self._holder[0]
            obs = engine.reset()
        except (TwiceError, ImportError):
            raise
        except Exception as exc:  # the engine's parsers raise their own types on bad PDDL or grammar
            self._holder[0] = None  # a half-loaded engine is not given back to the pool
            raise DataFormatError(
                entry.path, None, f"the engine cannot load this game ({type(exc).__name__}: {str(exc)[:300]})"
            ) from exc
        self.game = game
        info = self._info(engine)
        info.update(game=game.name, task_type=game.task_type, goal=game.goal)
        return self._shown(obs, info, first=True), info

    def _info(self, engine: "_engine.Engine") -> dict:
        return {"admissible_actions": list(engine.admissible), "won": engine.won}

    def _step(self, action: str) -> tuple[str, float, bool, dict]:
        engine = self.engine
        command = parse_action(action)
        if command in engine.admissible:
            obs = engine.step(command)
            invalid = False
        else:
            # What the engine answers to any command it does not know, without a round trip.
            obs = _engine.NOTHING_HAPPENS
            invalid = True
        info = self._info(engine)
        info["command"] = command
        info["invalid"] = invalid
        won = engine.won
        return self._shown(obs, info), (self.reward_scale if won else 0.0), won, info

    def _shown(self, obs: str, info: dict, first: bool = False) -> str:
        """The observation as the agent sees it (with the task and the admissible commands when asked)."""
        if self.show_task and not first:
            obs = f"{obs}\n\nYour task is to: {self.game.goal}."
        if not self.show_admissible:
            return obs
        return with_actions(obs, info["admissible_actions"])

    def close(self) -> None:
        """Give the engine back to the process pool and drop the game: a closed env holds
        no engine (the record stays readable).

        The pool keeps a few idle engines (``engine.MAX_IDLE_ENGINES``) for the next env or
        fork of the same game; the planner library copies they hold are never unloaded
        (see ``engine.py``).
        """
        holder = self.__dict__.get("_holder")
        if holder is not None:
            _release(holder)
        self.game = None
        super().close()
