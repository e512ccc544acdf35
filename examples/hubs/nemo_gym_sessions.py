"""NeMo Gym's GymnasiumServer protocol over a twice env, and a session restored after a crash.

    python examples/hubs/nemo_gym_sessions.py
    # in a NeMo Gym resources server (nemo-gym 0.7, Python >= 3.13.14):
    #   from twice_envs.integrations.nemo_gym import server_class
    #   server_class("SearchQA-v0").run_webserver()

The sessions object is what the server calls: ``reset(metadata, session_id)`` and
``step(action, metadata, session_id)``. A session's record (``export``) restores it on any server of
the same env: every turn is replayed and checked against its digest.
"""

from __future__ import annotations

import asyncio

from twice_envs.integrations.nemo_gym import TwiceGymSessions


async def play() -> dict:
    server = TwiceGymSessions("SearchToy-v0")
    text, info = await server.reset({"seed": 3}, "session-1")
    print("first observation:", text)
    for action in ("search q1", "search q2"):
        text, reward, terminated, truncated, info = await server.step(action, {}, "session-1")
        print(f"{action!r}: {text!r}, digest {info['digest'][:12]}")
    record = server.export("session-1")                   # what a checkpoint keeps

    restarted = TwiceGymSessions("SearchToy-v0")            # the server after a crash
    text, restored = await restarted.reset({"restore": record}, "session-1")
    print("restored at turn", restored["turn"], "with the same digest:", restored["digest"] == info["digest"])
    text, reward, terminated, truncated, after = await restarted.step("answer", {}, "session-1")
    print(f"'answer': {text!r}, reward {reward}")
    return {"same": restored["digest"] == info["digest"], "turn": after["turn"]}


def main() -> dict:
    return asyncio.run(play())


if __name__ == "__main__":
    main()
