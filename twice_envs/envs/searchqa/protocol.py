"""The Search-R1 turn protocol: prompt, action parsing, passage formatting and answer scoring.

A turn is the model's raw text. It ends at the first stop string (``</search>`` or
``</answer>``); the action is the first ``<search>...</search>`` or
``<answer>...</answer>`` pair in what remains. Answers are scored after the usual
normalisation (lower-case, drop punctuation, drop the articles a/an/the, collapse
whitespace).
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

#: Strings that end an agent turn.
STOP_STRINGS: tuple[str, ...] = ("</search>", "</answer>")

#: Queries longer than this many characters are cut before retrieval.
MAX_QUERY_CHARS = 1024

INSTRUCTIONS = (
    "Answer the question below. Every time you receive new information, first reason about it "
    "inside <think> and </think>. If you find that you are missing some knowledge, you can query "
    "a search engine by writing <search> query </search>; the top results will come back between "
    "<information> and </information>. You may search several times. Once you need no more "
    "information, give the final answer inside <answer> and </answer>, with no explanation, "
    "for example <answer> Paris </answer>."
)

INVALID_ACTION = (
    "\nMy previous action is invalid. To search, I should put the query between <search> and "
    "</search>. To give the final answer, I should put it between <answer> and </answer>. "
    "Let me try again.\n"
)


def budget_note(max_searches: int) -> str:
    """Said after the search that uses up the budget."""
    return f"All {max_searches} searches are used; give the final answer between <answer> and </answer>.\n"


_OPEN_RE = re.compile(r"<(search|answer)>")
_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


@dataclass(frozen=True)
class Action:
    """A parsed turn: ``kind`` is ``"search"``, ``"answer"`` or ``None`` (invalid)."""

    kind: Optional[str]
    content: str = ""


def format_question(question: str) -> str:
    """The question stripped, with ``?`` appended when it does not end with one."""
    q = question.strip()
    return q if q.endswith("?") else q + "?"


def first_prompt(question: str, instructions: str = INSTRUCTIONS) -> str:
    """The first observation: instructions, then ``Question: ...?``."""
    return f"{instructions} Question: {format_question(question)}\n"


def cut_at_stop(text: str, stops: Sequence[str] = STOP_STRINGS) -> str:
    """``text`` up to and including the earliest stop string (unchanged when none occurs)."""
    best = -1
    best_stop = ""
    for s in stops:
        i = text.find(s)
        if i >= 0 and (best < 0 or i < best):
            best, best_stop = i, s
    return text if best < 0 else text[: best + len(best_stop)]


def parse_action(text: str) -> Action:
    """Parse one raw turn (everything after the first stop string is ignored).

    The action is the leftmost ``<kind>`` opener that has a ``</kind>`` after it; its
    content runs to the first such closer. Linear in ``len(text)``: each opener is
    tested against the last closer of its kind instead of rescanning the rest of the
    text (a lazy regex does that and takes quadratic time on ``"<search>" * n``).
    """
    text = cut_at_stop(text)
    last_close = {kind: text.rfind(f"</{kind}>") for kind in ("search", "answer")}
    for m in _OPEN_RE.finditer(text):
        kind = m.group(1)
        if last_close[kind] >= m.end():
            end = text.find(f"</{kind}>", m.end())
            return Action(kind, text[m.end() : end].strip())
    return Action(None)


def clean_query(query: str, max_chars: int = MAX_QUERY_CHARS) -> str:
    """A query safe to retrieve with and to journal: valid UTF-8, no control characters,
    single spaces, at most ``max_chars`` characters."""
    q = query.encode("utf-8", "replace").decode("utf-8")  # lone surrogates become '?'
    q = "".join(" " if unicodedata.category(c)[0] == "C" else c for c in q)
    q = " ".join(q.split())
    return q[:max_chars].strip()


def split_contents(contents: str) -> tuple[str, str]:
    """wiki-18 ``contents`` (``'"Title"\\ntext'``) as ``(title line, text)``."""
    title, _, text = contents.partition("\n")
    return title, text


def format_passages(contents: Iterable[str]) -> str:
    """``Doc 1(Title: ...) text`` lines, one per passage (the title line is shown as stored)."""
    lines = []
    for i, c in enumerate(contents):
        title, text = split_contents(c)
        lines.append(f"Doc {i + 1}(Title: {title}) {text}")
    return "\n".join(lines)


def information_block(body: str) -> str:
    """The observation that carries search results back to the agent."""
    return f"\n\n<information>{body.strip()}</information>\n\n"


# ----------------------------------------------------------------------------- scoring
def normalize_answer(s: str) -> str:
    """Lower-case, remove punctuation, remove articles, collapse whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES_RE.sub(" ", s)
    return " ".join(s.split())


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    """1.0 if the normalised prediction equals any normalised gold answer."""
    p = normalize_answer(prediction)
    return float(any(p == normalize_answer(g) for g in golds))


def sub_exact_match(prediction: str, golds: Sequence[str]) -> float:
    """1.0 if any normalised gold answer occurs inside the normalised prediction."""
    p = normalize_answer(prediction)
    return float(any(normalize_answer(g) in p for g in golds if normalize_answer(g)))


def f1_score(prediction: str, golds: Sequence[str]) -> float:
    """Best token-level F1 over the gold answers (yes/no/noanswer must match exactly)."""
    p = normalize_answer(prediction)
    best = 0.0
    for g in golds:
        gn = normalize_answer(g)
        if (p in ("yes", "no", "noanswer") or gn in ("yes", "no", "noanswer")) and p != gn:
            continue
        pt, gt = p.split(), gn.split()
        common = Counter(pt) & Counter(gt)
        same = sum(common.values())
        if same == 0:
            continue
        precision, recall = same / len(pt), same / len(gt)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best
