"""The explorer page: one self-contained HTML file (inline CSS and JavaScript, no requests).

The CSS and the JavaScript are package data, ``static/explorer.css`` and ``static/explorer.js``
beside this module, read once at import time and written inline into every page.

The data rides in two ``<script type="application/json">`` blocks, never in the markup:

* ``twice-index``: titles, sources, the episode list, curves, scatters, problems and, per
  episode, the offsets of its detail in the second block;
* ``twice-details``: one JSON document per episode, one per line, parsed only when the episode is
  opened (opening a 10,000-episode run parses the list alone).

Both are ASCII JSON with ``<``, ``>`` and ``&`` written as ``\\u`` escapes, so no text from an
episode can end the block or open a tag; the script builds every element with ``textContent``
and attributes, never by parsing data as HTML. A Content-Security-Policy forbids every request
(no fonts, scripts, images or connections from anywhere), and lets only the page's own script run (by
its sha256; inline scripts are not allowed as such).
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from importlib import resources
from typing import Any

from twice_envs.agents.stats import THRESHOLD
from twice_envs.agents.view.load import Explorer
from twice_envs.agents.records import finite_json

#: Episodes per page of the list.
PAGE_SIZE = 50
#: The package data folder holding the page's stylesheet and script.
STATIC = "static"


def static_text(name: str) -> str:
    """The text of ``static/NAME``, one of the page's package data files."""
    try:
        return resources.files(__package__).joinpath(STATIC).joinpath(name).read_text(encoding="utf-8")
    except FileNotFoundError as err:
        raise FileNotFoundError(f"the explorer's {STATIC}/{name} is missing from the installed package "
                                f"{__package__} (its package data was not installed)") from err


# Each is inlined after a newline: <style>\n...</style>, <script>\n...</script>.
#: The page's stylesheet (``static/explorer.css``).
CSS = "\n" + static_text("explorer.css")
#: The page's script (``static/explorer.js``).
JS = "\n" + static_text("explorer.js")


def embed_json(value: Any) -> str:
    """``value`` as ASCII JSON safe inside a ``<script>`` element (no ``<``, ``>`` or ``&``)."""
    try:
        text = json.dumps(value, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    except ValueError:
        text = json.dumps(finite_json(value), ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render(x: Explorer) -> str:
    """The whole page for an :class:`~twice_envs.agents.view.load.Explorer`."""
    parts, offsets, pos = [], [], 0
    for d in x.details:
        text = embed_json(d)
        offsets.append([pos, pos + len(text)])
        parts.append(text)
        pos += len(text) + 1
    index = {"title": x.title, "path": x.path, "sources": x.sources, "rows": x.rows, "curves": x.curves,
             "scatters": x.scatters, "problems": x.problems, "offsets": offsets, "pageSize": PAGE_SIZE,
             "threshold": THRESHOLD}
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>{html.escape(x.title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
        "<div id=\"app\"><p class=\"loading\">Loading...</p></div>\n"
        f"<script type=\"application/json\" id=\"twice-index\">{embed_json(index)}</script>\n"
        f"<script type=\"application/json\" id=\"twice-details\">{chr(10).join(parts)}</script>\n"
        f"<script>{JS}</script>\n</body>\n</html>\n"
    )


def script_hash(script: str) -> str:
    """The CSP source that lets exactly ``script`` (the text of one inline ``<script>``) run."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii") + "'"


#: The page's Content-Security-Policy: nothing may be loaded from anywhere, and the one script that
#: may run is the page's own, named by its sha256 (no 'unsafe-inline' for scripts: a script planted
#: in the page never runs).
CSP = (f"default-src 'none'; script-src {script_hash(JS)}; style-src 'unsafe-inline'; img-src data:; "
       "base-uri 'none'; form-action 'none'")
