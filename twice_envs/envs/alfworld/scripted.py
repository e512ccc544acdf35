"""Scripted ALFWorld agents with a mistake rate, for warm-start transcripts and baselines.

``scripted_turns(env, rng, skill)`` plays an expert's command with probability ``skill``
and a random admissible command otherwise, so transcripts mix good and bad decisions and
their outcomes vary. The expert is the engine's planner (optimal, but it knows where every
object is) or, in a share ``handcoded`` of the episodes, ALFWorld's hand-coded expert
(which searches receptacles one by one, as an agent that sees only the text must), or, with
``searcher=True``, the :class:`WindowSearcher`, whose every command follows from what a
one-turn window shows. With
``tagged=True`` the command is written in the env's turn format (``<action>...</action>``),
as a model imitating it should write it; with ``notes=True`` a short note of what the agent is
after comes first (``<think>find apple</think><action>go to fridge 1</action>``: the env reads
only the action).

``renumbered_copies`` (the transcript augmenter of ``twice models build-tiny``) writes copies
of such episodes with the instance numbers of receptacles and objects permuted.
"""

from __future__ import annotations

import re
from typing import Any, Optional

import numpy as np

from twice_envs.envs.alfworld.env import parse_action
from twice_envs.envs.alfworld.expert import ALFWorldExpert, HandcodedExpert, as_turn
from twice_envs.envs.mistakes import Mistake, marked_like

#: One expert of each kind per process: each keeps its own engine and follows each env's history.
_EXPERTS: dict[str, object] = {}
#: The expert kind of each env's current episode, by ``id(env)`` (drawn at turn 0).
_EPISODE_EXPERT: dict[int, str] = {}


def scripted_turns(env, rng: np.random.Generator, skill: float = 1.0, tagged: bool = False,
                   handcoded: float = 0.0, notes: bool = False, searcher: bool = False) -> str:
    """An expert's command with probability ``skill``, else a random admissible one (marked as a
    :class:`~twice_envs.envs.mistakes.Mistake`); the expert
    of an episode is the hand-coded one with probability ``handcoded`` (drawn at its first turn),
    else the planner. With ``notes`` (implies ``tagged``) the command follows a short note of
    what the agent is after (:func:`task_note`), ``<think>find apple</think><action>...</action>``.
    ``searcher=True`` plays every episode with the :class:`WindowSearcher` instead."""
    if env.turn == 0 or id(env) not in _EPISODE_EXPERT:
        _EPISODE_EXPERT[id(env)] = "searcher" if searcher else "handcoded" if handcoded > 0 and rng.random() < handcoded else "planner"
    command = _command(env, rng, skill, _EPISODE_EXPERT[id(env)])
    text = as_turn(command) if tagged or notes else command
    if notes:
        note = _expert("searcher").note(env, command) if searcher else task_note(env)
        text = f"<think>{note}</think>{text}"
    return Mistake(text) if isinstance(command, Mistake) else text


def type_names(env=None) -> list[str]:
    """The object and receptacle type names of the game generator's rooms, lowercase and after a
    space as the observations write them (``" apple"``, ``" countertop"``): whole tokens of a tiny
    model, so that a name reads as one token in the task, the observation and the command. The
    space keeps a name from matching inside a word (``" pen"`` not in ``"open"``); a longer word
    that starts with a name (``" apples"``) still starts with its token. ``env`` is unused: every
    game of the generator draws its names from these."""
    from twice_envs.envs.alfworld.generator import LAYOUTS, OBJECTS, ROOM_KINDS

    types = set(OBJECTS) | {r for layout in LAYOUTS.values() for r, _ in layout.receptacles}
    types |= {r for receptacles, _ in ROOM_KINDS.values() for r in receptacles}
    return sorted(" " + t.lower() for t in types)


