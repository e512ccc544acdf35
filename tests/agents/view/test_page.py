"""The explorer page's stylesheet and script: package data files, checked here and inlined by :mod:`.page`."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from twice_envs.agents.view import page
from twice_envs.agents.view.load import load

from ._pairs import resync_pair, write_records

STATIC = Path(page.__file__).resolve().parent / page.STATIC
NODE = shutil.which("node")


@pytest.mark.skipif(NODE is None, reason="node is not installed: the explorer's script cannot be syntax-checked")
def test_the_script_parses():
    done = subprocess.run([NODE, "--check", str(STATIC / "explorer.js")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"static/explorer.js does not parse:\n{done.stderr}"


def _unbalanced(css: str) -> str:
    """Why the braces of ``css`` (comments and strings left out) do not balance; empty when they do."""
    text = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    text = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'', '""', text)
    depth = 0
    for number, line in enumerate(text.splitlines(), 1):
        for char in line:
            depth += {"{": 1, "}": -1}.get(char, 0)
            if depth < 0:
                return f"line {number}: a '}}' closes nothing"
    return f"{depth} '{{' never closed" if depth else ""


def test_the_stylesheet_braces_balance():
    assert _unbalanced((STATIC / "explorer.css").read_text(encoding="utf-8")) == ""
    assert _unbalanced("a { b: c; }\n}") == "line 2: a '}' closes nothing"
    assert _unbalanced("a { b: c;\n/* } */") == "1 '{' never closed"


def test_the_page_inlines_the_package_files_and_lets_only_that_script_run(tmp_path):
    factual, twin = resync_pair()
    html = page.render(load(write_records(tmp_path / "pair.jsonl", [factual], [twin])))
    css = (STATIC / "explorer.css").read_text(encoding="utf-8")
    js = (STATIC / "explorer.js").read_text(encoding="utf-8")
    assert f"<style>\n{css}</style>" in html
    assert html.count("<script>") == 1 and f"<script>\n{js}</script>" in html
    assert f"script-src {page.script_hash(chr(10) + js)};" in html


def test_a_missing_data_file_is_named():
    with pytest.raises(FileNotFoundError, match=r"static/nothing\.js is missing .*twice_envs\.agents\.view"):
        page.static_text("nothing.js")
