"""The model an unfinished build holds: ``twice models export DIR --out OUT``.

A long build (:mod:`.resume`) saves its training state every few steps. To measure it before
it ends (a learning curve of held-out success, say), :func:`export_checkpoint` writes the
weights of its last checkpoint as an ordinary model folder, loadable by every command that
takes ``--model``, without touching the checkpoint: the build continues from it as before.

The folder is that of a finished build (weights, tokenizer, ``twice_model.json``; an adapted
recipe's adapters too), except that its ``twice_model.json`` records the checkpoint
(``"checkpoint": {"phase", "step", "steps"}``), so it is never taken for the finished build of
its recipe. Only the transcripts' phase has a model to export: the copying and lookup drills
train a warm-up model that is not yet the build's.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from twice_envs._deps import require
from twice_envs.agents.models import lora
from twice_envs.agents.models.build import (
    _save_model,
    llama_config,
    pretrained_dir,
    ready_build,
    transcript_tokenizer,
)
from twice_envs.agents.models.dirs import models_dir
from twice_envs.agents.models.recipes import TINY_RECIPE, TinyModelConfig, model_name
from twice_envs.agents.models.resume import (
    CHECKPOINT_DIR,
    STATE_FILE,
    TRANSCRIPTS_FILE,
    load_trainable,
    read_state,
    read_transcripts,
    recorded_config,
)
from twice_envs.agents.models.transcripts import entity_ids
from twice_envs.agents.training.checkpoint import CheckpointError, load_failure


def checkpoint_recipe(folder: os.PathLike) -> tuple[str, TinyModelConfig]:
    """The recipe name and config recorded in the checkpoint of the build folder ``folder`` (a
    :class:`CheckpointError` naming the file when there is none or it is unreadable)."""
    import torch

    file = Path(folder) / CHECKPOINT_DIR / STATE_FILE
    if not file.is_file():
        raise CheckpointError(f"{file}: no build checkpoint there (is {folder} the output folder of a build "
                              "that was interrupted?)")
    try:
        blob = torch.load(file, map_location="cpu", weights_only=True)
        recipe, saved = str(blob["recipe"]), json.loads(blob["config"])
    except Exception as exc:  # noqa: BLE001 - read_state names the exact fault of a damaged file
        raise CheckpointError(f"{file}: not a readable build checkpoint ({load_failure(exc)})") from None
    if not isinstance(saved, dict):
        raise CheckpointError(f"{file}: no readable recipe config")
    return recipe, recorded_config(saved, file)


def export_checkpoint(folder: os.PathLike, out: os.PathLike, *, recipe: Optional[str] = None,
                      cfg: Optional[TinyModelConfig] = None) -> Path:
    """Write the model held by the checkpoint of the interrupted build in ``folder`` into ``out``
    (atomically) and return ``out``; the checkpoint is left as it was.

    The model is built by the recipe and config the checkpoint records (a build's ``--steps``,
    ``--envs``... included); given ``recipe`` or ``cfg``, the checkpoint is checked against them as
    a resumed build checks it (a :class:`CheckpointError` naming the file and what differs). A checkpoint of the copying or
    lookup drills is refused: that phase trains a warm-up model, not the build's. A recipe that
    starts from another build needs that build here (cached or shipped); none is trained.
    """
    torch = require("torch", "hf", "the tiny model")
    transformers = require("transformers", "hf", "the tiny model")
    folder, out = Path(folder), Path(out)
    saved_recipe, saved_cfg = checkpoint_recipe(folder)
    recipe, cfg = recipe or saved_recipe, cfg or saved_cfg
    state_file = folder / CHECKPOINT_DIR / STATE_FILE
    blob = read_state(state_file, recipe, cfg)
    if blob["phase"] != "sft":
        raise CheckpointError(f"{state_file}: saved in the {blob['phase']} drill (step {blob['step']}/{blob['steps']}), "
                              "before the build trains on its transcripts: there is no model to export yet")
    transcripts = folder / CHECKPOINT_DIR / TRANSCRIPTS_FILE
    if not transcripts.is_file():
        raise CheckpointError(f"{transcripts}: missing; the checkpoint's transcripts name its envs and tokenizer")
    episodes, per_env = read_transcripts(transcripts, recipe, cfg)
    adapter = None
    if cfg.base_model:
        base = pretrained_dir(cfg.base_model)
    elif cfg.start_from:
        base = ready_build(cfg.start_from, models_dir() / (model_name(cfg.start_from) or f"recipe-{cfg.start_from}"))
        if base is None:
            raise FileNotFoundError(f"recipe {recipe!r} starts from the build of {cfg.start_from!r}, which is not "
                                    f"here: build it first (twice models build-tiny --recipe {cfg.start_from})")
    else:
        base = None
    torch.manual_seed(cfg.seed)
    if base is not None:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(base), local_files_only=True)
        model = transformers.LlamaForCausalLM.from_pretrained(str(base), local_files_only=True, dtype=torch.float32)
    else:
        envs = [e for e in cfg.envs if e in per_env]
        whole = sorted(set(entity_ids(envs))) if cfg.id_tokens else []
        tokenizer = transcript_tokenizer(cfg, episodes, envs, whole)
        model = transformers.LlamaForCausalLM(llama_config(cfg, tokenizer))
    if cfg.base_model:
        alpha = 2.0 * cfg.adapter_rank
        adapter = {"base_model": cfg.base_model, "alpha": alpha,
                   "trainable": lora.add_adapters(model, rank=cfg.adapter_rank, alpha=alpha,
                                                  layers=range(-cfg.adapter_layers, 0), seed=cfg.seed)}
    try:
        load_trainable(model, blob["trainable"])
    except ValueError as exc:
        raise CheckpointError(f"{state_file}: its weights do not fit recipe {recipe!r}'s model ({exc})") from None
    meta = {"built_by": "twice models export", "recipe": TINY_RECIPE, "recipe_name": recipe, "config": asdict(cfg),
            "envs": per_env, "parameters": sum(p.numel() for p in model.parameters()),
            "checkpoint": {"phase": blob["phase"], "step": int(blob["step"]), "steps": int(blob["steps"])},
            "device": str(blob.get("device", "cpu"))}
    if adapter is not None:
        meta["adapter"] = adapter
    _save_model(model, tokenizer, meta, out)
    return out