def task_note(env) -> str:
    """What the agent is after, read from what it has seen: ``find <object>`` until it holds the
    task's object, then ``<object> to <target>`` (the receptacle, or the lamp of a look-at task).

    Everything in it is in the agent's context (the task sentence names the object and the target,
    and the engine says when the agent picks an object up or puts it down), so a model imitating
    such notes can write them itself; they put the object's name right before the command that
    must name it.
    """
    base = getattr(env, "unwrapped", env)
    obj, target, lamp = _task_names(base.game.pddl_params if base.game is not None else {})
    target = target or lamp
    if not obj:
        return "explore"
    holding = False
    for text in base.trajectory.observations[1:]:
        if re.match(rf"You pick up the {re.escape(obj)} \d+", text):
            holding = True
        elif re.match(rf"You (?:move|put) the {re.escape(obj)} \d+", text):
            holding = False
    return f"{obj} to {target}" if holding and target else f"find {obj}"


def _task_names(params: dict) -> tuple[str, str, str]:
    """The task's object type, target receptacle type and lamp type, as the text writes them."""
    return tuple(str(params.get(k) or "").lower() for k in ("object_target", "parent_target", "toggle_target"))


def _held(actions: list) -> Optional[str]:
    """The object the agent holds (``mug 2``), read from the ``move ... to ...`` commands it is offered."""
    return next((m.group(1) for a in actions if (m := re.match(r"move ([a-z]+ \d+) to ", a))), None)


#: Where the three transforming tasks transform the object (the receptacle type named by their verb).
_TOOLS = {"pick_clean_then_place_in_recep": ("clean", "sinkbasin"),
          "pick_heat_then_place_in_recep": ("heat", "microwave"),
          "pick_cool_then_place_in_recep": ("cool", "fridge")}
#: The room description of the first observation ("... you see a cabinet 2, a cabinet 1, and a sofa 1.").
_ROOM = re.compile(r"you see (.*?)\.(?:\n|$)")
#: The receptacles it names, in its order.
_NAMED = re.compile(r"\b(?:a|an) ([a-z]+ \d+)")


class WindowSearcher:
    """A text-only expert whose every command is a function of what a one-turn window shows: the
    task, the room description of the first observation, its own last command and the observation
    that answered it (which ends with the admissible commands).

    It searches the receptacles in the order the room description lists them (from the one it
    stands at to the next, cyclically), opens what is closed, takes an object of the task's type
    that does not already lie in a target receptacle, transforms it at the first sink basin,
    microwave or fridge the list names, carries it to the first target receptacle and puts it
    there (a look-at task instead searches on for the lamp and switches it on). Holding something
    else, it puts it down where it stands. Because it keeps no memory beyond the window, a model
    with a one-turn window can imitate it exactly, which ALFWorld's hand-coded expert (which
    remembers where it has been) does not allow.
    """

    def act(self, env: Any) -> str:
        """The searcher's next command for ``env`` (an ALFWorld env or a wrapper of one)."""
        base = getattr(env, "unwrapped", env)
        if base.game is None:
            raise TypeError("the searcher needs an ALFWorld env after reset()")
        task = base.game.task_type
        obj, target, lamp = _task_names(base.game.pddl_params)
        actions = list(base.last_info.get("admissible_actions") or [])
        last = parse_action(base.trajectory.actions[-1]) if base.trajectory.actions else ""
        described = _ROOM.search(base.trajectory.observations[0])
        room = _NAMED.findall(described.group(1)) if described else []

        def first(prefix: str) -> Optional[str]:
            return next((a for a in actions if a.startswith(prefix)), None)

        def go_next() -> str:
            reachable = {a[len("go to "):] for a in actions if a.startswith("go to ")}
            here = next((r for r in room if r not in reachable), None)
            start = room.index(here) + 1 if here is not None else 0
            for r in room[start:] + room[:start]:
                if r in reachable:
                    return f"go to {r}"
            return "look"

        held = _held(actions)
        if held is not None:
            if held.split()[0] != obj:
                return first(f"move {held} to ") or go_next()
            if task == "look_at_obj_in_light":
                return first(f"use {lamp} ") or go_next()
            verb, tool = _TOOLS.get(task, (None, None))
            if verb and not last.startswith(f"{verb} ") and not last.startswith(f"go to {target} "):
                return first(f"{verb} {held} with ") or self._go_first(room, actions, tool) or go_next()
            if last.startswith(f"go to {target} ") or (not verb and first(f"move {held} to {target} ")):
                return first(f"open {target} ") or first(f"move {held} to {target} ") or go_next()
            return self._go_first(room, actions, target) or go_next()
        take = next((a for a in actions if re.match(rf"take {obj} \d+ from (?!{target} )", a)), None)
        if task == "look_at_obj_in_light" and take is None and first(f"use {lamp} "):
            return go_next()
        return take or first("open ") or go_next()

    def note(self, env: Any, command: str) -> str:
        """What the searcher is after, as a note before ``command``: the task's object type
        (``mug``), with the instance it takes when ``command`` takes one (``mug 2``), or where the
        object it holds goes (``mug to shelf``). The instance comes right after the name, as the
        observation writes it, so a model writes the number only where the observation shows one."""
        base = getattr(env, "unwrapped", env)
        obj, target, lamp = _task_names(base.game.pddl_params)
        held = _held(list(base.last_info.get("admissible_actions") or []))
        if held is not None and held.split()[0] == obj:
            return f"{obj} to {target or lamp}"
        taken = re.match(rf"take ({obj} \d+) from ", str(command))
        return taken.group(1) if taken else obj

    @staticmethod
    def _go_first(room: list, actions: list, kind: str) -> Optional[str]:
        return next((f"go to {r}" for r in room if r.startswith(kind + " ") and f"go to {r}" in actions), None)


