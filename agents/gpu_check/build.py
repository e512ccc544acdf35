"""Section (d): the step rate of a model build on the device.

``twice models build-tiny --recipe alfworld-smol --steps 50 --device cuda`` runs as a child
process from start to end (drawing its ALFWorld transcripts, then training); the section stamps
each line it prints and measures steps per second between its step lines.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

from twice_envs.agents.gpu_check.context import Context
from twice_envs.agents.gpu_check.report import Section, skip

_STEP_LINE = re.compile(r"\[build-tiny\] step (\d+)/(\d+) loss")


def step_rate(stamps: list) -> Optional[dict]:
    """Steps per second from ``(seconds, step)`` stamps of the build's step lines: over all logged
    steps after the first, and over the last stretch (between the last two step lines)."""
    if len(stamps) < 2:
        return None
    (t0, s0), (t1, s1) = stamps[0], stamps[-1]
    out = {"steps_per_s": round((s1 - s0) / (t1 - t0), 3) if t1 > t0 else None, "from_step": s0, "to_step": s1}
    if len(stamps) >= 3:
        (ta, sa) = stamps[-2]
        out["last_stretch_steps_per_s"] = round((s1 - sa) / (t1 - ta), 3) if t1 > ta else None
    return out


def run_build(cmd: list, env: dict, timeout: float, cwd: Path) -> dict:
    """Run the build CLI in ``cwd``, stamping each of its output lines; kills it after ``timeout`` seconds
    (or when this function is interrupted).

    ``cwd`` is a scratch folder: ``python -m`` puts the working folder first on ``sys.path``, and a
    source checkout's ``twice_envs/`` there would hide the installed package.
    """
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, env=env,
                            cwd=str(cwd), start_new_session=True)
    lines: "queue.Queue" = queue.Queue()

    def reader():
        for line in proc.stdout:
            lines.put((time.monotonic() - t0, line.rstrip("\n")))
        lines.put(None)

    threading.Thread(target=reader, daemon=True).start()
    log, stamps, timed_out = [], [], False
    try:
        while True:
            left = timeout - (time.monotonic() - t0)
            try:
                item = lines.get(timeout=max(0.1, min(1.0, left)))
            except queue.Empty:
                item = ()
            if item is None:
                break
            if item:
                t, line = item
                log.append(f"{t:7.1f}s {line}")
                m = _STEP_LINE.search(line)
                if m:
                    stamps.append((t, int(m.group(1))))
            if time.monotonic() - t0 > timeout:
                timed_out = True
                break
    finally:  # past the timeout, or the check itself stopped (its budget, Ctrl-C): the build stops too
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        rc = proc.wait()
    return {"rc": rc, "timed_out": timed_out, "seconds": round(time.monotonic() - t0, 1), "stamps": stamps,
            "log_tail": log[-30:]}


def section_build(ctx: Context, sec: dict, deadline: float) -> None:
    """(d): ``twice models build-tiny`` for a few steps on the device; reports steps/s."""
    if not ctx.device:
        return skip(sec, "no CUDA")
    ctx.release()  # the models of sections b and c: the build needs the memory
    z = ctx.sizes
    work = ctx.work / "build"
    shutil.rmtree(work, ignore_errors=True)
    cmd = [sys.executable, "-m", "twice_envs.cli", "models", "build-tiny", "--recipe", z.d_recipe, "--device",
           ctx.device, "--steps", str(z.d_steps), "--checkpoint-every", "0", *z.d_args, "--out", str(work)]
    sec["criterion"] = f"the build finishes its {z.d_steps} steps (exit 0); steps/s measured between its step lines"
    sec["results"]["command"] = " ".join(["twice"] + cmd[3:])
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    res = run_build(cmd, env, max(10.0, deadline - time.monotonic()), cwd=ctx.work)
    rate = step_rate(res["stamps"])
    sec["results"].update({k: res[k] for k in ("rc", "timed_out", "seconds", "log_tail")})
    sec["results"]["step_lines"] = [[round(t, 1), s] for t, s in res["stamps"]]
    sec["results"]["rate"] = rate
    done = bool(res["stamps"]) and res["stamps"][-1][1] == z.d_steps
    sec["status"] = "PASS" if res["rc"] == 0 and done else "FAIL"
    if rate:
        first_t = res["stamps"][0][0]
        sec["lines"].append(f"{rate['steps_per_s']} steps/s over steps {rate['from_step']}-{rate['to_step']}"
                            + (f", {rate['last_stretch_steps_per_s']} steps/s over the last stretch"
                               if rate.get("last_stretch_steps_per_s") else "")
                            + f"; first step logged after {first_t:.1f} s, whole build {res['seconds']} s")
    sec["lines"].append(f"command: {sec['results']['command']}")
    if sec["status"] != "PASS":
        sec["lines"].append(f"exit {res['rc']}{' (timed out)' if res['timed_out'] else ''}; last lines:")
        sec["lines"] += ["  " + line for line in res["log_tail"][-12:]]
    shutil.rmtree(work, ignore_errors=True)  # the finished model (about 0.5 GB for alfworld-smol)


BUILD = Section("d", "{recipe} build: {steps} steps, --device {device}, steps/s", section_build,
                gpu_budget_s=1800, cpu_budget_s=180)
