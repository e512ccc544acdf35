"""``twice play``, ``twice replay`` and ``twice check``: the env from a person's seat."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import warnings
from typing import Optional, Sequence, TextIO

import twice_envs
from twice_envs.errors import RecordCountError, ReplayDivergence, TrajectoryFormatError, UncountedRecordsWarning
from twice_envs.replay import noise_kind
from twice_envs.trajectory import iter_records, save_trajectories

PLAY_HELP = """commands (anything else is sent to the env as an action):
  :fork N    continue from the state after N actions of this episode
  :undo      take back the last action (same as :fork turn-1)
  :save FILE save the episode so far as a trajectory file (JSON lines)
  :actions   list the admissible actions (where the env has them)
  :reset [SEED]  start again
  :help      this text
  :quit      leave"""


def parse_value(text: str):
    """A command-line value: JSON where it is JSON (numbers, ``true``, ``null``, lists...), else the text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_env_kwargs(parser: argparse.ArgumentParser, text: str) -> dict:
    """The value of an ``--env-kwargs`` option: a JSON object, else a usage error of ``parser``."""
    try:
        kwargs = json.loads(text)
    except json.JSONDecodeError as exc:
        parser.error(f"--env-kwargs is not JSON ({exc}): {text!r}")
    if not isinstance(kwargs, dict):
        parser.error(f"--env-kwargs must be a JSON object, got {text!r}")
    return kwargs


def _parse_kv(pairs: Sequence[str], what: str) -> dict:
    out = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep:
            raise SystemExit(f"{what} must be KEY=VALUE, got {p!r}")
        out[key] = parse_value(value)
    return out


def _tolerant(stream: TextIO, errors: str) -> TextIO:
    """``stream`` with the error handler ``errors``: a terminal may send bytes that are not
    UTF-8 (a Latin-1 ``é``); they reach the env as lone surrogates and are saved exactly."""
    reconfigure = getattr(stream, "reconfigure", None)
    if reconfigure is not None:
        try:
            reconfigure(errors=errors)
        except (ValueError, OSError):  # a stream that cannot change; keep it as it is
            pass
    return stream


