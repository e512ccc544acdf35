"""A credit method's settings: its config dataclass as JSON, as help text and as command-line flags.

A method registers a dataclass as its ``config`` (:func:`~.registry.register_credit`). Each field is
one setting; its help text is the field's ``metadata["help"]`` or else the string written under it
(an attribute docstring, as :class:`~.twice.TwiceConfig` writes them). From it:

* :func:`add_flags` gives ``twice train`` one flag per field, ``--PREFIX.FIELD`` (``--twice.beta``), the
  prefix being the name of the first registered method whose config the class is (one set of flags per
  class: ``--twice.beta`` sets the budget of every method that reads Twice's settings), and
  :func:`settings_from_flags` builds the chosen method's settings from them (a flag of another class is
  an error naming it);
* :func:`to_json` / :func:`from_json` store them in a run's ``config.json`` (an unknown field is an
  error naming it).
"""

from __future__ import annotations

import argparse
import ast
import inspect
import textwrap
import typing
from dataclasses import MISSING, asdict, fields, replace
from typing import Any, Optional

from twice_envs.agents.credit.registry import get_method, methods


def field_help(cls: type) -> dict[str, str]:
    """``field name -> help text`` of a config dataclass: ``metadata["help"]``, else the string literal
    written under the field in the class body (empty when there is neither)."""
    docs: dict[str, str] = {}
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    except (OSError, TypeError, SyntaxError):  # a class defined where no source is kept
        body = []
    for stmt, nxt in zip(body, body[1:]):
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and isinstance(nxt, ast.Expr) \
                and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
            docs[stmt.target.id] = " ".join(nxt.value.value.split())
    return {f.name: str(f.metadata.get("help", docs.get(f.name, ""))) for f in fields(cls)}


def flag_prefix(cls: type) -> str:
    """The flag prefix of a config class: the first registered method whose config it is."""
    return next(name for name in methods() if get_method(name).config is cls)


def _parser_of(kind: Any):
    """``str -> value`` for a field's annotated type (bool, int, float, str, and Optional of them)."""
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    optional = typing.get_origin(kind) is typing.Union and type(None) in typing.get_args(kind)
    base = args[0] if optional and len(args) == 1 else kind

    def parse(text: str):
        if optional and text.lower() == "none":
            return None
        if base is bool:
            if text.lower() not in ("true", "false", "1", "0"):
                raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
            return text.lower() in ("true", "1")
        if base in (int, float, str):
            return base(text)
        raise argparse.ArgumentTypeError(f"a setting of type {kind!r} cannot be given on the command line")

    parse.__name__ = getattr(base, "__name__", "value")  # argparse names the type in its error
    return parse


def config_classes() -> list[type]:
    """Each registered method's config class once, in registration order."""
    out: list[type] = []
    for name in methods():
        cls = get_method(name).config
        if cls is not None and cls not in out:
            out.append(cls)
    return out


def add_flags(parser: argparse.ArgumentParser) -> None:
    """One ``--PREFIX.FIELD`` flag per field of every registered config class, in a group per class
    (default: unset, so that only the flags given change the method's defaults)."""
    for cls in config_classes():
        prefix = flag_prefix(cls)
        users = [n for n in methods() if get_method(n).config is cls]
        group = parser.add_argument_group(f"{prefix} settings ({cls.__name__}; read by --method "
                                          f"{', '.join(users)})")
        hints = typing.get_type_hints(cls)
        helps = field_help(cls)
        for f in fields(cls):
            default = f.default if f.default is not MISSING else "(computed)"
            group.add_argument(f"--{prefix}.{f.name}", dest=f"{prefix}.{f.name}", type=_parser_of(hints[f.name]),
                               default=None, metavar=f.name.upper(),
                               help=f"{helps[f.name]} (default {default})".replace("%", "%%"))


def settings_from_flags(method: str, args: argparse.Namespace, base: Any = None) -> Any:
    """The settings of ``method``: ``base`` (default: the config's defaults) with the flags of its config class
    that were given; a flag of another class raises naming it. None for a method without settings."""
    cls = get_method(method).config
    given = {k: v for k, v in vars(args).items() if "." in k and v is not None}
    own = f"{flag_prefix(cls)}." if cls is not None else None
    stray = sorted(k for k in given if own is None or not k.startswith(own))
    if stray:
        reads = f"its settings are the --{own}* flags" if own else "it has no settings"
        raise ValueError(f"--{stray[0]} is not a setting of --method {method} ({reads})")
    if cls is None:
        return None
    values = {k[len(own):]: v for k, v in given.items()}
    return replace(base if base is not None else cls(), **values)


def to_json(settings: Any) -> Optional[dict]:
    """A method's settings as a JSON object (None for none)."""
    return None if settings is None else asdict(settings)


def from_json(method: str, data: Optional[dict], where: str = "credit") -> Any:
    """``method``'s settings from their JSON object (``where``: its place, named in errors); None or a
    missing object gives the defaults. A field the config class lacks raises naming it."""
    cls = get_method(method).config
    if cls is None:
        if data:
            raise ValueError(f"{where}: credit method {method!r} has no settings, but {sorted(data)} are given")
        return None
    if data is None:
        return cls()
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a JSON object of {cls.__name__} settings, found {data!r}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{where}.{unknown[0]}: not a setting of credit method {method!r} ({cls.__name__}: "
                         f"{', '.join(sorted(known))})")
    return cls(**data)
