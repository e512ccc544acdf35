"""Dependencies point one way: core <- envs <- wrappers <- agents <- integrations.

Every ``import`` of every module, including imports inside functions and
``importlib.import_module("...")`` with a literal name, is read from the source. Inside
``agents/`` the subpackages are layered too (:data:`AGENT_RANKS`), no two modules import
each other (directly or round a longer cycle), and string-named entry points
(``"package.module:function"``: the CLI's command tables) are edges of the graph, allowed only where :data:`COMPOSITION` declares them.
"""

from __future__ import annotations

import ast
import re
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


#: Layers inside agents/, lowest first: a module may import its own layer and those below.
AGENT_RANKS = {
    "twice_envs.agents": 0,
    "twice_envs.agents.types": 0,
    "twice_envs.agents.stats": 0,
    "twice_envs.agents.sampling": 1,
    "twice_envs.agents.credit": 2,
    "twice_envs.agents.rollout": 3,
    "twice_envs.agents.training": 4,
    "twice_envs.agents.models": 5,
    "twice_envs.agents.lab": 6,
    "twice_envs.agents.bench": 7,
    "twice_envs.agents.gpu_check": 7,
    "twice_envs.agents.cli": 8,
}
#: Declared composition edges: (importing module prefix, target prefix) pairs a string entry
#: point may take against the layers. The CLI's tables name every command's module; the
#: registry names the vector envs the way gymnasium names entry points (a credit method names no
#: verl estimator: verl chooses one by the method's needs).
COMPOSITION = {
    ("twice_envs.cli", "twice_envs"),
    ("twice_envs.registry", "twice_envs.wrappers.vector"),
}
ENTRY_POINT = re.compile(r"^(twice_envs(?:\.\w+)+):\w+$")


def _prefix_rank(module: str, ranks: dict) -> int | None:
    best = None
    for prefix, r in ranks.items():
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, r)
    return None if best is None else best[1]


def rank(module: str) -> int | None:
    return _prefix_rank(module, RANKS)


def modules(root: Path = ROOT, sources: dict = SOURCES) -> list[tuple[str, Path]]:
    out = []
    for folder, package in sources.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out.append((".".join([package, *parts]), path))
    return out


