"""Worker processes that share one loaded env: a forkserver that has made the envs once.

Many worker processes on one machine (a vector env, a ``multiprocessing`` pool, an
agent-loop's workers) each making ``SearchQA-v0`` over one index share the index's
memory-mapped files, but each also keeps its own interpreter heap: the imports, the
env's questions and lookup tables, and the pages of its parent's heap that Python's
reference counts and garbage collector write to. :func:`preload_forkserver` has
multiprocessing's forkserver import the envs' modules, **make each env once** (which loads
and caches the process-wide resources: index maps, passage store, questions, catalogue),
collect garbage and ``gc.freeze()`` what is left, before it forks any worker. Every
worker it forks then finds the resources loaded, and shares them copy-on-write::

    import multiprocessing, twice_envs
    from twice_envs.workers import preload_forkserver

    spec = ("SearchQA-v0", {"corpus": "wiki-18.jsonl"})
    preload_forkserver([spec])                      # before the first forkserver worker
    ctx = multiprocessing.get_context("forkserver")
    with ctx.Pool(8) as pool:                       # each worker's make() is a cache hit
        ...
    # and twice_envs.make_vec(id, n, vectorization_mode="async", context="forkserver")

What it measures (``twice bench searchqa --workers 8 --start-method forkserver``, see the
scaling page): 8 workers on one 1M-passage index, each forked from a server that has made
the env, use far less memory than 8 fresh interpreters.

Choices:

* The specs travel to the server in the environment variable
  :data:`ENV_VAR` (JSON), which the server reads once when it starts; so kwargs must be
  JSON values (paths as strings). A running forkserver has already read it:
  ``preload_forkserver`` stops it (``restart=True``, the default; workers it already
  forked keep running) so that the next forkserver worker starts a server with the new
  specs, or raises with ``restart=False``.
* An env that cannot be made in the server (a missing file, say) does not stop the
  server: it writes one line naming the env and the error to stderr, and each worker
  then makes that env itself (and meets the same error where it matters). Nor does a
  variable that is not JSON or not of this shape: the hook never raises, and reports
  each fault on stderr.
* Ids are looked up in the registry only, here and in the server
  (:func:`twice_envs.trust.registered_id`): the module of a ``"module:Env-v0"`` id is never
  imported, so an id that is not registered is refused before anything is imported. Modules
  the server must import (one that registers an id at run time) go in ``modules``.
* Only ``forkserver`` uses this. ``fork`` shares whatever the parent process has loaded
  (make the env in the parent before forking); ``spawn`` and Ray actors start fresh
  interpreters, which share only the mapped files.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import sys
from collections.abc import Iterable, Sequence
from multiprocessing import forkserver
from typing import Any

from twice_envs.errors import TwiceError
from twice_envs.registry import make
from twice_envs.trust import registered_id

#: The environment variable that carries the specs to the forkserver (JSON).
ENV_VAR = "TWICE_FORKSERVER_PRELOAD"
#: The module the forkserver imports last; importing it makes the envs and freezes the heap.
HOOK_MODULE = "twice_envs._forkserver_hook"

__all__ = ["ENV_VAR", "HOOK_MODULE", "forkserver_pid", "forkserver_running", "preload_forkserver", "stop_forkserver"]


def _specs(specs: Iterable[Any]) -> list:
    out = []
    for i, item in enumerate(specs):
        if isinstance(item, str):
            env_id, kwargs = item, {}
        elif isinstance(item, (tuple, list)) and len(item) == 2:
            env_id, kwargs = item
        else:
            env_id, kwargs = None, None
        if not isinstance(env_id, str) or not isinstance(kwargs, dict):
            raise TwiceError(f"preload_forkserver: spec {i} must be an env id or (env id, kwargs dict), got {item!r}")
        key = registered_id(env_id, f"preload_forkserver: spec {i}")  # looked up, never imported
        try:
            json.dumps(kwargs, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise TwiceError(f"preload_forkserver: the kwargs of spec {i} ({env_id}) must be JSON values "
                             f"(they travel to the forkserver in ${ENV_VAR}): {exc}") from None
        out.append([key, kwargs])
    return out


def forkserver_pid() -> int | None:
    """The pid of this process's multiprocessing forkserver, None when none runs (read from
    multiprocessing's own state, which is not public API)."""
    return getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)


def forkserver_running() -> bool:
    """Whether this process's multiprocessing forkserver is running."""
    return forkserver_pid() is not None


def stop_forkserver() -> None:
    """Stop this process's forkserver, if one runs (the next forkserver worker starts a new
    one; workers already forked keep running). This uses multiprocessing's own stop method,
    which is not public API; it is checked on Python 3.11 to 3.13."""
    server = getattr(forkserver, "_forkserver", None)
    stop = getattr(server, "_stop", None)
    if stop is None:
        raise TwiceError("this Python's multiprocessing.forkserver has no _stop(): start the preloaded "
                         "forkserver before any other forkserver worker instead")
    stop()


