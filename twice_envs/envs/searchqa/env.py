"""SearchQA: answer a question by searching a corpus, in the Search-R1 turn protocol.

One episode is one question. The agent's turns are raw model text; a turn ends at
``</search>`` or ``</answer>``. A search returns the top-k passages inside
``<information>``; an answer ends the episode and is scored; anything else returns
the invalid-action message. At most ``max_searches`` searches are run: the result of
the last one ends with a request for the answer, later searches are refused with
the same request; the turn limit truncates.

Every search goes through the tool journal, so forks, twins and replays read back
stored results instead of searching again. The env's own state is a handful of
plain values, so forks are snapshots.

Noisy retrieval (``noise_epsilon > 0``) replaces each shown passage, with
probability epsilon, by another passage of the top ``noise_pool``. The noise is
drawn from a seed taken from ``np_random`` at reset and, with
``noise_coupling="branch"`` (default), from the episode's history up to the search:
a fork or a self-twin sees the same noise, a twin whose history differs draws its
own (a nondeterministic tool is not shared silently). ``"episode"`` keys it by
(turn, query) instead, so a twin that issues the same query at the same turn shares
the tool's luck.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from typing import Any, Optional

from twice_envs.core import Protocol, TextEnv
from twice_envs.envs.searchqa import protocol as P
from twice_envs.envs.searchqa.corpus_gen import Rng
from twice_envs.envs.searchqa.loaders import Question
from twice_envs.envs.searchqa.resources import Resources, get_resources
from twice_envs.tools import shared_journal

REWARDS = ("em", "subem", "f1", "cost_f1")
COUPLINGS = ("branch", "episode")


class SearchQAEnv(TextEnv):
    """Search-R1 style question answering over a corpus (see the module docstring).

    Args:
        corpus: wiki-18 style JSONL passages; ``None`` uses the generated encyclopedia.
        questions: a question file (FlashRAG JSONL or Search-R1 parquet) used as split
            ``split``, or ``{split: path}``; ``None`` with the generated corpus uses its splits.
        generator: options of the generated encyclopedia (seed, num_entities,
            distractor_rate, num_train, num_dev, num_test, mix).
        retriever: ``"bm25"`` or ``"dense"``.
        retriever_options: BM25 (k1, b, stem, stopwords) or dense settings
            (model_path, query_prefix, passage_prefix, max_length, batch_size, index_path, use_gpu).
        topk: passages returned per search.
        max_searches: searches run per episode; later ones are refused.
        reward: ``"em"``, ``"subem"``, ``"f1"`` or ``"cost_f1"`` (F1 minus
            ``search_cost`` per search, charged on the search turns).
        search_cost: cost of one search for ``"cost_f1"``.
        noise_epsilon: probability of replacing each shown passage (0 = exact retrieval).
        noise_pool: replacements come from this many top passages.
        noise_coupling: ``"branch"`` or ``"episode"`` (see the module docstring).
        split: the split ``reset`` draws from unless the options name one.
        journal: SQLite file that persists search results across processes;
            ``None`` keeps them in this process's memory.
        max_query_chars: queries are cut to this many characters.
        max_turns: turn limit (default ``2 * max_searches + 2``).
        search_tool: name of a tool registered with
            :func:`~twice_envs.envs.searchqa.register_search_tool` to search with instead
            of the retriever (e.g. a journaled web-search API).
    """

    version = "1"
    reset_options = ("task", "index", "split")
    path_kwargs = ("corpus", "questions", "journal")
    has_gold_answer = True

    def __init__(
        self,
        *,
        corpus: Optional[str] = None,
        questions: Optional[str | dict] = None,
        generator: Optional[dict] = None,
        retriever: str = "bm25",
        retriever_options: Optional[dict] = None,
        topk: int = 3,
        max_searches: int = 4,
        reward: str = "em",
        search_cost: float = 0.05,
        noise_epsilon: float = 0.0,
        noise_pool: int = 20,
        noise_coupling: str = "branch",
        split: str = "train",
        journal: Optional[str] = None,
        max_query_chars: int = P.MAX_QUERY_CHARS,
        max_turns: Optional[int] = None,
        search_tool: Optional[str] = None,
        render_mode: Optional[str] = None,
    ) -> None:
        if reward not in REWARDS:
            raise ValueError(f"reward must be one of {REWARDS}, got {reward!r}")
        if noise_coupling not in COUPLINGS:
            raise ValueError(f"noise_coupling must be one of {COUPLINGS}, got {noise_coupling!r}")
        if not 0.0 <= float(noise_epsilon) <= 1.0:
            raise ValueError(f"noise_epsilon must be in [0, 1], got {noise_epsilon!r}")
        if int(topk) < 1 or int(max_searches) < 0 or int(max_query_chars) < 1:
            raise ValueError("topk and max_query_chars must be >= 1 and max_searches >= 0")
        super().__init__(max_turns=max_turns if max_turns is not None else 2 * int(max_searches) + 2, render_mode=render_mode)
        if isinstance(questions, str):
            questions = {split: questions}
        self.resources: Resources = get_resources(
            corpus=corpus, questions=questions, generator=generator, retriever=retriever,
            retriever_options=retriever_options, journal=journal, search_tool=search_tool,
        )
        journal_now = shared_journal(journal)  # read-only inside a replay
        if self.resources.journal is not journal_now:  # the cached resources came from the other mode
            self.resources = dataclasses.replace(self.resources, journal=journal_now)
        self._custom_tool = search_tool is not None
        if split not in self.resources.questions:
            raise ValueError(f"split {split!r} not found; available: {sorted(self.resources.questions)}")
        self.topk, self.max_searches = int(topk), int(max_searches)
        self.reward_mode, self.search_cost = reward, float(search_cost)
        self.noise_epsilon, self.noise_pool, self.noise_coupling = float(noise_epsilon), int(noise_pool), noise_coupling
        self.default_split, self.max_query_chars = split, int(max_query_chars)
        self._protocol = Protocol(P.INSTRUCTIONS, P.STOP_STRINGS, "<search> query </search> | <answer> answer </answer>")
        # episode state (plain values; see _snapshot)
        self._split, self._index = split, 0
        self._searches = 0
        self._answer: Optional[str] = None
        self._scores = (0.0, 0.0, 0.0)
        self._noise_seed = 0

    # ------------------------------------------------------------------ protocol
    def protocol(self) -> Protocol:
        return self._protocol

    @property
    def task(self) -> Question:
        """The current question."""
        return self.resources.questions[self._split][self._index]

    @property
    def num_searches(self) -> int:
        return self._searches

    def gold_answers(self) -> tuple[str, ...]:
        """The current question's golden answers (any of them scores EM 1)."""
        return tuple(self.task.golden_answers)

    def measures(self, info: dict, total_reward: float) -> dict[str, float]:
        """EM and F1 of the final answer (0 for an episode that never answered)."""
        return {"em": float(info.get("em", 0.0)), "f1": float(info.get("f1", 0.0))}

    def answer_action(self, answer: str) -> str:
        """``answer`` as a final-answer turn of the protocol: ``<answer> answer </answer>``."""
        return f"<answer> {answer} </answer>"

    # ------------------------------------------------------------------ episode
    def _reset(self, options: dict) -> tuple[str, dict]:
        qsets = self.resources.questions
        if "task" in options:
            loc = self.resources.task_index.get(str(options["task"]))
            if loc is None:
                raise ValueError(f"no question with id {options['task']!r}")
            same = self.resources.duplicate_ids.get(str(options["task"]))
            if same:
                raise ValueError(f"question id {options['task']!r} names {len(same)} questions "
                                 f"({', '.join(f'{s} {i}' for s, i in same)}): reset with "
                                 "options={'split': ..., 'index': ...} to choose one")
            split, index = loc
        else:
            split = str(options.get("split", self.default_split))
            if split not in qsets:
                raise ValueError(f"split {split!r} not found; available: {sorted(qsets)}")
            n = len(qsets[split])
            if "index" in options:
                index = options["index"]
                if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < n:
                    raise ValueError(f"index must be an int in 0..{n - 1} for split {split!r}, got {index!r}")
            else:
                index = int(self.np_random.integers(n))
        self._split, self._index = split, int(index)
        self._searches, self._answer, self._scores = 0, None, (0.0, 0.0, 0.0)
        self._noise_seed = int(self.np_random.integers(0, 1 << 63))
        return P.first_prompt(self.task.question), self._info()

    def _info(self, **extra: Any) -> dict:
        q = self.task
        em, subem, f1 = self._scores
        info = {
            "task_id": q.id, "split": self._split, "index": self._index, "question": q.question,
            "golden_answers": list(q.golden_answers), "num_searches": self._searches,
            "answered": self._answer is not None, "well_formed": self._answer is not None,
            "answer": self._answer, "em": em, "subem": subem, "f1": f1,
        }
        info.update(extra)
        return info

    def _step(self, action: str) -> tuple[str, float, bool, dict]:
        act = P.parse_action(action)
        if act.kind is None:
            return P.INVALID_ACTION, 0.0, False, self._info(invalid=True)
        if act.kind == "answer":
            golds = self.task.golden_answers
            self._answer = act.content
            self._scores = (P.exact_match(act.content, golds), P.sub_exact_match(act.content, golds), P.f1_score(act.content, golds))
            em, subem, f1 = self._scores
            reward = {"em": em, "subem": subem, "f1": f1, "cost_f1": f1}[self.reward_mode]
            return "", reward, True, self._info()
        # search
        if self._searches >= self.max_searches:
            body = (f"No search was run: the limit of {self.max_searches} searches is reached. "
                    "Give the final answer between <answer> and </answer>.")
            return P.information_block(body), 0.0, False, self._info(search_refused=True)
        query = P.clean_query(act.content, self.max_query_chars)
        cost = -self.search_cost if self.reward_mode == "cost_f1" else 0.0
        if not query:
            self._searches += 1
            return self._results("No results: the query is empty."), cost, False, self._info(query="", retrieved=[])
        try:
            items = self._retrieve(query, action)
        except Exception as exc:  # noqa: BLE001 -- a user tool (e.g. a web API) may fail; the episode goes on
            if not self._custom_tool:
                raise  # the state is untouched: a search is counted only once it ran
            self._searches += 1
            body = f"Search failed: {type(exc).__name__}: {str(exc)[:200]}"
            return self._results(body), cost, False, self._info(query=query, retrieved=[], tool_error=True)
        corpus = self.resources.corpus
        if items and isinstance(items[0], str):  # a tool that returns passages itself
            contents, retrieved = items, []
        else:  # a damaged passage raises here, before the search is counted
            contents, retrieved = [corpus.contents(i) for i in items], [corpus.passage_id(i) for i in items]
        self._searches += 1
        body = P.format_passages(contents) if contents else "No passage matches the query."
        return self._results(body), cost, False, self._info(query=query, retrieved=retrieved)

    def _results(self, body: str) -> str:
        obs = P.information_block(body)
        return obs + P.budget_note(self.max_searches) if self._searches == self.max_searches else obs

    def _retrieve(self, query: str, action: str) -> list:
        """Passage positions (or passage texts, from a tool that returns them) to show."""
        noisy = self.noise_epsilon > 0
        k = max(self.topk, self.noise_pool) if noisy else self.topk
        result = self.resources.journal.call(self.resources.tool, {"query": query, "k": k})
        ids = list(result["passages"] if "passages" in result else result["ids"])
        shown = ids[: self.topk]
        if not noisy:
            return shown
        if self.noise_coupling == "branch":
            where = [self._traj.digest, action]  # the history identifies the branch
        else:
            where = [self.turn, query]
        seed = int.from_bytes(hashlib.sha256(repr([self._noise_seed, *where]).encode()).digest()[:8], "little")
        rng = Rng(seed, block=16)
        pool = ids[: self.noise_pool]
        for i in range(len(shown)):
            if rng.random() < self.noise_epsilon:
                others = [p for p in pool if p not in shown]
                if others:
                    shown[i] = others[rng.below(len(others))]
        return shown

    # ------------------------------------------------------------------ forks
    def _spawn(self) -> "SearchQAEnv":
        """A fresh env with this one's settings, sharing its read-only resources and spaces.

        Equivalent to ``make(id, **kwargs)`` (every setting is immutable after
        ``__init__``) but costs a shallow copy, so ``fork`` stays cheaper than a search.
        """
        if self.spec is None:
            return super()._spawn()
        child = copy.copy(self)
        child._traj, child._schedule, child._snapshots, child._done, child._last_info = None, None, [], False, {}
        child._np_random = None
        child._np_random_seed = None
        return child

    def _snapshot(self) -> Any:
        return (self._split, self._index, self._searches, self._answer, self._scores, self._noise_seed)

    def _restore(self, state: Any) -> None:
        self._split, self._index, self._searches, self._answer, self._scores, self._noise_seed = state

    def close(self) -> None:
        """Release what this env holds (the record stays readable).

        A journal file's connection is closed (the process-wide journal opens it again
        for the next env that searches through it), the snapshots are dropped, and so
        are the env's references to the shared corpus maps, index and journal: a closed
        env kept alive pins none of them. The shared resources stay cached in the
        process for the next ``make`` (``resources.clear()`` forgets them); ``task`` and
        ``gold_answers()`` need an open env.
        """
        resources = self.__dict__.get("resources")
        if resources is not None and resources.journal.path is not None:
            resources.journal.close()
        self.resources = None
        self._snapshots = []
        super().close()
