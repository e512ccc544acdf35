"""Building a tiny model from its recipe: transcripts -> tokenizer -> supervised training -> folder."""

from __future__ import annotations

import copy
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import numpy as np

import twice_envs
from twice_envs._deps import require
from twice_envs.agents.models import lora
from twice_envs.agents.models.dirs import (
    SMOLLM2_NAME,
    TINY_NAME,
    models_dir,
    publish_dir,
)
from twice_envs.agents.models.gguf import smollm2_dir
from twice_envs.agents.models.recipes import (
    ADAPTER_FILE,
    DEFAULT_RECIPE,
    RECIPES,
    TINY_RECIPE,
    TinyModelConfig,
    model_name,
    shipped_adapter,
    shipped_dir,
    tiny_is_current,
    transcript_env_kwargs,
)
from twice_envs.agents.models.resume import (
    CHECKPOINT_DIR,
    CHECKPOINT_EVERY,
    TRANSCRIPTS_FILE,
    BuildCheckpoint,
)
from twice_envs.agents.models.sft import (
    copy_sequences,
    match_sequences,
    sft_sequences,
    stack_layers,
    train_sft,
)
from twice_envs.agents.models.tokenizer import SPECIAL_TOKENS, train_tokenizer
from twice_envs.agents.models.transcripts import (
    AUGMENTERS,
    available_envs,
    corpus_texts,
    entity_ids,
    relabelled_episodes,
    scripted_agent,
    scripted_episodes,
)
from twice_envs.agents.sampling.devices import torch_device
from twice_envs.agents.sampling.policy import HFPolicy


