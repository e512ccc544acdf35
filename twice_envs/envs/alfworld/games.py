"""ALFWorld game collections: the bundled games, or a directory of real ALFWorld data.

Real data (from ``alfworld-download``) is laid out as::

    $ALFWORLD_DATA/json_2.1.1/{train,valid_seen,valid_unseen}/<task>-<obj>-.../<trial>/game.tw-pddl

(with a ``traj_data.json`` beside each game). ``data_dir`` may name ``$ALFWORLD_DATA``,
its ``json_2.1.1`` folder, a split folder, or any folder holding game folders. It may also
name a folder of games in the bundled format (``<dir>/<split>/*.json``, as
``python -m twice_envs.envs.alfworld.generator --out DIR --split train --count N`` writes
them): those are assembled like the bundled games. A folder
laid out by split that lacks the requested split is an error (never another split's
games), and so is a split folder named for another split.
Games are listed in sorted order of their relative path (never filesystem order), so
an index names the same game on every machine.

Bundled games store only what this package authors (the PDDL problem, the task
sentence, a walkthrough); they are assembled into full games at load time with the
domain and grammar of the installed ``alfworld`` package.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Union

from twice_envs._cache import cache_dir, discard, read_json
from twice_envs.errors import DataFormatError, TwiceError
from twice_envs.trajectory import atomic_write_text

from twice_envs.envs.alfworld.engine import GameData
from twice_envs.envs.alfworld.tasks import TASK_TYPES, goal_sentence, resolve_task_types

__all__ = [
    "BUNDLED_DIR",
    "BUNDLED_FORMAT",
    "DATA_ENV_VAR",
    "GAME_CACHE_SIZE",
    "GAME_FILE",
    "GOAL_PLACEHOLDER",
    "GameEntry",
    "SPLITS",
    "TASK_TYPES",
    "alfworld_data_file",
    "assemble",
    "check_data_dir",
    "grammar_with_goal",
    "list_games",
    "load_authored",
    "load_game",
    "load_real_game",
    "resolve_data_dir",
    "resolve_task_types",
]

SPLITS: tuple[str, ...] = ("train", "valid_seen", "valid_unseen")
#: Folder of the bundled games (one JSON file of authored content per game).
BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"
#: Format tag of a bundled game file.
BUNDLED_FORMAT = "twice-alfworld-game/1"
GAME_FILE = "game.tw-pddl"
GOAL_PLACEHOLDER = "UNKNOWN GOAL"
DATA_ENV_VAR = "ALFWORLD_DATA"

_AUTHORED_KEYS = ("name", "task_type", "goal", "pddl_problem", "walkthrough")
_GAME_KEYS = ("pddl_domain", "grammar", "pddl_problem")


@dataclass(frozen=True)
class GameEntry:
    """One game of a collection.

    Attributes:
        name: the game's name (bundled: the file stem; real data: its path relative to the split).
        path: the file holding it.
        task_type: its ALFWorld task type.
        bundled: whether it is an authored bundled game (assembled at load time).
    """

    name: str
    path: str
    task_type: str
    bundled: bool


# ---------------------------------------------------------------------------- engine files
_alfworld_files: dict[str, str] = {}


def alfworld_data_file(name: str) -> str:
    """Text of ``alfworld/data/<name>`` from the installed ``alfworld`` package."""
    if name not in _alfworld_files:
        from twice_envs._deps import require

        alfworld = require("alfworld", "alfworld", "the ALFWorld env")
        path = Path(alfworld.__file__).resolve().parent / "data" / name
        if not path.is_file():
            raise TwiceError(f"the installed alfworld package has no data/{name} ({path}); reinstall alfworld")
        _alfworld_files[name] = path.read_text(encoding="utf-8")
    return _alfworld_files[name]


def grammar_with_goal(goal: str) -> str:
    """ALFWorld's grammar with the task sentence filled in (as ALFWorld's game generator does)."""
    grammar = alfworld_data_file("alfred.twl2")
    if GOAL_PLACEHOLDER not in grammar:
        raise TwiceError(f"the installed alfworld grammar has no '{GOAL_PLACEHOLDER}' placeholder; unsupported alfworld version")
    return grammar.replace(GOAL_PLACEHOLDER, goal.rstrip("."))


# ---------------------------------------------------------------------------- loading
def _read_json(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DataFormatError(path, None, f"not UTF-8 text ({exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataFormatError(path, exc.lineno, f"not valid JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise DataFormatError(path, 1, f"expected a JSON object, got {type(data).__name__}")
    return data


def load_authored(path: Union[str, Path]) -> dict:
    """Read and validate one bundled game file (authored content only)."""
    path = Path(path)
    data = _read_json(path)
    if data.get("format") != BUNDLED_FORMAT:
        raise DataFormatError(path, None, f"not a bundled ALFWorld game (format {data.get('format')!r}, expected {BUNDLED_FORMAT!r})")
    for key in _AUTHORED_KEYS:
        if key not in data:
            raise DataFormatError(path, None, f"missing key {key!r}")
    if data["task_type"] not in TASK_TYPES:
        raise DataFormatError(path, None, f"unknown task type {data['task_type']!r}")
    if not isinstance(data["walkthrough"], list) or not all(isinstance(a, str) for a in data["walkthrough"]):
        raise DataFormatError(path, None, "walkthrough must be a list of commands")
    return data


def assemble(authored: dict, path: Optional[str] = None) -> GameData:
    """A full game from authored content plus the installed engine's domain and grammar."""
    return GameData(
        name=authored["name"],
        domain=alfworld_data_file("alfred.pddl"),
        grammar=grammar_with_goal(authored["goal"]),
        problem=authored["pddl_problem"],
        walkthrough=tuple(authored["walkthrough"]),
        task_type=authored["task_type"],
        goal=authored["goal"].rstrip("."),
        pddl_params=dict(authored.get("pddl_params") or {}),
        path=path,
    )


