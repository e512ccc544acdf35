"""The trust rule: what a file from elsewhere may make an env do.

A record, a run folder's ``config.json``, an audit folder, an explorer input or the
forkserver's ``$TWICE_FORKSERVER_PRELOAD`` is data, and data is never trusted more than a
record:

* an env id read from it is looked up in the registry only (:func:`registered_id`):
  in the ``"module:Env-v0"`` form, which makes :func:`~twice_envs.make` import ``module``,
  the module is never imported, so ``Env-v0`` must be registered already;
* kwargs that name files or folders (:func:`path_kwargs`: a journal, a corpus, question
  or product files, data folders, caches, and any kwarg the env class declares in
  ``path_kwargs``) go to ``make`` only with the user's consent (``trusted=True``,
  ``--trust-kwargs``), since they would let the file choose where the env reads and
  writes (:func:`check_path_consent`, whose error names the kwargs and the file).

Every reader applies these two functions; :func:`twice_envs.replay` is one of them.
"""

from __future__ import annotations

from typing import Any, Callable, Collection, Mapping, Union

from twice_envs.errors import TwiceError
from twice_envs.registry import entry_point, registry

#: Kwarg names that name files or folders in any env.
PATH_NAMES = ("journal", "corpus", "questions", "products", "data", "cache", "path", "dir", "root")
#: Kwarg name endings that name files or folders in any env.
PATH_SUFFIXES = ("_path", "_paths", "_dir", "_dirs", "_root", "_file", "_files", "_folder", "_journal", "_cache")
#: The prefix gymnasium's registry gives twice_envs ids.
GYM_PREFIX = "twice_envs/"


class UntrustedInput(TwiceError, ValueError):
    """An env id or kwargs read from a file (or the environment) that the trust rule refuses."""


def registered_id(env_id: Any, source: str) -> str:
    """The registry key of an env id read from ``source``, found without importing anything.

    ``"twice_envs/X"`` names ``"X"``. The name must be registered already: in an id of the
    ``"module:Env-v0"`` form the module is never imported, so ``Env-v0`` must be registered
    (by a module imported before).

    Raises:
        UntrustedInput: the id is not a string, or its name is not registered (an id that
            names a module says so); the message names ``source`` and the id.
    """
    if not isinstance(env_id, str):
        raise UntrustedInput(f"{source}: the env id must be a string, found {type(env_id).__name__} {env_id!r:.80}")
    module, _, name = env_id.removeprefix(GYM_PREFIX).rpartition(":")
    if name in registry:
        return name
    if module:
        raise UntrustedInput(
            f"{source}: env id {env_id!r:.200} names a module to import ({module!r:.120}), and {name!r:.80} is not "
            "registered; an env id read from a file is looked up among the registered envs only, and nothing is "
            f"imported. If you trust that module, import it yourself (it registers {name!r:.80})."
        )
    raise UntrustedInput(
        f"{source}: env id {env_id!r:.200} is not registered here; import the module that registers it first "
        "(`twice envs` lists the registered ids)"
    )


def path_kwargs(env_id: str, kwargs: Mapping[str, Any]) -> list[str]:
    """The kwargs of ``kwargs`` for ``env_id`` that name files or folders and need consent.

    A kwarg needs consent when its name is a path name (:data:`PATH_NAMES`, an ending
    in :data:`PATH_SUFFIXES`, or the env class's ``path_kwargs``), it is not ``None``,
    and it differs from the value the env's registration gives it (a path the
    installed code chose is not the file's choice). For an id that is not registered (yet),
    the names alone decide.
    """
    spec = registry.get(env_id)
    declared = tuple(getattr(entry_point(spec), "path_kwargs", ())) if spec is not None else ()
    defaults = (spec.kwargs or {}) if spec is not None else {}
    out = []
    for name, value in kwargs.items():
        if value is None or (name in defaults and defaults[name] == value):
            continue
        lowered = str(name).lower()
        if name in declared or lowered in PATH_NAMES or lowered.endswith(PATH_SUFFIXES):
            out.append(name)
    return sorted(out)


def check_path_consent(
    env_id: str,
    kwargs: Mapping[str, Any],
    *,
    source: str,
    trusted: bool,
    consent: Union[str, Callable[[list[str]], str]],
    exempt: Collection[str] = (),
) -> None:
    """Raise unless every file or folder kwarg of ``kwargs`` (read from ``source``) has consent.

    Args:
        env_id: the registered id the kwargs go to.
        kwargs: the kwargs read from ``source``.
        source: the file (or variable) they were read from, named in the error.
        trusted: the user's consent: pass such kwargs on as they are.
        consent: how the user consents (the flag or argument), appended to the error; or a
            function of the names of the kwargs that returns it.
        exempt: kwargs the user named themselves (overrides), which need no consent.

    Raises:
        UntrustedInput: naming each such kwarg with its value, and ``source``.
    """
    if not isinstance(kwargs, Mapping):
        raise UntrustedInput(f"{source}: the env kwargs must be a JSON object, found {type(kwargs).__name__}")
    if trusted:
        return
    named = [k for k in path_kwargs(env_id, kwargs) if k not in exempt]
    if named:
        shown = ", ".join(f"{k}={kwargs[k]!r:.200}" for k in named)
        raise UntrustedInput(
            f"{source} names files or folders in its kwargs for {env_id} ({shown}); the env would read and write "
            f"where {source} says. {consent(named) if callable(consent) else consent}"
        )
