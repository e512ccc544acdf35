"""Policies: generate one turn for a batch of contexts, keyed by noise keys.

:class:`HFPolicy` is the transformers backend (CPU or GPU). Its decoding loop feeds
every step's logits to :class:`~twice_envs.agents.sampling.processor.KeyedLogitsProcessor`
(the same object ``model.generate`` can use), so each row's token is the keyed
sample of its own key whatever batch it sits in.

Prefix reuse: after a turn, the key/value cache of each row's context is kept in a
:class:`PrefixCache` (bounded, least recently used out first). A later request whose
context starts with a kept context (the next turn of the same episode, or a twin
that branches from it) recomputes only the new tokens.
"""

from __future__ import annotations

import inspect
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Protocol, Sequence

import torch

from twice_envs.agents.sampling.devices import torch_device
from twice_envs.agents.sampling.processor import (
    KEY_MODES,
    KeyedLogitsProcessor,
    newline_token_table,
)
from twice_envs.keys import NoiseKey


@dataclass
class SamplingConfig:
    """How turns are sampled."""

    temperature: float = 1.0
    """Softmax temperature tau."""
    top_p: float = 1.0
    """Nucleus mass (1.0: the whole vocabulary)."""
    max_new_tokens: int = 128
    """Tokens per turn at most."""
    greedy: bool = False
    """Plain argmax (evaluation); log-probs are still those of the sampling distribution."""
    key_mode: str = "line"
    """``line`` (DESIGN default), ``flat``, ``counter`` or ``ngram`` (see :class:`twice_envs.noise.KeyState`)."""

    def __post_init__(self) -> None:
        if self.key_mode not in KEY_MODES:
            raise ValueError(f"key_mode must be one of {KEY_MODES}, got {self.key_mode!r}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens!r}")


@dataclass
class GenerationRequest:
    """One row of a batch."""

    prompt_ids: list[int]
    """The full context so far, chat template applied (see :mod:`~twice_envs.agents.rollout.context`)."""
    noise_key: NoiseKey
    """Key base of the turn (the env's ``info["noise_key"]``)."""
    stop: tuple[str, ...] = ()
    """Strings that end the turn (the env's ``protocol().stop``)."""
    token_counter: int = 0
    """Tokens generated earlier in the episode (``key_mode="counter"``)."""
    candidates: Optional[tuple[str, ...]] = None
    """The turns to choose among, where the env lists them and the policy chooses
    (:class:`~twice_envs.agents.sampling.choice.ChoicePolicy`); None: generate the turn."""


@dataclass
class Generation:
    """One generated turn."""

    text: str
    """Decoded turn, cut after the first stop string (the stop string is kept)."""
    token_ids: list[int]
    """The generated tokens (up to and including the one that completed a stop string or EOS)."""
    logprobs: list[float]
    """Log-prob of each token under the sampling distribution (temperature/top-p applied)."""
    entropy: float
    """Mean per-token entropy of the sampling distribution."""
    stop_reason: str = "length"
    """``stop`` (a stop string), ``eos`` or ``length``."""
    reused_tokens: int = 0
    """Context tokens whose key/value cache was reused instead of recomputed."""
    choice: Optional[dict] = None
    """For a chosen turn, its :class:`~twice_envs.agents.sampling.choice.Choice` as a dict; None for a generated one."""


class Policy(Protocol):
    """What rollouts and the trainer need from a policy."""

    tokenizer: Any
    model: torch.nn.Module

    def generate(self, requests: list[GenerationRequest], sampling: SamplingConfig) -> list[Generation]: ...


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """``text`` up to and including the earliest stop string, and whether one occurred."""
    best, best_len = -1, 0
    for s in stops:
        if not s:
            continue
        i = text.find(s)
        if i >= 0 and (best < 0 or i < best):
            best, best_len = i, len(s)
    return (text, False) if best < 0 else (text[: best + best_len], True)


# ----------------------------------------------------------------------------- KV cache helpers
def _cache_layers(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``[(keys, values)]`` per layer, each ``(B, H, T, D)`` (transformers 4.x and 5.x caches)."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    if hasattr(cache, "key_cache"):  # pragma: no cover - older transformers
        return list(zip(cache.key_cache, cache.value_cache))
    return [(k, v) for k, v in cache]  # pragma: no cover - legacy tuples


def _make_cache(layers: list[tuple[torch.Tensor, torch.Tensor]]):
    from transformers import DynamicCache

    cache = DynamicCache()
    for i, (k, v) in enumerate(layers):
        cache.update(k, v, i)
    return cache


def model_forward(policy, ids, mask, pos, cache, keep: int):
    """``policy.model``'s forward pass with a key/value ``cache``: the logits of the last ``keep``
    positions (0: all) and the cache after it."""
    kwarg = getattr(policy, "_cache_kwarg", None)
    if kwarg is None:  # transformers renamed ``past_key_values`` to ``cache`` in 5.2x; pass the one the model takes
        kwarg = "cache" if "cache" in inspect.signature(policy.model.forward).parameters else "past_key_values"
        policy._cache_kwarg = kwarg
    out = policy.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=keep,
                       **{kwarg: cache})
    return out.logits, getattr(out, "cache", None) or getattr(out, "past_key_values", None)