def _goal_from_grammar(grammar: str) -> str:
    marker = "Your task is to: "
    i = grammar.find(marker)
    if i < 0:
        return ""
    rest = grammar[i + len(marker) :]
    end = rest.find('"')
    return rest[:end].rstrip(".") if end >= 0 else ""


def load_real_game(entry: GameEntry) -> GameData:
    """Read one ``game.tw-pddl`` of real ALFWorld data."""
    path = Path(entry.path)
    data = _read_json(path)
    for key in _GAME_KEYS:
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise DataFormatError(path, None, f"missing or empty {key!r}: not an ALFWorld game file")
    if data.get("solvable") is False:
        raise DataFormatError(path, None, "the game is marked unsolvable (\"solvable\": false)")
    grammar = data["grammar"]
    params: dict = {}
    traj = path.parent / "traj_data.json"
    if GOAL_PLACEHOLDER in grammar:
        # A game file without its task sentence: build one from traj_data.json.
        if not traj.is_file():
            raise DataFormatError(path, None, f"the grammar has no task sentence and there is no {traj.name} beside it")
        tdata = _read_json(traj)
        params = dict(tdata.get("pddl_params") or {})
        goal = _default_goal(entry.task_type, params)
        grammar = grammar.replace(GOAL_PLACEHOLDER, goal)
    walkthrough = data.get("walkthrough") or ()
    return GameData(
        name=entry.name,
        domain=data["pddl_domain"],
        grammar=grammar,
        problem=data["pddl_problem"],
        walkthrough=tuple(walkthrough),
        task_type=entry.task_type,
        goal=_goal_from_grammar(grammar),
        pddl_params=params,
        path=str(path),
    )


def _default_goal(task_type: str, params: dict) -> str:
    obj = str(params.get("object_target", "object")).lower()
    recep = str(params.get("parent_target", "receptacle")).lower()
    toggle = str(params.get("toggle_target", "desklamp")).lower()
    return goal_sentence(task_type, obj, recep, toggle, variant=0)


#: Games kept in memory per process (a real game is ~100 kB of text).
GAME_CACHE_SIZE = 256
_game_cache: "OrderedDict[str, GameData]" = OrderedDict()
_cache_lock = threading.Lock()


