"""The ``twice`` command line: one entry point, subcommands loaded on demand.

Each subcommand is a ``main(argv) -> int`` function in the module that owns it, so
``twice envs`` never imports torch and a missing optional dependency only affects
the commands that need it.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys
from typing import Optional, Sequence

import twice_envs
from twice_envs.errors import TwiceError

#: command -> ("module:function", one-line help). ``bench`` has its own table.
COMMANDS: dict[str, tuple[str, str]] = {
    "envs": ("twice_envs.cli:envs_main", "list registered env ids"),
    "play": ("twice_envs.play:play_main", "play an env in the terminal (:fork N, :undo, :save FILE)"),
    "replay": ("twice_envs.play:replay_main", "re-run a saved trajectory file and report the first divergence"),
    "check": ("twice_envs.play:check_main", "run the contract checker on an env id"),
    "bench": ("twice_envs.cli:bench_main", "benchmarks (twice bench with no name lists them)"),
    "models": ("twice_envs.agents.models.cli:models_main", "build or inspect models (build-tiny, export, smollm2, info)"),
    "rollout": ("twice_envs.agents.cli.rollout:rollout_main", "run an agent on an env and save episodes"),
    "train": ("twice_envs.agents.cli.train:train_main", "train an agent with a registered credit method"),
    "eval": ("twice_envs.agents.cli.train:eval_main", "greedy evaluation of a checkpoint"),
    "audit": ("twice_envs.agents.lab.cli:audit_main", "credit audit: wrong-sign rates against oracle advantages"),
    "plot": ("twice_envs.agents.lab.plots:plot_main", "plot learning curves of several runs"),
    "demo": ("twice_envs.agents.bench.demo:demo_main", "the main job: train GRPO and Twice on the embedded default"),
    "view": ("twice_envs.agents.view.cli:view_main", "write an HTML explorer of episodes, twins, curves and audits"),
    "serve": ("twice_envs.integrations.openenv.cli:serve_main",
              "serve an env through OpenEnv (WebSocket sessions; pip install 'twice-envs[openenv]')"),
    "check-gpu": ("twice_envs.agents.gpu_check.cli:check_gpu_main",
                  "check the keyed sampler and a build on a CUDA GPU (--bundle DIR: wheels for an offline machine)"),
}

BENCHES: dict[str, str] = {
    "noise": "twice_envs.bench_noise:main",
    "searchqa": "twice_envs.envs.searchqa.bench:main",
    "dense": "twice_envs.envs.searchqa.dense_bench:main",
    "alfworld": "twice_envs.envs.alfworld.bench:main",
    "webshop": "twice_envs.envs.webshop.bench:main",
    "soak": "twice_envs.soak:main",
    "sampler": "twice_envs.agents.bench.sampler:sampler_main",
    "rollout": "twice_envs.agents.bench.sampler:rollout_main",
    "vec": "twice_envs.wrappers.vector_bench:main",
    "credit": "twice_envs.agents.bench.credit:main",
    "learn": "twice_envs.agents.bench.learn:main",
    "coupling": "twice_envs.agents.bench.coupling:main",
    "keys": "twice_envs.agents.bench.keys:main",
    "ablations": "twice_envs.agents.bench.ablations:main",
    "games": "twice_envs.agents.bench.games:main",
    "cost": "twice_envs.agents.bench.cost:main",
    "overfit": "twice_envs.agents.bench.overfit:main",
    "update": "twice_envs.agents.bench.update:main",
    "serve": "twice_envs.integrations.openenv.bench:main",
    "choice": "twice_envs.agents.bench.choice:main",
}


def _load(target: str):
    module_name, _, func = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise SystemExit(f"twice: '{module_name}' is not part of this installation") from None
        raise
    return getattr(module, func)


def _usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name.ljust(width)}  {help_}" for name, (_, help_) in COMMANDS.items())
    return f"usage: twice COMMAND [ARGS...]\n\ncommands:\n{rows}\n\nRun 'twice COMMAND --help' for a command's options."


def envs_main(argv: Sequence[str]) -> int:
    """``twice envs``: one line per registered id."""
    parser = argparse.ArgumentParser(prog="twice envs", description="List registered env ids.")
    parser.parse_args(argv)
    width = max(map(len, twice_envs.registry), default=0)
    for env_id in sorted(twice_envs.registry):
        print(f"{env_id.ljust(width)}  {twice_envs.descriptions.get(env_id, '')}")
    return 0


def bench_main(argv: Sequence[str]) -> int:
    """``twice bench NAME [ARGS...]``."""
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: twice bench NAME [ARGS...]\n\nbenchmarks: " + ", ".join(BENCHES))
        return 0 if argv else 2
    name, rest = argv[0], list(argv[1:])
    if name not in BENCHES:
        close = difflib.get_close_matches(name, list(BENCHES), n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        print(f"twice bench: unknown benchmark '{name}'.{hint} Known: {', '.join(BENCHES)}", file=sys.stderr)
        return 2
    return int(_load(BENCHES[name])(rest) or 0)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        close = difflib.get_close_matches(cmd, list(COMMANDS), n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        print(f"twice: unknown command '{cmd}'.{hint}\n\n{_usage()}", file=sys.stderr)
        return 2
    try:
        return int(_load(COMMANDS[cmd][0])(rest) or 0)
    except TwiceError as exc:
        print(f"twice {cmd}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
