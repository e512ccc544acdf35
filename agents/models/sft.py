"""Supervised training of causal LMs on weighted token sequences (transcripts, copying drills)."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

from twice_envs.agents.rollout.context import (
    initial_prompt_ids,
    observation_ids,
    text_sequences,
)
from twice_envs.envs.mistakes import Mistake, Played


def sft_sequences(tokenizer, episodes, max_len: int, context_weight: float = 0.0,
                  end_turns: bool = False, window: Optional[int] = None,
                  mistake_weight: float = 1.0) -> list[tuple[list[int], list[float]]]:
    """Training sequences of scripted episodes ``(first_obs, [(action, obs), ...])``: the tokens the
    rollout would feed the model, weighted 1 on the turns and ``context_weight`` elsewhere, cut to
    ``max_len`` (sequences with nothing scored are dropped).

    With ``end_turns``, each turn ends with the tokenizer's EOS token, scored: the model learns to
    end its turn after the action, for envs whose actions end with no stop string. The rollout
    keeps the EOS that ended a turn among the turn's tokens, before the observation's tokens, so
    the sequence is again exactly what the rollout feeds the model.

    With a history ``window``, the sequences are those of a rollout with that window
    (:func:`~twice_envs.agents.rollout.context.text_sequences`): once turns drop out of the window,
    one sequence per turn, each after its own context.

    Turns marked as deliberate mistakes (:class:`~twice_envs.envs.mistakes.Mistake`) are weighted
    ``mistake_weight`` instead of 1 (0: they stay in the context but are not imitated); turns a
    model played (:class:`~twice_envs.envs.mistakes.Played`) are weighted 0.
    """

    def turn_weight(action: str) -> float:
        if isinstance(action, Played):
            return 0.0
        return float(mistake_weight) if isinstance(action, Mistake) else 1.0

    if window is not None:
        return _windowed_sft_sequences(tokenizer, episodes, max_len, context_weight, end_turns, window, turn_weight)
    seqs = []
    for first_obs, turns in episodes:
        ids = list(initial_prompt_ids(tokenizer, first_obs))
        mask = [context_weight] * len(ids)
        for action, obs in turns:
            a = tokenizer.encode(action, add_special_tokens=False)
            if end_turns:
                a = a + [tokenizer.eos_token_id]
            ids += a
            mask += [turn_weight(action)] * len(a)
            o = observation_ids(tokenizer, obs)
            ids += o
            mask += [context_weight] * len(o)
        ids, mask = ids[:max_len], mask[:max_len]
        if any(mask):
            seqs.append((ids, mask))
    return seqs


def _windowed_sft_sequences(tokenizer, episodes, max_len, context_weight, end_turns, window, turn_weight):
    seqs = []
    for first_obs, turns in episodes:
        blocks = []
        for action, obs in turns:
            a = tokenizer.encode(action, add_special_tokens=False)
            blocks.append((a + [tokenizer.eos_token_id] if end_turns else a, observation_ids(tokenizer, obs)))
        for ids, spans, first in text_sequences(initial_prompt_ids(tokenizer, first_obs), blocks, window):
            weights = [context_weight] * len(ids)
            for k, (start, end) in enumerate(spans, start=first):
                weights[start:end] = [turn_weight(turns[k][0])] * (end - start)
            ids, weights = ids[:max_len], weights[:max_len]
            if any(weights):
                seqs.append((ids, weights))
    return seqs


def stack_layers(model, bottom) -> None:
    """Give ``model`` the embeddings, final norm and first layers of the shallower ``bottom`` (same
    architecture otherwise), and zero the output projections of its other layers: each of those
    then adds nothing to the residual stream, so ``model`` computes exactly what ``bottom`` does."""
    import torch

    n = bottom.config.num_hidden_layers
    with torch.no_grad():
        model.get_input_embeddings().weight.copy_(bottom.get_input_embeddings().weight)
        model.model.norm.load_state_dict(bottom.model.norm.state_dict())
        for i, layer in enumerate(model.model.layers):
            if i < n:
                layer.load_state_dict(bottom.model.layers[i].state_dict())
            else:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()


def copy_sequences(vocab_size: int, n: int, length: tuple[int, int], *, first_id: int = 0,
                   seed: int = 0, alphabet: Optional[Sequence[int]] = None) -> list[tuple[list[int], list[float]]]:
    """``n`` sequences ``x + x`` of random token runs ``x``, scored on the repeat (after its first token).

    The runs draw from ids ``first_id .. vocab_size - 1``, or from ``alphabet`` when given."""
    rng = np.random.default_rng([seed, 0xC0B7])
    pool = np.asarray(alphabet if alphabet is not None else range(first_id, vocab_size), dtype=np.int64)
    if pool.size == 0:
        raise ValueError("copy_sequences needs a non-empty alphabet")
    out = []
    for _ in range(n):
        x = pool[rng.integers(0, pool.size, size=int(rng.integers(length[0], length[1] + 1)))].tolist()
        out.append((x + x, [0.0] * (len(x) + 1) + [1.0] * (len(x) - 1)))
    return out


def match_sequences(n: int, names: Sequence[int], letters: Sequence[int], *, items: tuple[int, int] = (2, 8),
                    filler: tuple[int, int] = (4, 40), seed: int = 0) -> list[tuple[list[int], list[float]]]:
    """``n`` synthetic lookups, scored on their answer: ``filler Q key filler L [T name tag]... A answer``.

    ``key`` and each listed ``name`` are drawn from ``names``, every other token from ``letters``
    (``Q L A T G`` are the first five letters, markers). In half of the sequences one listed name
    is the key, and the answer is that item (``T key tag``); otherwise no name is the key and the
    answer is ``G``. Only a model that compares the key, far back, with every listed name lowers
    this loss, which is the decision a text-game agent makes when it sees the object its task
    names among others (take it, or search on)."""
    rng = np.random.default_rng([seed, 0x3A7C])
    names, letters = np.asarray(names, dtype=np.int64), np.asarray(letters, dtype=np.int64)
    if names.size < items[1] + 1 or letters.size < 6:
        raise ValueError(f"match_sequences needs more than {items[1]} names and 6 letters")
    q, l, a, t, g = (int(x) for x in letters[:5])
    rest = letters[5:]

    def run(lo: int, hi: int) -> list[int]:
        return rest[rng.integers(0, rest.size, size=int(rng.integers(lo, hi + 1)))].tolist()

    out = []
    for _ in range(n):
        m = int(rng.integers(items[0], items[1] + 1))
        drawn = rng.choice(names.size, size=m + 1, replace=False)
        key, listed = int(names[drawn[0]]), [int(x) for x in names[drawn[1:]]]
        hit = bool(rng.random() < 0.5)
        if hit:
            listed[int(rng.integers(m))] = key
        tags = rest[rng.integers(0, rest.size, size=m)].tolist()
        ids = run(*filler) + [q, key] + run(*filler) + [l]
        for name, tag in zip(listed, tags):
            ids += [t, name, tag]
        answer = [t, key, tags[listed.index(key)]] if hit else [g]
        ids += [a]
        out.append((ids + answer, [0.0] * len(ids) + [1.0] * len(answer)))
    return out


def train_sft(model, seqs: list[tuple[list[int], list[int]]], *, steps: int, batch_size: int, lr: float,
              seed: int = 0, pad_id: int = 0, log: Callable[[str], None] = lambda m: None,
              stop_loss: Optional[float] = None, length_buckets: bool = False, checkpoint=None) -> list[float]:
    """Supervised training on ``(input_ids, loss_weights)`` sequences (0: not scored); returns the loss per step.

    Training runs where the model's parameters are (move the model to a GPU first to train there).

    With ``stop_loss``, training ends early once the mean loss of the last 25 steps is below it.
    With ``length_buckets``, each batch holds sequences of similar length (see :func:`bucket_batches`).

    ``checkpoint`` (a :class:`~twice_envs.agents.models.resume.PhaseCheckpoint`, None: none) saves the
    training state every few steps and restores a saved one before the first step: the run then
    continues exactly where the saved one stopped (same batches, optimiser and schedule). A phase
    that a saved build had already finished is skipped (returns no losses).
    """
    import torch

    if checkpoint is not None and checkpoint.skipped:
        return []
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.95))
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + np.cos(np.pi * min(1.0, s / max(1, steps))))
    )
    model.train()
    losses: list[float] = []
    if length_buckets:
        batches = bucket_batches([len(s) for s, _ in seqs], batch_size, g)
    else:
        batches = random_batches(len(seqs), batch_size, g)
    start, finished = 0, False
    if checkpoint is not None:
        start, finished = checkpoint.restore(model, opt, sched, batches, losses, steps)
    with torch.enable_grad():
        if not finished:
            _sft_loop(model, seqs, batches, opt, sched, steps, pad_id, losses, log, stop_loss, start=start,
                      on_step=None if checkpoint is None else checkpoint.after_step)
    model.eval()
    return losses


class RandomBatches:
    """Endless batches of ``batch_size`` indices below ``n``, drawn uniformly with replacement.

    Resumable: :meth:`state_dict` is the generator's state, and an iterator given it with
    :meth:`load_state_dict` yields the batches the saved one would have yielded next."""

    def __init__(self, n: int, batch_size: int, g) -> None:
        self.n, self.batch_size, self.g = n, batch_size, g

    def __iter__(self) -> "RandomBatches":
        return self

    def __next__(self) -> list[int]:
        import torch

        return torch.randint(self.n, (self.batch_size,), generator=self.g).tolist()

    def state_dict(self) -> dict:
        return {"kind": "random", "generator": self.g.get_state().clone()}

    def load_state_dict(self, state: dict) -> None:
        _check_kind(state, "random")
        self.g.set_state(state["generator"])


class BucketBatches:
    """Endless batches of indices whose lengths are close: each pass over the data sorts the
    sequences by length plus a fresh uniform jitter of ``spread`` tokens (so batches differ from
    pass to pass), cuts the order into batches and visits them in random order. Padding a batch
    to its longest sequence then costs little (a batch of random transcripts is padded to
    nearly the longest one).

    Resumable: :meth:`state_dict` is the generator's state at the start of the current pass and
    the position in the pass; :meth:`load_state_dict` draws that pass again and skips to the position."""

    def __init__(self, lengths: Sequence[int], batch_size: int, g, spread: int = 64) -> None:
        import torch

        self.lengths = torch.tensor(list(lengths), dtype=torch.float32)
        self.batch_size, self.g, self.spread = batch_size, g, spread
        self._pass_start = None  # the generator's state before the current pass was drawn
        self._chunks: list[list[int]] = []
        self._visit: list[int] = []
        self._pos = 0

    def __iter__(self) -> "BucketBatches":
        return self

    def _draw_pass(self) -> None:
        import torch

        self._pass_start = self.g.get_state().clone()
        key = self.lengths + self.spread * torch.rand(len(self.lengths), generator=self.g)
        order = torch.argsort(key).tolist()
        self._chunks = [order[i: i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        self._visit = torch.randperm(len(self._chunks), generator=self.g).tolist()
        self._pos = 0

    def __next__(self) -> list[int]:
        if self._pos >= len(self._visit):
            self._draw_pass()
        chunk = self._chunks[self._visit[self._pos]]
        self._pos += 1
        return chunk

    def state_dict(self) -> dict:
        if self._pass_start is None:  # nothing drawn yet
            return {"kind": "bucket", "generator": self.g.get_state().clone(), "position": -1}
        return {"kind": "bucket", "generator": self._pass_start.clone(), "position": self._pos}

    def load_state_dict(self, state: dict) -> None:
        _check_kind(state, "bucket")
        self.g.set_state(state["generator"])
        if int(state["position"]) < 0:
            self._pass_start, self._chunks, self._visit, self._pos = None, [], [], 0
            return
        self._draw_pass()
        self._pos = int(state["position"])


def _check_kind(state: dict, kind: str) -> None:
    if not isinstance(state, dict) or state.get("kind") != kind:
        found = state.get("kind") if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"the saved batch order is of kind {found!r}, not {kind!r}")


def random_batches(n: int, batch_size: int, g) -> RandomBatches:
    """Endless batches of ``batch_size`` indices below ``n``, drawn uniformly with replacement
    (a resumable :class:`RandomBatches`)."""
    return RandomBatches(n, batch_size, g)


def bucket_batches(lengths: Sequence[int], batch_size: int, g, spread: int = 64) -> BucketBatches:
    """Endless batches of indices whose lengths are close (a resumable :class:`BucketBatches`)."""
    return BucketBatches(lengths, batch_size, g, spread)


def _sft_loop(model, seqs, batches, opt, sched, steps, pad_id, losses, log, stop_loss=None, *, start: int = 0,
              on_step=None) -> None:
    """Steps ``start .. steps - 1`` of :func:`train_sft`; ``on_step(step_count, model, opt, sched, batches,
    losses, done)`` runs after each one (where a build saves its checkpoints)."""
    import torch

    from twice_envs.agents.training.loss import causal_attention_mask

    device = next(model.parameters()).device
    for step in range(start, steps):
        ids, mask, loss_mask = (t.to(device) for t in _pad([seqs[i] for i in next(batches)], pad_id))
        # the LM head only at the positions that are scored (the generated turns, a small
        # share of the tokens): with a large vocabulary it would otherwise dominate the step
        attn = causal_attention_mask(mask)  # None for these right-padded rows: the causal kernel alone
        hidden = model.get_decoder()(input_ids=ids, attention_mask=attn).last_hidden_state[:, :-1]
        weight = loss_mask[:, 1:]
        sel = weight > 0
        logits = model.get_output_embeddings()(hidden[sel]).float()
        nll = torch.nn.functional.cross_entropy(logits, ids[:, 1:][sel], reduction="none")
        loss = (nll * weight[sel]).sum() / weight[sel].sum().clamp(min=1e-6)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        done = stop_loss is not None and len(losses) >= 25 and np.mean(losses[-25:]) < stop_loss
        if step % 25 == 0 or step == steps - 1 or done:
            log(f"step {step + 1}/{steps} loss {np.mean(losses[-25:]):.3f}")
        if on_step is not None:
            on_step(step + 1, model, opt, sched, batches, losses, done)
        if done:
            break


def teacher_forced_loss(model, seqs: Sequence[tuple[list[int], list[float]]], *, batch_size: int = 8,
                        pad_id: int = 0) -> float:
    """Mean weighted next-token loss (nats per scored token) of ``model`` on ``(input_ids, loss_weights)``
    sequences, without training: the quality figure rebuilt models are compared by."""
    import torch

    from twice_envs.agents.training.loss import causal_attention_mask

    total, weight_sum = 0.0, 0.0
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for start in range(0, len(seqs), batch_size):
            batch = list(seqs[start: start + batch_size])
            ids, mask, weight = (t.to(device) for t in _pad(batch, pad_id))
            logits = model(input_ids=ids, attention_mask=causal_attention_mask(mask)).logits[:, :-1].float()
            nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
            total += float((nll * weight[:, 1:]).sum())
            weight_sum += float(weight[:, 1:].sum())
    model.train(was_training)
    if weight_sum <= 0:
        raise ValueError("no scored tokens: every sequence has zero loss weights")
    return total / weight_sum


def _pad(batch, pad_id: int):
    import torch

    width = max(len(s) for s, _ in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    loss_mask = torch.zeros((len(batch), width), dtype=torch.float32)
    for r, (s, m) in enumerate(batch):
        ids[r, : len(s)] = torch.tensor(s)
        mask[r, : len(s)] = 1
        loss_mask[r, : len(m)] = torch.tensor(m, dtype=torch.float32)
    return ids, mask, loss_mask
