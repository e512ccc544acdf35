"""``twice check-gpu``: run the sections in turn and write the report; ``--bundle DIR`` instead
writes the wheels an offline machine needs to run the check (:mod:`.bundle`).

Exit status: 0 when no section failed, 1 when one did, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

import torch

from twice_envs.agents.gpu_check.build import BUILD
from twice_envs.agents.gpu_check.bundle import write_bundle
from twice_envs.agents.gpu_check.context import CPU_SIZES, GPU_SIZES, SETUP, Context
from twice_envs.agents.gpu_check.philox import PHILOX, CorruptedReference
from twice_envs.agents.gpu_check.report import new_record, render_text, run_section, skip, write_report
from twice_envs.agents.gpu_check.timing import TIMING
from twice_envs.agents.gpu_check.tokens import TOKENS

#: The sections in the order they run; ``setup`` always runs.
SECTIONS = (SETUP, PHILOX, TOKENS, TIMING, BUILD)
BY_ID = {s.id: s for s in SECTIONS}
#: Default report folder (relative to the working folder).
DEFAULT_OUT = "runs/check-gpu"


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="twice check-gpu",
        description="Check the keyed sampler and a model build on a CUDA GPU: (a) Philox bit-identical to the "
                    "numpy reference, (b) the same tokens as on the CPU, (c) the sampler's share of generation "
                    "time, (d) a build's step rate. --bundle DIR writes what an offline machine needs.")
    p.add_argument("--cpu", action="store_true",
                   help="run every section on the CPU at tiny sizes (the shipped tiny model)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"report folder (default {DEFAULT_OUT})")
    p.add_argument("--work", default=None, help="scratch folder (default: a temporary one)")
    p.add_argument("--device", default=None, choices=("cuda", "cpu"),
                   help="where sections a-d run (default cuda when present; 'cpu' runs the GPU sizes on the CPU, "
                        "to try the check without a GPU: slow, see --small)")
    p.add_argument("--small", action="store_true", help="tiny sizes for sections a-c (without --cpu)")
    p.add_argument("--sections", default="abcd", help="which of a, b, c, d to run (default all)")
    p.add_argument("--model", default=None,
                   help="model name or folder for b and c (default: smollm2-135m; --cpu: tiny)")
    p.add_argument("--budgets", default=None, metavar="ID=SECONDS,...",
                   help="per-section time budgets, e.g. a=60,d=900 (a section past its budget is stopped)")
    p.add_argument("--corrupt-reference", action="store_true",
                   help="self-test: flip one bit of each numpy reference result; section a must FAIL")
    p.add_argument("--bundle", default=None, metavar="DIR",
                   help="write the wheels an offline machine needs to run the check into DIR (new or empty), "
                        "then stop")
    args = p.parse_args(argv)
    unknown = sorted(set(args.sections) - set(BY_ID))
    if unknown:
        p.error(f"--sections: unknown section(s) {', '.join(unknown)}; known: {', '.join(s.id for s in SECTIONS[1:])}")
    args.budget_overrides = {}
    for item in filter(None, (args.budgets or "").split(",")):
        sid, _, value = item.partition("=")
        sid = sid.strip()
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if sid not in BY_ID or seconds <= 0:
            p.error(f"--budgets: {item!r} is not ID=SECONDS with ID one of {', '.join(BY_ID)} and SECONDS > 0")
        args.budget_overrides[sid] = seconds
    return args


def run_checks(args: argparse.Namespace, *, hard_timeouts: bool = True) -> dict:
    """Run ``setup`` and the sections ``args.sections`` asks for; the report is written after each."""
    cpu_mode = bool(args.cpu)
    cuda = torch.cuda.is_available()
    device = "cpu" if cpu_mode else (args.device or ("cuda" if cuda else ""))
    if device == "cuda" and not cuda:
        device = ""
    if cpu_mode:
        sizes = CPU_SIZES
    elif args.small:  # tiny sizes for a-c; the build stays the full one
        sizes = dataclasses.replace(CPU_SIZES, d_recipe=GPU_SIZES.d_recipe, d_steps=GPU_SIZES.d_steps, d_args=())
    else:
        sizes = GPU_SIZES
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    ctx = Context(cpu_mode=cpu_mode, device=device, sizes=sizes, work=work, model=args.model,
                  reference=CorruptedReference() if args.corrupt_reference else None)
    out = Path(args.out)
    if cpu_mode:
        mode = "cpu (tiny sizes)"
    else:
        mode = (device or "cuda (not available)") + (" (small sizes)" if args.small else "")
    report = {"tool": "twice check-gpu", "mode": mode,
              "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "seconds": 0.0, "argv": list(getattr(args, "argv", [])), "sizes": dataclasses.asdict(sizes), "sections": []}
    fields = {"batches": " and ".join(map(str, sizes.c_batches)), "recipe": sizes.d_recipe, "steps": sizes.d_steps,
              "device": device or "cuda", "dev": ctx.dev_label}
    setup_failed = False
    for section in SECTIONS:
        if section.id != "setup" and section.id not in args.sections:
            continue
        title = section.title.format(**fields)
        budget = args.budget_overrides.get(section.id, section.cpu_budget_s if cpu_mode else section.gpu_budget_s)
        if setup_failed and section.id != PHILOX.id:
            sec = new_record(section.id, title)
            skip(sec, "the setup failed (see above)")
        else:
            sec = run_section(section.id, title, lambda rec, dl, s=section: s.run(ctx, rec, dl), budget,
                              hard=hard_timeouts)
        setup_failed = setup_failed or (section.id == "setup" and sec["status"] in ("ERROR", "FAIL"))
        report["sections"].append(sec)
        report["seconds"] = round(sum(s["seconds"] for s in report["sections"]), 1)
        report["model"] = dict(ctx.model_info)
        write_report(report, out)
        print(f"[check-gpu] {section.id}: {sec['status']} ({sec['seconds']} s)", file=sys.stderr, flush=True)
    ctx.release()
    return report


def check_gpu_main(argv: Optional[Sequence[str]] = None, *, hard_timeouts: bool = True) -> int:
    """``twice check-gpu [--cpu] [--out DIR] [--sections abcd] ...`` or ``twice check-gpu --bundle DIR``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    args.argv = argv
    if args.bundle is not None:
        write_bundle(Path(args.bundle))
        return 0
    with tempfile.TemporaryDirectory(prefix="check-gpu-") as tmp:
        if args.work is None:
            args.work = tmp
        report = run_checks(args, hard_timeouts=hard_timeouts)
    print(render_text(report), end="")
    print(f"[check-gpu] report: {Path(args.out).resolve()}/gpu_check.json and gpu_check.txt", file=sys.stderr)
    return 0 if report["ok"] else 1
