"""Built-in environments. Each subpackage's ``specs`` module registers its ids.

Registration is import-light: the specs name entry points as strings, so listing or
making one env never imports the others (or their optional dependencies).
"""

from __future__ import annotations

import importlib
import pkgutil


def _register_builtin() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.ispkg:
            try:
                importlib.import_module(f"{__name__}.{info.name}.specs")
            except ModuleNotFoundError as exc:
                if exc.name != f"{__name__}.{info.name}.specs":
                    raise


_register_builtin()
