"""Serve an env through OpenEnv and play it over the wire: an episode, a fork, and a restore on a second server.

    pip install 'twice-envs[openenv]'
    python examples/hubs/openenv_client.py

Against a server started elsewhere (``twice serve SearchToy-v0``), pass its address: ``--url http://127.0.0.1:8000``.
"""

from __future__ import annotations

import argparse
from contextlib import nullcontext

from twice_envs.integrations.openenv.client import TwiceEnvClient, export, fork, restore
from twice_envs.integrations.openenv.server import ServeConfig, ServerThread


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", help="a running server (default: start one on a free loopback port)")
    p.add_argument("--env", default="SearchToy-v0", help="the env id the servers started here run")
    args = p.parse_args(argv)
    config = ServeConfig(args.env, port=0)
    with (nullcontext(args.url) if args.url else ServerThread(config)) as url:
        with TwiceEnvClient(url).sync() as env:
            result = env.reset(seed=7)                  # the same first observation as make(...).reset(seed=7)
            print("first observation:", result.observation.text[:80])
            for action in ("search q1", "search q5", "search q2"):
                result = env.step(action)
                print(f"{action!r}: reward {result.reward}, digest {result.metadata['digest'][:12]}")
            branch, at_two = fork(env, turn=2)          # a new session holding the episode after 2 actions
            print("fork at turn 2:", at_two.metadata["digest"][:12])
            record = export(env)                        # JSON data: keep it, send it anywhere
    with ServerThread(config) as other, TwiceEnvClient(other).sync() as env:   # a second server: a restart
        restored = restore(env, record)
        print("restored on another server:", restored.metadata["digest"][:12])
    same = restored.metadata["digest"] == result.metadata["digest"]
    print("same digest after the restore:", same)
    return {"digest": result.metadata["digest"], "restored": restored.metadata["digest"], "same": same}


if __name__ == "__main__":
    main()
