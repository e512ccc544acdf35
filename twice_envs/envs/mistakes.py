"""The mark a scripted agent puts on a deliberate mistake.

Scripted agents play a random command on a share of turns so that their transcripts mix
good and bad decisions. A model trained on those transcripts would also learn to make the
mistakes; marking them lets the transcript writer keep them in the context (the model
still sees states that follow a mistake, and learns to recover) while weighting them
differently, or not at all, in the loss (``TinyModelConfig.mistake_weight``).
"""

from __future__ import annotations


class Mistake(str):
    """A turn text that a scripted agent played as a deliberate (random) mistake.

    It is a plain ``str`` to everything that reads it (the env parses it like any action);
    only code that asks ``isinstance(text, Mistake)`` tells it apart. Text rewritten from it
    (``str`` methods, augmenters) is a plain ``str`` again unless re-marked with :func:`marked_like`.
    """

    __slots__ = ()


class Played(str):
    """A turn text that a model played, in a transcript whose next turn a scripted agent relabels
    (:func:`~twice_envs.agents.models.transcripts.relabelled_episodes`): it stays in the context, as the
    model saw it, and is never imitated, whatever weight mistakes get."""

    __slots__ = ()


def marked_like(original: str, text: str) -> str:
    """``text`` with the mark of ``original`` (:class:`Mistake`, :class:`Played` or none), for augmenters
    that rewrite turns."""
    return type(original)(text) if isinstance(original, (Mistake, Played)) else text
