"""Where models live: the cache folder, the shipped tiny models, and checks of a model folder."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from twice_envs import _cache
from twice_envs.errors import TwiceError

SMOLLM2_NAME = "smollm2-135m"
TINY_NAME = "tiny"
#: The ``tiny`` model as shipped with the package (the ``reader`` recipe), so a fresh install
#: needs no build. ``twice models build-tiny --check`` rebuilds it and compares its quality.
SHIPPED_TINY = Path(__file__).resolve().parent / "tiny"
#: Files every model folder needs (the weights may be one file or shards).
MODEL_FILES = ("config.json",)


class ModelFolderError(TwiceError, ValueError):
    """A model folder is incomplete or corrupt (the message names the folder)."""


def models_dir() -> Path:
    """Where built and converted models live."""
    return _cache.cache_dir("models")


def tiny_path() -> Path:
    """The cached build of the ``tiny`` model."""
    return models_dir() / TINY_NAME


def publish_dir(tmp: Path, final: Path) -> None:
    """Move a finished model folder from ``tmp`` to ``final``, replacing an older one there."""
    if final.exists():
        shutil.rmtree(final)
    _cache.publish_dir(tmp, final, "config.json")


def check_model_dir(path: os.PathLike) -> Path:
    """``path`` if it looks like a loadable Hugging Face model folder; else a clear error naming it.

    Missing folder or ``config.json``: :class:`FileNotFoundError`; unreadable ``config.json``,
    no weights or no tokenizer: :class:`ModelFolderError`.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"model folder {path} does not exist")
    config = path / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"model folder {path} has no config.json (not a Hugging Face model folder)")
    try:
        json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ModelFolderError(f"model folder {path}: config.json is not valid JSON ({exc})") from exc
    weights = [p for p in path.iterdir() if p.suffix in (".safetensors", ".bin") or p.name.endswith(".gguf")]
    if not weights:
        raise ModelFolderError(f"model folder {path} holds no weights (*.safetensors or *.bin)")
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        raise ModelFolderError(f"model folder {path} holds no tokenizer (tokenizer.json, tokenizer.model or vocab.json)")
    return path
