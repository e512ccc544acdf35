"""Packaging invariants: every subpackage is listed, CI runs the README's test command, the README is a
front page whose links resolve, and every documentation page is in the site's nav."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

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
    # the one system package the README names for the browser tests comes first
    assert commands[0].startswith("command -v chromium ") and "apt-get install -y -qq chromium" in commands[0]
    assert "chromium" in readme
    assert commands[1:] == [setup[1]]


def test_top_level_layout():
    allowed = {"pyproject.toml", "README.md", "LICENSE", ".ci", ".gitignore", "twice_envs", "agents", "wrappers",
               "tests", "examples", "docs", "mkdocs.yml"}
    local = {".venv", ".pytest_cache", ".ruff_cache", ".hypothesis", "runs"}
    tracked = {p.name for p in ROOT.iterdir() if not p.name.startswith(".git") and p.name not in local}
    extra = {p for p in tracked - allowed if not p.endswith(".egg-info")}
    assert extra == set(), f"unexpected top-level entries: {extra}"


README_MAX_LINES = 300


def test_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines; move detail into docs/ (at most {README_MAX_LINES})")


def _relative_links(markdown: str) -> list[str]:
    """Targets of inline markdown links and images that are paths, not URLs or in-page anchors."""
    text = re.sub(r"```.*?```", "", markdown, flags=re.S)  # code blocks hold no links
    text = re.sub(r"`[^`\n]*`", "", text)
    targets = re.findall(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", text)
    return [t for t in targets if not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", t) and not t.startswith("#")]


def test_readme_relative_links_point_to_files():
    links = _relative_links((ROOT / "README.md").read_text())
    assert links, "the README links into docs/"
    missing = [t for t in links if not (ROOT / t.split("#", 1)[0]).exists()]
    assert missing == [], f"README.md links to missing files: {missing}"


def test_every_docs_page_is_in_the_nav():
    docs = ROOT / "docs"
    pages = {p.relative_to(docs).as_posix() for p in docs.rglob("*.md")}
    conf = (ROOT / "mkdocs.yml").read_text()
    assert re.search(r"^docs_dir:\s*docs\s*$", conf, flags=re.M)
    nav = set(re.findall(r"^\s*-\s*(?:[^:\n]+:\s*)?([\w./-]+\.md)\s*$", conf, flags=re.M))
    assert pages - nav == set(), f"pages missing from the mkdocs.yml nav: {sorted(pages - nav)}"
    assert nav - pages == set(), f"nav entries without a page: {sorted(nav - pages)}"


def test_the_explorers_stylesheet_and_script_are_package_data():
    """Every file in agents/view/static/ (read at run time by the explorer) is matched by pyproject's package-data."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    package = ROOT / "agents" / "view"
    static = sorted(p.relative_to(package).as_posix() for p in (package / "static").iterdir() if p.is_file())
    assert {"static/explorer.js", "static/explorer.css"} <= set(static)
    patterns = data.get("twice_envs.agents.view", []) + data.get("*", [])
    shipped = {p.relative_to(package).as_posix() for pattern in patterns for p in package.glob(pattern)}
    assert set(static) - shipped == set(), (
        f"add these to [tool.setuptools.package-data] 'twice_envs.agents.view': {sorted(set(static) - shipped)}")
