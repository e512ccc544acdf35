"""SearchQA env ids (entry points are strings: nothing heavy is imported here)."""

from __future__ import annotations

from twice_envs.registry import register

_ENTRY = "twice_envs.envs.searchqa.env:SearchQAEnv"

VARIANTS: dict[str, tuple[dict, str]] = {
    "SearchQA-v0": ({}, "Search-R1 protocol QA, BM25 over a generated fictional encyclopedia, exact-match reward"),
    "SearchQA-SubEM-v0": ({"reward": "subem"}, "SearchQA with sub-exact-match reward (gold answer inside the prediction)"),
    "SearchQA-F1-v0": ({"reward": "f1"}, "SearchQA with token-level F1 reward"),
    "SearchQA-Cost-v0": ({"reward": "cost_f1"}, "SearchQA with cost-aware utility: F1 - 0.05 x searches"),
    "SearchQA-Noisy-v0": ({"noise_epsilon": 0.2}, "SearchQA with noisy retrieval (each passage swapped w.p. 0.2 from the top 20)"),
    "SearchQA-Dense-v0": ({"retriever": "dense"}, "SearchQA with dense retrieval (local MiniLM encoder, faiss flat IP)"),
}

for _id, (_kwargs, _desc) in VARIANTS.items():
    register(_id, _ENTRY, kwargs=_kwargs, description=_desc, override=True)
