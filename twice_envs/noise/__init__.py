"""Keyed Gumbel noise: sampling noise addressed by a :class:`~twice_envs.keys.NoiseKey`.

A sampled token is ``argmax_v [logits_v / tau + g_v]`` over the top-p nucleus, where
``g_v`` is standard Gumbel noise read from a counter-based generator at an address
that depends only on the token's key, never on how many numbers were drawn before.
Two rollouts that read the same key therefore share their luck exactly.

This package is the one sampler core: every backend (transformers, vLLM's V1 and V2
processor interfaces, the toy envs) is a thin adapter that keeps one :class:`KeyState`
per row (key modes, line/pos advance) and runs :func:`keyed_choice` per step.
Its modules, each importing only those above it:

* :mod:`~twice_envs.noise.philox`: the generator. Philox4x32-10 (numpy reference,
  torch CPU/CUDA kernels), key rows and per-token keys, noise words, uniforms and
  Gumbel noise, bit-identical in every backend.
* :mod:`~twice_envs.noise.sampling`: the top-p nucleus, the keyed argmax
  (:func:`keyed_sample`), the log-probs of the distribution it draws from
  (:func:`sampling_logprobs`) and the sampling step (:func:`keyed_choice`).
* :mod:`~twice_envs.noise.keystate`: the per-row key state (:class:`KeyState`, the key
  modes, the line/pos advance) that forms the key of each generated token.

Every public name of the three modules is importable from here.
"""

from __future__ import annotations

from twice_envs.noise.philox import (
    G_MAX,
    G_MIN,
    G_RANGE,
    MASK32,
    PHILOX_M0,
    PHILOX_M1,
    PHILOX_ROUNDS,
    PHILOX_W0,
    PHILOX_W1,
    ROW_FIELDS,
    _philox_int,
    _token_keys_device,
    _words_to_gumbel,
    gumbel_np,
    gumbel_torch,
    key_rows,
    key_tensor,
    philox4x32_10,
    philox4x32_10_torch,
    philox_words_np,
    philox_words_torch,
    token_key,
    token_keys_np,
    token_keys_torch,
    uniforms_np,
    uniforms_torch,
)
from twice_envs.noise.sampling import (
    SKIP_GAP,
    KeyedChoice,
    _argmax_candidates,
    keyed_choice,
    keyed_sample,
    keyed_sample_np,
    nucleus_mask,
    nucleus_mask_np,
    sampling_logprobs,
    sampling_logprobs_np,
)
from twice_envs.noise.keystate import (
    KEY_MODES,
    NGRAM,
    KeyState,
    advance_line_pos,
    newline_token_mask,
    ngram_hash,
    seed_words,
    state_rows,
)

__all__ = [
    "G_MAX",
    "G_MIN",
    "G_RANGE",
    "KEY_MODES",
    "KeyState",
    "KeyedChoice",
    "NGRAM",
    "advance_line_pos",
    "gumbel_np",
    "gumbel_torch",
    "key_rows",
    "key_tensor",
    "newline_token_mask",
    "SKIP_GAP",
    "keyed_sample",
    "keyed_choice",
    "keyed_sample_np",
    "ngram_hash",
    "nucleus_mask",
    "nucleus_mask_np",
    "philox4x32_10",
    "philox4x32_10_torch",
    "philox_words_np",
    "philox_words_torch",
    "sampling_logprobs",
    "sampling_logprobs_np",
    "seed_words",
    "state_rows",
    "token_key",
    "token_keys_np",
    "token_keys_torch",
    "uniforms_np",
    "uniforms_torch",
]
