"""Scripted SearchQA agents that write Search-R1 turns (``<think>`` + ``<search>``/``<answer>``).

They read what the env showed them the way a careful model would: for a generated
question they follow its program (start entity, relations), search for the entity
they need next, find its passage among the results by title and read the fact from
the text. They never read the gold answer.

* ``scripted_turns(env, rng, skill=1.0)`` is the gold-hop agent: one search per hop.
* with ``skill < 1`` it makes mistakes at a rate ``1 - skill``: premature answers
  (guessing before the facts are in), weak queries (the relation alone, a misspelt
  name, a few words of the question) and sloppy final answers;
* ``random_turn(env, rng)`` searches random words and answers a random string.

Use them for tests, baselines and warm-start transcripts::

    rng = np.random.default_rng(0)
    obs, info = env.reset(seed=1)
    while True:
        obs, r, term, trunc, info = env.step(scripted_turns(env, rng, skill=0.7))
        if term or trunc: break
"""

from __future__ import annotations

import re
from typing import Any, Callable, Optional

import numpy as np

from twice_envs.envs.searchqa.corpus_gen import RELATION_WORDS, RELATIONS, extract_fact

_INFO_RE = re.compile(r"<information>(.*?)</information>", re.DOTALL)
_DOC_RE = re.compile(r"^Doc \d+\(Title: (.*?)\) (.*)$")
_YEAR_WORDS = ("1742", "1803", "1861", "1907", "1933")
_RANDOM_WORDS = ("river", "tower", "ancient", "history", "music", "company", "born", "city", "novel", "king",
                 "museum", "bridge", "famous", "winter", "harbour")


def _base(env: Any) -> Any:
    from twice_envs.wrappers.base import unwrap

    return unwrap(env)


def seen_passages(env: Any) -> dict[str, str]:
    """Title -> text of every passage shown so far in the episode (first sighting wins)."""
    docs: dict[str, str] = {}
    for obs in _base(env).trajectory.observations[1:]:
        for block in _INFO_RE.findall(obs):
            for line in block.split("\n"):
                m = _DOC_RE.match(line)
                if m:
                    docs.setdefault(m.group(1).strip().strip('"'), m.group(2))
    return docs


def _number(text: str) -> Optional[int]:
    digits = text.replace(",", "").strip()
    return int(digits) if digits.isdigit() else None


def plan(env: Any) -> tuple[str, dict]:
    """What a careful reader does next: ``("search", need)`` or ``("answer", {"answer": ...})``.

    ``need`` holds ``subject``, ``kind`` and ``relation`` of the missing fact.
    """
    base = _base(env)
    prog = base.task.metadata.get("program") if isinstance(base.task.metadata, dict) else None
    docs = seen_passages(env)
    if not prog:  # real data: no program to follow
        if not docs:
            return "search", {"subject": base.task.question, "kind": None, "relation": None}
        return "answer", {"answer": next(iter(docs))}
    if prog["op"] == "compose":
        subject, kind = prog["start"], prog["start_kind"]
        rels = prog["relations"]
        for j, rel in enumerate(rels):
            text = docs.get(subject)
            value = extract_fact(text, kind, subject, rel) if text is not None else None
            if value is None:
                return "search", {"subject": subject, "kind": kind, "relation": rel, "bridge": subject if j else None}
            if j == len(rels) - 1:
                return "answer", {"answer": value}
            subject, kind = value, RELATIONS[(kind, rel)]
    values = []
    for name in prog["entities"]:
        text = docs.get(name)
        value = extract_fact(text, prog["kind"], name, prog["relation"]) if text is not None else None
        if value is None or _number(value) is None:
            return "search", {"subject": name, "kind": prog["kind"], "relation": prog["relation"]}
        values.append(_number(value))
    a, b = prog["entities"]
    first = (values[0] < values[1]) == (prog["pick"] == "min")
    return "answer", {"answer": a if first else b}


def _good_query(need: dict, tries: int) -> str:
    if need["relation"] is None:
        return need["subject"]
    # after a miss, search the bare name (passages are titled by it)
    return need["subject"] if tries else f"{need['subject']} {RELATION_WORDS[need['relation']]}"


def _guess(env: Any, rng: np.random.Generator) -> str:
    docs = list(seen_passages(env))
    if docs:
        return docs[int(rng.integers(len(docs)))]
    return _YEAR_WORDS[int(rng.integers(len(_YEAR_WORDS)))]


def _turn(think: str, kind: str, content: str) -> str:
    return f"<think> {think} </think>\n<{kind}> {content} </{kind}>"


def _previous_queries(env: Any) -> list[str]:
    out = []
    for a in _base(env).trajectory.actions:
        m = re.search(r"<search>(.*?)</search>", a, re.DOTALL)
        if m:
            out.append(" ".join(m.group(1).split()))
    return out


def scripted_turns(env: Any, rng: Optional[np.random.Generator] = None, skill: float = 1.0) -> str:
    """The next raw turn of a scripted agent with mistake rate ``1 - skill`` (1.0: gold-hop agent)."""
    base = _base(env)
    rng = rng if rng is not None else np.random.default_rng(0)
    bad = min(max(1.0 - float(skill), 0.0), 1.0)
    action, what = plan(env)
    searches_left = base.max_searches - base.num_searches
    if action == "answer":
        if bad and rng.random() < 0.2 * bad:
            return _turn("I am fairly sure of this.", "answer", _guess(env, rng))
        return _turn(f"The passages give the answer: {what['answer']}.", "answer", what["answer"])
    if searches_left <= 0:
        return _turn("I cannot search any more, so I will guess.", "answer", _guess(env, rng))
    if bad:
        u = rng.random()
        if u < 0.4 * bad:
            return _turn("I think I already know this.", "answer", _guess(env, rng))
        if u < 0.8 * bad:
            subject = what["subject"]
            weak = [
                RELATION_WORDS.get(what["relation"] or "", "who"),
                subject[:-2] if len(subject) > 4 else subject + "s",
                " ".join(base.task.question.rstrip("?").split()[-3:]),
            ]
            q = weak[int(rng.integers(len(weak)))]
            return _turn(f"Let me search for {q}.", "search", q)
    good = _good_query(what, 0)
    tries = _previous_queries(env).count(good)
    q = _good_query(what, tries)
    rel = (what["relation"] or "answer").replace("_", " ")
    return _turn(f"I need the {rel} of {what['subject']}.", "search", q)


def random_turn(env: Any, rng: np.random.Generator) -> str:
    """A random agent: random-word searches, then a random answer."""
    if rng.random() < 0.5 and _base(env).num_searches < _base(env).max_searches:
        words = [_RANDOM_WORDS[int(i)] for i in rng.integers(len(_RANDOM_WORDS), size=2)]
        return _turn("Let me look something up.", "search", " ".join(words))
    return _turn("I will answer now.", "answer", _guess(env, rng))


def run_episode(env: Any, turn_fn: Callable[[Any], str], seed: int, options: Optional[dict] = None) -> dict:
    """Play one episode with ``turn_fn(env) -> turn text``; returns the last info."""
    _, info = env.reset(seed=seed, options=options)
    while True:
        _, _, term, trunc, info = env.step(turn_fn(env))
        if term or trunc:
            return info