def load_game(entry: GameEntry) -> GameData:
    """The game of ``entry`` (cached per process, least recently used dropped first)."""
    with _cache_lock:
        game = _game_cache.get(entry.path)
        if game is not None:
            _game_cache.move_to_end(entry.path)
            return game
    game = assemble(load_authored(entry.path), entry.path) if entry.bundled else load_real_game(entry)
    with _cache_lock:
        _game_cache[entry.path] = game
        while len(_game_cache) > GAME_CACHE_SIZE:
            _game_cache.popitem(last=False)
    return game


# ---------------------------------------------------------------------------- discovery
_list_cache: dict[tuple, list[GameEntry]] = {}


def check_data_dir(data_dir: object) -> Optional[str]:
    """``data_dir`` if it is None (the bundled games) or a non-blank string, else a ``ValueError``.

    An empty ``data_dir`` would name the current folder (``Path("")`` is ``.``), so it is
    refused rather than read as wherever the process happens to run.
    """
    if data_dir is None:
        return None
    if not isinstance(data_dir, str):
        raise ValueError(
            f"ALFWorld data_dir must be a folder path as a string (or None for the bundled games), "
            f"got {type(data_dir).__name__} {data_dir!r:.60}"
        )
    if not data_dir.strip():
        raise ValueError(
            f"ALFWorld data_dir {data_dir!r} is empty: it would name the current folder. Pass the folder of "
            f"your games (e.g. data_dir='$ALFWORLD_DATA'), or data_dir=None for the bundled games"
        )
    return data_dir


def list_games(data_dir: Optional[str], split: str, task_types: Iterable[str]) -> list[GameEntry]:
    """The sorted games of a collection (bundled when ``data_dir`` is None; never ``""``)."""
    data_dir = check_data_dir(data_dir)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; ALFWorld splits are {', '.join(SPLITS)}")
    task_types = tuple(task_types)
    key = (data_dir, split, task_types)
    if key in _list_cache:
        return list(_list_cache[key])
    entries = _list_bundled(split) if data_dir is None else _list_real(data_dir, split)
    kept = [e for e in entries if e.task_type in task_types]
    if not kept:
        where = f"the bundled {split} games" if data_dir is None else f"{data_dir} (split {split})"
        raise DataFormatError(
            where, None, f"no games of task type(s) {', '.join(task_types)} ({len(entries)} games of other types)"
        )
    _list_cache[key] = kept
    return list(kept)


def _list_bundled(split: str) -> list[GameEntry]:
    folder = BUNDLED_DIR / split
    entries = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        data = load_authored(path)
        entries.append(GameEntry(path.stem, str(path), data["task_type"], True))
    if not entries:
        raise DataFormatError(folder, None, "no bundled games: the package is incomplete; reinstall twice-envs or run "
                              "`python -m twice_envs.envs.alfworld.generator` to write them")
    return entries


def resolve_data_dir(data_dir: str, split: str) -> Path:
    """The folder holding ``split``'s games under ``data_dir`` (``$VARS`` and ``~`` expanded)."""
    raw = data_dir = check_data_dir(data_dir)
    if raw is None:
        raise ValueError("resolve_data_dir needs a data_dir; the bundled games have no data_dir")
    if "$" in data_dir:
        var = DATA_ENV_VAR if DATA_ENV_VAR in data_dir else data_dir
        data_dir = os.path.expandvars(data_dir)
        if "$" in data_dir:
            raise TwiceError(
                f"data_dir {raw!r} names an environment variable that is not set ({var}). Download the games "
                f"with `alfworld-download` and `export {DATA_ENV_VAR}=<folder>`, or pass data_dir='/path/to/data'"
            )
        if not data_dir.strip():
            raise ValueError(
                f"ALFWorld data_dir {raw!r} is empty once expanded (the variable is set to {data_dir!r}): it would "
                f"name the current folder. Set it to the folder of your games, or pass data_dir=None for the bundled games"
            )
    root = Path(os.path.expanduser(data_dir))
    if not root.is_dir():
        raise TwiceError(f"ALFWorld data_dir {root} (from {raw!r}) is not a folder")
    for parent in (root / "json_2.1.1", root):
        if (parent / split).is_dir():
            return parent / split
        # A folder laid out by split must hold this split: never serve another split's games.
        present = [s for s in SPLITS if (parent / s).is_dir()]
        if present:
            raise DataFormatError(
                parent, None, f"no {split!r} split folder here (it holds {', '.join(present)}); "
                f"download that split with `alfworld-download` or choose split={present[0]!r}"
            )
    if root.name in SPLITS and root.name != split:  # data_dir names another split's folder
        raise DataFormatError(root, None, f"this is the {root.name!r} split folder, but split={split!r} was asked for")
    return root


