"""A small random policy on CreditToy-v0 for fast trainer tests (no model build needed)."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def _tokenizer():
    from twice_envs.agents.models.tokenizer import train_tokenizer

    texts = ["Pick an action 0-3 on each of 3 turns; collect enough points.", "A red light.", "A green light.",
             "0\n", "1\n", "2\n", "3\n", "Invalid action: answer with one digit 0-3. Turn wasted."] * 20
    return train_tokenizer(texts, 300)


def small_policy(seed: int = 0):
    """A 2-layer Llama with a BPE tokenizer trained on the toy's strings, briefly warm-started
    (built once per process and seed; every call returns a fresh copy)."""
    import copy

    from twice_envs.agents.sampling.policy import HFPolicy

    model, tok = _built(seed)
    return HFPolicy(copy.deepcopy(model), tok)


@functools.lru_cache(maxsize=2)
def _built(seed: int):
    import torch
    import transformers

    tok = _tokenizer()
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                                   tie_word_embeddings=True, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    model = transformers.LlamaForCausalLM(cfg)
    _warm_start(model, tok, seed)
    model.eval()
    return model, tok


def _warm_start(model, tok, seed):
    """A few supervised steps on random valid toy episodes, so turns are mostly digits."""
    import random

    from twice_envs.agents.models.sft import train_sft
    from twice_envs.agents.rollout.context import initial_prompt_ids, observation_ids
    from twice_envs.envs.credittoy.env import CreditToyEnv

    rng = random.Random(seed)
    first = CreditToyEnv().protocol().instructions
    seqs = []
    for _ in range(32):
        ids = list(initial_prompt_ids(tok, first))
        mask = [0] * len(ids)
        for _t in range(3):
            a = tok.encode(f"{rng.randrange(4)}\n", add_special_tokens=False)
            o = observation_ids(tok, rng.choice(["A red light.", "A green light."]))
            ids += a + o
            mask += [1] * len(a) + [0] * len(o)
        seqs.append((ids, mask))
    train_sft(model, seqs, steps=12, batch_size=8, lr=2e-2, seed=seed, pad_id=tok.pad_token_id)


def toy_config(tmp_path, **kw):
    from twice_envs.agents.training.config import cpu_config

    base = dict(env="CreditToy-v0", indexed_tasks=False, questions_per_update=3, group_size=3, max_new_tokens=3,
                updates=2, lr=1e-3, warmup_steps=1, eval_questions=4, checkpoint_every=1, out_dir=str(tmp_path / "run"),
                max_turns=3)
    base.update(kw)
    return cpu_config(**base)


import pytest


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny models run fastest on one thread, and the CI machine is shared (restored afterwards)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
