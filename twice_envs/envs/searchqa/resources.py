"""Heavy, read-only resources of a SearchQA env (corpus, questions, retriever, journal).

They are built once per process and shared by every env made with the same data
settings, so ``make`` again (what ``fork`` does) costs a dictionary lookup. On disk
everything is cached under ``twice_envs._cache.cache_dir("searchqa", ...)``:
generated files by generator config, corpus stores by source file, indexes by
corpus version.
"""

from __future__ import annotations

import os
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from twice_envs.envs.searchqa.corpus import CorpusStore, open_corpus
from twice_envs.envs.searchqa.corpus_gen import GENERATOR_VERSION, GeneratorConfig, write_generated
from twice_envs.envs.searchqa.loaders import Question, load_questions
from twice_envs.envs.searchqa.retrievers import Retriever, SearchTool
from twice_envs.tools import Journal, Tool, shared_journal
from twice_envs.trajectory import canonical_json


@dataclass
class Resources:
    """What the envs of one data setting share.

    Attributes:
        corpus: the passage store.
        questions: split name -> questions.
        task_index: question id -> (split, position) of its first question.
        duplicate_ids: question id -> every (split, position) it names, for the ids that name
            more than one question (Search-R1's merged NQ + HotpotQA files can repeat a FlashRAG
            id such as ``train_0``); ``reset(options={"task": id})`` refuses them.
        retriever: the retriever.
        tool: the search tool (journaled through ``journal``).
        journal: the tool journal.
        generated: whether the data came from the embedded generator.
    """

    corpus: CorpusStore
    questions: dict[str, list[Question]]
    task_index: dict[str, tuple[str, int]]
    retriever: Retriever
    tool: Tool
    journal: Journal
    generated: bool = False
    title_cache: dict = field(default_factory=dict)
    duplicate_ids: dict[str, list[tuple[str, int]]] = field(default_factory=dict)


_CACHE: dict[str, Resources] = {}
_LOCK = threading.Lock()

#: name -> factory(resources) -> Tool, for ``make("SearchQA-v0", search_tool=name)``.
SEARCH_TOOLS: dict[str, Callable[[Resources], Tool]] = {}


def register_search_tool(name: str, factory: Callable[[Resources], Tool]) -> None:
    """Make ``search_tool=name`` use ``factory(resources)`` as the env's search.

    The tool is called as ``tool(query=..., k=...)`` through the env's journal and
    returns ``{"ids": [corpus positions]}`` or ``{"passages": ['"Title"\\ntext', ...]}``.
    Register it in every process that makes or replays such envs.
    """
    SEARCH_TOOLS[name] = factory
    with _LOCK:  # envs made before now keep their tool; new ones see this factory
        for key in [k for k in _CACHE if k.endswith(canonical_json(name) + "]")]:
            del _CACHE[key]


def _cache_root() -> str:
    # The same root cache_dir() uses, without touching the disk (this runs on every fork).
    return os.environ.get("TWICE_CACHE") or str(Path.home() / ".cache" / "twice_envs")


def _make_retriever(kind: str, options: dict, corpus: CorpusStore) -> Retriever:
    if kind == "bm25":
        from twice_envs.envs.searchqa.bm25 import BM25Params
        from twice_envs.envs.searchqa.retrievers import BM25Retriever

        return BM25Retriever(corpus, BM25Params(**options))
    if kind == "dense":
        from twice_envs.envs.searchqa.retrievers import DenseParams, DenseRetriever

        return DenseRetriever(corpus, DenseParams(**options))
    raise ValueError(f"retriever must be 'bm25' or 'dense', got {kind!r}")


def get_resources(
    *,
    corpus: Optional[str],
    questions: Optional[dict[str, str]],
    generator: Optional[dict],
    retriever: str,
    retriever_options: Optional[dict],
    journal: Optional[str],
    search_tool: Optional[str] = None,
) -> Resources:
    """The shared resources for these settings (built on first use in this process, and again once
    their passage store found a damaged passage)."""
    if search_tool is not None and search_tool not in SEARCH_TOOLS:
        raise ValueError(f"no search tool named {search_tool!r} is registered (register_search_tool); known: {sorted(SEARCH_TOOLS)}")
    key = canonical_json([_cache_root(), corpus, questions, generator, retriever, retriever_options or {}, journal, search_tool])
    res = _CACHE.get(key)
    if res is not None and not res.corpus.damaged:
        return res
    with _LOCK:
        res = _CACHE.get(key)
        if res is None or res.corpus.damaged:
            res = _build(corpus, questions, generator, retriever, retriever_options or {}, journal)
            if search_tool is not None:
                res.tool = SEARCH_TOOLS[search_tool](res)
            _CACHE[key] = res
    return res


def _build(corpus, questions, generator, retriever, retriever_options, journal) -> Resources:
    from twice_envs._cache import cache_dir

    generated = corpus is None
    if generated:
        cfg = GeneratorConfig.from_kwargs(generator)
        paths = write_generated(cfg, cache_dir("searchqa", "generated") / f"g{GENERATOR_VERSION}-{cfg.digest()[:16]}")
        corpus = str(paths["corpus"])
        if questions is None:
            questions = {s: str(paths[s]) for s in ("train", "dev", "test")}
    elif generator:
        raise ValueError("'generator' options only apply to the generated corpus; drop them or drop 'corpus'")
    if not questions:
        raise ValueError("a custom corpus needs question files: questions='path.jsonl' or {'train': ..., 'dev': ...}")
    store = open_corpus(corpus)
    qsets = {split: load_questions(path) for split, path in questions.items()}
    task_index, duplicates = index_question_ids(qsets, questions)
    ret = _make_retriever(retriever, retriever_options, store)
    return Resources(store, qsets, task_index, ret, SearchTool(ret), shared_journal(journal), generated,
                     duplicate_ids=duplicates)


def index_question_ids(qsets: dict[str, list[Question]], files: Optional[dict] = None
                       ) -> tuple[dict[str, tuple[str, int]], dict[str, list[tuple[str, int]]]]:
    """Each question id's first ``(split, position)``, and every location of the ids that name more
    than one question. Repeated ids are kept (every question stays reachable by split and index)
    and reported once, in a :class:`UserWarning` that names the files and a few of the ids."""
    places: dict[str, list[tuple[str, int]]] = {}
    for split, qs in qsets.items():
        for i, q in enumerate(qs):
            places.setdefault(q.id, []).append((split, i))
    first = {qid: locs[0] for qid, locs in places.items()}
    duplicates = {qid: locs for qid, locs in places.items() if len(locs) > 1}
    if duplicates:
        where = ", ".join(str(f) for f in (files or {}).values()) or "the question files"
        shown = "; ".join(f"{qid!r} at {', '.join(f'{s} {i}' for s, i in locs[:3])}"
                          for qid, locs in list(duplicates.items())[:3])
        warnings.warn(f"{len(duplicates)} question ids name more than one question in {where} (e.g. {shown}); "
                      "reset those questions with options={'split': ..., 'index': ...}: "
                      "options={'task': id} refuses an id that is not unique", UserWarning, stacklevel=3)
    return first, duplicates


def clear() -> None:
    """Forget the resources built in this process (tests use it)."""
    with _LOCK:
        _CACHE.clear()
