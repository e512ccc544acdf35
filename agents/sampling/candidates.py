"""Scoring candidate continuations of contexts with a local transformers policy, sharing each context's pass.

:func:`score_batch` scores the candidates of many contexts in one forward pass. A row holds the
context's tokens not found in the policy's kept prefix caches, then the candidates as a token
trie (:class:`Trie`): a prefix that several candidates share (``<action>go to``) is one set of
positions. A tree mask lets each trie token see the context and its own ancestors only, at the
position it has after the context, so every candidate is scored exactly as if it followed the
context alone, and the context and shared prefixes are computed once. A row whose trie is larger
than ``chunk`` tokens is scored alone: the context first, then its candidates in tries of at most
``chunk`` tokens each.

Each row's context cache is kept for twins of the turn (the prefix without its last token, as
generation keeps it), and :func:`remember` keeps the context with the chosen candidate for the
episode's next turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from twice_envs.agents.sampling.policy import (SamplingConfig, _cache_layers, _make_cache, model_forward,
                                              stacked_prefix_cache)
from twice_envs.noise import sampling_logprobs


@dataclass
class Scored:
    """The scores of one context's candidates.

    Attributes:
        model: per candidate, its tokens' log-probs under the model (``log_softmax`` of the logits).
        sampling: the same under the sampling distribution (temperature and nucleus applied).
        reused: context tokens whose kept key/value cache was reused.
        kv: per layer ``(keys, values)`` ``(H, N, D)``: the context's, then the trie's (None where they
            were not kept).
        columns: each candidate's token columns in ``kv``.
    """

    model: list[list[float]]
    sampling: list[list[float]]
    reused: int
    kv: Optional[list[tuple[torch.Tensor, torch.Tensor]]] = None
    columns: Optional[list[list[int]]] = None


class Trie:
    """Candidates as a token trie: ``tokens[i]`` has parent node ``parents[i]`` (-1: the context) and depth
    ``depths[i]`` (0: the first token after the context); ``paths[c]`` are candidate ``c``'s nodes in order.
    A parent always comes before its children."""

    def __init__(self, candidates: Sequence[Sequence[int]]) -> None:
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.depths: list[int] = []
        self.paths: list[list[int]] = []
        node_of: dict[tuple[int, int], int] = {}
        for c in candidates:
            path, parent = [], -1
            for depth, tok in enumerate(c):
                key = (parent, int(tok))
                if key not in node_of:
                    node_of[key] = len(self.tokens)
                    self.tokens.append(int(tok))
                    self.parents.append(parent)
                    self.depths.append(depth)
                parent = node_of[key]
                path.append(parent)
            self.paths.append(path)

    def __len__(self) -> int:
        return len(self.tokens)

    def sees(self) -> torch.Tensor:
        """``(N, N)`` bool: node ``i`` sees node ``j`` (``j`` is ``i`` or one of its ancestors)."""
        n = len(self.tokens)
        out = torch.zeros((n, n), dtype=torch.bool)
        for i, p in enumerate(self.parents):
            if p >= 0:
                out[i] = out[p]
            out[i, i] = True
        return out


def _token_logprobs(first: torch.Tensor, nodes: torch.Tensor, path: list[int], tokens: list[int],
                    sampling: SamplingConfig):
    """Log-probs of a candidate's ``tokens``: the first from the context's last logits ``first``, token ``j``
    from the logits ``nodes`` of its trie node ``path[j - 1]``."""
    lg = torch.cat([first[None], nodes[path[:-1]]], dim=0).double()
    tok = torch.tensor(tokens, device=lg.device)[:, None]
    model = torch.log_softmax(lg, dim=-1).gather(-1, tok).squeeze(-1).tolist()
    samp = sampling_logprobs(lg, sampling.temperature, sampling.top_p).gather(-1, tok).squeeze(-1).tolist()
    return model, samp


def _lookup(policy, ctx: list[int]):
    if not policy.prefix_reuse:
        return 0, None
    return policy.prefix_cache.lookup(ctx, len(ctx) - 1)


def _keep_context(policy, ctx: list[int], kv) -> None:
    """Keep the context without its last token (a twin of the turn recomputes that one for its logits). The
    kept tensors are views of ``kv``, which no one writes to."""
    if policy.prefix_reuse and len(ctx) > 1:
        policy.prefix_cache.put(ctx[:-1], [(k[:, : len(ctx) - 1], v[:, : len(ctx) - 1]) for k, v in kv])


def remember(policy, context: Sequence[int], scored: Scored, index: int, tokens: Sequence[int]) -> None:
    """Keep the cache of ``context`` followed by candidate ``index`` (its ``tokens``) for the next turn."""
    if not policy.prefix_reuse or scored.kv is None:
        return
    cols = torch.tensor(list(range(len(context))) + list(scored.columns[index]), device=scored.kv[0][0].device)
    kv = [(k[:, cols], v[:, cols]) for k, v in scored.kv]
    policy.prefix_cache.put(list(context) + list(tokens), kv)


def _check(contexts, candidates) -> None:
    if len(contexts) != len(candidates):
        raise ValueError(f"{len(contexts)} contexts but {len(candidates)} candidate lists")
    for i, (ctx, cands) in enumerate(zip(contexts, candidates)):
        if not ctx:
            raise ValueError(f"row {i}: a choice needs a non-empty context")
        if not cands or any(not c for c in cands):
            raise ValueError(f"row {i}: every candidate needs at least one token")


@torch.no_grad()
def score_batch(policy, contexts: Sequence[Sequence[int]], candidates: Sequence[Sequence[Sequence[int]]],
                sampling: SamplingConfig, *, chunk: int = 1024, rows_per_pass: int = 1) -> list[Scored]:
    """The candidates of every context scored (see the module docstring); one :class:`Scored` per row.

    ``rows_per_pass``: rows per forward pass (padded to the longest). One row per pass is the default:
    on CPU the padding costs more than the extra calls (measured with the shipped game models)."""
    _check(contexts, candidates)
    policy.fresh_prefix_cache()  # as generation does
    ctxs = [[int(t) for t in c] for c in contexts]
    cands = [[[int(t) for t in c] for c in row] for row in candidates]
    out: list[Optional[Scored]] = [None] * len(ctxs)
    tries = [Trie(row) for row in cands]
    small = [b for b, t in enumerate(tries) if len(t) <= chunk]
    for b in range(len(ctxs)):
        if b not in small:
            out[b] = _score_long(policy, ctxs[b], cands[b], sampling, chunk)
    step = max(1, int(rows_per_pass))
    for at in range(0, len(small), step):
        group = small[at: at + step]
        rows = _score_packed(policy, [ctxs[b] for b in group], [cands[b] for b in group], [tries[b] for b in group],
                             sampling)
        for b, res in zip(group, rows):
            out[b] = res
    return out  # type: ignore[return-value]


def score_candidates(policy, context: Sequence[int], candidates: Sequence[Sequence[int]], sampling: SamplingConfig,
                     *, chunk: int = 1024) -> tuple[list[list[float]], list[list[float]], int]:
    """One context's candidates: ``(model log-probs, sampling log-probs, reused)`` (:func:`score_batch`)."""
    res = score_batch(policy, [context], [candidates], sampling, chunk=chunk)[0]
    return res.model, res.sampling, res.reused


