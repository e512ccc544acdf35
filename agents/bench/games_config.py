"""The settings of ``twice bench games`` (:class:`GamesBenchConfig`), sized for two shared CPU cores."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

from twice_envs.agents.bench.heldout import GAMES, GameSetting
from twice_envs.agents.credit.registry import methods as registered_methods
from twice_envs.agents.models.load import resolve_model_dir
from twice_envs.agents.models.recipes import play_max_turns, trained_env_kwargs, trained_window


@dataclass
class GamesBenchConfig:
    """``twice bench games`` settings (the defaults are sized for two shared CPU cores)."""

    envs: tuple[str, ...] = ("ALFWorld-v0", "WebShop-v0")
    """Envs to compare on."""
    methods: tuple[str, ...] = field(default_factory=lambda: registered_methods("games"))
    """Credit methods (each starts from the same model; default: the registered methods that join this bench)."""
    seeds: tuple[int, ...] = (0, 1, 2)
    """Training seeds per method."""
    updates: int = 4
    """Policy updates per run."""
    tasks_per_update: int = 4
    """Training tasks per update."""
    group_size: int = 4
    """Episodes per training task."""
    eval_tasks: Optional[int] = None
    """Held-out tasks per evaluation (None: the env's ``GameSetting.bench_eval``, or with
    ``--eval-only`` the whole held-out set: all ALFWorld valid_unseen games, 100 WebShop test goals)."""
    eval_samples: Optional[int] = None
    """Episodes per held-out task and evaluation (None: the env's ``GameSetting.bench_eval``; 4 with
    ``--eval-only``)."""
    lr: float = 2e-4
    """Learning rate."""
    filter_groups: bool = False
    """Dynamic sampling for every method (:attr:`~twice_envs.agents.training.config.TrainConfig.filter_groups`):
    train on ``tasks_per_update`` groups whose returns differ, drawing up to ``TrainConfig.max_sample_batches``
    batches an update."""
    beta: float = 0.5
    """Auxiliary budget of Twice and CRR."""
    out: str = "runs/games"
    """Output folder (a run folder per env, method and seed; results.json; curves PNG)."""
    model: Optional[dict] = None
    """Start model per env id (None: the env's tiny game model)."""
    max_turns: Optional[int] = None
    """Turn cap of training and held-out episodes (None: the start model's, else the env's :data:`GAMES` setting)."""
    max_new_tokens: Optional[int] = None
    """Tokens per turn at most (None: the env's :data:`GAMES` setting)."""
    eval_every: int = 0
    """Also evaluate held-out success every N updates while a method trains (0: only after training): the
    method's held-out learning curve, each point paired with the start model (``curve`` in results.json)."""
    train_kwargs: Optional[dict] = None
    """Extra ``make`` kwargs of the training env per env id, e.g. ``{"WebShop-v0": {"reward": "success"}}``
    (train on the success the held-out figures count, not the graded score); held-out envs are unchanged."""
    choose: Optional[str] = None
    """``sum`` or ``mean``: every policy chooses among the env's listed actions by that score and trains each
    choice as one decision (:attr:`~twice_envs.agents.training.config.TrainConfig.choose`); None: free text."""
    micro_batch: Optional[int] = None
    """Episodes per forward/backward pass of an update (:attr:`TrainConfig.micro_batch`; None: a whole
    minibatch). Bounds the memory of large updates."""
    resume: bool = False
    """Continue each run whose folder holds a checkpoint to ``updates`` (:func:`continue_run`): a
    comparison measured at one size is carried to a larger one without training its first updates
    again; the curve points evaluated before (``curve.json`` of each run) are kept."""
    eval_noise_seed: int = 10**6 + 1
    """Noise seed of the held-out evaluations of training seed 0 (seed ``s`` uses this plus ``s``): the same
    seed gives the same held-out luck, so runs with the same seed pair up episode by episode."""
    jobs: int = 1
    """Runs (a method and a seed each) trained at once, each in a spawned process of its own (one per core puts
    every core to work). The figures do not depend on it (each run trains
    on one thread from its own seed)."""

    def start_model(self, env_id: str) -> str:
        """The start model of ``env_id`` (name or folder)."""
        return (self.model or {}).get(env_id) or GAMES[env_id].model

    def eval_size(self, env_id: str) -> tuple[Optional[int], int]:
        """``(tasks, samples)`` of each evaluation in the RL comparison: each as set, else the env's default."""
        tasks, samples = GAMES[env_id].bench_eval
        return (tasks if self.eval_tasks is None else self.eval_tasks), (self.eval_samples or samples)

    def setting(self, env_id: str) -> GameSetting:
        """The env's :data:`GAMES` setting with this run's overrides; the env is made with the kwargs
        the start model was trained with (:func:`~twice_envs.agents.models.recipes.trained_env_kwargs`), with
        its history window unless the setting names one, and with its turn cap
        (:func:`~twice_envs.agents.models.recipes.play_max_turns`) unless ``max_turns`` is set."""

        s = GAMES[env_id]
        model_dir = resolve_model_dir(self.start_model(env_id))
        kwargs = {**s.env_kwargs, **trained_env_kwargs(model_dir, env_id)}
        window = s.window if s.window is not None else trained_window(model_dir)
        turns = self.max_turns or play_max_turns(model_dir, s.max_turns)
        return replace(s, env_kwargs=kwargs, max_turns=turns,
                       max_new_tokens=self.max_new_tokens or s.max_new_tokens, window=window)
