"""ALFWorld task types and task sentences, and the import order of the ALFWorld modules.

Runs without the ``alfworld`` extra: the task vocabulary and the module graph are pure Python.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from twice_envs.envs.alfworld import tasks
from twice_envs.envs.alfworld.tasks import TASK_TYPES, goal_sentence, resolve_task_types

PACKAGE = "twice_envs.envs.alfworld"
FOLDER = Path(tasks.__file__).resolve().parent


@pytest.mark.parametrize("args,sentence", [
    (("pick_and_place_simple", "apple", "countertop"), "move an apple to the countertop"),
    (("pick_and_place_simple", "egg", "fridge", "desklamp", 1), "place an egg in the fridge"),
    (("look_at_obj_in_light", "book", "desk", "floorlamp"), "look at the book under the light of the floorlamp"),
    (("pick_two_obj_and_place", "knife", "drawer"), "place two knives in the drawer"),
    (("pick_two_obj_and_place", "box", "shelf", "desklamp", 3), "move two boxes to the shelf"),
    (("pick_cool_then_place_in_recep", "potato", "diningtable", "desklamp", 1), "put a chilled potato in the diningtable"),
])
def test_goal_sentences(args, sentence):
    assert goal_sentence(*args) == sentence


def test_every_task_type_has_sentences():
    for task_type in TASK_TYPES:
        assert goal_sentence(task_type, "apple", "fridge") != goal_sentence(task_type, "apple", "fridge", variant=1)


def test_resolve_task_types():
    assert resolve_task_types(None) == TASK_TYPES
    assert resolve_task_types([6, "pick_and_place_simple", 1]) == ("pick_and_place_simple", "pick_two_obj_and_place")
    assert resolve_task_types("look_at_obj_in_light") == ("look_at_obj_in_light",)
    with pytest.raises(ValueError, match="Did you mean 'pick_and_place_simple'"):
        resolve_task_types("pick_and_place_simpel")
    for bad in (0, 7, True, [], [1.0], ["nothing"]):
        with pytest.raises(ValueError):
            resolve_task_types(bad)


def test_names_stay_importable_where_callers_import_them():
    from twice_envs.envs.alfworld import games, generator

    assert games.TASK_TYPES is generator.TASK_TYPES is TASK_TYPES
    assert games.resolve_task_types is resolve_task_types
    assert generator.goal_sentence is goal_sentence


def _alfworld_imports(path: Path) -> set[str]:
    """The modules of this package that ``path`` imports, anywhere in the file (functions too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([PACKAGE, *([base] if base else [])])
            if base == PACKAGE:
                found |= {a.name for a in node.names if (FOLDER / f"{a.name}.py").is_file()}
            elif base.startswith(PACKAGE + "."):
                found.add(base[len(PACKAGE) + 1 :].split(".")[0])
        elif isinstance(node, ast.Import):
            found |= {a.name[len(PACKAGE) + 1 :].split(".")[0] for a in node.names if a.name.startswith(PACKAGE + ".")}
    return found - {path.stem}


def test_module_imports_point_one_way():
    """No import circle among the ALFWorld modules, not even through an import inside a function."""
    graph = {p.stem: _alfworld_imports(p) for p in sorted(FOLDER.glob("*.py")) if p.stem != "__init__"}
    assert graph["tasks"] == set()
    assert "generator" not in graph["games"] and {"tasks", "games"} <= graph["generator"]
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import circle: {' -> '.join(path + (module,))}"
        if module in done:
            return
        for dep in sorted(graph.get(module, ())):
            visit(dep, path + (module,))
        done.add(module)

    for module in graph:
        visit(module, ())
