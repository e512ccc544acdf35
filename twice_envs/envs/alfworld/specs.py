"""Registers ALFWorld-v0 and one id per task type (entry points are strings: nothing heavy is imported)."""

from __future__ import annotations

from twice_envs.registry import register

ENTRY_POINT = "twice_envs.envs.alfworld.env:ALFWorldEnv"

#: Per-task-type ids: suffix -> task type.
TASK_IDS = {
    "PickPlace": "pick_and_place_simple",
    "Look": "look_at_obj_in_light",
    "Clean": "pick_clean_then_place_in_recep",
    "Heat": "pick_heat_then_place_in_recep",
    "Cool": "pick_cool_then_place_in_recep",
    "PickTwo": "pick_two_obj_and_place",
}

register(
    "ALFWorld-v0",
    ENTRY_POINT,
    kwargs={},
    description="ALFWorld household tasks in the real text engine (bundled games; data_dir='$ALFWORLD_DATA' for the real set)",
    max_episode_steps=50,
    override=True,
)
for _suffix, _task in TASK_IDS.items():
    register(
        f"ALFWorld-{_suffix}-v0",
        ENTRY_POINT,
        kwargs={"task_types": [_task]},
        description=f"ALFWorld, {_task} tasks only",
        max_episode_steps=50,
        override=True,
    )
