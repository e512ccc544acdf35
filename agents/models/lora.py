"""Low-rank adapters: fine-tune a pretrained causal LM by training a small update of some layers.

An adapted linear layer computes ``W x + (alpha / rank) * B (A x)``, with ``W`` frozen, ``A``
(``rank x in``) drawn at random and ``B`` (``out x rank``) zero, so the adapted model starts out
computing exactly what the pretrained one does. Only ``A`` and ``B`` train. Adapting the top
layers only keeps the backward pass out of the layers below them, which on a CPU halves the cost
of a step of a 30-layer model adapted in its top 12. After training, :func:`merge_adapters` folds
``B A`` into ``W``, so the result is an ordinary model folder; :func:`adapter_state` is what a
build needs to ship (a few MB), and :func:`apply_adapter` rebuilds the merged model from the base
weights and that state.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

#: The linear layers of a Llama block that are adapted by default (attention and MLP).
LLAMA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class AdaptedLinear(torch.nn.Module):
    """A frozen ``torch.nn.Linear`` plus a trainable low-rank update."""

    def __init__(self, base: torch.nn.Linear, rank: int, alpha: float, generator: torch.Generator) -> None:
        super().__init__()
        if rank < 1:
            raise ValueError(f"rank must be >= 1, got {rank}")
        self.base = base
        base.requires_grad_(False)
        self.scale = alpha / rank
        a = torch.empty(rank, base.in_features, dtype=base.weight.dtype)
        bound = 1.0 / math.sqrt(base.in_features)
        a.uniform_(-bound, bound, generator=generator)
        self.lora_a = torch.nn.Parameter(a)
        self.lora_b = torch.nn.Parameter(torch.zeros(base.out_features, rank, dtype=base.weight.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_a.T @ self.lora_b.T) * self.scale

    def merged(self) -> torch.nn.Linear:
        """The base layer with the update folded into its weight."""
        _fold(self.base, self.lora_a, self.lora_b, self.scale)
        return self.base


def _fold(layer: torch.nn.Linear, a: torch.Tensor, b: torch.Tensor, scale: float) -> None:
    """``W += scale * B A``: the one merge arithmetic, so a merged build and one rebuilt from its
    saved state hold the same weights bit for bit."""
    with torch.no_grad():
        layer.weight += scale * (b.to(layer.weight.dtype) @ a.to(layer.weight.dtype))


def _blocks(model) -> torch.nn.ModuleList:
    return model.get_decoder().layers


def add_adapters(model, *, rank: int, alpha: float, layers: Sequence[int],
                 targets: Sequence[str] = LLAMA_TARGETS, seed: int = 0) -> int:
    """Freeze ``model`` and adapt the ``targets`` linear layers of the blocks ``layers`` (indices,
    negative ones count from the top); returns the number of trainable parameters."""
    model.requires_grad_(False)
    blocks = _blocks(model)
    g = torch.Generator().manual_seed(seed)
    n = 0
    for i in sorted({i % len(blocks) for i in layers}):
        for name, module in list(blocks[i].named_modules()):
            for child_name, child in list(module.named_children()):
                if child_name in targets and isinstance(child, torch.nn.Linear):
                    adapted = AdaptedLinear(child, rank, alpha, g)
                    setattr(module, child_name, adapted)
                    n += adapted.lora_a.numel() + adapted.lora_b.numel()
    if n == 0:
        raise ValueError(f"no linear layer named {list(targets)} in blocks {list(layers)}")
    return n


def _adapted(model):
    for name, module in model.named_modules():
        for child_name, child in module.named_children():
            if isinstance(child, AdaptedLinear):
                yield module, child_name, child, f"{name}.{child_name}" if name else child_name


def adapter_state(model) -> dict[str, torch.Tensor]:
    """The trained update of every adapted layer: ``{"<layer>.lora_a": A, "<layer>.lora_b": B}``."""
    state = {}
    for _, _, child, full in _adapted(model):
        state[f"{full}.lora_a"] = child.lora_a.detach().clone()
        state[f"{full}.lora_b"] = child.lora_b.detach().clone()
    if not state:
        raise ValueError("the model has no adapters")
    return state


def merge_adapters(model) -> None:
    """Fold every adapter into its base layer, leaving a plain model (in place)."""
    for module, child_name, child, _ in list(_adapted(model)):
        setattr(module, child_name, child.merged())


def apply_adapter(model, state: dict[str, torch.Tensor], alpha: float) -> None:
    """Add a saved :func:`adapter_state` to the plain ``model`` it was trained on (in place):
    ``W += (alpha / rank) * B A`` for every layer the state names."""
    modules = dict(model.named_modules())
    names = sorted({k.rsplit(".", 1)[0] for k in state})
    for full in names:
        if f"{full}.lora_a" not in state or f"{full}.lora_b" not in state:
            raise ValueError(f"adapter state: {full} lacks lora_a or lora_b")
        layer = modules.get(full)
        if not isinstance(layer, torch.nn.Linear):
            raise ValueError(f"adapter state names {full}, which is not a linear layer of this model")
        a, b = state[f"{full}.lora_a"], state[f"{full}.lora_b"]
        if a.shape[1] != layer.in_features or b.shape[0] != layer.out_features or a.shape[0] != b.shape[1]:
            raise ValueError(f"adapter state: {full} has shapes {tuple(a.shape)}, {tuple(b.shape)}, which do not "
                             f"fit a {layer.in_features} -> {layer.out_features} layer")
        _fold(layer, a, b, alpha / a.shape[0])