@contextmanager
def torch_threads(threads: Optional[int]):
    """Run the block on ``threads`` torch threads (None or 0: as it is), restoring the count after."""
    old = torch.get_num_threads()
    if threads and threads != old:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if torch.get_num_threads() != old:
            torch.set_num_threads(old)


def stacked_prefix_cache(hits: Sequence[tuple[int, Any]], c_max: int, device):
    """One batch cache of the kept prefixes ``hits`` (``(length, layers)`` per row, ``layers`` None
    where nothing was kept), each left-padded to ``c_max`` positions; None when ``c_max`` is 0."""
    if not c_max:
        return None
    layers = []
    ref = next(h[1] for h in hits if h[1] is not None)
    for li, (k_ref, _) in enumerate(ref):
        kk = torch.zeros((len(hits), k_ref.shape[0], c_max, k_ref.shape[-1]), dtype=k_ref.dtype, device=device)
        vv = torch.zeros_like(kk)
        for b, (cl, kv) in enumerate(hits):
            if cl:
                kk[b, :, c_max - cl:] = kv[li][0]
                vv[b, :, c_max - cl:] = kv[li][1]
        layers.append((kk, vv))
    return _make_cache(layers)


class PrefixCache:
    """Kept key/value caches of contexts, looked up by longest matching prefix.

    Args:
        max_bytes: total size kept; least recently used entries are dropped first.
    """

    def __init__(self, max_bytes: int = 1 << 30) -> None:
        self.max_bytes = int(max_bytes)
        self._entries: "OrderedDict[tuple[int, ...], tuple[list[tuple[torch.Tensor, torch.Tensor]], int]]" = OrderedDict()
        self._by_len: dict[int, int] = {}
        self.bytes = 0
        self.hits = 0
        self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self._by_len.clear()
        self.bytes = 0

    def snapshot(self) -> tuple:
        """The kept entries as they are now, for :meth:`restore` (a shallow copy: kept tensors are never
        written to)."""
        return OrderedDict(self._entries), dict(self._by_len), self.bytes

    def restore(self, snapshot: tuple) -> None:
        """Keep exactly the entries of ``snapshot`` (from :meth:`snapshot`) again; the counters stay."""
        entries, by_len, nbytes = snapshot
        self._entries, self._by_len, self.bytes = OrderedDict(entries), dict(by_len), nbytes

    def put(self, ids: Sequence[int], kv: list[tuple[torch.Tensor, torch.Tensor]], size: Optional[int] = None) -> None:
        """Keep ``kv`` (per layer ``(H, T, D)`` keys and values, ``T = len(ids)``) for ``ids``."""
        key = tuple(int(x) for x in ids)
        if not key or key in self._entries:
            if key in self._entries:
                self._entries.move_to_end(key)
            return
        nbytes = size if size is not None else sum(k.numel() * k.element_size() * 2 for k, _ in kv)
        if nbytes > self.max_bytes:
            return
        self._entries[key] = (kv, nbytes)
        self._by_len[len(key)] = self._by_len.get(len(key), 0) + 1
        self.bytes += nbytes
        while self.bytes > self.max_bytes and self._entries:
            old, (_, size_old) = self._entries.popitem(last=False)
            self.bytes -= size_old
            self._by_len[len(old)] -= 1
            if not self._by_len[len(old)]:
                del self._by_len[len(old)]

    def lookup(self, ids: Sequence[int], max_len: int) -> tuple[int, Optional[list[tuple[torch.Tensor, torch.Tensor]]]]:
        """The longest kept prefix of ``ids`` no longer than ``max_len``: ``(length, kv)`` or ``(0, None)``."""
        ids = tuple(int(x) for x in ids)
        for n in sorted((n for n in self._by_len if n <= max_len), reverse=True):
            hit = self._entries.get(ids[:n])
            if hit is not None:
                self._entries.move_to_end(ids[:n])
                self.hits += 1
                self.reused_tokens += n
                return n, hit[0]
        return 0, None