def build_tiny(out_dir: Optional[os.PathLike] = None, config: Optional[TinyModelConfig] = None, *,
               progress: bool = True, recipe: str = DEFAULT_RECIPE, device: str = "cpu",
               checkpoint_every: int = CHECKPOINT_EVERY, resume: bool = False) -> Path:
    """Build the tiny model into ``out_dir`` (default: the cache) and return its path; ``config``
    defaults to the :data:`RECIPES` entry ``recipe``, whose name is recorded with the build.

    ``device`` is where the model trains (``cpu``, ``cuda``, ...; a device this machine lacks is
    refused before any work). The weights are saved from the CPU either way; float training is not
    bit-identical across devices, so only a CPU build is compared byte for byte with a shipped one.

    While it trains, the build keeps a checkpoint in ``out_dir/checkpoint`` (:mod:`.resume`): its
    transcripts once drawn, and its training state every ``checkpoint_every`` optimiser steps
    (0: no checkpoint). With ``resume``, a checkpoint there is checked against this recipe and
    config and continued (transcripts not drawn again, training from the saved step); without
    one the build starts afresh and says so. The finished build replaces the checkpoint.
    """
    torch = require("torch", "hf", "the tiny model")
    transformers = require("transformers", "hf", "the tiny model")
    cfg = config or RECIPES[recipe]

    dev = torch_device(device)

    if cfg.relabel_episodes and not cfg.start_from:
        raise ValueError("relabel_episodes needs start_from: the build whose states are relabelled")
    final = Path(out_dir) if out_dir is not None else models_dir() / TINY_NAME
    log = (lambda msg: print(f"[build-tiny] {msg}", file=sys.stderr, flush=True)) if progress else (lambda msg: None)
    t0 = time.time()
    ckpt = BuildCheckpoint(final, recipe, cfg, every=checkpoint_every, resume=resume, log=log)
    saved = ckpt.load_transcripts()
    if resume and ckpt.saved is None and saved is None:
        log(f"no checkpoint in {final / CHECKPOINT_DIR}: starting the build afresh")
    envs = available_envs(cfg.envs)
    if not envs:
        raise RuntimeError(f"none of the envs {cfg.envs} can be made here; the tiny model needs transcripts")
    episodes, per_env = [], {}
    if saved is not None:
        episodes, per_env = saved
        log(f"{len(episodes)} saved transcripts from {final / CHECKPOINT_DIR / TRANSCRIPTS_FILE}")
    for k, env_id in enumerate(envs if saved is None else ()):
        n_eps = int(cfg.episodes_by_env.get(env_id, cfg.episodes_per_env))
        t_env = time.time()
        eps = scripted_episodes(env_id, n_eps, seed=cfg.seed + k, skill_range=cfg.skill_range,
                                max_turns=cfg.max_turns, agent_options=cfg.agent_options.get(env_id),
                                env_kwargs=transcript_env_kwargs(cfg, env_id),
                                reset_options=cfg.reset_options.get(env_id))
        log(f"{env_id}: {len(eps)} scripted episodes ({time.time() - t_env:.1f}s)")
        augment = scripted_agent(env_id, AUGMENTERS) if cfg.renamed_copies else None
        if augment is not None:
            env = twice_envs.make(env_id)
            env.reset(seed=cfg.seed)
            eps = eps + augment(env, eps, cfg.renamed_copies, np.random.default_rng([cfg.seed, k, 0xA5]))
            log(f"{env_id}: {len(eps)} transcripts with renamed copies")
        per_env[env_id] = len(eps)
        episodes += eps
    log(f"{len(episodes)} scripted episodes from {', '.join(envs)} ({time.time() - t0:.1f}s)")
    if cfg.start_from and cfg.base_model:
        raise ValueError("start_from and base_model both name the weights to start from: set one")
    base = recipe_build(cfg.start_from, progress=progress, device=device, resume=resume) if cfg.start_from else None
    if cfg.base_model:
        base = pretrained_dir(cfg.base_model)
    whole = sorted(set(entity_ids(envs))) if cfg.id_tokens and base is None else []
    if base is not None:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(base), local_files_only=True)
        log(f"continuing from {base}")
    else:
        tokenizer = transcript_tokenizer(cfg, episodes, envs, whole)
    if cfg.relabel_episodes and saved is None:

        base_policy = HFPolicy.from_pretrained(base, device=dev)
        for k, env_id in enumerate(envs):
            t_env = time.time()
            eps = relabelled_episodes(base_policy, env_id, cfg.relabel_episodes, seed=cfg.seed + 50 + k,
                                      max_turns=cfg.max_turns, window=cfg.window, max_new_tokens=cfg.relabel_tokens,
                                      agent_options=cfg.agent_options.get(env_id),
                                      env_kwargs=transcript_env_kwargs(cfg, env_id),
                                      reset_options=cfg.reset_options.get(env_id))
            log(f"{env_id}: {len(eps)} relabelled states of {cfg.relabel_episodes} episodes of {base.name} "
                f"({time.time() - t_env:.1f}s)")
            per_env[f"{env_id} relabelled"] = len(eps)
            episodes += eps
    if saved is None:
        ckpt.save_transcripts(episodes, per_env)
    seqs = sft_sequences(tokenizer, episodes, cfg.max_len, cfg.context_loss_weight, cfg.end_turns, cfg.window,
                         cfg.mistake_weight)
    n_tok = sum(len(s) for s, _ in seqs)
    log(f"tokenizer: {len(tokenizer)} tokens; {len(seqs)} sequences, {n_tok} tokens ({time.time() - t0:.1f}s)")

    threads_before = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    if base is not None:
        model = transformers.LlamaForCausalLM.from_pretrained(str(base), local_files_only=True, dtype=torch.float32)
    else:
        mcfg = llama_config(cfg, tokenizer)
        model = transformers.LlamaForCausalLM(mcfg)
        if cfg.embedding_std != mcfg.initializer_range:
            with torch.no_grad():
                model.get_input_embeddings().weight.normal_(0.0, cfg.embedding_std)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: Llama, {n_params / 1e6:.2f}M parameters")
    adapter = None
    if cfg.base_model:
        adapter = {"base_model": cfg.base_model, "alpha": 2.0 * cfg.adapter_rank,
                   "trainable": lora.add_adapters(model, rank=cfg.adapter_rank, alpha=2.0 * cfg.adapter_rank,
                                                  layers=range(-cfg.adapter_layers, 0), seed=cfg.seed)}
        log(f"adapters: rank {cfg.adapter_rank} in the top {cfg.adapter_layers} blocks, "
            f"{adapter['trainable'] / 1e6:.2f}M trainable parameters")
    model.to(dev)
    try:
        if cfg.copy_steps and base is None:
            copy_seqs = copy_sequences(cfg.copy_vocab or len(tokenizer), 4 * cfg.copy_steps * cfg.batch_size, cfg.copy_length,
                                       first_id=len(SPECIAL_TOKENS), seed=cfg.seed)
            warm = model
            if 0 < cfg.copy_layers < cfg.num_layers:
                small = copy.deepcopy(mcfg)
                small.num_hidden_layers = cfg.copy_layers
                torch.manual_seed(cfg.seed)
                warm = transformers.LlamaForCausalLM(small)
                warm.get_input_embeddings().weight.data.copy_(model.get_input_embeddings().weight.data)
                warm.to(dev)
            log(f"copying warm-up: {cfg.copy_steps} steps, {warm.config.num_hidden_layers} layers")
            train_sft(warm, copy_seqs, steps=cfg.copy_steps, batch_size=4 * cfg.batch_size, lr=cfg.lr, seed=cfg.seed,
                      log=log, pad_id=tokenizer.pad_token_id, stop_loss=0.1, checkpoint=ckpt.phase("copy"))
            # the first drill's alphabet, which the later drills draw from too
            letters = list(range(len(SPECIAL_TOKENS), cfg.copy_vocab or len(tokenizer) - len(whole)))
            if cfg.copy_id_steps and whole:
                # as many draws of the id tokens as of the first drill's alphabet
                ids = tokenizer.convert_tokens_to_ids(whole)
                alphabet = letters + ids * max(1, round(len(letters) / len(ids)))
                log(f"copying drill over {len(ids)} id tokens: {cfg.copy_id_steps} steps")
                train_sft(warm, copy_sequences(0, 4 * cfg.copy_id_steps * cfg.batch_size, cfg.copy_length, seed=cfg.seed + 1,
                                               alphabet=alphabet),
                          steps=cfg.copy_id_steps, batch_size=4 * cfg.batch_size, lr=cfg.lr, seed=cfg.seed + 1, log=log,
                          pad_id=tokenizer.pad_token_id, checkpoint=ckpt.phase("copy_id"))
            if cfg.match_steps:
                names = tokenizer.convert_tokens_to_ids(whole) if whole else letters[5:]  # the first five mark
                log(f"lookup drill over {len(names)} names: {cfg.match_steps} steps")
                train_sft(warm, match_sequences(4 * cfg.match_steps * cfg.batch_size, names, letters, seed=cfg.seed + 2),
                          steps=cfg.match_steps, batch_size=4 * cfg.batch_size, lr=cfg.lr, seed=cfg.seed + 2, log=log,
                          pad_id=tokenizer.pad_token_id, stop_loss=0.1, checkpoint=ckpt.phase("match"))
            if warm is not model:
                stack_layers(model, warm)
        train_sft(model, seqs, steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr, seed=cfg.seed, log=log,
                  pad_id=tokenizer.pad_token_id, length_buckets=cfg.length_buckets, checkpoint=ckpt.phase("sft"))
    finally:
        torch.set_num_threads(threads_before)
    meta = {"built_by": "twice models build-tiny", "recipe": TINY_RECIPE, "recipe_name": recipe, "config": asdict(cfg), "envs": per_env, "parameters": n_params,
            "train_tokens": n_tok, "seconds": round(time.time() - t0, 1), "device": str(dev)}
    if adapter is not None:
        meta["adapter"] = adapter
    _save_model(model, tokenizer, meta, final)
    log(f"saved to {final} ({time.time() - t0:.1f}s)")
    return final


