"""The explorer's screenshots for the docs (``docs/img/explorer-*.png``), taken in headless Chromium.

    python -m tests.agents.view.screenshots --searchqa RUN --webshop RUN --lab AUDIT --out docs/img

RUN: ``twice train --method twice`` run folders; AUDIT: a lab audit folder (``twice audit --env
SearchToy-v0``). For each run the twin shown is the coupled one whose later turn shares the most
tokens with the factual turn under the same keys.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Optional

from twice_envs.agents.view.cli import write_explorer
from twice_envs.agents.view.load import load

from ._browser import Browser, find_chromium


def _keyed(t: dict) -> dict:
    if not t.get("tk"):
        return {}
    return {(t["key"][0], *t["tk"][4 * j: 4 * j + 4]): t["ids"][j] for j in range(len(t["ids"]))}


def shrink(path: Path, colors: int = 96) -> Path:
    """Store a screenshot as a palette PNG (a third of the size; the page's few colours survive)."""
    from PIL import Image

    with Image.open(path) as img:
        img.convert("RGB").quantize(colors=colors, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    return path


def best_twin(path: Path) -> Optional[tuple[int, int, int]]:
    """``(episode, twin, turn)``: the coupled twin and later turn with the most tokens shared under the same key."""
    best = None
    for d in load(path).details:
        for i, tw in enumerate(d["twins"]):
            if tw["self"] or not tw["coupled"]:
                continue
            for u in range(tw["t"] + 1, min(len(d["turns"]), tw["t"] + len(tw["turns"]))):
                f, w = d["turns"][u], tw["turns"][u - tw["t"]]
                other = _keyed(w)
                same = sum(other.get((f["key"][0], *f["tk"][4 * j: 4 * j + 4])) == f["ids"][j]
                           for j in range(len(f.get("ids", []))) if f.get("tk"))
                if best is None or same > best[0]:
                    best = (same, d["id"], i, u)
    return None if best is None else best[1:]


def shoot_twin(b: Browser, run: Path, out: Path, work: Path, height: int = 1750) -> Path:
    page = write_explorer(run, work / f"{run.name}.html")
    b.open(page)
    pick = best_twin(run)
    if pick is None:
        raise SystemExit(f"{run}: no coupled twin with a later turn to show")
    episode, twin, turn = pick
    b.evaluate(f"twiceView.open({episode}, {turn})")
    b.evaluate(f"document.querySelector('#detail button[data-twin=\"{twin}\"]').click()")
    b.evaluate(f"document.querySelector('tr.row[data-turn=\"{turn}\"]').click()")
    top = b.evaluate("document.getElementById('detail').getBoundingClientRect().top + window.scrollY")
    bottom = b.evaluate("document.getElementById('tokens').getBoundingClientRect().bottom + window.scrollY")
    return b.screenshot(out, clip={"x": 0, "y": top - 8, "width": 1180, "height": min(bottom - top + 16, height)})


def shoot_scatter(b: Browser, audit: Path, out: Path, work: Path) -> Path:
    b.open(write_explorer(audit, work / "lab.html"))
    b.evaluate("twiceView.showTab('audit')")
    top = b.evaluate("document.querySelector('#tab-audit h3').getBoundingClientRect().top + window.scrollY")
    return b.screenshot(out, clip={"x": 0, "y": top - 8, "width": 1180, "height": 640})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--searchqa", type=Path, required=True)
    p.add_argument("--webshop", type=Path, required=True)
    p.add_argument("--lab", type=Path, required=True)
    p.add_argument("--out", type=Path, default=Path("docs/img"))
    a = p.parse_args(argv)
    chromium = find_chromium()
    if chromium is None:
        raise SystemExit("chromium is not installed (Debian: apt-get install -y chromium)")
    a.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, Browser(chromium, width=1180, height=900) as b:
        work = Path(tmp)
        for path in (shoot_twin(b, a.searchqa, a.out / "explorer-searchqa-twin.png", work),
                     shoot_twin(b, a.webshop, a.out / "explorer-webshop-twin.png", work),
                     shoot_scatter(b, a.lab, a.out / "explorer-lab-scatter.png", work)):
            shrink(path)
            print(f"{path} ({path.stat().st_size // 1024} KB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
