"""Scripted SearchQA agents that write Search-R1 turns (``<think>`` + ``<search>``/``<answer>``).

They read what the env showed them the way a careful model would: for a generated
question they follow its program (start entity, relations), search for the entity
they need next, find its passage among the results by title and read the fact from
the text. They never read the gold answer.

* ``scripted_turns(env, rng, skill=1.0)`` is the gold-hop agent: one search per hop.
* with ``quote=True`` its reasoning quotes the passage sentence it read a fact from;
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

from twice_envs.envs.mistakes import Mistake, marked_like
from twice_envs.envs.searchqa.corpus_gen import RELATION_WORDS, RELATIONS, extract_fact

_SENTENCE_RE = re.compile(r"(?<=\.)\s+")
_INFO_RE = re.compile(r"<information>(.*?)</information>", re.DOTALL)
_DOC_RE = re.compile(r"^Doc \d+\(Title: (.*?)\) (.*)$")
_YEAR_WORDS = ("1742", "1803", "1861", "1907", "1933")
_RANDOM_WORDS = ("river", "tower", "ancient", "history", "music", "company", "born", "city", "novel", "king",
                 "museum", "bridge", "famous", "winter", "harbour")


def _base(env: Any) -> Any:
    return getattr(env, "unwrapped", env)


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


def evidence_sentence(text: str, value: str) -> str:
    """The first sentence of a passage ``text`` that states ``value`` (empty when none does)."""
    for sentence in _SENTENCE_RE.split(text.strip()):
        if value in sentence:
            return sentence.strip()
    return ""


def plan(env: Any) -> tuple[str, dict]:
    """What a careful reader does next: ``("search", need)`` or ``("answer", {"answer": ...})``.

    ``need`` holds ``subject``, ``kind`` and ``relation`` of the missing fact. Both carry
    ``evidence``: the passage sentences that state the facts the step rests on (the previous
    hop's, or both of a comparison), which ``quote=True`` turns quote.
    """
    base = _base(env)
    prog = base.task.metadata.get("program") if isinstance(base.task.metadata, dict) else None
    docs = seen_passages(env)
    if not prog:  # real data: no program to follow
        if not docs:
            return "search", {"subject": base.task.question, "kind": None, "relation": None, "evidence": []}
        return "answer", {"answer": next(iter(docs)), "evidence": []}
    evidence: list[str] = []
    if prog["op"] == "compose":
        subject, kind = prog["start"], prog["start_kind"]
        rels = prog["relations"]
        for j, rel in enumerate(rels):
            text = docs.get(subject)
            value = extract_fact(text, kind, subject, rel) if text is not None else None
            if value is None:
                return "search", {"subject": subject, "kind": kind, "relation": rel, "bridge": subject if j else None,
                                  "evidence": evidence[-1:]}
            evidence.append(evidence_sentence(text, value))
            if j == len(rels) - 1:
                return "answer", {"answer": value, "evidence": evidence[-1:]}
            subject, kind = value, RELATIONS[(kind, rel)]
    values = []
    for name in prog["entities"]:
        text = docs.get(name)
        value = extract_fact(text, prog["kind"], name, prog["relation"]) if text is not None else None
        if value is None or _number(value) is None:
            return "search", {"subject": name, "kind": prog["kind"], "relation": prog["relation"], "evidence": []}
        values.append(_number(value))
        evidence.append(evidence_sentence(text, value))
    a, b = prog["entities"]
    first = (values[0] < values[1]) == (prog["pick"] == "min")
    return "answer", {"answer": a if first else b, "evidence": evidence}


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


def _quote(what: dict, fallback: str) -> str:
    # Quoting the sentence that states a fact makes reading it a copy of a span the
    # model has just seen, which small models learn far sooner than picking the fact
    # out of the passages directly.
    quoted = " ".join(x for x in what.get("evidence", []) if x)
    return f"{quoted} {fallback}" if quoted else fallback


def _previous_queries(env: Any) -> list[str]:
    out = []
    for a in _base(env).trajectory.actions:
        m = re.search(r"<search>(.*?)</search>", a, re.DOTALL)
        if m:
            out.append(" ".join(m.group(1).split()))
    return out


def scripted_turns(env: Any, rng: Optional[np.random.Generator] = None, skill: float = 1.0, quote: bool = False) -> str:
    """The next raw turn of a scripted agent with mistake rate ``1 - skill`` (1.0: gold-hop agent).

    The mistakes (premature guesses, weak searches) are marked as
    :class:`~twice_envs.envs.mistakes.Mistake`. With ``quote``, the reasoning of a turn that
    follows a successful read quotes the passage sentence that states the fact, before the
    answer or the next need.
    """
    base = _base(env)
    rng = rng if rng is not None else np.random.default_rng(0)
    bad = min(max(1.0 - float(skill), 0.0), 1.0)
    action, what = plan(env)
    searches_left = base.max_searches - base.num_searches
    if action == "answer":
        if bad and rng.random() < 0.2 * bad:
            return Mistake(_turn("I am fairly sure of this.", "answer", _guess(env, rng)))
        if quote:
            return _turn(_quote(what, f"The answer is {what['answer']}."), "answer", what["answer"])
        return _turn(f"The passages give the answer: {what['answer']}.", "answer", what["answer"])
    if searches_left <= 0:
        return _turn("I cannot search any more, so I will guess.", "answer", _guess(env, rng))
    if bad:
        u = rng.random()
        if u < 0.4 * bad:
            return Mistake(_turn("I think I already know this.", "answer", _guess(env, rng)))
        if u < 0.8 * bad:
            subject = what["subject"]
            weak = [
                RELATION_WORDS.get(what["relation"] or "", "who"),
                subject[:-2] if len(subject) > 4 else subject + "s",
                " ".join(base.task.question.rstrip("?").split()[-3:]),
            ]
            q = weak[int(rng.integers(len(weak)))]
            return Mistake(_turn(f"Let me search for {q}.", "search", q))
    good = _good_query(what, 0)
    tries = _previous_queries(env).count(good)
    q = _good_query(what, tries)
    rel = (what["relation"] or "answer").replace("_", " ")
    need = f"I need the {rel} of {what['subject']}."
    return _turn(_quote(what, need) if quote else need, "search", q)


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


# ----------------------------------------------------------------------------- transcript augmentation
_CAPITALISED_RE = re.compile(r"\b[A-Z][a-z]+\b")
_NAME_WORDS: dict[int, frozenset] = {}


def name_words(env: Any) -> frozenset:
    """The invented words of the env's generated names: entity titles and countries, without
    the generator's fixed words (adjectives and nouns of titles, organisation forms)."""
    from twice_envs.envs.searchqa import corpus_gen as cg

    corpus = _base(env).resources.corpus
    if id(corpus) in _NAME_WORDS:
        return _NAME_WORDS[id(corpus)]
    fixed = set(cg._ADJ) | set(cg._NOUN) | {"The", "New", "Upper", "Lower", "Old"}
    for form in cg._ORG_FORMS:
        fixed.update(_CAPITALISED_RE.findall(form))
    words: set[str] = set()
    for content in corpus.iter_contents():
        title, _, text = content.partition("\n")
        title = title.strip().strip('"')
        words.update(_CAPITALISED_RE.findall(title))
        country = extract_fact(text, "place", title, "country")
        if country:
            words.update(_CAPITALISED_RE.findall(country))
    _NAME_WORDS[id(corpus)] = out = frozenset(words - fixed)
    return out


def renamed_copies(env: Any, episodes: list, copies: int, rng: np.random.Generator) -> list:
    """``copies`` variants of each scripted episode ``(first_obs, [(action, obs), ...])`` in which
    the invented name words are permuted: each is replaced, consistently within the episode,
    by another name word of the corpus drawn at random.

    The facts, the reasoning and the answers stay right (only the names change) and every
    name is still a word of the corpus (so a tokenizer trained on it keeps names whole), but
    no name keeps its facts across transcripts: a model trained on them cannot memorise
    names and must copy them from the question and the passages.
    """
    words = name_words(env)
    pool = sorted(words)
    out = []
    for first_obs, turns in episodes:
        texts = [first_obs] + [x for turn in turns for x in turn]
        present = sorted({w for t in texts for w in _CAPITALISED_RE.findall(t) if w in words})
        for _ in range(copies):
            targets = rng.choice(len(pool), size=len(present), replace=False)
            mapping = {w: pool[int(j)] for w, j in zip(present, targets)}
            sub = lambda text: _CAPITALISED_RE.sub(lambda m: mapping.get(m.group(0), m.group(0)), text)  # noqa: E731
            out.append((sub(first_obs), [(marked_like(a, sub(a)), sub(o)) for a, o in turns]))
    return out