def play_main(argv: Sequence[str], stdin: Optional[TextIO] = None, stdout: Optional[TextIO] = None) -> int:
    """Play ENV: show the observation, read an action, show the reward."""
    parser = argparse.ArgumentParser(prog="twice play", description="Play an env in the terminal.\n\n" + PLAY_HELP,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("env", help="env id, e.g. SearchQA-v0 (see `twice envs`)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="reset option (JSON value)")
    parser.add_argument("--kwarg", action="append", default=[], metavar="KEY=VALUE", help="make() kwarg (JSON value)")
    args = parser.parse_args(argv)
    stdin = stdin or _tolerant(sys.stdin, "surrogateescape")
    out = stdout or _tolerant(sys.stdout, "backslashreplace")

    env = twice_envs.make(args.env, **_parse_kv(args.kwarg, "--kwarg"))
    options = _parse_kv(args.option, "--option")
    obs, info = env.reset(seed=args.seed, options=options)

    def show(obs: str, info: dict) -> None:
        print(f"\n--- turn {info['turn']} ---\n{obs}", file=out)
        if info.get("admissible_actions"):
            n = len(info["admissible_actions"])
            print(f"({n} admissible actions; :actions lists them)", file=out)

    print(f"{env.env_id} seed={args.seed}. Type an action, or :help.", file=out)
    show(obs, info)
    total = 0.0
    while True:
        print("> ", end="", file=out, flush=True)
        line = stdin.readline()
        if not line:
            print("", file=out)
            break
        line = line.rstrip("\n")
        cmd = line.strip()
        if cmd in (":quit", ":q", ":exit"):
            break
        if cmd == ":help":
            print(PLAY_HELP, file=out)
            continue
        if cmd == ":actions":
            for a in info.get("admissible_actions") or ["(this env does not list admissible actions)"]:
                print(f"  {a}", file=out)
            continue
        if cmd.startswith(":reset"):
            parts = cmd.split()
            seed = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else args.seed
            obs, info = env.reset(seed=seed, options=options)
            total = 0.0
            show(obs, info)
            continue
        if cmd.startswith(":fork") or cmd == ":undo":
            if cmd == ":undo":
                n = env.turn - 1
            else:
                parts = cmd.split()
                if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
                    print("usage: :fork N", file=out)
                    continue
                n = int(parts[1])
            try:
                env = env.fork(n)
            except (ValueError, TypeError) as exc:
                print(f"cannot fork: {exc}", file=out)
                continue
            info = env.last_info
            total = env.trajectory.total_reward
            show(env.trajectory.observations[-1], info)
            continue
        if cmd.startswith(":save"):
            parts = cmd.split(maxsplit=1)
            if len(parts) != 2:
                print("usage: :save FILE", file=out)
                continue
            try:
                save_trajectories(parts[1], [env.trajectory])
            except OSError as exc:  # a person typed the path: say why and keep the session
                print(f"cannot save to {parts[1]}: {exc.strerror or exc}", file=out)
                continue
            print(f"saved {env.turn} turns to {parts[1]}", file=out)
            continue
        if cmd.startswith(":"):
            print(f"unknown command {cmd!r}; :help lists them", file=out)
            continue
        obs, reward, terminated, truncated, info = env.step(line)
        total += float(reward)
        show(obs, info)
        flag = " (invalid action)" if info.get("invalid") else ""
        print(f"reward {float(reward):g}, total {total:g}{flag}", file=out)
        if terminated or truncated:
            print(f"episode {'finished' if terminated else 'truncated'}; :reset, :fork N or :quit", file=out)
    return 0


def replay_main(argv: Sequence[str]) -> int:
    """Replay every trajectory in FILE; report each record's result (a bad one does not stop the rest)."""
    parser = argparse.ArgumentParser(prog="twice replay", description="Re-run saved trajectories and verify them.")
    parser.add_argument("file", help="a JSON lines trajectory file (from :save, RecordEpisodes or rollouts)")
    parser.add_argument("--show", action="store_true", help="print each episode's turns")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="import MODULE first (one that registers the episodes' env ids)")
    parser.add_argument("--trust-kwargs", action="store_true",
                        help="pass file and folder kwargs the records name (journal, corpus, data folders) to the "
                             "envs; without it such records are refused, since a replay would use those paths")
    args = parser.parse_args(argv)

    for m in args.imports:
        importlib.import_module(m)

    bad = 0
    n = 0
    damaged = None
    with warnings.catch_warnings(record=True) as notes:  # an uncounted (older) file is a note, not a failure
        warnings.simplefilter("always", UncountedRecordsWarning)
        for i, (where, record) in enumerate(iter_records(args.file), 1):
            while notes:
                print(f"note: {notes.pop(0).message}")
            if isinstance(record, RecordCountError):
                damaged = record
                break
            n += 1
            if isinstance(record, TrajectoryFormatError):
                bad += 1
                print(f"episode {i}: UNREADABLE: {record}")
                continue
            head = f"episode {i} ({record.env_id}, seed {record.seed})"
            try:
                env = twice_envs.replay(record, trusted=args.trust_kwargs)
            except ReplayDivergence as exc:
                bad += 1
                print(f"{head}: DIVERGED at turn {exc.turn}: {exc}")
                if 0 < exc.turn <= record.num_turns:
                    print(f"  action:   {record.actions[exc.turn - 1]!r:.300}")
                    print(f"  recorded: {record.observations[exc.turn][:300]!r}")
                continue
            except Exception as exc:  # noqa: BLE001 -- one bad record (unknown env, bad kwargs) must not stop the rest
                bad += 1
                print(f"{head}: FAILED ({where}): {type(exc).__name__}: {str(exc)[:500]}")
                continue
            print(f"{head}: {record.num_turns} turns, reward {record.total_reward:g}: replays exactly"
                  f"{_twin_note(record, noise_kind(record))}")
            if args.show:
                traj = env.trajectory
                print(traj.observations[0])
                for a, o, r in zip(traj.actions, traj.observations[1:], traj.rewards):
                    print(f"> {a}\n{o}\n(reward {r:g})")
        for note in notes:
            print(f"note: {note.message}")
    if damaged is not None:
        print(f"FILE DAMAGED: {damaged}")
    if n == 0:
        print(f"{args.file}: no episodes")
        return 1
    print(f"{n - bad}/{n} episodes replay exactly")
    return 1 if bad or damaged else 0


def _twin_note(record, kind: str) -> str:
    """What ``twice replay`` adds for a twin's record (``kind`` from :func:`twice_envs.replay.noise_kind`):
    its kind and, for an independent twin, that its noise seed is not its reset's and no replay checks it."""
    if kind == "factual":
        return ""
    seed = record.noise["episode_seed"]
    unchecked = ", not its reset's: a fresh seed no replay can check" if kind == "independent twin" else ""
    article = "an" if kind[0] in "aeiou" else "a"
    return f" ({article} {kind}: branches {record.noise['branches']}, noise seed {seed}{unchecked})"


def check_main(argv: Sequence[str]) -> int:
    """Run the contract checker on an env id."""
    parser = argparse.ArgumentParser(prog="twice check", description="Check an env against the twice_envs contract.")
    parser.add_argument("env")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args(argv)
    report = twice_envs.check_env(
        twice_envs.make(args.env), seed=args.seed, num_episodes=args.episodes, num_steps=args.steps
    )
    print(report)
    return 0
