"""Checkpoints of a build in progress, so an interrupted build continues where it stopped.

A build writes into ``OUT/checkpoint/`` (``OUT`` its output folder) while it trains:

* ``transcripts.json.gz``: the build's transcripts (scripted, augmented and relabelled
  episodes, with their :class:`~twice_envs.envs.mistakes.Mistake` / ``Played`` marks), written
  once they are all drawn, so a continued build does not play them again;
* ``state.pt``: every ``checkpoint_every`` optimiser steps of each supervised phase (the
  copying and lookup drills, then the transcripts), the trainable weights (all of them, or
  only the low-rank adapters of a recipe that trains adapters), the optimiser and scheduler
  states, the phase and step, the batch order's position, the losses so far and the torch,
  numpy and Python RNG states, with the recipe's name, its config and the build version.

Both are written atomically (a temporary file, then a rename) and hold plain values only:
``state.pt`` is read with ``torch.load(..., weights_only=True)``, so a file that would run code
when unpickled is refused, never executed. A continued build checks that the checkpoint is of
the same recipe, config (the thread count aside) and build version and names what differs;
on the same machine and library versions it ends with the bytes an uninterrupted build writes.
The finished build replaces the folder, checkpoint included.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from twice_envs.agents.models.recipes import TINY_RECIPE, TinyModelConfig
from twice_envs.agents.training.checkpoint import CheckpointError, _unpickler_reason, load_failure
from twice_envs.envs.mistakes import Mistake, Played

#: Version of the layout of a build checkpoint (stored under ``"format"``).
BUILD_CHECKPOINT_FORMAT = 1
#: The folder, inside a build's output folder, that holds its checkpoint.
CHECKPOINT_DIR = "checkpoint"
STATE_FILE = "state.pt"
TRANSCRIPTS_FILE = "transcripts.json.gz"
#: Default optimiser steps between two checkpoints: about 10 minutes of the slowest recipe's steps
#: on two cores, 10-20 seconds of a tiny recipe's (each save takes a few milliseconds).
CHECKPOINT_EVERY = 50
#: The supervised phases of a build, in the order they run.
PHASES = ("copy", "copy_id", "match", "sft")
#: Config fields that may differ between a checkpoint and the build that continues it.
FREE_FIELDS = ("threads",)

_STATE_KEYS = ("format", "build_version", "recipe", "config", "phase", "step", "steps", "finished", "trainable",
               "optimizer", "scheduler", "batches", "losses", "rng")


def config_json(cfg: TinyModelConfig) -> dict:
    """``cfg`` as the JSON values a checkpoint records (tuples become lists)."""
    return json.loads(json.dumps(asdict(cfg), default=list))


def recorded_config(saved: dict, file: os.PathLike) -> TinyModelConfig:
    """The :class:`TinyModelConfig` a checkpoint of ``file`` recorded as ``saved`` (its JSON values:
    lists become tuples again where the field is a tuple); a field this version does not know is a
    :class:`CheckpointError` naming the file."""
    from dataclasses import fields

    known = {f.name for f in fields(TinyModelConfig)}
    unknown = sorted(set(saved) - known)
    if unknown:
        raise CheckpointError(f"{file}: its recipe config has fields this version does not know: {', '.join(unknown)}")
    defaults = TinyModelConfig()
    return TinyModelConfig(**{k: tuple(v) if isinstance(getattr(defaults, k), tuple) and isinstance(v, list) else v
                              for k, v in saved.items()})


def config_differences(saved: dict, cfg: TinyModelConfig) -> list[str]:
    """``field: saved -> current`` for each field (but :data:`FREE_FIELDS`) where the recorded
    config ``saved`` differs from ``cfg``."""
    now = config_json(cfg)
    out = []
    for key in sorted(set(saved) | set(now)):
        if key in FREE_FIELDS:
            continue
        if saved.get(key, "<absent>") != now.get(key, "<absent>"):
            out.append(f"{key}: {saved.get(key, '<absent>')!r} in the checkpoint, {now.get(key, '<absent>')!r} now")
    return out


class BuildCheckpoint:
    """The checkpoint of one build in ``folder/checkpoint`` (see the module's description).

    ``every``: optimiser steps between two saves (0: never save). With ``resume``, a checkpoint
    found there is checked against ``recipe`` and ``cfg`` (a :class:`CheckpointError` naming the
    file and what differs) and continued; without, any checkpoint there is removed.
    """

    def __init__(self, folder: os.PathLike, recipe: str, cfg: TinyModelConfig, *, every: int = CHECKPOINT_EVERY,
                 resume: bool = False, log: Callable[[str], None] = lambda m: None) -> None:
        if every < 0:
            raise ValueError(f"checkpoint_every must be >= 0, got {every}")
        self.dir = Path(folder) / CHECKPOINT_DIR
        self.recipe, self.cfg, self.every, self.log = recipe, cfg, int(every), log
        self.saved: Optional[dict] = None
        if resume:
            self.saved = read_state(self.dir / STATE_FILE, recipe, cfg) if (self.dir / STATE_FILE).exists() else None
            if self.saved is not None:
                log(f"continuing from {self.dir / STATE_FILE}: {self.saved['phase']} phase, "
                    f"step {self.saved['step']}/{self.saved['steps']}")
        elif self.dir.is_dir():  # a fresh build: an older checkpoint there must not be continued later
            shutil.rmtree(self.dir)
            log(f"removed the older checkpoint in {self.dir}")
        self.resume = resume

    # -- transcripts ----------------------------------------------------------------------------
    def load_transcripts(self) -> Optional[tuple[list, dict]]:
        """The saved ``(episodes, per_env)`` of a build that is continued, None if there are none."""
        file = self.dir / TRANSCRIPTS_FILE
        if not self.resume or not file.exists():
            return None
        return read_transcripts(file, self.recipe, self.cfg)

    def save_transcripts(self, episodes: list, per_env: dict) -> None:
        if self.every:
            write_transcripts(self.dir / TRANSCRIPTS_FILE, self.recipe, self.cfg, episodes, per_env)

    # -- phases ---------------------------------------------------------------------------------
    def phase(self, name: str) -> "PhaseCheckpoint":
        """The checkpointing of the supervised phase ``name`` (one of :data:`PHASES`)."""
        if name not in PHASES:
            raise ValueError(f"unknown build phase {name!r}")
        saved = self.saved
        skipped = saved is not None and PHASES.index(name) < PHASES.index(saved["phase"])
        own = saved if saved is not None and saved["phase"] == name else None
        return PhaseCheckpoint(self, name, skipped, own)

    def write_state(self, blob: dict) -> None:
        import torch

        self.dir.mkdir(parents=True, exist_ok=True)
        _atomic(self.dir / STATE_FILE, lambda tmp: torch.save(blob, tmp))


class PhaseCheckpoint:
    """What :func:`~twice_envs.agents.models.sft.train_sft` needs to save and restore one phase."""

    def __init__(self, build: BuildCheckpoint, name: str, skipped: bool, saved: Optional[dict]) -> None:
        self.build, self.name, self.skipped, self.saved = build, name, skipped, saved
        self.steps = 0

    def restore(self, model, opt, sched, batches, losses: list, steps: int) -> tuple[int, bool]:
        """Load the saved state of this phase into the fresh training objects; returns
        ``(first step to run, whether the phase had finished)`` (``(0, False)`` without one)."""
        self.steps = int(steps)
        saved = self.saved
        if saved is None:
            return 0, False
        file = self.build.dir / STATE_FILE
        if int(saved["steps"]) != steps:
            raise CheckpointError(f"{file}: the {self.name} phase was saved with {saved['steps']} steps, "
                                  f"this build runs {steps}")
        try:
            load_trainable(model, saved["trainable"])
            opt.load_state_dict(saved["optimizer"])
            sched.load_state_dict(saved["scheduler"])
            batches.load_state_dict(saved["batches"])
        except (KeyError, ValueError, RuntimeError, TypeError, IndexError) as exc:
            raise CheckpointError(f"{file}: does not fit this build's {self.name} phase ({type(exc).__name__}: "
                                  f"{exc})") from None
        losses[:] = [float(x) for x in saved["losses"]]
        set_rng_states(saved["rng"])
        return int(saved["step"]), bool(saved["finished"])

    def after_step(self, step: int, model, opt, sched, batches, losses: list, done: bool) -> None:
        """Save a checkpoint every ``every`` steps (``step``: steps run so far in this phase)."""
        every = self.build.every
        if not every or step % every:
            return
        self.build.write_state({
            "format": BUILD_CHECKPOINT_FORMAT,
            "build_version": TINY_RECIPE,
            "recipe": self.build.recipe,
            "config": json.dumps(config_json(self.build.cfg)),
            "phase": self.name,
            "step": int(step),
            "steps": self.steps,
            "finished": bool(done),
            "trainable": trainable_state(model),
            "optimizer": plain(opt.state_dict()),
            "scheduler": plain(sched.state_dict()),
            "batches": batches.state_dict(),
            "losses": [float(x) for x in losses],
            "rng": rng_states(),
            "device": str(next(model.parameters()).device),
        })


def plain(value):
    """``value`` with numpy scalars made Python numbers (the same doubles), so it loads with
    ``weights_only=True`` (a schedule's learning rates are numpy floats)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    return value


def trainable_state(model) -> dict:
    """The parameters that train (all of a model trained whole; the adapters of an adapted one),
    on the CPU."""
    return {n: p.detach().to("cpu").clone() for n, p in model.named_parameters() if p.requires_grad}


def load_trainable(model, state: dict) -> None:
    """Copy a :func:`trainable_state` into ``model``; a name or shape that does not fit is a ``ValueError``."""
    import torch

    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    missing, extra = sorted(set(params) - set(state)), sorted(set(state) - set(params))
    if missing or extra:
        raise ValueError(f"trainable parameters differ (missing {missing[:3]}, unknown {extra[:3]})")
    with torch.no_grad():
        for n, p in params.items():
            if tuple(state[n].shape) != tuple(p.shape):
                raise ValueError(f"{n} has shape {tuple(state[n].shape)}, the model's is {tuple(p.shape)}")
            p.copy_(state[n])


def rng_states() -> dict:
    """The torch, numpy (global) and Python RNG states, as tensors and plain values."""
    import torch

    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {"torch": torch.get_rng_state(), "numpy": {"kind": str(kind), "keys": [int(k) for k in keys],
                                                      "pos": int(pos), "has_gauss": int(has_gauss),
                                                      "cached_gaussian": float(cached)},
            "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]]}


def set_rng_states(states: dict) -> None:
    import torch

    torch.set_rng_state(states["torch"])
    n = states["numpy"]
    np.random.set_state((n["kind"], np.asarray(n["keys"], dtype=np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))


def read_state(file: os.PathLike, recipe: str, cfg: TinyModelConfig) -> dict:
    """The contents of a build's ``state.pt``, loaded without running code and checked against the
    build that continues it: a :class:`CheckpointError` naming the file when it is damaged, holds
    more than tensors and plain values, lacks fields, or is of another format, build version,
    recipe or config (naming the fields that differ)."""
    import pickle

    import torch

    file = Path(file)
    try:
        blob = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(f"{file}: refused to load: it holds objects other than tensors and plain values "
                              f"(not a build checkpoint; loading it could run code): {_unpickler_reason(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError, EOFError, zipfile errors... for damaged files
        raise CheckpointError(f"{file}: not a readable build checkpoint ({load_failure(exc)})") from None
    if not isinstance(blob, dict):
        raise CheckpointError(f"{file}: not a build checkpoint (holds a {type(blob).__name__}, expected a dict)")
    _check_header(file, blob, recipe, cfg, lambda b: json.loads(b["config"]))
    missing = [k for k in _STATE_KEYS if k not in blob]
    if missing:
        raise CheckpointError(f"{file}: not a complete build checkpoint (missing {', '.join(missing)})")
    if blob["phase"] not in PHASES:
        raise CheckpointError(f"{file}: unknown build phase {blob['phase']!r}")
    return blob


def _check_header(file: Path, blob: dict, recipe: str, cfg: TinyModelConfig, saved_config) -> None:
    if blob.get("format") != BUILD_CHECKPOINT_FORMAT:
        raise CheckpointError(f"{file}: build checkpoint format {blob.get('format')!r}; this version reads "
                              f"{BUILD_CHECKPOINT_FORMAT}")
    if blob.get("build_version") != TINY_RECIPE:
        raise CheckpointError(f"{file}: a checkpoint of build version {blob.get('build_version')!r}; this version "
                              f"builds version {TINY_RECIPE} (start the build afresh)")
    if blob.get("recipe") != recipe:
        raise CheckpointError(f"{file}: a checkpoint of recipe {blob.get('recipe')!r}, not of {recipe!r}")
    try:
        saved = saved_config(blob)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{file}: no readable recipe config ({type(exc).__name__}: {exc})") from None
    if not isinstance(saved, dict):
        raise CheckpointError(f"{file}: no readable recipe config")
    diffs = config_differences(saved, cfg)
    if diffs:
        raise CheckpointError(f"{file}: a checkpoint of recipe {recipe!r} with another config: " + "; ".join(diffs))


_MARKS = {"": str, "mistake": Mistake, "played": Played}


def _mark(action: str) -> str:
    return "mistake" if isinstance(action, Mistake) else "played" if isinstance(action, Played) else ""


def write_transcripts(file: os.PathLike, recipe: str, cfg: TinyModelConfig, episodes: list, per_env: dict) -> None:
    """Save a build's transcripts (atomically, as gzipped JSON; the marks of the turns kept)."""
    file = Path(file)
    blob = {"format": BUILD_CHECKPOINT_FORMAT, "build_version": TINY_RECIPE, "recipe": recipe,
            "config": config_json(cfg), "per_env": per_env,
            "episodes": [[first, [[_mark(a), str(a), o] for a, o in turns]] for first, turns in episodes]}
    file.parent.mkdir(parents=True, exist_ok=True)
    data = gzip.compress(json.dumps(blob).encode("utf-8"), compresslevel=6, mtime=0)
    _atomic(file, lambda tmp: Path(tmp).write_bytes(data))


def read_transcripts(file: os.PathLike, recipe: str, cfg: TinyModelConfig) -> tuple[list, dict]:
    """``(episodes, per_env)`` saved by :func:`write_transcripts`, checked like a state file."""
    file = Path(file)
    try:
        blob = json.loads(gzip.decompress(file.read_bytes()).decode("utf-8"))
        if not isinstance(blob, dict):
            raise ValueError(f"holds a {type(blob).__name__}, expected an object")
    except (OSError, EOFError, ValueError) as exc:
        raise CheckpointError(f"{file}: not readable saved transcripts ({type(exc).__name__}: {exc})") from None
    _check_header(file, blob, recipe, cfg, lambda b: b["config"])
    try:
        episodes = [(str(first), [(_MARKS[m](a), str(o)) for m, a, o in turns]) for first, turns in blob["episodes"]]
        per_env = {str(k): int(v) for k, v in blob["per_env"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"{file}: damaged saved transcripts ({type(exc).__name__}: {exc})") from None
    return episodes, per_env


def _atomic(file: Path, write: Callable[[str], None]) -> None:
    tmp = file.with_name(f"{file.name}.{os.getpid()}.tmp")  # one per process: two builds never share one
    try:
        write(str(tmp))
        os.replace(tmp, file)
    finally:
        tmp.unlink(missing_ok=True)


def checkpoint_summary(folder: os.PathLike) -> Optional[str]:
    """A one-line description of the checkpoint in the build folder ``folder`` (None: it holds none);
    unreadable files are described as such, never loaded unsafely."""
    file = Path(folder) / CHECKPOINT_DIR / STATE_FILE
    if not file.exists():
        return None
    import torch

    try:
        blob = torch.load(file, map_location="cpu", weights_only=True)
        return (f"recipe {blob['recipe']!r}, {blob['phase']} phase, step {blob['step']}/{blob['steps']}")
    except Exception:  # noqa: BLE001 - a description only; --resume reports the error in full
        return "an unreadable checkpoint"
