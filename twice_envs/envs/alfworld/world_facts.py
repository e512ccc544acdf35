"""What the rooms of the generated ALFWorld games hold, and which task types each room can play.

Object kinds (:data:`OBJECTS`: what can be done with each type, where it can be), the fixed
room layouts (:data:`LAYOUTS`) and the splits' layouts per task type (:data:`TASK_LAYOUTS`),
the drawn training rooms (:func:`drawn_layout`, never equal to a held-out room), and
:func:`playable`. :mod:`.generator` builds games from these (and re-exports them); changing
anything here changes the generated games and so the cache digests that depend on them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from twice_envs.keys import stable_seed
from twice_envs.envs.alfworld.tasks import TASK_TYPES

# ---------------------------------------------------------------------------- world facts
#: Receptacle types that open and close.
OPENABLE = frozenset({"Fridge", "Microwave", "Cabinet", "Drawer", "Safe"})
#: Receptacles whose ALFRED object id carries a basin suffix (displayed "sinkbasin 1").
BASINS = {"SinkBasin": "Sink", "BathtubBasin": "Bathtub"}


@dataclass(frozen=True)
class ObjectKind:
    """An object type: what can be done with it and where it can be.

    Attributes:
        props: state predicates it supports (heatable, coolable, cleanable, toggleable).
        receptacles: receptacle types that can hold it.
        pickupable: whether the agent can take it.
    """

    props: frozenset
    receptacles: tuple[str, ...]
    pickupable: bool = True


def _kind(props: str, receps: str, pickupable: bool = True) -> ObjectKind:
    return ObjectKind(frozenset(props.split()), tuple(receps.split()), pickupable)


_FOOD = "CounterTop DiningTable Fridge Microwave SinkBasin GarbageCan"
OBJECTS: dict[str, ObjectKind] = {
    # kitchen
    "Apple": _kind("heatable coolable cleanable", _FOOD),
    "Potato": _kind("heatable coolable cleanable", _FOOD),
    "Egg": _kind("heatable coolable cleanable", _FOOD),
    "Tomato": _kind("heatable coolable cleanable", _FOOD),
    "Bread": _kind("heatable coolable", "CounterTop DiningTable Fridge Microwave GarbageCan"),
    "Lettuce": _kind("coolable cleanable", "CounterTop DiningTable Fridge SinkBasin GarbageCan"),
    "Mug": _kind("heatable coolable cleanable", "CounterTop DiningTable Cabinet Shelf CoffeeMachine SinkBasin Microwave Fridge"),
    "Cup": _kind("heatable coolable cleanable", "CounterTop DiningTable Cabinet Shelf SinkBasin Microwave Fridge"),
    "Plate": _kind("heatable coolable cleanable", "CounterTop DiningTable Cabinet Shelf SinkBasin Microwave Fridge"),
    "Pan": _kind("coolable cleanable", "StoveBurner CounterTop DiningTable Cabinet SinkBasin Fridge"),
    "Knife": _kind("cleanable", "CounterTop DiningTable Drawer SinkBasin"),
    "Spatula": _kind("cleanable", "CounterTop DiningTable Drawer SinkBasin"),
    "Fork": _kind("cleanable", "CounterTop DiningTable Drawer SinkBasin"),
    "DishSponge": _kind("cleanable", "CounterTop SinkBasin Cabinet Drawer"),
    # bathroom
    "SoapBar": _kind("cleanable", "CounterTop Toilet SinkBasin BathtubBasin Cabinet GarbageCan"),
    "Cloth": _kind("cleanable", "CounterTop Cabinet SinkBasin BathtubBasin Drawer"),
    "SprayBottle": _kind("", "Toilet CounterTop Cabinet GarbageCan Shelf"),
    "ToiletPaper": _kind("", "Toilet CounterTop Cabinet Drawer ToiletPaperHanger GarbageCan"),
    "Candle": _kind("", "CounterTop Cabinet Toilet Shelf"),
    "SoapBottle": _kind("", "CounterTop Cabinet Toilet Shelf GarbageCan"),
    # bedroom, living room
    "Book": _kind("", "Bed Desk SideTable Shelf Drawer Dresser CoffeeTable Sofa ArmChair"),
    "CellPhone": _kind("", "Bed Desk SideTable Drawer Dresser Sofa ArmChair Shelf"),
    "Pen": _kind("", "Desk SideTable Drawer Shelf Dresser"),
    "KeyChain": _kind("", "SideTable Drawer Dresser Desk Shelf CoffeeTable Sofa Safe"),
    "CD": _kind("", "Desk Drawer Shelf SideTable Safe"),
    "AlarmClock": _kind("", "Desk SideTable Shelf Dresser"),
    "Pillow": _kind("", "Bed Sofa ArmChair"),
    "CreditCard": _kind("", "Desk SideTable Drawer Shelf Dresser CoffeeTable Sofa ArmChair Safe"),
    "RemoteControl": _kind("", "Sofa ArmChair CoffeeTable SideTable TVStand Dresser Drawer"),
    "Vase": _kind("", "Shelf SideTable CoffeeTable TVStand Dresser"),
    "Watch": _kind("", "SideTable Drawer Dresser CoffeeTable Shelf Safe"),
    "Statue": _kind("", "Shelf CoffeeTable SideTable Dresser TVStand"),
    "DeskLamp": _kind("toggleable", "Desk SideTable Dresser", pickupable=False),
}


@dataclass(frozen=True)
class Layout:
    """A room: its receptacles (type, count) and the object types that live in it."""

    name: str
    receptacles: tuple[tuple[str, int], ...]
    objects: tuple[str, ...]


LAYOUTS: dict[str, Layout] = {
    l.name: l
    for l in (
        Layout(
            "kitchen_a",
            (("CounterTop", 2), ("Cabinet", 3), ("Drawer", 2), ("Fridge", 1), ("Microwave", 1), ("SinkBasin", 1),
             ("StoveBurner", 2), ("DiningTable", 1), ("GarbageCan", 1), ("CoffeeMachine", 1)),
            ("Apple", "Potato", "Egg", "Tomato", "Bread", "Lettuce", "Mug", "Cup", "Plate", "Pan", "Knife", "Fork",
             "Spatula", "DishSponge"),
        ),
        Layout(
            "kitchen_b",
            (("CounterTop", 1), ("Cabinet", 4), ("Drawer", 3), ("Fridge", 1), ("Microwave", 1), ("SinkBasin", 1),
             ("StoveBurner", 1), ("DiningTable", 1), ("GarbageCan", 1), ("Shelf", 1)),
            ("Apple", "Potato", "Egg", "Tomato", "Bread", "Lettuce", "Mug", "Cup", "Plate", "Pan", "Knife", "Spatula"),
        ),
        Layout(
            "bathroom",
            (("CounterTop", 1), ("Cabinet", 2), ("Drawer", 2), ("SinkBasin", 1), ("BathtubBasin", 1), ("Toilet", 1),
             ("ToiletPaperHanger", 1), ("Shelf", 1), ("GarbageCan", 1)),
            ("SoapBar", "Cloth", "SprayBottle", "ToiletPaper", "Candle", "SoapBottle"),
        ),
        Layout(
            "bedroom",
            (("Bed", 1), ("Desk", 1), ("SideTable", 2), ("Drawer", 3), ("Shelf", 2), ("Dresser", 1), ("GarbageCan", 1),
             ("Safe", 1)),
            ("Book", "CellPhone", "Pen", "KeyChain", "CD", "AlarmClock", "Pillow", "CreditCard", "Watch", "DeskLamp"),
        ),
        Layout(
            "livingroom",
            (("Sofa", 1), ("ArmChair", 1), ("CoffeeTable", 1), ("SideTable", 2), ("Drawer", 2), ("Shelf", 2),
             ("TVStand", 1), ("Dresser", 1), ("GarbageCan", 1)),
            ("Book", "KeyChain", "CreditCard", "RemoteControl", "Vase", "Watch", "Statue", "Pillow", "DeskLamp"),
        ),
    )
}

#: Predicate the target object needs, and the appliance type that makes it true.
_STATE_CHANGE = {
    "pick_clean_then_place_in_recep": ("cleanable", "isClean", "SinkBasin"),
    "pick_heat_then_place_in_recep": ("heatable", "isHot", "Microwave"),
    "pick_cool_then_place_in_recep": ("coolable", "isCool", "Fridge"),
}
#: Layouts each task type is generated in: (seen layouts, unseen layouts).
TASK_LAYOUTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "pick_and_place_simple": (("kitchen_a", "bathroom", "bedroom"), ("kitchen_b", "livingroom")),
    "look_at_obj_in_light": (("bedroom",), ("livingroom",)),
    "pick_clean_then_place_in_recep": (("kitchen_a", "bathroom"), ("kitchen_b",)),
    "pick_heat_then_place_in_recep": (("kitchen_a",), ("kitchen_b",)),
    "pick_cool_then_place_in_recep": (("kitchen_a",), ("kitchen_b",)),
    "pick_two_obj_and_place": (("kitchen_a", "bathroom", "bedroom"), ("kitchen_b", "livingroom")),
}

# ---------------------------------------------------------------------------- drawn rooms
#: Room kinds of the drawn training rooms: (receptacle type -> (min, max) count, object types).
#: A drawn room takes every receptacle type at a count drawn from its range and a random
#: subset of the object types, so names, counts and contents differ from room to room.
ROOM_KINDS: dict[str, tuple[dict[str, tuple[int, int]], tuple[str, ...]]] = {
    "kitchen": (
        {"CounterTop": (1, 3), "Cabinet": (2, 6), "Drawer": (1, 4), "Fridge": (1, 1), "Microwave": (1, 1),
         "SinkBasin": (1, 1), "StoveBurner": (1, 4), "DiningTable": (0, 1), "GarbageCan": (1, 1),
         "CoffeeMachine": (0, 1), "Shelf": (0, 2)},
        LAYOUTS["kitchen_a"].objects,
    ),
    "bathroom": (
        {"CounterTop": (1, 2), "Cabinet": (1, 4), "Drawer": (0, 3), "SinkBasin": (1, 2), "BathtubBasin": (0, 1),
         "Toilet": (1, 1), "ToiletPaperHanger": (0, 1), "Shelf": (0, 2), "GarbageCan": (1, 1)},
        LAYOUTS["bathroom"].objects,
    ),
    "bedroom": (
        {"Bed": (1, 1), "Desk": (0, 1), "SideTable": (1, 2), "Drawer": (1, 4), "Shelf": (0, 3), "Dresser": (0, 1),
         "GarbageCan": (1, 1), "Safe": (0, 1)},
        LAYOUTS["bedroom"].objects,
    ),
    "livingroom": (
        {"Sofa": (1, 1), "ArmChair": (0, 2), "CoffeeTable": (1, 1), "SideTable": (1, 2), "Drawer": (0, 4),
         "Shelf": (0, 3), "TVStand": (0, 1), "Dresser": (0, 1), "GarbageCan": (1, 1)},
        LAYOUTS["livingroom"].objects,
    ),
}
_HELD_OUT_ROOMS = {
    frozenset(LAYOUTS[name].receptacles) for _, unseen in TASK_LAYOUTS.values() for name in unseen
}


def drawn_layout(name: str) -> Layout:
    """The drawn training room ``name`` (``"<kind>-room<i>"``, e.g. ``"livingroom-room3"``).

    Deterministic in its name. A draw whose receptacles (types and counts) equal those of a
    held-out (``valid_unseen``) room is drawn again, so a held-out room is never trained on;
    the room kinds themselves are shared, as ALFWorld's unseen scenes share the kinds of its
    training scenes.
    """
    kind, sep, index = name.partition("-room")
    if kind not in ROOM_KINDS or not sep or not index.isdigit():
        raise ValueError(f"not a drawn room name: {name!r} (expected <kind>-room<i>, kind one of {tuple(ROOM_KINDS)})")
    counts, objects = ROOM_KINDS[kind]
    for attempt in range(100):
        rng = np.random.default_rng(stable_seed("room", name, attempt))
        receptacles = tuple((t, int(rng.integers(lo, hi + 1))) for t, (lo, hi) in counts.items())
        receptacles = tuple((t, c) for t, c in receptacles if c > 0)
        if frozenset(receptacles) in _HELD_OUT_ROOMS:
            continue
        present = {t for t, _ in receptacles}
        holdable = [o for o in objects if set(OBJECTS[o].receptacles) & present]
        keep = [o for o in holdable if o == "DeskLamp" or rng.random() < 0.75]
        return Layout(name, receptacles, tuple(keep))
    raise RuntimeError(f"could not draw room {name!r} apart from the held-out rooms")


def drawn_rooms(rooms: int) -> dict[str, tuple[str, ...]]:
    """Names of ``rooms`` drawn training rooms of every kind, with the task types each can play
    (:func:`playable`: a kitchen has no lamp, a bathroom no microwave or fridge, ...)."""
    names = [f"{kind}-room{i}" for kind in ROOM_KINDS for i in range(int(rooms))]
    return {name: tuple(t for t in TASK_TYPES if playable(t, drawn_layout(name))) for name in names}


def layout_named(name: str) -> Layout:
    """A fixed layout of :data:`LAYOUTS` or a drawn room (:func:`drawn_layout`)."""
    return LAYOUTS[name] if name in LAYOUTS else drawn_layout(name)


# ---------------------------------------------------------------------------- what a room can play
def _targets(task_type: str, layout: Layout) -> list[str]:
    """Object types a game of ``task_type`` in ``layout`` can be about (empty: the room cannot play it)."""
    present = {t for t, _ in layout.receptacles}
    movable = [o for o in layout.objects if OBJECTS[o].pickupable]
    if task_type in _STATE_CHANGE:
        able, _, appliance = _STATE_CHANGE[task_type]
        if appliance not in present:
            return []
        movable = [o for o in movable if able in OBJECTS[o].props]
        movable = [o for o in movable if set(OBJECTS[o].receptacles) & present - {appliance, "GarbageCan"}]
    if task_type == "look_at_obj_in_light" and "DeskLamp" not in layout.objects:
        return []
    # at least two receptacle types, so the object can start away from the goal's
    return [o for o in movable if len(set(OBJECTS[o].receptacles) & present) >= 2]


def playable(task_type: str, layout: Layout) -> bool:
    """Whether ``layout`` has what a game of ``task_type`` needs (appliance, lamp, a target object)."""
    return bool(_targets(task_type, layout))
