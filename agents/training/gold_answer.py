"""The LLM policy's probability of a task's gold answer along an episode (IGPO's ``answer_probs``).

For an episode of ``T`` turns, :func:`answer_probs` gives ``T + 1`` probabilities ``p_0 .. p_T``:
``p_k`` is the probability that the model, shown the context it saw before turn ``k``
(:func:`~twice_envs.agents.rollout.context.turn_context`: the first prompt, then the earlier
turns with their observations; ``k = T``: after the last turn and its observation), writes the
gold answer as its next turn, teacher-forced:

    p_k = exp((1 / L) sum_j log pi(a_j | context_k, a_<j))

the geometric mean over the answer's ``L`` tokens. The answer is the env's final-answer action
(``EpisodeRecord.info["gold_actions"]``, recorded at the end of the rollout from the env's
:meth:`~twice_envs.core.TextEnv.gold_answers` and :meth:`~twice_envs.core.TextEnv.answer_action`:
SearchQA's ``<answer> X </answer>``), encoded as the policy's tokenizer encodes text, without
special tokens. The log-probs are the model's own (temperature 1, no nucleus): a nucleus would
give an answer outside it probability 0 and make every gain between such contexts 0.

Several accepted answers: the first is scored. The same string at every turn makes ``p_k - p_{k-1}``
a change of belief in one answer (a maximum over answers could switch answers between turns and
count the switch as a gain), and the datasets list their canonical answer first.

After the last turn the env recorded no observation tokens (the episode was over); its observation
is encoded with the chat template (:func:`~twice_envs.agents.rollout.context.observation_ids`) so
the answer is scored at the start of a fresh assistant turn, as at every other boundary.

Batched: every (episode, boundary) sequence is packed into padded rows, ``batch_size`` rows per
forward pass, through :func:`~twice_envs.agents.training.loss.token_logprobs` with the answer
tokens as the targets.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from twice_envs.agents.rollout.context import observation_ids, turn_context
from twice_envs.agents.training.loss import PackedBatch, token_logprobs
from twice_envs.agents.types import EpisodeRecord


def gold_action(episode: EpisodeRecord) -> str:
    """The answer text scored for ``episode``: the first of its recorded ``gold_actions``."""
    actions = episode.info.get("gold_actions")
    if not actions:
        raise ValueError(f"episode of {episode.env_id} (seed {episode.seed}) carries no gold answer: its env has none, "
                         "or it was not recorded by the rollout (EpisodeRecord.info['gold_actions'])")
    return str(actions[0])


def boundary_contexts(policy, episode: EpisodeRecord) -> list[list[int]]:
    """The ``T + 1`` contexts the answer is scored after: before each turn, and after the last turn
    with its observation rendered as the next user message (when the rollout recorded none)."""
    T = len(episode.turns)
    out = [turn_context(episode, k) for k in range(T + 1)]
    if T and not episode.turns[-1].obs_token_ids:
        out[-1] = out[-1] + observation_ids(policy.tokenizer, episode.turns[-1].obs)
    return out


@torch.no_grad()
def sequence_logprobs(model, contexts: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], *,
                      batch_size: int = 8, pad_id: int = 0, device=None) -> list[np.ndarray]:
    """Teacher-forced log-probs of ``targets[i]`` after ``contexts[i]`` under ``model`` (temperature 1, no
    nucleus): one array per row, batched ``batch_size`` rows per forward pass."""
    out: list[np.ndarray] = []
    for start in range(0, len(contexts), batch_size):
        rows = [(list(c), list(t)) for c, t in zip(contexts[start: start + batch_size],
                                                    targets[start: start + batch_size])]
        width = max(len(c) + len(t) for c, t in rows)
        B = len(rows)
        ids = torch.full((B, width), pad_id, dtype=torch.long)
        attn = torch.zeros((B, width), dtype=torch.long)
        mask = torch.zeros((B, width), dtype=torch.float32)
        for b, (c, t) in enumerate(rows):
            n = len(c) + len(t)
            ids[b, :n] = torch.tensor(c + t)
            attn[b, :n] = 1
            mask[b, len(c):n] = 1.0
        zeros = torch.zeros((B, width), dtype=torch.float32)
        batch = PackedBatch(ids.to(device), attn.to(device), mask.to(device), zeros.to(device), zeros.to(device))
        lp = token_logprobs(model, batch, 1.0, 1.0).double().cpu()
        for b, (c, t) in enumerate(rows):
            out.append(lp[b, len(c): len(c) + len(t)].numpy())
    return out


def answer_probs(policy, episodes: Sequence[EpisodeRecord], *, batch_size: int = 8) -> list[np.ndarray]:
    """``p_0 .. p_T`` of every episode (see the module): the geometric mean of the model's probabilities of
    the gold answer's tokens after each boundary context. A credit context's ``answer_probs``."""
    model = getattr(policy, "model", None)
    if model is None:
        raise ValueError("scoring the gold answer needs a policy with local weights (policy.model)")
    tok = policy.tokenizer
    contexts, targets, owner = [], [], []
    for i, ep in enumerate(episodes):
        answer = list(tok.encode(gold_action(ep), add_special_tokens=False))
        if not answer:
            raise ValueError(f"the gold answer of an episode of {ep.env_id} encodes to no tokens")
        for ctx in boundary_contexts(policy, ep):
            contexts.append(ctx)
            targets.append(answer)
            owner.append(i)
    pad = tok.pad_token_id if getattr(tok, "pad_token_id", None) is not None else 0
    lps = sequence_logprobs(model, contexts, targets, batch_size=batch_size, pad_id=pad,
                            device=getattr(policy, "device", None))
    out: list[list[float]] = [[] for _ in episodes]
    for i, lp in zip(owner, lps):
        out[i].append(float(np.exp(lp.mean())))
    return [np.array(p, dtype=np.float64) for p in out]
