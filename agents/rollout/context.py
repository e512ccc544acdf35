"""Prompts and training sequences: how an episode becomes the token stream the model sees.

The first prompt is the chat template applied to ``[system], user: first_obs`` with the
assistant generation prompt. After each turn, :func:`observation_ids` appends the
template's text between the assistant's content and the next assistant turn (end of
the assistant message, the user message holding the observation, the next
assistant header). Generated tokens are never re-tokenised: the model's context is
``prompt + turn_0 tokens + obs_0 tokens + turn_1 tokens + ...``, exactly what
:func:`pack_episode` rebuilds for training.

**History window.** An episode generated with ``window=w`` shows the model, before each
turn, the first prompt (it holds the task) and only the last ``w`` turns with their
observations (the latest observation lists the admissible actions where the env has
them): :func:`turn_context` is the one definition of that context. The blocks kept are
the same token ids as ever, so the context is still never re-tokenised; a windowed
episode packs into one sequence per turn once turns start to drop out of the window
(:func:`pack_segments`), because each such turn saw a different context.
"""

from __future__ import annotations

from typing import Optional, Sequence

from twice_envs.agents.types import EpisodeRecord, TurnRecord

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

    A windowed episode (``ep.window`` set) packs this way only while no turn has dropped
    out of its window; otherwise this raises ``ValueError`` (use :func:`pack_segments`).
    """
    if ep.window is not None:
        segs = pack_segments(ep)
        if len(segs) != 1:
            raise ValueError(f"a windowed episode (window {ep.window}, {len(ep.turns)} turns) saw {len(segs)} "
                             "different contexts: pack it with pack_segments, one sequence per context")
        return segs[0]
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


def check_window(window) -> Optional[int]:
    """``window`` as an int >= 0, or None (the whole episode); anything else raises ``ValueError``."""
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(f"window must be an int >= 0 (turns of history) or None (the whole episode), got {window!r}")
    return window


def _kept(earlier: list, window: Optional[int]) -> list:
    if window is None:
        return earlier
    return earlier[len(earlier) - window:] if 0 < window < len(earlier) else (earlier if window else [])


def _blocks(turns: Sequence[TurnRecord]) -> list[tuple[list[int], list[int]]]:
    return [(list(t.token_ids), list(t.obs_token_ids)) for t in turns]


def _context(prompt_ids: Sequence[int], earlier: Sequence[tuple[list[int], list[int]]], window: Optional[int]) -> list[int]:
    """``prompt_ids`` followed by the ``(turn_ids, obs_ids)`` blocks of the earlier turns that the window keeps."""
    ids = list(prompt_ids)
    for turn_ids, obs_ids in _kept(list(earlier), window):
        ids += list(turn_ids) + list(obs_ids)
    return ids


def turn_context(ep: EpisodeRecord, k: int) -> list[int]:
    """The token ids the model saw before ``ep.turns[k]`` (``k = len(ep.turns)``: before the next turn).

    ``prompt_ids`` followed by the earlier turns (``ep.history`` then ``ep.turns[:k]``), each
    with its observation; with ``ep.window = w`` only the last ``w`` of them.
    """
    return _context(ep.prompt_ids, _blocks(list(ep.history) + list(ep.turns[:k])), ep.window)


def twin_prefix(ep: EpisodeRecord, turn: int) -> tuple[list[int], list[TurnRecord]]:
    """``(prompt_ids, history)`` of a twin of ``ep`` branching at ``turn``: the factual context
    before the turn as one prompt (whole-episode context), or the first prompt and the factual
    turns the window still holds (windowed)."""
    if ep.window is None:
        return turn_context(ep, turn), []
    return list(ep.prompt_ids), _kept(list(ep.history) + list(ep.turns[:turn]), ep.window)


def segments(n_history: int, n_turns: int, window: Optional[int]) -> list[tuple[int, int]]:
    """Turn ranges ``[a, b)`` packed as one sequence each.

    In a sequence that starts with turn ``a``'s context, turn ``k`` sees that context plus
    turns ``a..k-1``: exactly its own context while no earlier turn has dropped out of the
    window (``n_history + k <= window``). The first sequence holds those turns; every later
    turn saw a context of its own and gets its own sequence.
    """
    if n_turns <= 0:
        return []
    if window is None:
        return [(0, n_turns)]
    b = 1
    while b < n_turns and n_history + b <= window:
        b += 1
    return [(0, b)] + [(k, k + 1) for k in range(b, n_turns)]


def pack_segments(ep: EpisodeRecord) -> list[tuple[list[int], list[int], list[float], list[int]]]:
    """The episode as training sequences, each ``(input_ids, loss_mask, old_logprobs, turn_of_token)``
    like :func:`pack_episode`: one sequence for a whole-episode context, several for a windowed
    episode (:func:`segments`). Every turn's tokens appear once, after exactly the context it
    was sampled from."""
    if ep.window is None:
        return [pack_episode(ep)]
    first = ep.twin_of[1] if ep.twin_of is not None else 0
    for k, t in enumerate(ep.turns):
        if len(t.logprobs) != len(t.token_ids):
            raise ValueError(f"turn {k}: {len(t.token_ids)} tokens but {len(t.logprobs)} log-probs")
    out = []
    for ids, spans, a in _sequences(ep.prompt_ids, _blocks(ep.history), _blocks(ep.turns), ep.window):
        mask, old, turn_of = [0] * len(ids), [0.0] * len(ids), [-1] * len(ids)
        for j, (start, end) in enumerate(spans):
            mask[start:end] = [1] * (end - start)
            old[start:end] = [float(x) for x in ep.turns[a + j].logprobs]
            turn_of[start:end] = [first + a + j] * (end - start)
        out.append((ids, mask, old, turn_of))
    return out


def _sequences(prompt_ids: Sequence[int], history: Sequence[tuple[list[int], list[int]]],
               turns: Sequence[tuple[list[int], list[int]]], window: Optional[int]
               ) -> list[tuple[list[int], list[tuple[int, int]], int]]:
    """``(input_ids, [(start, end) of each turn's tokens], first turn)`` per sequence of
    :func:`segments`; ``history`` and ``turns`` are ``(turn_ids, obs_ids)`` blocks. A sequence is its
    first turn's context, then its turns with the observations between them."""
    out = []
    for a, b in segments(len(history), len(turns), window):
        ids = _context(prompt_ids, list(history) + list(turns[:a]), window)
        spans = []
        for k in range(a, b):
            turn_ids, obs_ids = turns[k]
            spans.append((len(ids), len(ids) + len(turn_ids)))
            ids += list(turn_ids) + (list(obs_ids) if k < b - 1 else [])
        out.append((ids, spans, a))
    return out


def text_sequences(prompt_ids: Sequence[int], blocks: Sequence[tuple[list[int], list[int]]],
                   window: Optional[int]) -> list[tuple[list[int], list[tuple[int, int]], int]]:
    """Sequences of a text episode (scripted transcripts) with the rollout's contexts:
    ``blocks`` are ``(turn_ids, obs_ids)``; returns ``(input_ids, [(start, end) of each turn's
    tokens], index of its first turn)`` per sequence of :func:`segments`, as
    :func:`pack_segments` packs a rollout."""
    return _sequences(prompt_ids, [], blocks, window)
