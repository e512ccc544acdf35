"""Quality of a build, measured the same way for a shipped and a rebuilt model, and compared within tolerances."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from twice_envs.agents.models.recipes import TinyModelConfig, transcript_env_kwargs
from twice_envs.agents.models.sft import sft_sequences, teacher_forced_loss
from twice_envs.agents.models.transcripts import available_envs, scripted_episodes
from twice_envs.agents.sampling.policy import HFPolicy
from twice_envs.agents.training.config import cpu_config
from twice_envs.agents.training.trainer import evaluate

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
    policy = HFPolicy.from_pretrained(Path(path))
    seqs = sft_sequences(policy.tokenizer, check_transcripts(config, episodes), config.max_len,
                         end_turns=config.end_turns, window=config.window)
    loss = teacher_forced_loss(policy.model, seqs, pad_id=policy.tokenizer.pad_token_id)
    em = None
    if em_questions:
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