def preload_forkserver(specs: Sequence[Any], *, modules: Sequence[str] = (), restart: bool = True) -> None:
    """Have the forkserver make each env of ``specs`` once before it forks workers.

    Args:
        specs: env ids, or ``(env_id, kwargs)`` pairs with JSON-valued kwargs, as given to
            :func:`twice_envs.make`.
        modules: more modules for the server to import first (the workers' own).
        restart: stop a forkserver that is already running, so that the next one reads
            these specs; with ``False`` a running server raises :class:`TwiceError`.

    Raises :class:`TwiceError` for an id that is not registered (the module of a
    ``"module:Env-v0"`` id is never imported: import it yourself and name it in ``modules``), a
    malformed spec or kwargs that are not JSON. Also sets multiprocessing's forkserver preload
    list (``set_forkserver_preload``) to ``modules`` followed by the hook that makes the envs.
    """
    encoded = json.dumps({"envs": _specs(specs)}, allow_nan=False)
    modules = [str(m) for m in modules]
    if forkserver_running():
        if not restart:
            raise TwiceError("the forkserver is already running: call preload_forkserver before the first "
                             "forkserver worker starts, or pass restart=True")
        stop_forkserver()
    os.environ[ENV_VAR] = encoded
    multiprocessing.set_forkserver_preload(modules + ["twice_envs", HOOK_MODULE])


def load_in_server(environ: dict | None = None, freeze: bool = True) -> list:
    """Run in the forkserver by :data:`HOOK_MODULE`: make, reset and close each env named in
    ``$TWICE_FORKSERVER_PRELOAD`` (its shared resources stay cached), collect garbage and
    ``gc.freeze()`` (unless ``freeze=False``).

    Never raises, whatever the variable holds (the server must keep running): a value that is
    not ``{"envs": [[env_id, kwargs], ...]}`` (entries may also be bare ids), an entry of
    another shape, an id that is not registered (looked up in the registry only: the module
    of a ``"module:Env-v0"`` id is never imported) or an env that cannot be made is
    reported on stderr, one line each, and skipped.

    Returns ``[(what, error or None), ...]``: ``what`` is the env id, or where in the variable
    the fault lies when there is no usable id.
    """
    environ = os.environ if environ is None else environ
    try:
        done = _preload(environ.get(ENV_VAR))
    except Exception as exc:  # noqa: BLE001 - nothing in the variable may stop the server
        done = [(f"${ENV_VAR}", f"{type(exc).__name__}: {exc}")]
    for what, error in done:
        if error is not None:
            try:
                print(f"twice_envs: the forkserver could not preload {what}: {error}; each worker makes its "
                      "envs itself", file=sys.stderr, flush=True)
            except Exception:  # noqa: BLE001,S110 - a closed stderr must not stop the server either
                pass
    gc.collect()
    if freeze:
        gc.freeze()  # the collector no longer writes to these objects, so forked workers share their pages
    return done


def _preload(raw: Any) -> list:
    """Check every entry of the variable's value ``raw`` first (nothing is made before all are
    checked), then make each env that passed; returns :func:`load_in_server`'s list."""
    if not raw:
        return []
    shape = 'expected {"envs": [[env id, kwargs], ...]}'
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        return [(f"${ENV_VAR}", f"${ENV_VAR} is not valid JSON ({type(exc).__name__}: {exc}); {shape}")]
    envs = data.get("envs") if isinstance(data, dict) else None
    if not isinstance(envs, list):
        found = f"a {type(data).__name__}" if not isinstance(data, dict) else f"envs = {envs!r:.80}"
        return [(f"${ENV_VAR}", f"${ENV_VAR} is not valid ({shape}, found {found})")]
    done: list = []
    todo = []
    for i, item in enumerate(envs):
        where = f"${ENV_VAR} entry {i}"
        env_id, kwargs = (item, {}) if isinstance(item, str) else (item if _is_pair(item) else (None, None))
        if not isinstance(kwargs, dict):
            done.append((where, f"expected an env id or [env id, kwargs object], found {item!r:.120}"))
            continue
        try:
            todo.append((registered_id(env_id, where), kwargs))
        except TwiceError as exc:
            done.append((where, str(exc)))
    for env_id, kwargs in todo:
        try:
            env = make(env_id, **kwargs)
            try:
                env.reset(seed=0)
            finally:
                env.close()
            done.append((env_id, None))
        except Exception as exc:  # noqa: BLE001 - reported, and each worker makes it itself
            done.append((env_id, f"{type(exc).__name__}: {exc}"))
    return done


def _is_pair(item: Any) -> bool:
    return isinstance(item, list) and len(item) == 2
