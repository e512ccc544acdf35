"""Import optional dependencies with an error that names the extra to install."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from twice_envs.errors import MissingExtra


def require(module: str, extra: str, what: str = "") -> ModuleType:
    """Import ``module`` or raise :class:`MissingExtra` naming ``pip install 'twice-envs[extra]'``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtra(module, extra, what) from exc


def available(module: str) -> bool:
    """Whether ``module`` can be imported (without importing it twice)."""
    return importlib.util.find_spec(module) is not None
