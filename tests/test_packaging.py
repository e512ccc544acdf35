"""Packaging invariants: every subpackage is listed, CI runs the README's test command."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_dir_is_listed_in_pyproject():
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(conf["packages"])
    mapping = conf["package-dir"]
    found = set()
    for name, rel in mapping.items():
        base = ROOT / rel
        for init in base.rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            sub = init.parent.relative_to(base).parts
            pkg = ".".join((name, *sub))
            # subpackages of a mapped dir that is itself mapped elsewhere are not ours
            if any(pkg.startswith(other + ".") or pkg == other for other in mapping if other != name and other.startswith(name + ".")):
                continue
            found.add(pkg)
    assert found - listed == set(), f"add these to [tool.setuptools] packages: {sorted(found - listed)}"
    assert listed - found == set(), f"listed but missing: {sorted(listed - found)}"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)\n```", readme, flags=re.S)
    setup = [b.strip() for b in blocks[:2]]
    assert "twice demo" in setup[0]
    assert "pytest" in setup[1]
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [l for l in ci.splitlines() if l.strip() and not l.startswith("#") and not l.startswith("set ") and not l.startswith("cd ")]
    assert commands == [setup[1]]


def test_top_level_layout():
    allowed = {"pyproject.toml", "README.md", "LICENSE", ".ci", ".gitignore", "twice_envs", "agents", "wrappers", "tests", "examples"}
    tracked = {p.name for p in ROOT.iterdir() if not p.name.startswith(".git") and p.name not in {".venv", ".pytest_cache", ".hypothesis", "runs"}}
    extra = {p for p in tracked - allowed if not p.endswith(".egg-info")}
    assert extra == set(), f"unexpected top-level entries: {extra}"
