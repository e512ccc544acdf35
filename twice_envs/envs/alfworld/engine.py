"""The real ALFWorld engine (TextWorld's PDDL env + ALFWorld's name demangler), pooled.

The engine's state lives in a private copy of the fast-downward shared library, so it
cannot be copied or pickled: forks replay. What *can* be shared is everything that
does not change during an episode, so this module keeps, per process:

* the translated planning task of each problem (``fast_downward.pddl2sas`` output; a
  pure function of the domain and problem text), so a reset never re-translates;
* the parsed game logic (the grammar and action templates) of each game, so loading
  a game into another library copy never re-parses it;
* the parse trees of the grammar snippets and queries the engine renders on every
  step, and shallow copies of its rendering contexts (same text, ~10x faster steps);
* a pool of idle engines, each a library copy with a game loaded, so a fork of a game
  that is already loaded takes an engine off the shelf and only resets it.

A reset then costs one ``load_sas`` in the native library plus the admissible
commands of the first state. The caches are installed into the engine's modules
once per process; :func:`plain_engine` undoes them (the tests compare both engines
text for text, the benchmark times both).

Threads: each env holds its own engine (its own library copy), but the engine's
parsers (TextWorld keeps its tatsu parsers in module globals, and a parse keeps its
state on the parser), its PDDL translator (fast downward's, which rewrites
``sys.argv``, its module options and ``sys.stdout``) and the parsed game logic are
shared by the whole process. :data:`LOCK`, one re-entrant lock per process, guards
each of them: every parser entry point, the translator and the construction of a
planning state (which writes into the shared logic) are wrapped with it, with or
without the caches, and so is loading a game into an engine. Everything else a reset
or a step does touches only its own engine, or only reads the shared logic and
grammar. With the caches warm a step never parses, so the lock is rarely taken and
threads (one env per thread) stay usable; tests check episodes played in threads
against the same episodes played by one thread. A fork waits until no thread holds
the lock, so a forked child never inherits a parse in progress.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import os
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from twice_envs._deps import require
from twice_envs.errors import TwiceError

#: Games whose translations and parsed logic each process keeps.
CACHE_SIZE = 64
#: Idle engines of other games a process keeps warm before it reloads one of them
#: instead of copying the planner library again. Library copies are never unloaded
#: (unloading fast-downward crashes the interpreter at exit), so a process holds as
#: many as it ever used at once, plus this many.
MAX_IDLE_ENGINES = 4

NOTHING_HAPPENS = "Nothing happens."


class PlannerTimeout(TwiceError):
    """The engine's planner did not answer within the time limit."""


@dataclass(frozen=True)
class GameData:
    """A complete game, as the engine reads it.

    Attributes:
        name: the game's name in its collection (a relative path for real data).
        domain: PDDL domain text (ALFWorld's ``alfred.pddl``).
        grammar: text grammar (ALFWorld's ``alfred.twl2`` with the task sentence filled in).
        problem: PDDL problem text.
        walkthrough: a known solution, if the game file has one.
        task_type: one of the six ALFWorld task types.
        goal: the task sentence.
        pddl_params: ALFWorld's task parameters (object_target, parent_target, ...).
        path: the game file on disk, when it has one.
    """

    name: str
    domain: str
    grammar: str
    problem: str
    walkthrough: tuple[str, ...] = ()
    task_type: str = ""
    goal: str = ""
    pddl_params: dict = field(default_factory=dict, compare=False, hash=False)
    path: Optional[str] = None

    @functools.cached_property
    def key(self) -> str:
        """Content hash: two games with one key behave identically."""
        h = hashlib.sha256()
        for part in (self.domain, self.grammar, self.problem):
            h.update(part.encode("utf-8"))
            h.update(b"\x00")
        return h.hexdigest()

    def as_json(self) -> dict:
        """The ``game.tw-pddl`` JSON the engine loads."""
        data = {"pddl_domain": self.domain, "grammar": self.grammar, "pddl_problem": self.problem, "solvable": True}
        if self.walkthrough:
            data["walkthrough"] = list(self.walkthrough)
        return data


class _LRU(OrderedDict):
    def __init__(self, size: int = CACHE_SIZE) -> None:
        super().__init__()
        self.size = size

    def get_or(self, key: Any, build: Callable[[], Any]) -> Any:
        if key in self:
            self.move_to_end(key)
            return self[key]
        value = build()
        self[key] = value
        while len(self) > self.size:
            self.popitem(last=False)
        return value


