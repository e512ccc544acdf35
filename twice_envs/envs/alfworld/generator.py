"""Generate small, genuine ALFWorld games for all six task types.

Each game is a PDDL problem over ALFWorld's own domain (``alfred.pddl``): receptacles
and objects named by the ALFRED convention (``Apple|+00.47|+01.15|-00.48`` mangled to
``Apple_bar__plus_00_dot_47_...``, which ALFWorld's demangler shows as "apple 1"), a
room layout, and a goal of the task type. The walkthrough is found by the engine's
own planner and verified by playing it in the engine; a game is kept only when the
goal does not hold at the start and the walkthrough wins.

Run ``python -m twice_envs.envs.alfworld.generator [--out DIR]`` to rewrite the
bundled set (deterministic: the same code writes the same files), or
``--split train --count N`` to write ``N`` games per task type and layout of one split
(a training set of any size: ``make("ALFWorld-v0", data_dir=DIR)`` plays it), and
``--rooms R`` to add ``R`` randomly drawn rooms of each kind (kitchen, bathroom, bedroom,
living room) to the train split. Games of the ``valid_unseen`` split are laid out in rooms no
other split uses: drawn rooms equal to one of them are drawn again. The object kinds, the room
layouts and the drawn rooms live in :mod:`.world_facts`.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from twice_envs._cache import MANIFEST, cache_dir, cached, read_manifest, write_manifest
from twice_envs.errors import DataFormatError
from twice_envs.keys import stable_seed
from twice_envs.envs.alfworld.engine import POOL, GameData
from twice_envs.envs.alfworld.games import BUNDLED_DIR, BUNDLED_FORMAT, alfworld_data_file, grammar_with_goal
from twice_envs.envs.alfworld.tasks import TASK_TYPES, goal_sentence

# Re-exported: callers import the world facts and rooms from here as well.
from twice_envs.envs.alfworld.world_facts import (  # noqa: F401
    BASINS,
    LAYOUTS,
    OBJECTS,
    OPENABLE,
    ROOM_KINDS,
    TASK_LAYOUTS,
    _STATE_CHANGE,
    Layout,
    ObjectKind,
    _targets,
    drawn_layout,
    drawn_rooms,
    layout_named,
    playable,
)

#: Games per (task type, layout) in each split.
SPLIT_COUNTS = {"train": 2, "valid_seen": 1, "valid_unseen": 1}
#: What the manifest of a cached collection of generated games (:func:`generated_collection`) names.
COLLECTION_FORMAT = "alfworld.generated/1"


# ---------------------------------------------------------------------------- naming
def mangle(text: str) -> str:
    """ALFRED id -> PDDL name (the convention ALFWorld's demangler reverses)."""
    for a, b in (("-", "_minus_"), ("|", "_bar_"), ("+", "_plus_"), (".", "_dot_"), (",", "_comma_")):
        text = text.replace(a, b)
    return text


def _object_id(kind: str, xyz: tuple[float, float, float]) -> str:
    coords = "|".join(f"{v:+06.2f}" for v in xyz)
    if kind in BASINS:
        return mangle(f"{BASINS[kind]}|{coords}|{kind}")
    return mangle(f"{kind}|{coords}")


def _location_id(cells: tuple[int, int, int, int]) -> str:
    return mangle("loc|" + "|".join(str(c) for c in cells))


# ---------------------------------------------------------------------------- problems
@dataclass
class _World:
    layout: Layout
    receptacles: list[tuple[str, str, str]]  # (id, type, location id)
    objects: list[tuple[str, str, str]]  # (id, type, receptacle id)
    start: str


def _coords(rng: np.random.Generator, used: set) -> tuple[float, float, float]:
    while True:
        xyz = tuple(round(float(v), 2) for v in rng.uniform(-3.5, 3.5, size=3))
        if xyz not in used:
            used.add(xyz)
            return xyz  # type: ignore[return-value]


def _build_world(layout: Layout, rng: np.random.Generator, placements: list[tuple[str, Optional[str]]]) -> _World:
    """Receptacles of the layout at fresh coordinates; ``placements`` are (object type, receptacle type or None)."""
    used: set = set()
    cells: set = set()
    receps = []
    for rtype, count in layout.receptacles:
        for _ in range(count):
            while True:
                cell = (int(rng.integers(-8, 9)), int(rng.integers(-8, 9)), int(rng.integers(0, 4)), int(rng.choice([0, 30, 60])))
                if cell not in cells and cell[:2] != (0, 0):
                    cells.add(cell)
                    break
            receps.append((_object_id(rtype, _coords(rng, used)), rtype, _location_id(cell)))
    objects = []
    for otype, where in placements:
        allowed = [r for r in receps if r[1] in OBJECTS[otype].receptacles]
        if where is not None:
            allowed = [r for r in allowed if r[1] == where]
        if not allowed:
            raise ValueError(f"no receptacle in {layout.name} can hold {otype}")
        recep = allowed[int(rng.integers(len(allowed)))]
        objects.append((_object_id(otype, _coords(rng, used)), otype, recep[0]))
    return _World(layout, receps, objects, _location_id((0, 0, 0, 30)))


def _goal_pddl(task_type: str, obj: str, recep: str, toggle: str) -> str:
    if task_type == "pick_and_place_simple":
        body = f"(inReceptacle ?o ?r) (objectType ?o {obj}Type) (receptacleType ?r {recep}Type)"
        return f"(:goal (exists (?r - receptacle) (exists (?o - object) (and {body}))))"
    if task_type in _STATE_CHANGE:
        able, pred, _ = _STATE_CHANGE[task_type]
        body = f"({able} ?o) ({pred} ?o) (inReceptacle ?o ?r) (objectType ?o {obj}Type) (receptacleType ?r {recep}Type)"
        return f"(:goal (exists (?r - receptacle) (exists (?o - object) (and {body}))))"
    if task_type == "pick_two_obj_and_place":
        second = f"(exists (?o2 - object) (and (not (= ?o1 ?o2)) (objectType ?o2 {obj}Type) (inReceptacle ?o2 ?r)))"
        body = f"(objectType ?o1 {obj}Type) (receptacleType ?r {recep}Type) (inReceptacle ?o1 ?r) {second}"
        return f"(:goal (exists (?r - receptacle) (exists (?o1 - object) (and {body}))))"
    if task_type == "look_at_obj_in_light":
        lamp = (
            f"(exists (?t - object ?r - receptacle ?a - agent ?l - location) (and (objectType ?t {toggle}Type) "
            "(toggleable ?t) (isToggled ?t) (receptacleAtLocation ?r ?l) (atLocation ?a ?l) (inReceptacle ?t ?r)))"
        )
        held = f"(exists (?o - object ?a - agent) (and (objectType ?o {obj}Type) (holds ?a ?o)))"
        return f"(:goal (and {lamp} {held}))"
    raise ValueError(f"unknown task type {task_type!r}")


def problem_pddl(world: _World, name: str, goal: str) -> str:
    """The PDDL problem text of a world."""
    otypes = sorted({t for _, t, _ in world.objects} | {"Knife", "ButterKnife"})
    rtypes = sorted({t for _, t, _ in world.receptacles} | {"SinkBasin", "Microwave", "Fridge"})
    locations = sorted({loc for _, _, loc in world.receptacles} | {world.start})
    lines = [f"(define (problem {name})", "(:domain alfred)", "(:objects", "agent1 - agent"]
    lines += [f"{t}Type - otype" for t in otypes]
    lines += [f"{t}Type - rtype" for t in rtypes]
    lines += [f"{oid} - object" for oid, _, _ in world.objects]
    lines += [f"{rid} - receptacle" for rid, _, _ in world.receptacles]
    lines += [f"{loc} - location" for loc in locations]
    lines += [")", "(:init", f"(atLocation agent1 {world.start})"]
    recep_loc = {rid: loc for rid, _, loc in world.receptacles}
    for rid, rtype, loc in world.receptacles:
        lines.append(f"(receptacleAtLocation {rid} {loc})")
        lines.append(f"(receptacleType {rid} {rtype}Type)")
        if rtype in OPENABLE:
            lines.append(f"(openable {rid})")
    for oid, otype, rid in world.objects:
        kind = OBJECTS[otype]
        lines.append(f"(objectType {oid} {otype}Type)")
        lines.append(f"(inReceptacle {oid} {rid})")
        lines.append(f"(objectAtLocation {oid} {recep_loc[rid]})")
        if kind.pickupable:
            lines.append(f"(pickupable {oid})")
        lines += [f"({p} {oid})" for p in sorted(kind.props)]
    present_r = {t for _, t, _ in world.receptacles}
    for otype in otypes:
        if otype in OBJECTS:
            lines += [f"(canContain {r}Type {otype}Type)" for r in sorted(set(OBJECTS[otype].receptacles) & present_r)]
    lines += [")", goal, ")"]
    return "\n".join(lines) + "\n"


def _pick(rng: np.random.Generator, items: Sequence[str]) -> str:
    return items[int(rng.integers(len(items)))]


def _draw_task(task_type: str, layout: Layout, rng: np.random.Generator) -> tuple[dict, list[tuple[str, Optional[str]]]]:
    """Target object, parent receptacle (and lamp) for a task, plus the object placements."""
    present = {t for t, _ in layout.receptacles}
    toggle = ""
    obj = _pick(rng, _targets(task_type, layout))
    parents = [r for r in OBJECTS[obj].receptacles if r in present]
    if task_type in _STATE_CHANGE:
        parents = [r for r in parents if r not in (_STATE_CHANGE[task_type][2], "GarbageCan")]
    recep = _pick(rng, sorted(parents)) if task_type != "look_at_obj_in_light" else ""
    starts = [r for r in OBJECTS[obj].receptacles if r in present and r != recep]
    if not starts:
        raise ValueError(f"{obj} cannot start away from {recep}")
    placements: list[tuple[str, Optional[str]]] = [(obj, _pick(rng, sorted(starts)))]
    if task_type == "pick_two_obj_and_place":
        placements.append((obj, _pick(rng, sorted(starts))))
    if task_type == "look_at_obj_in_light":
        toggle = "DeskLamp"
    # distractors: other types only, so the goal never holds by accident
    others = [o for o in layout.objects if o != obj and o != "DeskLamp"]
    for o in rng.permutation(others)[: int(rng.integers(4, 8))]:
        placements.append((str(o), None))
    if "DeskLamp" in layout.objects:
        placements.append(("DeskLamp", None))
    params = {
        "object_target": obj,
        "parent_target": recep,
        "toggle_target": toggle,
        "mrecep_target": "",
        "object_sliced": False,
    }
    return params, placements


def game_name(task_type: str, layout_name: str, split: str, k: int) -> str:
    """The name (and file stem) of generated game ``k`` of a task type, room layout and split."""
    return f"{task_type}-{layout_name}-{split}-{k}"


def make_game(task_type: str, layout_name: str, split: str, k: int, engine_timeout_s: float = 30.0) -> dict:
    """One verified game (authored content only), deterministic in its arguments."""
    layout = layout_named(layout_name)
    name = game_name(task_type, layout_name, split, k)
    for attempt in range(20):
        rng = np.random.default_rng(stable_seed(name, attempt))
        try:
            params, placements = _draw_task(task_type, layout, rng)
            world = _build_world(layout, rng, placements)
        except ValueError:  # a drawn room may lack a place for this draw's objects; draw again
            continue
        obj, recep = params["object_target"].lower(), params["parent_target"].lower()
        goal = goal_sentence(task_type, obj, recep, params["toggle_target"].lower(), variant=k)
        pddl_name = "plan_" + name.replace("-", "_")
        problem = problem_pddl(world, pddl_name, _goal_pddl(task_type, params["object_target"], params["parent_target"], params["toggle_target"]))
        game = GameData(name, alfworld_data_file("alfred.pddl"), grammar_with_goal(goal), problem, task_type=task_type, goal=goal)
        engine = POOL.acquire(game)
        try:
            engine.reset()
            if engine.won:
                continue
            plan = engine.plan(engine_timeout_s)
            if len(plan) < 2:
                continue
            for command in plan:
                if command not in engine.admissible:
                    raise AssertionError(f"{name}: planner command {command!r} is not admissible")
                engine.step(command)
            if not engine.won:
                continue
        finally:
            POOL.release(engine)
        return {
            "format": BUNDLED_FORMAT,
            "name": name,
            "split": split,
            "task_type": task_type,
            "layout": layout_name,
            "goal": goal,
            "pddl_params": params,
            "pddl_problem": problem,
            "walkthrough": plan,
        }
    raise RuntimeError(f"could not generate a verified game for {name}")


def generate(out_dir: Path, counts: Optional[dict] = None, *, keep_existing: bool = False, rooms: int = 0) -> list[Path]:
    """Write ``counts[split]`` games (default :data:`SPLIT_COUNTS`: the bundled set) of every task type
    in each of its layouts of that split (seen layouts for train and valid_seen, unseen ones for
    valid_unseen) under ``out_dir/<split>/``. With ``keep_existing``, a game file already there is
    kept (a cache of generated games is filled once). ``rooms`` adds that many drawn rooms of each
    kind (:func:`drawn_layout`) to the train split's layouts."""
    from twice_envs.trajectory import atomic_write_text

    counts = SPLIT_COUNTS if counts is None else counts
    drawn = drawn_rooms(rooms)
    written = []
    for task_type in TASK_TYPES:
        seen, unseen = TASK_LAYOUTS[task_type]
        for split, count in counts.items():
            layouts = unseen if split == "valid_unseen" else seen
            if split == "train":
                layouts = tuple(layouts) + tuple(name for name, tasks in drawn.items() if task_type in tasks)
            for layout_name in layouts:
                for k in range(count):
                    path = out_dir / split / f"{game_name(task_type, layout_name, split, k)}.json"
                    if not (keep_existing and path.is_file()):
                        game = make_game(task_type, layout_name, split, k)
                        atomic_write_text(path, json.dumps(game, indent=1, sort_keys=True) + "\n")
                    written.append(path)
    return written


def generated_collection(split: str, count: int, rooms: int = 0) -> Path:
    """A cache folder of ``count`` generated games per task type and layout of ``split`` (written on
    first use, a few seconds per 10 games), to pass as ``make("ALFWorld-v0", data_dir=...)``;
    ``rooms`` drawn rooms of each kind join the train split's layouts (:func:`generate`).

    The folder is generated aside and renamed into place, and every call checks it against its
    manifest (each game file's size and digest, and the settings): a damaged or missing game is
    named in a ``RuntimeWarning`` and the collection generated again (:func:`twice_envs._cache.cached`).
    """
    if split not in SPLIT_COUNTS or int(count) < 1:
        raise ValueError(f"need a split of {tuple(SPLIT_COUNTS)} and a positive count, got {split!r}, {count!r}")
    if int(rooms) < 0 or (rooms and split != "train"):
        raise ValueError(f"drawn rooms are for the train split only and cannot be negative, got {split!r}, rooms={rooms!r}")
    folder = cache_dir("alfworld", "generated") / (f"{split}-{int(count)}" + (f"-rooms{int(rooms)}" if rooms else ""))
    settings = {"format": BUNDLED_FORMAT, "split": split, "count": int(count), "rooms": int(rooms)}

    def check(d: Path) -> Path:
        meta = read_manifest(d, COLLECTION_FORMAT, None)
        if meta.get("settings") != settings:
            raise DataFormatError(d / MANIFEST, None, f"generated with {meta.get('settings')}, not {settings}")
        return d

    def build(tmp: Path) -> None:
        written = generate(tmp, {split: int(count)}, rooms=int(rooms))
        write_manifest(tmp, COLLECTION_FORMAT, [p.relative_to(tmp).as_posix() for p in written], {"settings": settings})

    return cached(folder, check, build, "generated ALFWorld games")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Generate the bundled ALFWorld games (verified by the engine).")
    parser.add_argument("--out", default=str(BUNDLED_DIR), help="output folder (default: the package's bundled/)")
    parser.add_argument("--split", choices=tuple(SPLIT_COUNTS), default=None,
                        help="write only this split (default: the bundled set of every split)")
    parser.add_argument("--count", type=int, default=None, help="games per task type and layout (with --split)")
    parser.add_argument("--rooms", type=int, default=0, help="drawn training rooms of each kind (with --split train)")
    args = parser.parse_args(argv)
    if args.count is not None and (args.split is None or args.count < 1):
        parser.error("--count needs --split and a positive number")
    if args.rooms and (args.split != "train" or args.rooms < 0):
        parser.error("--rooms needs --split train and a positive number")
    counts = None if args.split is None else {args.split: args.count or SPLIT_COUNTS[args.split]}
    paths = generate(Path(args.out), counts, rooms=args.rooms)
    print(f"wrote {len(paths)} games under {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
