"""Checkpoints of a training run: everything that changes during training, saved and restored exactly.

``checkpoint/state.pt`` holds the model, optimiser, scheduler, predictor, the critic (weights and
optimiser, for a method that needs one) and every RNG state,
as tensors and plain values only, so it is read with ``torch.load(..., weights_only=True)``
and a crafted file cannot run code.
"""

from __future__ import annotations

import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from twice_envs.agents.credit import predictor as pred
from twice_envs.errors import TwiceError


class CheckpointError(TwiceError, ValueError):
    """A checkpoint file is missing, unreadable, or holds more than tensors and plain values."""


@dataclass
class TrainState:
    """Everything that changes during training (what a checkpoint holds)."""

    policy: Any
    reference: Any
    optimizer: Any
    scheduler: Any
    predictor: pred.PredictorState
    rng: np.random.Generator
    update: int = 0
    critic: Any = None
    """The run's critic (:class:`~twice_envs.agents.training.critic.LLMCritic`) when its method needs one."""


CHECKPOINT_FORMAT = 1
"""Version of the layout :func:`save_checkpoint` writes (stored under ``"format"``)."""


_CHECKPOINT_KEYS = ("model", "optimizer", "scheduler", "predictor", "rng", "torch_rng", "python_rng", "update")


def save_checkpoint(state: TrainState, path: os.PathLike) -> None:
    """Atomically write model, optimiser, scheduler, predictor and RNG states to ``path/state.pt``.

    Only tensors and plain values (dicts, lists, tuples, numbers, strings) go in, so the
    file loads with ``torch.load(weights_only=True)``.
    """
    import torch

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    blob = {
        "format": CHECKPOINT_FORMAT,
        "model": state.policy.model.state_dict(),
        "optimizer": state.optimizer.state_dict(),
        "scheduler": state.scheduler.state_dict(),
        "predictor": state.predictor.to_json(),
        "rng": state.rng.bit_generator.state,
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
        "update": state.update,
    }
    if state.critic is not None:  # weights and optimiser of the critic (methods that need one)
        blob["critic"] = state.critic.state_dict()
    tmp = path / "state.pt.tmp"
    torch.save(blob, tmp)
    os.replace(tmp, path / "state.pt")


def read_checkpoint(file: os.PathLike) -> dict:
    """The contents of a ``state.pt`` written by :func:`save_checkpoint`, loaded without running code.

    Raises :class:`CheckpointError` naming the file when it is missing, truncated, not a
    torch file, holds objects other than tensors and plain values (a pickle that would
    run code is refused, never executed), or lacks a checkpoint's fields.
    """
    import pickle

    import torch

    file = Path(file)
    if not file.is_file():
        raise CheckpointError(f"{file}: no checkpoint file there")
    try:
        blob = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(f"{file}: refused to load: it holds objects other than tensors and plain values "
                              f"(not a checkpoint written by twice train; loading it could run code): "
                              f"{_unpickler_reason(exc)}") from None
    except Exception as exc:  # torch raises RuntimeError, EOFError, zipfile errors... for damaged files
        raise CheckpointError(f"{file}: not a readable checkpoint ({load_failure(exc)})") from None
    if not isinstance(blob, dict):
        raise CheckpointError(f"{file}: not a checkpoint (holds a {type(blob).__name__}, expected a dict)")
    missing = [k for k in _CHECKPOINT_KEYS if k not in blob]
    if missing:
        raise CheckpointError(f"{file}: not a complete checkpoint (missing {', '.join(missing)})")
    if blob.get("format", CHECKPOINT_FORMAT) != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{file}: checkpoint format {blob['format']!r}; this version reads {CHECKPOINT_FORMAT}")
    return blob


#: Lines of torch's load errors that advise loading unsafely or point elsewhere, not at the file.
_ADVICE = re.compile(r"weights_only|Weights only load failed|trusted source|file an issue|Check the documentation"
                     r"|safe_globals|allowlist", re.IGNORECASE)
#: Terminal colour codes torch puts in its messages.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _unpickler_reason(exc: BaseException, default: str = "it holds objects other than tensors and plain values") -> str:
    """What ``torch.load(weights_only=True)`` found in a file it refused, in one line (``default``
    when the message names nothing).

    torch's message is mostly advice to load the file again with ``weights_only=False``, which
    would run whatever code the file holds; only the finding is kept (the global or the pickle
    operation it refused), never the advice.
    """
    text = _ANSI.sub("", str(exc))
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1]
    for line in text.splitlines():
        line = line.strip().split(". Please")[0].rstrip(".")
        if line and not _ADVICE.search(line):
            return line
    return default


def load_failure(exc: BaseException) -> str:
    """``exc``, raised by ``torch.load(weights_only=True)`` on a damaged or foreign file, as
    ``"Kind: finding"`` in one line, without torch's advice to load the file unsafely."""
    finding = _unpickler_reason(exc, default="")
    return f"{type(exc).__name__}: {finding}" if finding else type(exc).__name__


def load_checkpoint(state: TrainState, path: os.PathLike) -> TrainState:
    """Restore a checkpoint written by :func:`save_checkpoint` (``path`` is its folder) into ``state``."""
    import torch

    blob = read_checkpoint(Path(path) / "state.pt")
    state.policy.model.load_state_dict(blob["model"])
    state.optimizer.load_state_dict(blob["optimizer"])
    state.scheduler.load_state_dict(blob["scheduler"])
    state.predictor = pred.PredictorState.from_json(blob["predictor"])
    state.rng.bit_generator.state = blob["rng"]
    torch.set_rng_state(blob["torch_rng"])
    random.setstate(blob["python_rng"])
    state.update = int(blob["update"])
    if state.critic is not None:
        if "critic" not in blob:
            raise CheckpointError(f"{Path(path) / 'state.pt'}: this run's method needs a critic, and the checkpoint "
                                  "holds none (written by a run of another method?)")
        state.critic.load_state_dict(blob["critic"])
    clear_prefix_cache(state.policy)
    return state


def clear_prefix_cache(policy) -> None:
    """Drop a policy's cached key/values: they were computed by the old weights."""
    cache = getattr(policy, "prefix_cache", None)
    if cache is not None:
        cache.clear()