_translations: _LRU = _LRU(2 * CACHE_SIZE)  # two translations per game
_logics: _LRU = _LRU()
_names: _LRU = _LRU()
#: Guards the engine's process-wide state (parsers, translator, shared game logic, the
#: caches of this module): see the module docstring. Re-entrant: a guarded load calls
#: guarded parsers.
LOCK = threading.RLock()
_lock = LOCK
if hasattr(os, "register_at_fork"):
    # A fork while another thread parses would give the child a parser in mid-parse and a
    # lock that no thread of the child holds: fork only between guarded calls.
    os.register_at_fork(before=LOCK.acquire, after_in_parent=LOCK.release, after_in_child=LOCK.release)


def _modules() -> tuple[Any, Any, Any, Any]:
    """Import the engine (raises MissingExtra with the pip command when absent)."""
    require("alfworld", "alfworld", "the ALFWorld env")
    textworld = require("textworld", "alfworld", "the ALFWorld env")
    fast_downward = require("fast_downward", "alfworld", "the ALFWorld env (fast-downward-textworld)")
    pddl = require("textworld.envs.pddl", "alfworld", "the ALFWorld env (textworld[pddl])")
    from textworld.envs.pddl import logic as pddl_logic

    with LOCK:  # two threads making their first env at once install each wrapper once
        _install_locks(fast_downward, pddl_logic)
        if not _caches_disabled:
            _install_translation_cache(fast_downward)
            _install_text_caches()
    return textworld, fast_downward, pddl, pddl_logic


