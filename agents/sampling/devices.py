"""Where models run: a device name checked against this machine before any work starts."""

from __future__ import annotations

import argparse
from typing import Any


def torch_device(name: Any) -> Any:
    """``name`` (``cpu``, ``cuda``, ``cuda:N``, ``mps``) as a ``torch.device`` that this machine has;
    otherwise a ``ValueError`` naming it (torch's own error for a missing CUDA build or GPU comes
    later, mid-run, and does not say which setting asked for the device)."""
    import torch

    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device {name!r} is not a torch device (cpu, cuda, cuda:N, mps): {exc}") from exc
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (dev.index or 0) >= count:
            raise ValueError(f"device {name!r} is not available here: torch sees {count} CUDA device(s)")
    elif dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(f"device {name!r} is not available here: torch sees no MPS device")
    elif dev.type != "cpu":
        raise ValueError(f"device {name!r}: models run on cpu, cuda or mps")
    return dev


def device_arg(name: str) -> str:
    """An argparse ``type`` for a ``--device`` option: ``name`` if :func:`torch_device` accepts it."""
    try:
        torch_device(name)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return name