def _index_stamp(files: list[tuple[str, os.stat_result]]) -> str:
    h = hashlib.sha256()
    for rel, st in files:
        h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _list_real(data_dir: str, split: str) -> list[GameEntry]:
    folder = resolve_data_dir(data_dir, split)
    authored = sorted(folder.glob("*.json"))
    if authored:  # generated games in the bundled format
        return [GameEntry(p.stem, str(p), load_authored(p)["task_type"], True) for p in authored]
    found: list[tuple[str, os.stat_result]] = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        if GAME_FILE in files:
            rel = os.path.relpath(root, folder)
            # ALFWorld does not support these trajectories in text (movable receptacles, slicing).
            if "movable" in rel or "Sliced" in rel:
                continue
            found.append((rel, os.stat(os.path.join(root, GAME_FILE))))
    found.sort(key=lambda item: item[0])
    if not found:
        raise DataFormatError(
            folder, None,
            f"no ALFWorld games ({GAME_FILE} files) here. Expected $ALFWORLD_DATA/json_2.1.1/{split}/<task>/<trial>/"
            f"{GAME_FILE}: run `alfworld-download` and point data_dir at the folder it filled",
        )
    index = _cached_index(folder, found)
    entries = []
    for rel, _ in found:
        task_type, solvable = index[rel]
        if solvable:
            entries.append(GameEntry(rel, str(folder / rel / GAME_FILE), task_type, False))
    return entries


def _cached_index(folder: Path, found: list[tuple[str, os.stat_result]]) -> dict[str, tuple[str, bool]]:
    """Task type and solvability of each game, cached on disk (reading 3,000 games takes seconds).

    The cache file records the sha256 of what it holds: a damaged one is named in a
    ``RuntimeWarning`` and computed again.
    """
    stamp = _index_stamp(found)
    cache_file = cache_dir("alfworld", "index") / (hashlib.sha256(str(folder).encode()).hexdigest()[:24] + ".v2.json")
    if os.path.lexists(cache_file):
        try:
            saved = read_json(cache_file)
            if saved["sha256"] != _index_digest(saved["stamp"], saved["games"]):
                raise DataFormatError(cache_file, None, "its contents do not match the sha256 it records")
            if saved["stamp"] == stamp:
                return {rel: (t, bool(s)) for rel, t, s in saved["games"]}
        except (KeyError, TypeError, ValueError) as exc:  # DataFormatError is a ValueError
            warnings.warn(f"cached ALFWorld game index unusable, computing it again: {cache_file}: "
                          f"{type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)
            if not cache_file.is_file():
                discard(cache_file)
    index: dict[str, tuple[str, bool]] = {}
    for rel, _ in found:
        index[rel] = (_task_type_of(folder / rel), _is_solvable(folder / rel / GAME_FILE))
    games = [[r, t, s] for r, (t, s) in sorted(index.items())]
    atomic_write_text(cache_file, json.dumps({"stamp": stamp, "games": games, "sha256": _index_digest(stamp, games)}))
    return index


def _index_digest(stamp: str, games: list) -> str:
    return hashlib.sha256(json.dumps([stamp, games], sort_keys=True).encode()).hexdigest()


def _task_type_of(game_dir: Path) -> str:
    for part in reversed(game_dir.parts):
        head = part.split("-", 1)[0]
        if head in TASK_TYPES:
            return head
    traj = game_dir / "traj_data.json"
    if traj.is_file():
        task_type = _read_json(traj).get("task_type")
        if task_type in TASK_TYPES:
            return task_type
        raise DataFormatError(traj, None, f"unknown task_type {task_type!r}")
    raise DataFormatError(game_dir, None, "cannot tell the task type: no <task_type>-... folder name and no traj_data.json")


def _is_solvable(path: Path) -> bool:
    data = _read_json(path)
    return data.get("solvable", True) is not False