def _score_packed(policy, ctxs: list[list[int]], cands: list[list[list[int]]], tries: list[Trie],
                  sampling) -> list[Scored]:
    """Every row in one forward pass: the context's new tokens, then its candidates' trie (left-padded kept
    prefixes, right-padded rows)."""
    dev, n = policy.device, len(ctxs)
    hits = [_lookup(policy, c) for c in ctxs]
    c_len = [h[0] for h in hits]
    c_max = max(c_len)
    rests = [ctx[c:] for ctx, c in zip(ctxs, c_len)]
    q_len = [len(r) + len(t) for r, t in zip(rests, tries)]
    q_max = max(q_len)
    ids = torch.full((n, q_max), int(policy.pad_id), dtype=torch.long)
    pos = torch.zeros((n, q_max), dtype=torch.long)
    allowed = torch.zeros((n, q_max, c_max + q_max), dtype=torch.bool)
    for b, trie in enumerate(tries):
        r, T = len(rests[b]), len(ctxs[b])
        ids[b, :r] = torch.tensor(rests[b], dtype=torch.long)
        ids[b, r: q_len[b]] = torch.tensor(trie.tokens, dtype=torch.long)
        pos[b, :r] = torch.arange(c_len[b], T)
        pos[b, r: q_len[b]] = T + torch.tensor(trie.depths, dtype=torch.long)
        allowed[b, :q_len[b], c_max - c_len[b]: c_max] = True  # the kept prefix
        allowed[b, :r, c_max: c_max + r] = torch.ones((r, r), dtype=torch.bool).tril()
        allowed[b, r: q_len[b], c_max: c_max + r] = True
        allowed[b, r: q_len[b], c_max + r: c_max + q_len[b]] = trie.sees()
        allowed[b, q_len[b]:, 0] = True  # padding sees one column (its output is never read)
    cache = stacked_prefix_cache(hits, c_max, dev)
    logits, cache = model_forward(policy, ids.to(dev), _mask(policy, allowed[:, None]), pos.to(dev), cache, 0)
    full = _cache_layers(cache)
    policy.stats.prefill_tokens += sum(q_len)
    policy.stats.reused_tokens += sum(c_len)
    out = []
    for b, trie in enumerate(tries):
        r, T = len(rests[b]), len(ctxs[b])
        model_lp, samp_lp = [], []
        for c, path in zip(cands[b], trie.paths):
            m, s = _token_logprobs(logits[b, r - 1], logits[b, r:], path, c, sampling)
            model_lp.append(m)
            samp_lp.append(s)
        # this row's columns: kept prefix, new context tokens, trie
        cols = torch.cat([torch.arange(c_max - c_len[b], c_max), torch.arange(c_max, c_max + q_len[b])]).to(dev)
        kv = [(k[b][:, cols], v[b][:, cols]) for k, v in full]
        _keep_context(policy, ctxs[b], kv)
        out.append(Scored(model_lp, samp_lp, c_len[b], kv, [[T + i for i in path] for path in trie.paths]))
    return out


