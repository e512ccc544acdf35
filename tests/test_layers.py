"""Dependencies point one way: core <- envs <- wrappers <- agents <- integrations.

Every ``import`` of every module, including imports inside functions and
``importlib.import_module("...")`` with a literal name, is read from the source.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: layer rank of each import-package prefix (the longest matching prefix wins)
RANKS = {
    "twice_envs": 0,
    "twice_envs.envs": 1,
    "twice_envs.wrappers": 2,
    "twice_envs.agents": 3,
    "twice_envs.integrations": 4,
}
#: source folder -> import package (pyproject maps wrappers/ and agents/ into twice_envs)
SOURCES = {
    "twice_envs": "twice_envs",
    "wrappers": "twice_envs.wrappers",
    "agents": "twice_envs.agents",
}
#: The one upward edge allowed: ``import twice_envs`` registers the built-in ids (whose
#: entry points are strings, so no env module is imported with it).
ALLOWED = {("twice_envs", "twice_envs.envs")}
NAMES = {"core": 0, "envs": 1, "wrappers": 2, "agents": 3}


def rank(module: str) -> int | None:
    best = None
    for prefix, r in RANKS.items():
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, r)
    return None if best is None else best[1]


def modules(root: Path = ROOT, sources: dict = SOURCES) -> list[tuple[str, Path]]:
    out = []
    for folder, package in sources.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out.append((".".join([package, *parts]), path))
    return out


def imports(module: str, path: Path) -> list[tuple[int, str]]:
    """``(line, imported module)`` for every import in the file, wherever it is."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")
                parent = parent[: len(parent) - (node.level - 1)]
                base = ".".join(parent + ([base] if base else []))
            # `from twice_envs import wrappers` imports the subpackage
            found += [(node.lineno, f"{base}.{a.name}" if rank(f"{base}.{a.name}") != rank(base) else base) for a in node.names]
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__"))
            )
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def violations(root: Path = ROOT, sources: dict = SOURCES) -> list[str]:
    out = []
    for module, path in modules(root, sources):
        own = rank(module)
        for line, target in imports(module, path):
            r = rank(target)
            if r is not None and r > own and (module, target) not in ALLOWED:
                out.append(f"{path.relative_to(root)}:{line}: {module} imports {target}")
    return out


def test_no_module_imports_a_higher_layer():
    assert violations() == []


def test_the_scan_sees_imports_in_functions_and_by_name(tmp_path):
    # the scan is not vacuous: it reads the layers' real downward imports ...
    seen = {(rank(m), rank(t)) for m, p in modules() for _, t in imports(m, p) if rank(t) is not None}
    assert {(2, 0), (3, 2), (1, 0)} <= seen
    # ... and it catches a core module that reaches up inside a function or by name
    fake = tmp_path / "twice_envs"
    fake.mkdir()
    (fake / "check.py").write_text(
        "def f():\n    from twice_envs.wrappers.twin import twin\n"
        "def g():\n    import importlib\n    importlib.import_module('twice_envs.agents.rollout')\n"
        "from . import envs\n"
    )
    found = violations(tmp_path, {"twice_envs": "twice_envs"})
    assert len(found) == 3 and all("twice_envs.check imports" in v for v in found)


@pytest.mark.parametrize("layer", sorted(NAMES, key=NAMES.get))
def test_every_layer_is_scanned(layer):
    assert any(rank(m) == NAMES[layer] for m, _ in modules())
