"""SearchQA: the Search-R1 protocol as a replayable, forkable env (see :mod:`.env`).

``register_search_tool(name, factory)`` plugs a custom replayable tool in as the
env's search (``make("SearchQA-v0", search_tool=name)``).
"""

from __future__ import annotations

from typing import Any, Callable


def register_search_tool(name: str, factory: Callable[[Any], Any]) -> None:
    """See :func:`twice_envs.envs.searchqa.resources.register_search_tool`."""
    from twice_envs.envs.searchqa.resources import register_search_tool as _register

    _register(name, factory)


__all__ = ["register_search_tool"]