# ----------------------------------------------------------------------------- the transformers policy
@dataclass
class GenerationStats:
    """Counters of the last and all :meth:`HFPolicy.generate` calls."""

    calls: int = 0
    generated_tokens: int = 0
    prefill_tokens: int = 0
    reused_tokens: int = 0
    seconds: float = 0.0
    sampler_seconds: float = 0.0


class HFPolicy:
    """A transformers causal LM as a :class:`Policy`.

    Args:
        model: the causal LM (trainable; :meth:`generate` runs it under ``no_grad``).
        tokenizer: its tokenizer, with a chat template.
        device: where the model runs.
        prefix_reuse: keep each turn's key/value cache for later requests that extend it.
        prefix_cache_bytes: the cache's size bound.
        num_threads: CPU threads while generating (``None``: torch's setting). Small models
            default to 1: their matrices are too small to split, and idle OpenMP threads
            spinning on a loaded machine cost more than they save (measured: 45x slower
            with 2 threads than with 1 on a busy 2-core machine).
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Any, *, device: str = "cpu", prefix_reuse: bool = True,
                 prefix_cache_bytes: int = 1 << 30, num_threads: Optional[int] = -1) -> None:
        device = torch_device(device)
        self.model = model.to(device)
        n_params = sum(p.numel() for p in model.parameters())
        if num_threads == -1:
            num_threads = 1 if (device.type == "cpu" and n_params < 20_000_000) else None
        self.num_threads = num_threads
        self.model.eval()
        self.tokenizer = tokenizer
        self.device = device
        self.prefix_reuse = prefix_reuse
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.newline_table = newline_token_table(tokenizer, self.vocab_size)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
        eos = set()
        for name in ("eos_token_id",):
            v = getattr(tokenizer, name, None)
            if v is not None:
                eos.add(int(v))
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        if isinstance(gen_eos, int):
            eos.add(gen_eos)
        elif isinstance(gen_eos, (list, tuple)):
            eos.update(int(x) for x in gen_eos)
        self.eos_ids = eos
        self.stats = GenerationStats()
        #: the processor of the last call (for inspection and tests)
        self.last_processor: Optional[KeyedLogitsProcessor] = None

    @classmethod
    def from_pretrained(cls, path: str | Path, *, device: str = "cpu", dtype: Optional[torch.dtype] = None,
                        **kwargs: Any) -> "HFPolicy":
        """Load a local Hugging Face model directory (never downloads)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch_device(device)  # before the weights load

        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=dtype or torch.float32)
        return cls(model, tokenizer, device=device, **kwargs)

    def new_processor(self, requests: Sequence[GenerationRequest], sampling: SamplingConfig) -> KeyedLogitsProcessor:
        """The keyed processor for a batch (usable with ``model.generate`` too)."""
        return KeyedLogitsProcessor(
            [r.noise_key for r in requests],
            self.newline_table,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            key_mode=sampling.key_mode,
            token_counters=[r.token_counter for r in requests],
            contexts=[list(r.prompt_ids) for r in requests],
            greedy=sampling.greedy,
        )

    # The forward pass is split from the sampler so benchmarks can time each.
    def _forward(self, ids, mask, pos, cache):
        logits, cache = model_forward(self, ids, mask, pos, cache, 1)
        return logits[:, -1, :], cache

    def generate(self, requests: list[GenerationRequest], sampling: SamplingConfig, *,
                 processor: Optional[Any] = None) -> list[Generation]:
        """Generate one turn for every request (batched; rows never influence each other's noise).

        ``processor`` replaces the keyed sampler (a callable ``(input_ids, scores) -> scores``
        whose argmax is taken); benchmarks use it to time plain sampling in the same loop.
        """
        if not requests:
            return []
        with torch_threads(self.num_threads), torch.no_grad():
            return self._generate(requests, sampling, processor)

    def _weights_version(self) -> int:
        # Every in-place update of a parameter (optimiser steps, load_state_dict) bumps
        # its version counter, so the sum changes whenever the weights may have changed.
        return sum(p._version for p in self.model.parameters())

    def fresh_prefix_cache(self) -> None:
        """Drop the kept key/value caches if the weights changed since they were made."""
        version = self._weights_version()
        if version != getattr(self, "_cached_version", None):
            self.prefix_cache.clear()  # kept key/value caches belong to the old weights
            self._cached_version = version

    def _generate(self, requests, sampling, processor) -> list[Generation]:
        self.fresh_prefix_cache()
        t_start = time.perf_counter()
        n = len(requests)
        dev = self.device
        keyed = processor is None
        proc = self.new_processor(requests, sampling) if keyed else processor
        self.last_processor = proc if keyed else None

        # ---- prefill: reuse kept prefixes, feed the rest (left-padded in two segments)
        prompts = [list(map(int, r.prompt_ids)) for r in requests]
        if any(not p for p in prompts):
            raise ValueError("every request needs a non-empty prompt")
        hits = [(0, None)] * n
        if self.prefix_reuse:
            hits = [self.prefix_cache.lookup(p, len(p) - 1) for p in prompts]
        c_len = [h[0] for h in hits]
        c_max = max(c_len)
        rest = [p[c:] for p, c in zip(prompts, c_len)]
        r_max = max(len(x) for x in rest)
        width = c_max + r_max
        mask = torch.zeros((n, width), dtype=torch.long)
        ids = torch.full((n, r_max), self.pad_id, dtype=torch.long)
        for b in range(n):
            mask[b, c_max - c_len[b]: c_max] = 1
            mask[b, width - len(rest[b]):] = 1
            ids[b, r_max - len(rest[b]):] = torch.tensor(rest[b], dtype=torch.long)
        pos_all = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = stacked_prefix_cache(hits, c_max, dev)
        mask_d = mask.to(dev)
        logits, cache = self._forward(ids.to(dev), mask_d, pos_all[:, c_max:].to(dev), cache)
        next_pos = pos_all[:, -1] + 1
        self.stats.prefill_tokens += sum(len(x) for x in rest)
        self.stats.reused_tokens += sum(c_len)

        # ---- decode
        stops = [tuple(s for s in r.stop if s) for r in requests]
        gen: list[list[int]] = [[] for _ in range(n)]
        done = [False] * n
        reason = ["length"] * n
        texts = [""] * n
        t_sampler = 0.0
        lp_rows: list[list[float]] = [[] for _ in range(n)]
        ent_rows: list[list[float]] = [[] for _ in range(n)]
        for step in range(sampling.max_new_tokens):
            ts = time.perf_counter()
            if keyed:
                if step:
                    proc.advance(tokens_cpu)
                tokens = proc.choose(logits)
                lp_step = proc.logprobs[-1].tolist()
                ent_step = proc.entropies[-1].tolist()
            else:
                scores = proc(None, logits)
                tokens = torch.argmax(scores, dim=-1)
                lp_step = ent_step = [0.0] * n
            tokens_cpu = tokens.cpu()
            t_sampler += time.perf_counter() - ts
            tok_list = tokens_cpu.tolist()
            for b in range(n):
                if done[b]:
                    continue
                t = tok_list[b]
                gen[b].append(t)
                lp_rows[b].append(lp_step[b])
                ent_rows[b].append(ent_step[b])
                if t in self.eos_ids:
                    done[b], reason[b] = True, "eos"
                    continue
                if stops[b]:
                    text = self.tokenizer.decode(gen[b], skip_special_tokens=False)
                    cut, hit = cut_at_stop(text, stops[b])
                    if hit:
                        done[b], reason[b], texts[b] = True, "stop", cut
            if all(done) or step == sampling.max_new_tokens - 1:
                break
            mask_d = torch.cat([mask_d, torch.ones((n, 1), dtype=torch.long, device=dev)], dim=1)
            logits, cache = self._forward(tokens.to(dev)[:, None], mask_d, next_pos[:, None].to(dev), cache)
            next_pos = next_pos + 1

        # ---- keep the contexts' caches for later turns and twins
        if self.prefix_reuse and cache is not None:
            layers = _cache_layers(cache)
            valid = mask_d.bool().cpu()
            for b in range(n):
                cols = valid[b].nonzero().squeeze(-1)
                # columns fed so far: the prompt, then every generated token but the last
                fed = prompts[b] + gen[b][:-1]
                cols = cols[: len(fed)]
                kv = [(k[b][:, cols.to(k.device)].clone(), v[b][:, cols.to(v.device)].clone()) for k, v in layers]
                self.prefix_cache.put(fed, kv)
                # the prompt minus its last token: a twin of this turn has the same prompt
                # and must recompute at least one token to get its first logits
                lp = len(prompts[b]) - 1
                if lp > 0:
                    self.prefix_cache.put(prompts[b][:lp], [(k[:, :lp], v[:, :lp]) for k, v in kv])

        out = []
        for b in range(n):
            text = texts[b] or self.tokenizer.decode(
                [t for t in gen[b] if t not in self.eos_ids], skip_special_tokens=False)
            ent = ent_rows[b]
            out.append(Generation(text, gen[b], lp_rows[b], float(sum(ent) / len(ent)) if ent else 0.0,
                                  reason[b], c_len[b]))
        self.stats.calls += 1
        self.stats.generated_tokens += sum(len(g) for g in gen)
        self.stats.sampler_seconds += t_sampler
        self.stats.seconds += time.perf_counter() - t_start
        return out
