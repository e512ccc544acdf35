"""Prompts and training sequences: how an episode becomes the token stream the model sees.

The first prompt is the chat template applied to ``[system], user: first_obs`` with the
assistant generation prompt. After each turn, :func:`observation_ids` appends the
template's text between the assistant's content and the next assistant turn (end of
the assistant message, the user message holding the observation, the next
assistant header). Generated tokens are never re-tokenised: the model's context is
``prompt + turn_0 tokens + obs_0 tokens + turn_1 tokens + ...``, exactly what
:func:`pack_episode` rebuilds for training.
"""

from __future__ import annotations

from typing import Optional

from twice_envs.agents.types import EpisodeRecord

_SENTINEL = "\u2063TWICE-ASSISTANT-CONTENT\u2063"


def _template(tokenizer, messages: list[dict], add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def initial_prompt_ids(tokenizer, first_obs: str, system: Optional[str] = None) -> list[int]:
    """Token ids of the first prompt (chat template with the generation prompt)."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": first_obs}]
    text = _template(tokenizer, messages, True)
    return list(tokenizer.encode(text, add_special_tokens=False))


def observation_suffix(tokenizer, obs: str) -> str:
    """The template text that follows an assistant turn's content when ``obs`` answers it."""
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": _SENTINEL},
        {"role": "user", "content": obs},
    ]
    text = _template(tokenizer, messages, True)
    i = text.find(_SENTINEL)
    if i < 0:  # pragma: no cover - a template that drops assistant content
        raise ValueError("the chat template does not render assistant messages")
    return text[i + len(_SENTINEL):]


def observation_ids(tokenizer, obs: str) -> list[int]:
    """Tokens appended after a turn: end of the assistant message, ``obs`` as a user
    message, and the next assistant header (loss mask 0)."""
    return list(tokenizer.encode(observation_suffix(tokenizer, obs), add_special_tokens=False))


def pack_episode(ep: EpisodeRecord) -> tuple[list[int], list[int], list[float], list[int]]:
    """``(input_ids, loss_mask, old_logprobs, turn_of_token)`` of an episode.

    ``input_ids = prompt_ids + turn_0.token_ids + turn_0.obs_token_ids + ...``;
    ``loss_mask`` is 1 on generated tokens; ``old_logprobs`` holds the sampling
    log-probs there (0 elsewhere); ``turn_of_token`` the turn index (``-1`` elsewhere).
    The last turn's observation tokens are included when recorded (they are masked).
    For a twin record, ``turns`` start at the branch turn and ``prompt_ids`` holds the
    context before it, so the same call packs twins.
    """
    ids = list(ep.prompt_ids)
    mask = [0] * len(ids)
    old = [0.0] * len(ids)
    turn_of = [-1] * len(ids)
    first = ep.twin_of[1] if ep.twin_of is not None else 0
    for k, t in enumerate(ep.turns):
        if len(t.logprobs) != len(t.token_ids):
            raise ValueError(f"turn {k}: {len(t.token_ids)} tokens but {len(t.logprobs)} log-probs")
        ids += t.token_ids
        mask += [1] * len(t.token_ids)
        old += [float(x) for x in t.logprobs]
        turn_of += [first + k] * len(t.token_ids)
        ids += t.obs_token_ids
        mask += [0] * len(t.obs_token_ids)
        old += [0.0] * len(t.obs_token_ids)
        turn_of += [-1] * len(t.obs_token_ids)
    return ids, mask, old, turn_of