def transcript_tokenizer(cfg: TinyModelConfig, episodes: list, envs: list, whole: list):
    """The tokenizer a from-scratch recipe trains on its transcripts (and with
    ``cfg.tokenizer_corpus`` the envs' corpora); ``whole``: tokens kept whole."""
    texts = []
    for first_obs, turns in episodes:
        texts.append(first_obs)
        for a, o in turns:
            texts += [a, o]
    if cfg.tokenizer_corpus:
        texts += corpus_texts(envs)
    return train_tokenizer(texts, cfg.vocab_size, whole)


def llama_config(cfg: TinyModelConfig, tokenizer):
    """The ``LlamaConfig`` of a from-scratch recipe's model over ``tokenizer``."""
    transformers = require("transformers", "hf", "the tiny model")
    return transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=max(2048, cfg.max_len * 4),
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )


def _save_model(model, tokenizer, meta: dict, final: Path) -> None:
    """Write a trained model into ``final`` atomically: its weights (with the adapters of an
    adapted build, ``meta["adapter"]``, saved apart and merged in), tokenizer and ``twice_model.json``."""
    model.eval()
    model.to("cpu")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    if "adapter" in meta:
        from safetensors.torch import save_file

        save_file(lora.adapter_state(model), str(tmp / ADAPTER_FILE))
        lora.merge_adapters(model)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / "twice_model.json").write_text(json.dumps(meta, indent=1, default=list))
    publish_dir(tmp, final)