def _locked(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` called under :data:`LOCK` (marked, so it is wrapped once)."""

    @functools.wraps(function)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        with LOCK:
            return function(*args, **kwargs)

    guarded._twice_locked = True  # type: ignore[attr-defined]
    return guarded


def _install_locks(fast_downward: Any, pddl_logic: Any) -> None:
    """Guard the engine's shared, non-thread-safe entry points with :data:`LOCK` (once per process).

    * TextWorld's three tatsu parsers (the logic language, the PDDL logic and the text
      grammar) are module globals whose parse state lives on the parser object: two
      threads inside one corrupt each other's parse (``IndexError: pop from empty
      list`` from ``tatsu/contexts.py``, or a wrong tree).
    * fast downward's translator rewrites ``sys.argv``, its module options and
      ``sys.stdout`` while it runs.
    * a new planning state (``PddlState``, built by every load and reset) adds the
      translator's types to the game logic, which all engines of the game share.

    The wrappers go under the caches (installed afterwards, they wrap these), so
    :func:`plain_engine` keeps them.
    """
    import textworld.logic as tw_logic
    from textworld.envs.pddl import textgen

    targets = [(module, "_parse_and_convert") for module in (tw_logic, pddl_logic, textgen)]
    # TextWorld's own game logic calls its parser directly, not through _parse_and_convert.
    targets += [(tw_logic.GameLogic, "_parse"), (pddl_logic.PddlState, "__init__"), (fast_downward, "pddl2sas")]
    for owner, name in targets:
        function = getattr(owner, name)
        # Below a cache wrapper (``__wrapped__``) sits the guarded function once installed.
        below = getattr(function, "__wrapped__", None)
        if getattr(function, "_twice_locked", False) or getattr(below, "_twice_locked", False):
            continue
        setattr(owner, name, _locked(function))


def _install_translation_cache(fast_downward: Any) -> None:
    """Memoise ``fast_downward.pddl2sas`` (a pure function of its text arguments).

    The engine calls it twice on every reset; with the cache a reset skips the Python
    translator entirely. The original also overwrites ``sys.argv``; the wrapper puts
    it back.
    """
    original = fast_downward.pddl2sas
    if getattr(original, "_twice_cached", False):
        return

    def pddl2sas(domain: str, problem: str, verbose: bool = False, optimize: bool = False):
        key = (hashlib.sha256(domain.encode()).hexdigest(), hashlib.sha256(problem.encode()).hexdigest(), bool(optimize))
        with _lock:
            if key in _translations:
                _translations.move_to_end(key)
                return _translations[key]
            argv = list(sys.argv)
            try:
                result = original(domain, problem, verbose=verbose, optimize=optimize)
            finally:
                sys.argv[:] = argv
            return _translations.get_or(key, lambda: result)

    pddl2sas._twice_cached = True  # type: ignore[attr-defined]
    pddl2sas.__wrapped__ = original  # type: ignore[attr-defined]
    fast_downward.pddl2sas = pddl2sas


def _install_text_caches() -> None:
    """Memoise the engine's parsing of grammar snippets and queries (pure functions of their text),
    and copy rendering contexts shallowly.

    The engine re-parses, with a PEG parser, every template and condition it renders
    on every step (the admissible commands alone need dozens), which is most of a
    step's cost. The cached parse trees are deep-copied on each use, exactly as a fresh
    parse would hand out new objects; conjunctive queries are immutable rules. The
    equivalence is tested against the plain engine on every bundled game.
    """
    from textworld.envs.pddl import textgen
    from textworld.logic import Rule

    parse = textgen._parse_and_convert
    if not getattr(parse, "_twice_cached", False):
        trees: dict = {}

        def parse_and_convert(text: str, rule_name: str = "start", trace: bool = False, **kwargs: Any) -> Any:
            if trace or kwargs:
                return parse(text, rule_name=rule_name, trace=trace, **kwargs)
            key = (text, rule_name)
            tree = trees.get(key)
            if tree is None:
                tree = trees[key] = parse(text, rule_name=rule_name)
            return copy.deepcopy(tree)

        parse_and_convert._twice_cached = True  # type: ignore[attr-defined]
        parse_and_convert.__wrapped__ = parse  # type: ignore[attr-defined]
        textgen._parse_and_convert = parse_and_convert

    copy_context = textgen.copy_context
    if not getattr(copy_context, "_twice_cached", False):
        # The engine deep-copies every rendering context (entity infos included) for
        # each symbol it expands; the contexts' dicts are updated, their values are only
        # read, so copying the dicts gives the same text for a fraction of the cost.
        def shallow_copy_context(context: dict) -> dict:
            return {
                "state": context["state"],
                "facts": context["facts"],
                "variables": dict(context["variables"]),
                "mapping": dict(context["mapping"]),
                "entity_infos": context["entity_infos"],
            }

        shallow_copy_context._twice_cached = True  # type: ignore[attr-defined]
        shallow_copy_context.__wrapped__ = copy_context  # type: ignore[attr-defined]
        textgen.copy_context = shallow_copy_context

    query = Rule.__dict__["parse_conjunctive_query"].__func__
    if not getattr(query, "_twice_cached", False):
        rules: dict = {}

        def parse_conjunctive_query(cls: type, expr: str) -> Any:
            rule = rules.get((cls, expr))
            if rule is None:
                rule = rules[(cls, expr)] = query(cls, expr)
            return rule

        parse_conjunctive_query._twice_cached = True  # type: ignore[attr-defined]
        parse_conjunctive_query.__wrapped__ = query  # type: ignore[attr-defined]
        Rule.parse_conjunctive_query = classmethod(parse_conjunctive_query)


def plain_engine() -> None:
    """Undo the caches of this module in this process (to measure or compare the plain engine)."""
    import fast_downward
    from textworld.envs.pddl import textgen
    from textworld.logic import Rule

    if getattr(fast_downward.pddl2sas, "_twice_cached", False):
        fast_downward.pddl2sas = fast_downward.pddl2sas.__wrapped__
    if getattr(textgen._parse_and_convert, "_twice_cached", False):
        textgen._parse_and_convert = textgen._parse_and_convert.__wrapped__
    if getattr(textgen.copy_context, "_twice_cached", False):
        textgen.copy_context = textgen.copy_context.__wrapped__
    query = Rule.__dict__["parse_conjunctive_query"].__func__
    if getattr(query, "_twice_cached", False):
        Rule.parse_conjunctive_query = classmethod(query.__wrapped__)
    global _caches_disabled
    _caches_disabled = True


_caches_disabled = False


def _logic_for(game: GameData) -> Any:
    _, _, _, pddl_logic = _modules()
    key = (hashlib.sha256(game.domain.encode()).hexdigest(), hashlib.sha256(game.grammar.encode()).hexdigest())
    with _lock:
        return _logics.get_or(key, lambda: pddl_logic.GameLogic(domain=game.domain, grammar=game.grammar))


def _demangled_names(key: str, entity_infos: dict) -> dict[str, str]:
    """ALFWorld's display names ("apple 1") for the entity ids of a game, cached per game."""

    def build() -> dict[str, str]:
        from alfworld.agents.utils.misc import Demangler

        demangler = Demangler(game_infos=entity_infos, shuffle=False)
        return {eid: demangler.demangle_alfred_name(eid) for eid in entity_infos}

    with _lock:
        return _names.get_or(key, build)


class Engine:
    """One copy of the planner library with one game loaded (TextWorld's ``PddlEnv``)."""

    def __init__(self, facts: bool = False) -> None:
        textworld, _, pddl, _ = _modules()
        infos = textworld.EnvInfos(won=True, admissible_commands=True, facts=facts)
        self._env = pddl.PddlEnv(infos)
        #: The engine's last game state (TextWorld ``GameState``: feedback, facts if asked, ...).
        self.state: Any = None
        self.game: Optional[GameData] = None
        self.key: Optional[str] = None
        self.admissible: list[str] = []
        self.won = False
        self.poisoned = False

    def load(self, game: GameData) -> None:
        """Load ``game`` into this library copy (the parsed logic comes from the cache)."""
        _, _, _, pddl_logic = _modules()
        with LOCK:
            self._load(game, pddl_logic)

    def _load(self, game: GameData, pddl_logic: Any) -> None:
        env = self._env
        data = game.as_json()
        try:
            # The same steps as PddlEnv.load, but with the shared parsed logic.
            env._game_data = data
            env._game_file = game.path
            env.walkthrough = data.get("walkthrough")
            env._logic = _logic_for(game)
            env._pddl_state = pddl_logic.PddlState(env.downward_lib, game.problem, env._logic)
            env._entity_infos = env._get_entity_infos()
        except AttributeError:  # a TextWorld whose internals moved: take the plain path
            env.load(data)
        key = game.key
        names = _demangled_names(key, env._entity_infos)
        for eid, info in env._entity_infos.items():
            info.name = names[eid]
        self.game, self.key = game, key

    def reset(self) -> str:
        """Start the loaded game; returns the first observation."""
        state = self.state = self._env.reset()
        self.admissible = list(state["admissible_commands"])
        self.won = bool(state["won"])
        return state.feedback

    def step(self, command: str) -> str:
        """Apply a command (one that is not admissible gets the engine's "Nothing happens.")."""
        state, _, _ = self._env.step(command)
        self.state = state
        self.admissible = list(state["admissible_commands"])
        self.won = bool(state["won"])
        return state.feedback

    def facts(self) -> list[Any]:
        """The current state's facts (TextWorld propositions with engine ids)."""
        return list(self._env._pddl_state.facts)

    def plan(self, timeout_s: float) -> list[str]:
        """The engine's planner (fast downward) from the current state, as commands.

        The planner runs in native code that cannot be interrupted, so it runs in a
        daemon thread; past ``timeout_s`` this engine is abandoned (never reused) and
        :class:`PlannerTimeout` is raised.
        """
        result: dict[str, Any] = {}
        state = self._env._pddl_state
        infos = self._env._entity_infos

        def run() -> None:
            try:
                result["plan"] = state.replan(infos)
            except BaseException as exc:  # noqa: BLE001 -- reported to the caller
                result["error"] = exc

        thread = threading.Thread(target=run, name="alfworld-planner", daemon=True)
        thread.start()
        thread.join(timeout_s)
        if thread.is_alive():
            self.poisoned = True
            raise PlannerTimeout(
                f"the planner found no plan within {timeout_s:g} s for game {self.game.name if self.game else '?'}; "
                "the planner thread was abandoned (raise timeout_s if the game is large)"
            )
        if "error" in result:
            raise TwiceError(f"the planner failed on game {self.game.name if self.game else '?'}: {result['error']}")
        return list(result.get("plan") or [])


class EnginePool:
    """Idle engines of this process, by game; forks take one instead of loading again."""

    def __init__(self, max_idle: int = MAX_IDLE_ENGINES) -> None:
        self.max_idle = max_idle
        self._idle: list[Engine] = []
        self._lock = threading.Lock()
        self.created = 0
        self.reused = 0

    def acquire(self, game: GameData) -> Engine:
        """An engine with ``game`` loaded: an idle one of this game, else a reloaded idle one, else a new one."""
        key = game.key
        with self._lock:
            for i in range(len(self._idle) - 1, -1, -1):
                if self._idle[i].key == key:
                    self.reused += 1
                    return self._idle.pop(i)
            engine = self._idle.pop(0) if len(self._idle) >= self.max_idle else None
        if engine is None:
            engine = Engine()
            self.created += 1
        engine.load(game)
        return engine

    def release(self, engine: Optional[Engine]) -> None:
        """Give an engine back (a poisoned one is dropped)."""
        if engine is None or engine.poisoned:
            return
        with self._lock:
            if engine not in self._idle:
                self._idle.append(engine)

    @property
    def idle(self) -> int:
        """Engines waiting in the pool."""
        return len(self._idle)


#: The per-process pool every ALFWorld env draws from.
POOL = EnginePool()
