"""The settings of a training run (:class:`TrainConfig`) and the settings they imply.

Everything that matters for reproducibility lives in :class:`TrainConfig`; ``config.json``
in a run folder is its JSON form (:func:`read_run_config` reads it back, naming the file
when it is damaged).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Optional

from twice_envs.agents.credit import settings
from twice_envs.agents.credit.ablations import apply_ablations
from twice_envs.agents.credit.registry import get_method
from twice_envs.agents.credit.twice import TwiceConfig
from twice_envs.agents.credit.vineppo import VineConfig
from twice_envs.agents.sampling.choice import SCORES
from twice_envs.agents.sampling.policy import SamplingConfig
from twice_envs.errors import DataFormatError


@dataclass
class TrainConfig:
    """One training run. Defaults are the CPU settings for the tiny model (see :func:`cpu_config`)."""

    env: str = "SearchQA-v0"
    """Registered env id."""
    env_kwargs: dict = field(default_factory=dict)
    """Keyword arguments for ``twice_envs.make``."""
    model: str = "tiny"
    """``tiny``, ``smollm2-135m`` or a local Hugging Face model directory."""
    method: str = "twice"
    """Credit method: a name in :mod:`twice_envs.agents.credit.registry`."""
    credit: Any = None
    """The method's settings: an instance of its registered config class (None: its defaults;
    :func:`credit_settings`). ``config.json`` holds them in full."""
    updates: int = 30
    """Policy updates (one batch of questions each)."""
    questions_per_update: int = 8
    """Tasks per update (published: 256)."""
    group_size: int = 5
    """Episodes per task (G; published: 5); a method registered with ``rollouts=r`` samples ``r x G``."""
    filter_groups: bool = False
    """Dynamic sampling (DAPO; verl's ``algorithm.filter_groups``): drop the task groups whose episodes
    all end with the same return (their GRPO credit is zero) and draw further batches of
    ``questions_per_update`` tasks until that many groups with differing returns are kept, or
    ``max_sample_batches`` batches are drawn. The update trains on at most ``questions_per_update``
    such groups (on the first batch as sampled when no batch has one). Rollouts cost up to
    ``max_sample_batches`` times as much (``sample_batches`` and ``trained_groups`` in the metrics).
    The filter is on outcomes for every method, Twice's twins included."""
    max_sample_batches: int = 4
    """Batches an update draws at most with ``filter_groups`` (verl's ``max_num_gen_batches``); >= 1."""
    max_turns: Optional[int] = 4
    """Turn cap per episode (None: the env's own limit; SearchQA caps searches at 4 itself)."""
    window: Optional[int] = None
    """Turns of history in the model's context (None: the whole episode; the first prompt,
    which holds the task, is always kept). Use the window the model was trained with."""
    choose: Optional[str] = None
    """Where the env lists its actions (``info["admissible_actions"]``), choose among them by this score of
    their token log-probs (``sum`` or ``mean``; :class:`~twice_envs.agents.sampling.choice.ChoicePolicy`) and
    train the choice as one decision; None: every turn is generated as text."""
    max_new_tokens: int = 128
    """Tokens per turn at most (published: 500; the tiny model's quoted reasoning takes up to about 110)."""
    temperature: float = 1.0
    """Sampling temperature (published: 1)."""
    top_p: float = 1.0
    """Nucleus mass (published: 1)."""
    lr: float = 2e-4
    """Peak AdamW learning rate (published: 1e-6 for real models)."""
    critic_lr: float = 2e-3
    """AdamW learning rate of the critic (methods that need one, e.g. ``ppo``). The PPO recipe trains
    3B/7B models with the critic's rate 10x the actor's (1e-5 against 1e-6); the tiny model's actor rate
    is scaled up (2e-4), and the critic keeps the recipe's ratio: 10 x 2e-4. ``published_config``: 1e-5."""
    warmup_steps: int = 3
    """Optimiser steps of linear learning-rate warm-up."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    minibatches: int = 2
    """Optimiser steps per update (the batch's episodes are split into this many minibatches)."""
    micro_batch: Optional[int] = None
    """Episodes per forward/backward pass (None: a whole minibatch). A minibatch's gradients accumulate
    over its micro-batches before its one optimiser step, each scaled by the minibatch's token count,
    so the step is the same up to float summation order and memory is bounded by the micro-batch
    (what TRL calls gradient accumulation and verl a micro batch)."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm."""
    clip_eps: float = 0.2
    """PPO clip epsilon."""
    kl_coef: float = 0.001
    """KL-to-reference weight."""
    seed: int = 0
    """Seed of task sampling, noise seeds, the minibatch order, the credit step's coins
    (:func:`~twice_envs.agents.training.trainer.credit_generator`) and torch."""
    train_split: str = "train"
    """Split the training tasks come from."""
    dev_split: str = "dev"
    """Split for evaluation."""
    task_pool: Optional[int] = None
    """Training tasks are drawn from the first ``task_pool`` of the split (None: all)."""
    indexed_tasks: bool = True
    """Name tasks by the reset options ``{"split", "index"}`` where the env has splits
    (SearchQA); envs without them get tasks by reset seed only."""
    task_ids: Optional[tuple[int, ...]] = None
    """Train on exactly these tasks of ``train_split``, named by ``{"split", "index"}`` on any env whose
    reset takes them (SearchQA, WebShop): an overfit test's few tasks. None: tasks as ``task_pool`` and
    ``indexed_tasks`` say."""
    eval_questions: int = 40
    """Dev questions for the greedy evaluation."""
    eval_every: int = 0
    """Evaluate every N updates (0: only when asked)."""
    checkpoint_every: int = 10
    """Write a checkpoint every N updates (and at the end)."""
    out_dir: str = "runs/run"
    """Run directory (config, metrics, checkpoint)."""
    threads: int = 1
    """torch CPU threads (0: torch's default; the tiny model runs fastest on one)."""

    def __post_init__(self) -> None:
        if self.choose is not None and self.choose not in SCORES:
            raise ValueError(f"choose must be one of {sorted(SCORES)} or None, got {self.choose!r}")
        cls = get_method(self.method).config
        if self.credit is not None and not isinstance(self.credit, cls or ()):
            raise ValueError(f"credit: the settings of credit method {self.method!r} are "
                             f"{cls.__name__ if cls else 'none'}, got {type(self.credit).__name__}")

    def to_json(self) -> dict:
        d = asdict(replace(self, credit=None))
        d["credit"] = settings.to_json(credit_settings(self))
        d["task_ids"] = None if self.task_ids is None else list(self.task_ids)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "TrainConfig":
        d = dict(d)
        method = d.get("method", cls.method)
        if LEGACY_FIELDS & set(d):  # a run folder written before the method held its own settings
            d["credit"] = legacy_credit(method, d.pop("twice", None), d.pop("vine_k", None), d.pop("ablations", None))
        else:
            d["credit"] = settings.from_json(method, d.get("credit"))
        if d.get("task_ids") is not None:
            d["task_ids"] = tuple(int(i) for i in d["task_ids"])
        return cls(**d)


#: The fields a run's config.json had before each method held its own settings (``credit``).
LEGACY_FIELDS = frozenset({"twice", "vine_k", "ablations"})


def legacy_credit(method: str, twice: Optional[dict], vine_k: Optional[int], ablations: Optional[list]) -> Any:
    """The settings of an older run's ``twice``, ``vine_k`` and ``ablations`` fields, for the run's method.

    A method that reads Twice's settings gets them (its ablations applied); ``vineppo`` gets ``vine_k``. Any
    value the run set that its method's settings cannot hold raises naming the field, rather than resume
    the run with other settings than it was trained with (Twice's settings that a method never read are
    dropped, except the sampler's ``key_mode``, which every method's sampling read)."""
    cls = get_method(method).config
    old = TwiceConfig(**(twice or {}))
    changed = apply_ablations(old, tuple(ablations or ()))
    if cls is TwiceConfig:
        return changed
    if ablations:
        raise ValueError(f"ablations: {list(ablations)} change Twice's settings, which credit method {method!r} "
                         "does not hold")
    if old.key_mode != TwiceConfig.key_mode:
        raise ValueError(f"twice.key_mode: {old.key_mode!r} was the run's sampler key mode, which the settings of "
                         f"credit method {method!r} do not hold")
    if cls is VineConfig:
        return VineConfig(per_state=int(vine_k if vine_k is not None else VineConfig.per_state),
                          budget=None)  # such runs estimated every boundary
    return None if cls is None else cls()


def cpu_config(**overrides: Any) -> TrainConfig:
    """CPU defaults for the tiny model: 8 questions x G=5 per update, 128-token turns, lr 2e-4.

    Sized so that a few dozen updates of GRPO and Twice fit in minutes on two cores.
    """
    return replace(TrainConfig(), **overrides)


#: The published run length and learning-rate warm-up, in updates.
PUBLISHED_UPDATES = 400
PUBLISHED_WARMUP_UPDATES = 20


def published_config(**overrides: Any) -> TrainConfig:
    """The method's published settings for real models: 400 updates of 256 questions, G = 5, lr 1e-6 after a
    linear warm-up of 20 updates, 500-token turns, 4 minibatches (PPO mini-batches of 64 questions).

    The scheduler steps once per optimiser step, so the warm-up is ``20 x minibatches`` steps (of the
    overridden ``minibatches`` too) unless ``warmup_steps`` is given."""
    minibatches = overrides.get("minibatches", 4)
    base = TrainConfig(
        questions_per_update=256, group_size=5, max_turns=None, max_new_tokens=500, temperature=1.0, top_p=1.0,
        lr=1e-6, critic_lr=1e-5, warmup_steps=PUBLISHED_WARMUP_UPDATES * minibatches, minibatches=minibatches,
        updates=PUBLISHED_UPDATES, eval_questions=500, eval_every=10, checkpoint_every=10, threads=0,
    )
    return replace(base, **overrides)


def sampling_config(config: TrainConfig, *, greedy: bool = False) -> SamplingConfig:
    """The sampling settings of a run (greedy for evaluation); the noise key mode is the method's
    ``key_mode`` setting where it has one (Twice's and the methods that read its settings)."""
    return SamplingConfig(temperature=config.temperature, top_p=config.top_p, max_new_tokens=config.max_new_tokens,
                          greedy=greedy, key_mode=getattr(credit_settings(config), "key_mode", TwiceConfig.key_mode))


def credit_settings(config: TrainConfig) -> Any:
    """The run's method settings: ``config.credit``, or the defaults of the method's config class (None for a
    method without settings)."""
    if config.credit is not None:
        return config.credit
    cls = get_method(config.method).config
    return None if cls is None else cls()


def with_settings(config: TrainConfig, **values: Any) -> TrainConfig:
    """``config`` with ``values`` set in its method's settings where the settings have such fields (the others
    are not the method's settings and are left out: ``with_settings(cfg, beta=0.5)`` sets Twice's budget and
    leaves GRPO as it is)."""
    current = credit_settings(config)
    if current is None:
        return config
    names = {f.name for f in fields(current)}
    return replace(config, credit=replace(current, **{k: v for k, v in values.items() if k in names}))


def read_run_config(file: os.PathLike) -> TrainConfig:
    """A run's ``config.json``; a damaged or foreign file raises :class:`~twice_envs.errors.DataFormatError` naming it."""
    file = Path(file)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise DataFormatError(file, None, f"not UTF-8 text ({exc.reason})") from None
    except json.JSONDecodeError as exc:
        raise DataFormatError(file, exc.lineno, f"invalid JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise DataFormatError(file, None, f"expected a JSON object of training settings, found a {type(data).__name__}")
    try:
        return TrainConfig.from_json(data)
    except (TypeError, ValueError) as exc:  # unknown or misspelt fields, values of the wrong kind
        raise DataFormatError(file, None, f"not a training config: {exc}") from None
