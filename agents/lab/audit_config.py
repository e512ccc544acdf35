"""What the LLM audit samples (:class:`AuditConfig`) and what it gives back (:class:`AuditResult`).

See :mod:`twice_envs.agents.lab.audit` for the audit itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from twice_envs.agents import stats as cs
from twice_envs.errors import TwiceError


class NothingToAudit(TwiceError):
    """The audited episodes hold no decision to audit (with ``mixed_only``: no group with differing returns)."""


@dataclass
class AuditConfig:
    """What the audit samples."""

    env: str = "SearchQA-v0"
    """Env id."""
    env_kwargs: dict = field(default_factory=dict)
    """Env kwargs."""
    split: str = "dev"
    """Held-out split."""
    questions: int = 16
    """Held-out questions (one audited factual episode each; with ``mixed_only``, the candidates)."""
    mixed_only: bool = False
    """Audit only the questions whose group has mixed outcomes (some episodes succeed, some
    fail). Where a weak policy fails every episode of a question, its decisions hardly change
    the expected outcome and every estimator's credit is 0 there, which says nothing about
    the estimators; the rates are then conditional on the question being within reach."""
    group_size: int = 5
    """GRPO group size (the group gives GRPO's baseline)."""
    oracle_rollouts: int = 64
    """Independent rollouts per state for the oracle values (at least 1; the standard error of
    ``A*`` needs 2 and shrinks as ``1 / sqrt(oracle_rollouts)``)."""
    pairs: tuple = (1,)
    """``J`` values: independent pairs per decision for Twice's diagnostic row and
    counterfactuals per decision for CRR."""
    vine_k: tuple = (2,)
    """``K`` values: VinePPO rollouts per state."""
    training_row: bool = True
    """Also run the training-time Twice credit (``twice-train`` rows)."""
    beta: float = 0.7
    """Auxiliary budget of the training-time row."""
    threshold: float = cs.THRESHOLD
    """Decisions with ``|A*|`` at least this count for the wrong-sign rate."""
    n_boot: int = 1000
    """Bootstrap resamples."""
    max_new_tokens: int = 128
    """Tokens per turn."""
    max_turns: Optional[int] = 4
    """Turn cap."""
    window: Optional[int] = None
    """Turns of history in the model's context (None: the whole episode); a windowed model is
    audited with the window it plays with."""
    temperature: float = 1.0
    """Sampling temperature."""
    indexed_tasks: bool = True
    """Name tasks by ``{"split", "index"}`` reset options."""
    seed: int = 0
    """Noise seed of the audit."""
    decisions: int = 0
    """Audit at least this many decisions where the sampled groups hold them: after the first episode of
    every group, the second of every group, and so on (0: the first episode of each group only)."""


@dataclass
class AuditResult:
    """Per-decision values, the table with CIs, the per-turn table and the comparisons."""

    config: AuditConfig
    oracle: np.ndarray
    """``A*`` per audited decision."""
    episodes: np.ndarray
    """The audited episode of each decision (the bootstrap resamples these)."""
    turns: np.ndarray
    """The turn of each decision."""
    credit: dict
    """Method -> credit per decision (utility units)."""
    aux_tokens: dict
    """Method -> auxiliary tokens generated."""
    pairs_of: dict
    """Method -> ``J`` (0 where no pair ceiling applies)."""
    rows: list
    """One row per method: each figure as ``{"value", "lo", "hi"}``."""
    pair_rows: list
    """Twin vs independent pairs (``J = 1``): pooled and per-decision rho, ties, reversals."""
    per_turn: list
    comparisons: list
    policy_tokens: int = 0
    """Tokens the policy generated in the audited episodes."""
    questions: int = 0
    """Questions audited (fewer than asked for with ``mixed_only``)."""
    group_utilities: list = field(default_factory=list)
    """Utilities of every sampled factual episode, in group order (audited or not)."""
    budget: dict = field(default_factory=dict)
    """Budgeted update rows (``twice``, ``crr``): target, accounted and generated auxiliary tokens
    and their ratios to the target (:func:`~twice_envs.agents.lab.scoring.budget_figures`)."""
    gigpo_penalty: dict = field(default_factory=dict)
    """What GiGPO's invalid-action penalty changes (not part of the ``gigpo`` row)."""
    oracle_se: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """The standard error of ``A*`` per audited decision (NaN where a state has fewer than two
    rollouts; empty where the oracle is not estimated from rollouts)."""
    skipped: dict = field(default_factory=dict)
    """Registered methods without a row, and why (:func:`~twice_envs.agents.lab.audit.other_update_rows`)."""
    records: tuple = ()
    """``(factual episodes, twins)``: every sampled factual episode and the coupled twin of pair 0 of
    each audited decision (its ``twin_of`` names the episode's index and the turn), for the explorer."""
    coupling: dict = field(default_factory=dict)
    """The coupling figures (:func:`~twice_envs.agents.lab.coupling.coupling_summary`; rho-bar from the
    estimated oracle), where both pair sets were run."""
    table2: list = field(default_factory=list)
    """The published table's methods and their rows (:func:`~twice_envs.agents.lab.table2.mark_tables`)."""

    def row(self, method: str) -> dict:
        return next(r for r in self.rows if r["method"] == method)

    def oracle_resolution(self) -> dict:
        """The median and 90th percentile of :attr:`oracle_se` over the decisions where it is finite
        (NaN where none is), the threshold, and ``resolves``: whether the median is at most the
        threshold (``None`` where no standard error is finite)."""
        se = np.asarray(self.oracle_se, float)
        se = se[np.isfinite(se)]
        median, p90 = (float(np.median(se)), float(np.percentile(se, 90))) if len(se) else (float("nan"),) * 2
        return {"median_se": median, "p90_se": p90, "threshold": float(self.config.threshold),
                "resolves": bool(median <= self.config.threshold) if len(se) else None}
