"""The policy loss: PPO-clip on generated tokens with a KL penalty to a frozen reference.

Per generated token ``i`` of turn ``t`` (observation and prompt tokens never enter, nor the tokens of a
turn chosen among listed candidates, which enters as one decision: :mod:`.choice_loss`):

    r_i  = exp(logp_new_i - logp_old_i)
    pg_i = -min(r_i A_t, clip(r_i, 1 - eps, 1 + eps) A_t)
    kl_i = exp(logp_ref_i - logp_new_i) - (logp_ref_i - logp_new_i) - 1   (the k3 estimator, >= 0)
    loss = mean over the batch's generated tokens of (pg_i + kl_coef kl_i)

Log-probs are those of the distribution the turns were sampled from: temperature
``tau`` and the top-p nucleus, renormalised over the nucleus
(:func:`twice_envs.noise.sampling_logprobs`, the same definition the sampler and the
recorded rollout log-probs use), so the ratio is exactly 1 before the first update.
A token outside the new nucleus gets log-prob ``-inf`` (ratio 0, clipped like any
small ratio when its advantage is negative).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from twice_envs.agents.rollout.context import pack_segments
from twice_envs.agents.training.choice_loss import ChoiceTurn
from twice_envs.agents.types import EpisodeRecord
from twice_envs.noise import sampling_logprobs


@dataclass
class LossConfig:
    """PPO-clip + KL settings (published defaults)."""

    clip_eps: float = 0.2
    """PPO clipping range epsilon."""
    kl_coef: float = 0.001
    """Weight of the KL penalty to the frozen reference policy."""
    temperature: float = 1.0
    """Sampling temperature the log-probs are taken at (the rollouts' temperature)."""
    top_p: float = 1.0
    """Nucleus mass the log-probs are renormalised over (the rollouts' top-p)."""


@dataclass
class PackedBatch:
    """Episodes packed into padded tensors (right padding).

    Attributes:
        input_ids: ``(B, L)`` token ids.
        attention_mask: ``(B, L)`` 1 on real tokens.
        loss_mask: ``(B, L)`` 1 on generated tokens (targets), aligned with ``input_ids``.
        advantages: ``(B, L)`` the advantage of each generated token's turn (0 elsewhere).
        old_logprobs: ``(B, L)`` log-probs recorded at sampling time (0 elsewhere).
        choices: the turns chosen among listed candidates (their tokens are 0 in ``loss_mask``;
            :class:`~.choice_loss.ChoiceTurn`).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    advantages: torch.Tensor
    old_logprobs: torch.Tensor
    choices: list = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return int(self.loss_mask.sum())

    @property
    def num_units(self) -> int:
        """The loss's units: generated tokens, and one per chosen turn."""
        return self.num_tokens + len(self.choices)


def pack(episodes: Sequence[EpisodeRecord], advantages: Sequence[np.ndarray], pad_id: int = 0) -> PackedBatch:
    """Pack factual episodes and their per-turn advantages for the loss: a row per sequence of
    :func:`~twice_envs.agents.rollout.context.pack_segments` (one per episode unless it is windowed)."""
    rows, choices = [], []
    for e, (ep, adv) in enumerate(zip(episodes, advantages)):
        if len(adv) != len(ep.turns):
            raise ValueError(f"{len(adv)} advantages for an episode with {len(ep.turns)} turns")
        first = ep.twin_of[1] if ep.twin_of else 0
        for ids, mask, old, turn_of in pack_segments(ep):
            a = [float(adv[t - first]) if t >= 0 else 0.0 for t in turn_of]
            mask = list(mask)
            for j, t in enumerate(turn_of):
                if t < 0 or ep.turns[t - first].choice is None:
                    continue
                mask[j] = 0
                if j == 0 or turn_of[j - 1] != t:  # the chosen turn's first token
                    turn = ep.turns[t - first]
                    choices.append(ChoiceTurn(len(rows), j, turn.choice, list(turn.token_ids), float(adv[t - first]),
                                              f"episode {e} turn {t}"))
            rows.append((ids, mask, old, a))
    width = max(len(r[0]) for r in rows)
    B = len(rows)
    out = PackedBatch(
        torch.full((B, width), pad_id, dtype=torch.long),
        torch.zeros((B, width), dtype=torch.long),
        torch.zeros((B, width), dtype=torch.float32),
        torch.zeros((B, width), dtype=torch.float32),
        torch.zeros((B, width), dtype=torch.float32),
        choices,
    )
    for b, (ids, mask, old, a) in enumerate(rows):
        n = len(ids)
        out.input_ids[b, :n] = torch.tensor(ids)
        out.attention_mask[b, :n] = 1
        out.loss_mask[b, :n] = torch.tensor(mask, dtype=torch.float32)
        out.advantages[b, :n] = torch.tensor(a, dtype=torch.float32)
        out.old_logprobs[b, :n] = torch.tensor(old, dtype=torch.float32)
    return out


def packed_length(episode: EpisodeRecord) -> int:
    """Tokens of ``episode``'s rows as :func:`pack` lays them out (what its padding is measured against)."""
    return sum(len(seg[0]) for seg in pack_segments(episode))


def pack_micro_batches(episodes: Sequence[EpisodeRecord], advantages: Sequence[np.ndarray], indices: Sequence[int],
                       size: int, pad_id: int = 0) -> list[PackedBatch]:
    """The episodes at ``indices`` packed ``size`` to a batch, in the order given (the update sorts them by
    :func:`packed_length`, so that each batch wastes little padding)."""
    return [pack([episodes[i] for i in indices[j:j + size]], [advantages[i] for i in indices[j:j + size]],
                 pad_id=pad_id) for j in range(0, len(indices), size)]


def causal_attention_mask(attention_mask: torch.Tensor) -> torch.Tensor | None:
    """The padding mask a causal LM's forward needs for ``attention_mask``: ``None`` when every row
    is right-padded (its real tokens first, then only padding), else the mask itself.

    With right padding the causal mask alone keeps every real token from seeing a pad (the pads
    come after it), and only the pads' own outputs, which no loss reads, change. Without an
    explicit mask, torch's attention runs its causal kernel, which skips the upper triangle instead
    of computing and masking it: the same log-probs up to float rounding (equal on the CPU measured),
    in less time (``twice bench update`` measures both)."""
    mask = attention_mask.bool()
    if mask.ndim != 2:
        return attention_mask
    lengths = mask.sum(-1, keepdim=True)
    prefix = torch.arange(mask.shape[-1], device=mask.device)[None, :] < lengths
    return None if bool(torch.equal(mask, prefix)) else attention_mask


def token_logprobs(model: torch.nn.Module, batch: PackedBatch, temperature: float = 1.0,
                   top_p: float = 1.0, *, padding_mask: bool = False) -> torch.Tensor:
    """``(B, L)`` log-prob of each generated token given the tokens before it (0 elsewhere).

    Under the sampling distribution (``temperature``, nucleus ``top_p``) of
    :func:`twice_envs.noise.sampling_logprobs`, differentiable.

    The output head runs only at the positions that predict a generated token (a
    fraction of the sequence: prompts and observations dominate), when the model
    exposes its body and head (``model.model`` / ``lm_head``, as HF causal LMs do).
    A right-padded batch (:func:`pack`'s) runs without its padding mask
    (:func:`causal_attention_mask`) unless ``padding_mask`` is set, which passes it always
    (the baseline ``twice bench update`` measures against).
    """
    target = batch.loss_mask[:, 1:] > 0
    attn = batch.attention_mask if padding_mask else causal_attention_mask(batch.attention_mask)
    body, head = getattr(model, "model", None), getattr(model, "lm_head", None)
    if body is not None and head is not None:
        hidden = body(input_ids=batch.input_ids, attention_mask=attn).last_hidden_state[:, :-1]
        logits = head(hidden[target]).float()
    else:
        logits = model(input_ids=batch.input_ids, attention_mask=attn).logits[:, :-1][target].float()
    logp = sampling_logprobs(logits, temperature, top_p)
    lp = logp.gather(-1, batch.input_ids[:, 1:][target][:, None]).squeeze(-1)
    out = torch.zeros(batch.input_ids.shape, dtype=lp.dtype, device=lp.device)
    rows, cols = torch.nonzero(target, as_tuple=True)
    return out.index_put((rows, cols + 1), lp)


def ppo_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    config: LossConfig,
    num_tokens: int | None = None,
) -> tuple[torch.Tensor, dict]:
    """The loss summed over masked tokens divided by ``num_tokens`` (default: the mask's count).

    Passing the whole batch's token count lets minibatches accumulate gradients to the
    batch mean. Returns ``(loss, stats)``.
    """
    mask = loss_mask.float()
    n = float(num_tokens if num_tokens is not None else max(mask.sum().item(), 1.0))
    on = mask > 0
    zero = torch.zeros_like(new_logprobs)
    # where (not a product with the mask): a token outside a nucleus has log-prob -inf,
    # and -inf * 0 would be nan
    log_ratio = torch.where(on, new_logprobs - old_logprobs, zero)
    ratio = torch.exp(log_ratio)
    pg1 = ratio * advantages
    pg2 = torch.clamp(ratio, 1 - config.clip_eps, 1 + config.clip_eps) * advantages
    pg = -torch.minimum(pg1, pg2)
    # the k3 estimator is infinite for a token outside the new or the reference nucleus
    # (top_p < 1): such tokens carry no KL term rather than an infinite one
    both = on & torch.isfinite(new_logprobs) & torch.isfinite(ref_logprobs)
    d = torch.where(both, ref_logprobs - new_logprobs, zero)
    kl = torch.exp(d) - d - 1
    loss = ((pg + config.kl_coef * kl) * mask).sum() / n
    with torch.no_grad():
        stats = {
            "pg_loss": float((pg * mask).sum() / n),
            "kl": float((kl * mask).sum() / n),
            "clip_frac": float((((ratio - 1).abs() > config.clip_eps).float() * mask).sum() / n),
        }
    return loss, stats