def _expert(kind: str):
    if kind not in _EXPERTS:
        _EXPERTS[kind] = {"handcoded": HandcodedExpert, "searcher": WindowSearcher}.get(kind, lambda: ALFWorldExpert(timeout_s=5.0))()
    return _EXPERTS[kind]


def _command(env, rng: np.random.Generator, skill: float, kind: str = "planner") -> str:
    actions = list(env.last_info.get("admissible_actions") or [])
    if actions and rng.random() >= skill:
        return Mistake(actions[int(rng.integers(len(actions)))])
    try:
        return _expert(kind).act(env)
    except Exception:  # planner timeout, no plan, or the hand-coded expert gave up: a random command
        return Mistake(actions[int(rng.integers(len(actions)))] if actions else "look")


#: An entity as ALFWorld writes it: a lowercase name and its instance number ("cabinet 3").
_ENTITY = re.compile(r"\b([a-z]+) (\d+)\b")
_ADMISSIBLE = re.compile(r"(Admissible actions: )(.*)\.$", re.S)


def renumbered_copies(env: Any, episodes: list, copies: int, rng: np.random.Generator, extra: int = 3) -> list:
    """``copies`` variants of each scripted episode ``(first_obs, [(action, obs), ...])`` in which the
    instance numbers of the receptacles and objects are permuted: within an episode, each name's
    numbers map one to one onto numbers drawn from 1 to its largest number plus ``extra``
    ("cabinet 1, 2, 3" may become "cabinet 5, 1, 4"), and admissible-command lists are sorted again.

    The play stays right (each command still names what it named, under its new number), but a
    room's receptacles no longer carry the same names in every transcript: a model trained on
    them must copy the names from the observation instead of recalling those of the training
    rooms. (The engine numbers a room's instances from 1; the copies do not, on purpose.)
    """
    del env
    out = []
    for first_obs, turns in episodes:
        texts = [first_obs] + [t for pair in turns for t in pair]
        numbers: dict[str, set] = {}
        for text in texts:
            for name, num in _ENTITY.findall(text):
                numbers.setdefault(name, set()).add(int(num))
        for _ in range(copies):
            table = {}
            for name in sorted(numbers):
                used = sorted(numbers[name])
                drawn = rng.choice(np.arange(1, used[-1] + extra + 1), size=len(used), replace=False)
                table.update({(name, n): int(m) for n, m in zip(used, drawn)})

            def rename(text: str) -> str:
                text = _ENTITY.sub(lambda m: f"{m[1]} {table[(m[1], int(m[2]))]}", text)
                return _ADMISSIBLE.sub(lambda m: m[1] + ", ".join(sorted(m[2].split(", "))) + ".", text)

            out.append((rename(first_obs), [(marked_like(a, rename(a)), rename(o)) for a, o in turns]))
    return out
