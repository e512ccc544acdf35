"""``twice bench keys``: rho-bar per noise-key layout and the n-gram layout's bias on TextLab-v0.

See :func:`~twice_envs.agents.lab.text_lab.key_layout_rho` and
:func:`~twice_envs.agents.lab.text_lab.ngram_bias` for what is measured and how to read it.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

from twice_envs import progress
from twice_envs.agents.lab.policies import add_setting_args, text_setting_from_args
from twice_envs.agents.lab.text_lab import format_measurements, key_layout_rho, ngram_bias
from twice_envs.trajectory import atomic_write_text


def main(argv: Sequence[str]) -> int:
    """``twice bench keys``: rho-bar per key layout and the n-gram layout's bias on TextLab."""
    p = argparse.ArgumentParser(prog="twice bench keys", description=main.__doc__.split(": ", 1)[1])
    p.add_argument("--groups", type=int, default=600, help="rho-bar: groups of 5 factual episodes, each decision "
                   "twinned in every layout (default 600)")
    p.add_argument("--tv-groups", type=int, default=2400, help="TV: groups of 5 episodes per layout (default 2400)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-boot", type=int, default=1000)
    p.add_argument("--summary", choices=("outcome", "actions"), default="outcome",
                   help="trajectory summary of the TV (default outcome: turns taken and facts found)")
    p.add_argument("--out", default=None, help="also write keys.json in this folder")
    add_setting_args(p)
    progress.add_argument(p)
    a = p.parse_args(argv)
    progress.apply(a)
    try:
        setting = text_setting_from_args(a)
    except ValueError as exc:
        p.error(str(exc))
    with progress.Progress("bench keys: rho-bar, then the n-gram TV", 2, unit="stages") as bar:
        rho = key_layout_rho(setting, a.groups, a.seed, n_boot=a.n_boot)
        bar.update()
        tv = ngram_bias(setting, a.tv_groups, a.seed, n_boot=a.n_boot, summary=a.summary)
        bar.update()
    print(format_measurements(rho, tv, a.summary), end="")
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        doc = {"setting": asdict(setting), "groups": a.groups, "tv_groups": a.tv_groups, "seed": a.seed, "rho": rho,
               "tv": tv, "summary": a.summary}
        atomic_write_text(out / "keys.json", json.dumps(doc, indent=1))
        print(f"written: {out / 'keys.json'}")
    return 0