def _from_base(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a ``from ... import`` reads from (relative imports resolved)."""
    base = node.module or ""
    if node.level:
        parent = package.split(".")
        parent = parent[: len(parent) - (node.level - 1)]
        base = ".".join(parent + ([base] if base else []))
    return base


def imports(module: str, path: Path) -> list[tuple[int, str]]:
    """``(line, imported module)`` for every import in the file, wherever it is."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(node, package)
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


def entry_points(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every ``"twice_envs.x.y:name"`` string constant in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [(n.lineno, m.group(1)) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and (m := ENTRY_POINT.match(n.value))]


def declared(module: str, target: str) -> bool:
    return any((module == a or module.startswith(a + ".")) and (target == b or target.startswith(b + "."))
               for a, b in COMPOSITION)


def edges(module: str, path: Path) -> list[tuple[int, str]]:
    """The file's imports and its entry points that :data:`COMPOSITION` does not declare."""
    return imports(module, path) + [(ln, t) for ln, t in entry_points(path) if not declared(module, t)]


def module_imports(module: str, path: Path) -> list[str]:
    """Every module name an import in the file may load: ``from p import x`` gives ``p.x`` and ``p``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = [t for _, t in imports(module, path)]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            out += [f"{_from_base(node, package)}.{a.name}" for a in node.names]
    return out


def graph(root: Path = ROOT, sources: dict = SOURCES) -> dict[str, set[str]]:
    """Module -> the project modules it imports (by statement or by an undeclared entry point)."""
    mods = dict(modules(root, sources))
    out: dict[str, set[str]] = {m: set() for m in mods}
    for module, path in mods.items():
        found = module_imports(module, path) + [t for _, t in entry_points(path) if not declared(module, t)]
        for target in found:
            # `from package import name` may name a module or an attribute: keep the longest module
            while target and target not in mods:
                target = target.rpartition(".")[0]
            # a package's own modules load it first: that is no edge back to it
            if target and target != module and not module.startswith(target + "."):
                out[module].add(target)
    return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def agent_violations(root: Path = ROOT, sources: dict = SOURCES) -> list[str]:
    """Imports from an agents subpackage into a higher one (by :data:`AGENT_RANKS`)."""
    out = []
    for module, path in modules(root, sources):
        own = _prefix_rank(module, AGENT_RANKS)
        if own is None:
            continue
        for line, target in edges(module, path):
            r = _prefix_rank(target, AGENT_RANKS)
            if r is not None and r > own:
                out.append(f"{path.relative_to(root)}:{line}: {module} imports {target}")
    return out


def violations(root: Path = ROOT, sources: dict = SOURCES) -> list[str]:
    out = []
    for module, path in modules(root, sources):
        own = rank(module)
        for line, target in edges(module, path):
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
        "def g():\n    import importlib\n    importlib.import_module('twice_envs.agents.rollout.episodes')\n"
        "from . import envs\n"
    )
    found = violations(tmp_path, {"twice_envs": "twice_envs"})
    assert len(found) == 3 and all("twice_envs.check imports" in v for v in found)


@pytest.mark.parametrize("layer", sorted(NAMES, key=NAMES.get))
def test_every_layer_is_scanned(layer):
    assert any(rank(m) == NAMES[layer] for m, _ in modules())


def test_agents_subpackages_are_layered():
    assert agent_violations() == []


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_the_cycle_check_fails_on_a_planted_cycle(tmp_path):
    pkg = tmp_path / "agents"
    (pkg / "rollout").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "rollout" / "__init__.py").write_text("")
    (pkg / "rollout" / "a.py").write_text("def f():\n    from twice_envs.agents.rollout.b import g\n")
    (pkg / "rollout" / "b.py").write_text("from twice_envs.agents.rollout import a\n")
    (pkg / "types.py").write_text("X = 'twice_envs.agents.rollout.a:f'\n")  # an undeclared entry point
    src = {"agents": "twice_envs.agents"}
    assert cycles(graph(tmp_path, src)) == [["twice_envs.agents.rollout.a", "twice_envs.agents.rollout.b"]]
    # the entry point from the lowest layer up to rollout is a layering violation
    assert [v.split(": ", 1)[1] for v in agent_violations(tmp_path, src)] == [
        "twice_envs.agents.types imports twice_envs.agents.rollout.a"]
    # declared composition edges are not violations: the CLI table names agents modules
    assert declared("twice_envs.cli", "twice_envs.agents.cli.train")
    assert not declared("twice_envs.agents.types", "twice_envs.agents.rollout.a")


def test_entry_points_are_seen_and_resolve():
    """The CLI's tables are read as edges, each names a real module, and no credit method names an
    integration's module (verl finds a method's estimator by its needs)."""
    import importlib.util

    seen = {(m, t) for m, p in modules() for _, t in entry_points(p)}
    assert ("twice_envs.cli", "twice_envs.agents.cli.train") in seen
    assert not any(m.startswith("twice_envs.agents.credit") for m, _ in seen)
    for _, target in seen:
        assert importlib.util.find_spec(target) is not None, target


# --- startup: what runs while ``import twice_envs`` is half done, and imports inside core functions

#: Words one of which a comment must say for an import inside a core function: the import
#: would close an import cycle, or it loads an optional dependency only the caller needs.
REASONS = ("cycle", "optional")


def startup_modules(root: Path = ROOT) -> list[tuple[str, Path]]:
    """The modules ``import twice_envs`` runs before the package is bound: the built-in envs'
    package, each env's ``__init__`` and its ``specs`` (which registers its ids)."""
    envs = root / "twice_envs" / "envs"
    paths = [envs / "__init__.py", *sorted(envs.glob("*/__init__.py")), *sorted(envs.glob("*/specs.py"))]
    return [(m, p) for m, p in modules(root, {"twice_envs": "twice_envs"}) if p in paths]


def package_imports(module: str, path: Path) -> list[str]:
    """``file:line`` of each module-level import of the ``twice_envs`` package itself (not one of its modules)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    top = {id(n) for n in tree.body}
    lines = {line for line, target in imports(module, path) if target == "twice_envs"}
    return [f"{'/'.join(path.parts[-2:])}:{n.lineno}" for n in ast.walk(tree)
            if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) in top and n.lineno in lines]


def unexplained_imports(path: Path) -> list[str]:
    """``line: source`` of each import inside a function with no comment naming a :data:`REASONS` word,
    on its line or in the comments just above it (a comment may head a group of imports)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    tree = ast.parse("\n".join(lines), filename=str(path))
    out = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            said, i = [lines[node.lineno - 1].partition("#")[2]], node.lineno - 2
            while i >= 0 and lines[i].strip().startswith(("#", "import ", "from ")):
                said.append(lines[i].partition("#")[2])
                i -= 1
            if not any(word in " ".join(said).lower() for word in REASONS):
                out.append(f"{'/'.join(path.parts[-2:])}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return out


def core_paths(root: Path = ROOT) -> list[Path]:
    return [p for m, p in modules(root, {"twice_envs": "twice_envs"}) if rank(m) == 0]


def test_startup_imports_the_registry_not_the_half_built_package():
    """An env's ``specs`` registers through :mod:`twice_envs.registry`: ``import twice_envs`` is
    still running when it does, so the package has no names bound yet."""
    seen = startup_modules()
    assert sum(p.name == "specs.py" for _, p in seen) >= 5
    assert [where for m, p in seen for where in package_imports(m, p)] == []


def test_every_env_folder_registers_its_ids():
    import twice_envs

    folders = {p.parent.name for _, p in startup_modules() if p.name == "specs.py"}
    registered = {str(s.entry_point).split(".")[2] for s in twice_envs.registry.values()
                  if str(s.entry_point).startswith("twice_envs.envs.")}
    assert folders <= registered


def test_imports_inside_core_functions_say_why():
    paths = core_paths()
    assert {"core.py", "replay.py", "check.py", "layout.py", "cli.py"} <= {p.name for p in paths}
    assert [line for p in paths for line in unexplained_imports(p)] == []


def test_the_startup_scans_see_a_planted_package_import_and_an_unexplained_import(tmp_path):
    env = tmp_path / "twice_envs" / "envs" / "toy"
    env.mkdir(parents=True)
    (tmp_path / "twice_envs" / "envs" / "__init__.py").write_text("")
    (env / "__init__.py").write_text("")
    (env / "specs.py").write_text(
        "import twice_envs\nfrom twice_envs import register\nfrom twice_envs.registry import register\n"
        "def f():\n    import twice_envs\n")
    (seen,) = [(m, p) for m, p in startup_modules(tmp_path) if p.name == "specs.py"]
    assert package_imports(*seen) == ["toy/specs.py:1", "toy/specs.py:2"]
    core = tmp_path / "twice_envs" / "mod.py"
    core.write_text(
        "def f():\n    import json\n"
        "def g():\n    # optional: torch is only needed here\n    import torch\n    import torch.nn\n"
        "def h():\n    from twice_envs import check  # an import cycle: check imports this module\n"
        "def k():\n    x = 1  # optional\n    import pickle\n")
    assert unexplained_imports(core) == ["twice_envs/mod.py:2: import json", "twice_envs/mod.py:11: import pickle"]
