"""ALFWorld's six task types and their task sentences.

The vocabulary shared by the game collections (:mod:`.games`, which names the task
type of every game and writes the task sentence of a real game that lacks one) and the
game generator (:mod:`.generator`, which draws games of each type). It imports
neither, so both import it.
"""

from __future__ import annotations

import difflib
from typing import Sequence, Union

#: The task types in ALFWorld's order: ALFWorld's task-type id ``i`` (1-6) is ``TASK_TYPES[i - 1]``.
TASK_TYPES: tuple[str, ...] = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)


def resolve_task_types(task_types: Union[None, str, int, Sequence[Union[str, int]]]) -> tuple[str, ...]:
    """Normalise a task-type selection (names, or ALFWorld's ids 1-6) to names in canonical order."""
    if task_types is None:
        return TASK_TYPES
    if isinstance(task_types, (str, int)):
        task_types = [task_types]
    chosen = set()
    for t in task_types:
        if isinstance(t, bool) or not isinstance(t, (str, int)):
            raise ValueError(f"task types are names or ids 1-6, got {t!r}")
        if isinstance(t, int):
            if not 1 <= t <= len(TASK_TYPES):
                raise ValueError(f"unknown ALFWorld task type id {t}: ids are 1-6 ({', '.join(TASK_TYPES)})")
            chosen.add(TASK_TYPES[t - 1])
        elif t in TASK_TYPES:
            chosen.add(t)
        else:
            close = difflib.get_close_matches(t, TASK_TYPES, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"unknown ALFWorld task type {t!r}.{hint} Known: {', '.join(TASK_TYPES)}")
    if not chosen:
        raise ValueError(f"task_types selects no task type; choose from {', '.join(TASK_TYPES)}")
    return tuple(t for t in TASK_TYPES if t in chosen)


# ---------------------------------------------------------------------------- task sentences
#: Sentence templates of each task type; a game uses template ``variant % len(templates)``.
_GOALS = {
    "pick_and_place_simple": ("move {a_obj} to the {recep}", "place {a_obj} in the {recep}"),
    "look_at_obj_in_light": ("look at the {obj} under the light of the {toggle}", "hold {a_obj} and switch on the {toggle}"),
    "pick_clean_then_place_in_recep": ("clean {a_obj} and place it in the {recep}", "put a washed {obj} in the {recep}"),
    "pick_heat_then_place_in_recep": ("heat {a_obj} and place it in the {recep}", "put a warmed {obj} in the {recep}"),
    "pick_cool_then_place_in_recep": ("cool {a_obj} and place it in the {recep}", "put a chilled {obj} in the {recep}"),
    "pick_two_obj_and_place": ("place two {objs} in the {recep}", "move two {objs} to the {recep}"),
}


_IRREGULAR_PLURALS = {"knife": "knives", "cloth": "cloths"}


def _plural(word: str) -> str:
    if word in _IRREGULAR_PLURALS:
        return _IRREGULAR_PLURALS[word]
    return word + ("es" if word.endswith(("s", "sh", "ch", "x", "o")) else "s")


def _with_article(word: str) -> str:
    return ("an " if word[:1] in "aeiou" else "a ") + word


def goal_sentence(task_type: str, obj: str, recep: str, toggle: str = "desklamp", variant: int = 0) -> str:
    """The task sentence of a game (lower-case type names, as ALFWorld shows them)."""
    templates = _GOALS[task_type]
    return templates[variant % len(templates)].format(
        obj=obj, a_obj=_with_article(obj), objs=_plural(obj), recep=recep, toggle=toggle
    )