def recipe_build(recipe: str, *, progress: bool = True, device: str = "cpu", resume: bool = False) -> Path:
    """The folder of a current build of ``recipe``: the cached one (under its model name, else
    ``recipe-NAME``), else the shipped one, else a fresh build into the cache on ``device`` (a
    recipe that another one starts from need not be shipped); with ``resume``, that build
    continues from a checkpoint an interrupted one left in the cache."""
    cached = models_dir() / (model_name(recipe) or f"recipe-{recipe}")
    return ready_build(recipe, cached) or build_tiny(cached, recipe=recipe, progress=progress, device=device,
                                                     resume=resume)


def pretrained_dir(name_or_path: str) -> Path:
    """The folder of a pretrained model a recipe fine-tunes (``TinyModelConfig.base_model``):
    ``smollm2-135m``, converted into the cache on first use, or a local Hugging Face folder."""
    if name_or_path.lower() in (SMOLLM2_NAME, "smollm2"):
        return smollm2_dir()
    path = Path(name_or_path).expanduser()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"base model {name_or_path!r} is neither {SMOLLM2_NAME} nor a local Hugging Face "
                                "model folder (a folder with config.json); models are never downloaded")
    return path


def build_from_adapter(adapter_dir: os.PathLike, out_dir: os.PathLike) -> Path:
    """Rebuild a build shipped as its adapters alone (``adapter.safetensors`` and
    ``twice_model.json``) into ``out_dir``: the base model's weights with the adapters merged in,
    its tokenizer, and the build's description. On the machine that trained it, the weights are
    those of the build byte for byte (the merge is the same arithmetic)."""
    torch = require("torch", "hf", "adapted models")
    transformers = require("transformers", "hf", "adapted models")
    from safetensors.torch import load_file

    adapter_dir, final = Path(adapter_dir), Path(out_dir)
    meta_path = adapter_dir / "twice_model.json"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        base_model, alpha = meta["adapter"]["base_model"], float(meta["adapter"]["alpha"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{meta_path}: not the description of an adapted build ({type(exc).__name__}: {exc})") from exc
    try:
        state = load_file(str(adapter_dir / ADAPTER_FILE))
    except Exception as exc:  # safetensors raises its own error types
        raise ValueError(f"{adapter_dir / ADAPTER_FILE}: unreadable adapters ({type(exc).__name__}: {exc})") from exc
    base = pretrained_dir(base_model)
    model = transformers.LlamaForCausalLM.from_pretrained(str(base), local_files_only=True, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(base), local_files_only=True)
    lora.apply_adapter(model, state, alpha)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    shutil.copyfile(adapter_dir / ADAPTER_FILE, tmp / ADAPTER_FILE)
    shutil.copyfile(meta_path, tmp / "twice_model.json")
    publish_dir(tmp, final)
    return final


def ready_build(recipe: str, path: os.PathLike) -> Optional[Path]:
    """A current build of ``recipe`` without training: ``path`` if it holds one, else the shipped
    build, else ``path`` rebuilt from the shipped adapters (seconds); None if there is none."""
    if tiny_is_current(path, recipe):
        return Path(path)
    shipped = shipped_dir(recipe)
    if shipped is not None and tiny_is_current(shipped, recipe):
        return shipped
    adapter = shipped_adapter(recipe)
    return build_from_adapter(adapter, path) if adapter is not None else None