def _mask(policy, allowed: torch.Tensor) -> torch.Tensor:
    """``allowed`` as the model's attention takes a custom mask: boolean for SDPA, else additive."""
    if getattr(policy.model.config, "_attn_implementation", None) == "sdpa":
        return allowed.to(policy.device)
    dtype = policy.model.get_output_embeddings().weight.dtype
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min).to(policy.device)


def _score_long(policy, ctx: list[int], cands: list[list[int]], sampling, chunk: int) -> Scored:
    """One row alone: the context, then its candidates in packed passes of at most ``chunk`` tokens."""
    dev = policy.device
    reused, kept = _lookup(policy, ctx)
    cache = _make_cache([(k[None].to(dev), v[None].to(dev)) for k, v in kept]) if kept else None
    rest = torch.tensor([ctx[reused:]], dtype=torch.long, device=dev)
    mask = torch.ones((1, len(ctx)), dtype=torch.long, device=dev)
    pos = torch.arange(reused, len(ctx), device=dev)[None]
    logits, cache = model_forward(policy, rest, mask, pos, cache, 1)
    first = logits[0, -1]
    layers = [(k[0], v[0]) for k, v in _cache_layers(cache)]  # (H, T, D) per layer
    policy.stats.prefill_tokens += len(ctx) - reused
    policy.stats.reused_tokens += reused
    _keep_context(policy, ctx, layers)
    parts: list[list[list[int]]] = [[]]
    for c in cands:
        if parts[-1] and len(Trie(parts[-1] + [c])) > chunk:
            parts.append([])
        parts[-1].append(c)
    model_lp, samp_lp = [], []
    for part in parts:
        trie = Trie(part)
        nodes = _score_trie_after(policy, layers, len(ctx), trie)
        for c, path in zip(part, trie.paths):
            m, s = _token_logprobs(first, nodes, path, c, sampling)
            model_lp.append(m)
            samp_lp.append(s)
    return Scored(model_lp, samp_lp, reused)


def _score_trie_after(policy, layers, T: int, trie: Trie) -> torch.Tensor:
    """Logits ``(nodes, V)`` of a trie after a context of ``T`` tokens whose per-layer ``(H, T, D)`` keys and
    values are ``layers``."""
    dev = policy.device
    q = len(trie)
    allowed = torch.zeros((1, 1, q, T + q), dtype=torch.bool)
    allowed[0, 0, :, :T] = True
    allowed[0, 0, :, T:] = trie.sees()
    ids = torch.tensor([trie.tokens], dtype=torch.long, device=dev)
    pos = (T + torch.tensor([trie.depths], dtype=torch.long)).to(dev)
    out, _ = model_forward(policy, ids, _mask(policy, allowed), pos, _make_cache([(k[None], v[None])
                                                                                for k, v in layers]), 0)
    return out[0]
