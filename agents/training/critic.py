"""The LLM critic of PPO: a value head on a separate copy of the policy's body.

:class:`LLMCritic` is a deep copy of the policy model's transformer body (``model.model``
of a transformers causal LM; the output head is not copied) with a ``Linear(hidden, 1)``
value head initialised at zero, so every value starts at 0. ``V(s_t)`` is read at the last
token before turn ``t``'s first generated token: the hidden state of the context the policy
saw when it generated the turn. The sequences are the trainer's
(:func:`~twice_envs.agents.rollout.context.pack_segments`): one per episode, or one per
context of a windowed episode, so a windowed turn's value is read after its own context.

:meth:`LLMCritic.fit` takes as many AdamW steps as the policy update (the trainer's
minibatch count) on ``0.5 (V - target)^2`` averaged over the batch's turns, with the
gradient clipped like the policy's. Its learning rate is ``TrainConfig.critic_lr``.

It serves the credit step's critic interface (``values``, ``fit``;
:class:`~twice_envs.agents.credit.registry.CreditContext`), and :meth:`LLMCritic.state_dict` /
:meth:`LLMCritic.load_state_dict` hold everything a resumed run needs (weights and optimiser,
tensors and plain values only).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np

from twice_envs.agents.rollout.context import pack_segments
from twice_envs.agents.types import EpisodeRecord


def value_positions(episode: EpisodeRecord) -> list[tuple[list[int], list[tuple[int, int]]]]:
    """The episode's training sequences with, in each, ``(turn, position)`` of every turn it trains:
    the position of the last token before the turn's first generated token. Every turn appears once."""
    first = episode.twin_of[1] if episode.twin_of else 0
    out, seen = [], set()
    for ids, _mask, _old, turn_of in pack_segments(episode):
        marks = []
        for j, t in enumerate(turn_of):
            if t >= 0 and t not in seen:
                seen.add(t)
                marks.append((t - first, j - 1))
        out.append((ids, marks))
    missing = [t for t in range(len(episode.turns)) if t + first not in seen]
    if missing:
        raise ValueError(f"turns {missing} generated no tokens: the critic has no position to read them at")
    return out


class LLMCritic:
    """A value head on a copy of ``model``'s body (see the module).

    Args:
        model: the policy's causal LM (its ``model`` attribute is the body that is copied).
        lr: AdamW learning rate.
        minibatches: AdamW steps per :meth:`fit` (the batch's episodes split into this many).
        max_grad_norm: gradient clipping norm.
        pad_id: the padding token id.
        eval_batch: episodes per forward pass in :meth:`values`.
    """

    def __init__(self, model, *, lr: float, minibatches: int = 2, max_grad_norm: float = 1.0, pad_id: int = 0,
                 eval_batch: int = 16):
        import torch

        body = getattr(model, "model", None)
        if body is None:
            raise ValueError("the LLM critic copies a causal LM's body (model.model); this model has none")
        self.body = copy.deepcopy(body).train()
        for p in self.body.parameters():
            p.requires_grad_(True)
        param = next(self.body.parameters())
        hidden = int(model.config.hidden_size)
        self.head = torch.nn.Linear(hidden, 1).to(device=param.device, dtype=param.dtype)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)
        self.device = param.device
        self.minibatches, self.max_grad_norm = int(minibatches), float(max_grad_norm)
        self.pad_id, self.eval_batch = int(pad_id), int(eval_batch)
        self.optimizer = torch.optim.AdamW(self.parameters(), lr=lr, weight_decay=0.0)

    def parameters(self):
        return list(self.body.parameters()) + list(self.head.parameters())

    # ------------------------------------------------------------- forward
    def _forward(self, episodes: Sequence[EpisodeRecord]):
        """``(values, (episode, turn) of each)``: a 1-D tensor of ``V(s_t)`` for every turn of ``episodes``."""
        import torch

        from twice_envs.agents.training.loss import causal_attention_mask

        rows, where = [], []
        for i, ep in enumerate(episodes):
            for ids, marks in value_positions(ep):
                rows.append((ids, [j for _, j in marks]))
                where += [(i, t) for t, _ in marks]
        width = max(len(ids) for ids, _ in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(rows), width), dtype=torch.long)
        b_idx, p_idx = [], []
        for b, (ids, pos) in enumerate(rows):
            input_ids[b, :len(ids)] = torch.tensor(ids)
            attn[b, :len(ids)] = 1
            b_idx += [b] * len(pos)
            p_idx += pos
        hidden = self.body(input_ids=input_ids.to(self.device),
                           attention_mask=causal_attention_mask(attn.to(self.device))).last_hidden_state
        h = hidden[torch.tensor(b_idx, device=self.device), torch.tensor(p_idx, device=self.device)]
        return self.head(h).squeeze(-1).float(), where

    def values(self, episodes: Sequence[EpisodeRecord]) -> list[np.ndarray]:
        """``V(s_t)`` before each turn of each episode (no gradient)."""
        import torch

        out = [np.zeros(len(ep.turns)) for ep in episodes]
        self.body.eval()
        with torch.no_grad():
            for s in range(0, len(episodes), self.eval_batch):
                chunk = list(episodes[s:s + self.eval_batch])
                v, where = self._forward(chunk)
                for x, (i, t) in zip(v.cpu().numpy(), where):
                    out[s + i][t] = float(x)
        self.body.train()
        return out

    # ------------------------------------------------------------- fitting
    def fit(self, episodes: Sequence[EpisodeRecord], targets: Sequence[np.ndarray]) -> dict:
        """``minibatches`` AdamW steps of ``0.5 (V - target)^2`` (mean over each minibatch's turns).

        Minibatches group episodes of similar length (ties by index), so a fit is deterministic given
        the weights. Returns the mean value loss over the steps (each taken before its step)."""
        import torch

        if len(targets) != len(episodes):
            raise ValueError(f"{len(targets)} target arrays for {len(episodes)} episodes")
        for ep, tg in zip(episodes, targets):
            if len(tg) != len(ep.turns):
                raise ValueError(f"{len(tg)} targets for an episode with {len(ep.turns)} turns")
        lengths = [sum(len(seg[0]) for seg in pack_segments(e)) for e in episodes]
        order = np.lexsort((np.arange(len(episodes)), lengths))
        chunks = [c for c in np.array_split(order, max(1, min(self.minibatches, len(episodes)))) if len(c)]
        losses = []
        for chunk in chunks:
            v, where = self._forward([episodes[i] for i in chunk])
            tgt = torch.tensor([float(targets[chunk[i]][t]) for i, t in where], dtype=torch.float32,
                               device=v.device)
            loss = 0.5 * ((v - tgt) ** 2).mean()
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.parameters(), self.max_grad_norm)
            self.optimizer.step()
            losses.append(float(loss.detach()))
        return {"value_loss": float(np.mean(losses)) if losses else float("nan")}

    # ------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        """Weights (body and head) and optimiser state: tensors and plain values only."""
        return {"body": self.body.state_dict(), "head": self.head.state_dict(),
                "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.body.load_state_dict(state["body"])
        self.head.load_state_dict(state["head"])
        self.optimizer.load_state_dict(state["optimizer"])


def make_critic(policy, config) -> LLMCritic:
    """The critic of a training run (``config``: its :class:`~twice_envs.agents.training.config.TrainConfig`)."""
    return LLMCritic(policy.model, lr=config.critic_lr, minibatches=config.minibatches,
                     max_grad_norm=config.max_grad_norm, pad_id=getattr(policy, "pad_id", 0))
