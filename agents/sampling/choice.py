"""A policy that chooses among listed actions: candidate scores and a keyed Gumbel-max over them.

Where a turn's request lists candidate turns (:attr:`GenerationRequest.candidates`, the env's
admissible actions written as the model writes a turn), :class:`ChoicePolicy` scores every
candidate by the model's token log-probabilities given the context and draws one by keyed
Gumbel-max; a request without candidates is generated as text by the wrapped policy, so one
episode may mix chosen and generated turns.

* **Scores** (:data:`SCORES`): ``sum`` (default), the total of the candidate's token
  log-probabilities (the log-probability of the whole turn, so at temperature 1 the choice is
  the model's own distribution over the listed turns), or ``mean``, their length-normalised mean. The
  log-probabilities are the model's own (``log_softmax`` of the logits, no temperature, no
  nucleus); the temperature applies to the choice.
* **The draw**: ``argmax_i [score_i / tau + g_i]``, the sampler core's keyed argmax
  (:func:`twice_envs.noise.keyed_choice`) with candidate index ``i`` in place of the vocabulary id,
  so it is an exact sample from ``softmax(scores / tau)``. The key is :func:`choice_key` of the
  turn's key base: ``(episode_seed, turn, branch, line=CHOICE_LINE, pos=0)``. No generated token
  ever reads ``line = 2**32 - 1`` (a turn would need that many newlines; the ``flat``, ``counter``
  and ``ngram`` key modes keep ``line = 0``), so the choice's noise is apart from every token key.
  A twin draws its candidate on ``branch = k`` and the factual keys afterwards, like any turn.
* **Cost**: one forward pass per turn (or per ``rows_per_pass`` turns): the context's tokens that
  the wrapped policy's kept prefix caches lack, then the candidates as a token trie, masked so
  that each candidate sees the context and itself only
  (:func:`~twice_envs.agents.sampling.candidates.score_batch`).

A chosen turn comes back as a :class:`Generation` whose tokens are the candidate's tokens (they
enter the context like a generated turn's) and whose ``choice`` holds the candidates, their
scores, the index drawn, the key and the choice's log-probability (:class:`Choice`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional, Sequence

import torch

from twice_envs.agents.sampling.candidates import remember, score_batch
from twice_envs.agents.sampling.policy import Generation, GenerationRequest, SamplingConfig, torch_threads
from twice_envs.keys import NoiseKey
from twice_envs.noise import MASK32, key_rows, keyed_choice

#: The ``line`` of a choice's noise key: one no generated token reads.
CHOICE_LINE = MASK32
#: The most candidates a turn may list.
MAX_CANDIDATES = 1000

#: Score of a candidate from its token log-probabilities, by name.
SCORES: dict[str, Callable[[Sequence[float]], float]] = {
    "mean": lambda lp: float(sum(lp) / len(lp)),
    "sum": lambda lp: float(sum(lp)),
}
#: The default score (see the text-games page for the measurement that chose it).
DEFAULT_SCORE = "sum"


class CandidateError(ValueError):
    """A candidate list that cannot be chosen from (empty, duplicated, too long, not text)."""


def check_candidates(candidates: Any, where: str = "the candidate list") -> tuple[str, ...]:
    """``candidates`` as a tuple of distinct non-empty strings (1 to :data:`MAX_CANDIDATES`), else
    :class:`CandidateError` naming the problem and ``where``."""
    if isinstance(candidates, (str, bytes)) or not isinstance(candidates, Sequence):
        raise CandidateError(f"{where} must be a list of strings, got {type(candidates).__name__}")
    cands = tuple(candidates)
    if not cands:
        raise CandidateError(f"{where} is empty: there is nothing to choose from")
    if len(cands) > MAX_CANDIDATES:
        raise CandidateError(f"{where} has {len(cands)} candidates, more than the {MAX_CANDIDATES} a turn may list")
    for i, c in enumerate(cands):
        if not isinstance(c, str) or not c:
            raise CandidateError(f"{where}: candidate {i} must be a non-empty string, got {c!r}")
    seen: dict[str, int] = {}
    for i, c in enumerate(cands):
        if c in seen:
            raise CandidateError(f"{where}: candidate {i} {c!r} repeats candidate {seen[c]} (duplicates would "
                                 "double its chance)")
        seen[c] = i
    return cands


def choice_key(key: NoiseKey) -> NoiseKey:
    """The noise key of the choice of a turn with key base ``key``: ``(seed, turn, branch, CHOICE_LINE, 0)``."""
    return NoiseKey(int(key.episode_seed), int(key.turn), int(key.branch), CHOICE_LINE, 0)


def keyed_candidate(scores: Sequence[float], key: NoiseKey, temperature: float = 1.0,
                    greedy: bool = False) -> tuple[int, float, float]:
    """``(index, log-prob, entropy)`` of the keyed Gumbel-max draw from ``softmax(scores / temperature)``.

    ``key`` is the choice's key (:func:`choice_key`); ``greedy`` takes the plain argmax (lowest index
    on ties) and still reports the sampling distribution's log-prob and entropy.
    """
    s = torch.tensor([[float(x) for x in scores]], dtype=torch.float64)
    rows = torch.from_numpy(key_rows([key]))
    res = keyed_choice(s, rows, temperature=float(temperature), greedy=greedy)
    return int(res.tokens[0]), float(res.logprobs[0]), float(res.entropy[0])


@dataclass
class Choice:
    """What a choice turn records (``TurnRecord.choice`` holds it as a dict).

    Attributes:
        candidates: the candidate turns, in the env's order.
        scores: each candidate's score (``score`` of its token log-probabilities).
        score: the score's name (:data:`SCORES`).
        token_counts: each candidate's number of tokens.
        index: the candidate drawn.
        key: the choice's noise key ``[episode_seed, turn, branch, line, pos]``.
        temperature: ``tau`` of ``softmax(scores / tau)``.
        greedy: the plain argmax was taken instead of the keyed draw.
        logprob: the drawn candidate's log-probability under ``softmax(scores / tau)``.
        entropy: that distribution's entropy (nats).
    """

    candidates: list[str]
    scores: list[float]
    score: str
    token_counts: list[int]
    index: int
    key: list[int]
    temperature: float
    greedy: bool
    logprob: float
    entropy: float

    def to_json(self) -> dict:
        return asdict(self)


# ----------------------------------------------------------------------------- the policy
@dataclass
class ChoiceStats:
    """Counters of :class:`ChoicePolicy`'s choices."""

    turns: int = 0
    candidates: int = 0
    candidate_tokens: int = 0
    seconds: float = 0.0


def choosing(policy, score: Optional[str]):
    """``policy`` choosing among listed candidates by ``score`` (a :class:`ChoicePolicy` around it), or as it is
    when ``score`` is None or it chooses already."""
    if score is None or getattr(policy, "chooses", False):
        return policy
    return ChoicePolicy(policy, score=score)


class ChoicePolicy:
    """A local transformers policy (:class:`~twice_envs.agents.sampling.policy.HFPolicy`) that chooses
    among a request's candidates where it lists them and generates text elsewhere.

    Args:
        policy: the wrapped policy; it generates the turns without candidates and scores the others.
        score: the candidate score (:data:`SCORES`).
        chunk: candidate trie tokens per pass at most (a turn with more is scored in several passes).
        rows_per_pass: turns scored together in one forward pass
            (:func:`~twice_envs.agents.sampling.candidates.score_batch`).

    Rollouts (:func:`~twice_envs.agents.rollout.episodes.rollout`, twins, audits) pass a turn's
    candidates when the policy says it ``chooses``; every other attribute is the wrapped policy's.
    """

    chooses = True

    def __init__(self, policy, *, score: str = DEFAULT_SCORE, chunk: int = 1024, rows_per_pass: int = 1) -> None:
        if getattr(policy, "model", None) is None or not hasattr(policy, "prefix_cache"):
            raise ValueError("a choice policy scores candidates with local weights: wrap a transformers policy "
                             f"(HFPolicy), not {type(policy).__name__}")
        if score not in SCORES:
            raise ValueError(f"score must be one of {sorted(SCORES)}, got {score!r}")
        for name, value in (("chunk", chunk), ("rows_per_pass", rows_per_pass)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        self.rows_per_pass = rows_per_pass
        self.policy = policy
        self.score = score
        self.chunk = int(chunk)
        self.choice_stats = ChoiceStats()
        self._encoded: dict[tuple[str, tuple[str, ...]], list[int]] = {}

    def __getattr__(self, name: str):
        if name == "policy":  # not set yet (during unpickling)
            raise AttributeError(name)
        return getattr(self.policy, name)

    def candidate_tokens(self, text: str, stop: Sequence[str]) -> list[int]:
        """The tokens of a candidate turn: its text, then the end-of-turn token unless the text ends with
        a stop string (a generated turn ends at a stop string or at that token)."""
        key = (text, tuple(stop))
        if key not in self._encoded:
            ids = list(self.policy.tokenizer.encode(text, add_special_tokens=False))
            eos = self.policy.tokenizer.eos_token_id
            if not any(s and text.endswith(s) for s in stop) and eos is not None:
                ids.append(int(eos))
            self._encoded[key] = ids
        return list(self._encoded[key])

    def choose(self, requests: Sequence[GenerationRequest], sampling: SamplingConfig) -> list[Generation]:
        """One chosen turn for every request (each lists candidates), scored in one batched pass."""
        # on the generator's thread count, as generation runs (idle threads spinning cost more than they save)
        with torch_threads(getattr(self.policy, "num_threads", None)):
            return self._choose(requests, sampling)

    def _choose(self, requests: Sequence[GenerationRequest], sampling: SamplingConfig) -> list[Generation]:
        t0 = time.perf_counter()
        cands = [check_candidates(r.candidates, f"the candidates of turn {r.noise_key.turn} (episode seed "
                                                f"{r.noise_key.episode_seed})") for r in requests]
        toks = [[self.candidate_tokens(c, r.stop) for c in row] for r, row in zip(requests, cands)]
        scored = score_batch(self.policy, [r.prompt_ids for r in requests], toks, sampling, chunk=self.chunk,
                             rows_per_pass=self.rows_per_pass)
        out = []
        for r, row, tk, sc in zip(requests, cands, toks, scored):
            scores = [SCORES[self.score](lp) for lp in sc.model]
            key = choice_key(r.noise_key)
            index, logprob, entropy = keyed_candidate(scores, key, sampling.temperature, sampling.greedy)
            remember(self.policy, r.prompt_ids, sc, index, tk[index])
            choice = Choice(list(row), scores, self.score, [len(t) for t in tk], index, [int(v) for v in key],
                            float(sampling.temperature), bool(sampling.greedy), logprob, entropy)
            out.append(Generation(row[index], tk[index], sc.sampling[index], entropy, "choice", sc.reused,
                                  choice=choice.to_json()))
            self.choice_stats.candidates += len(row)
            self.choice_stats.candidate_tokens += sum(map(len, tk))
        self.choice_stats.turns += len(requests)
        self.choice_stats.seconds += time.perf_counter() - t0
        return out

    def generate(self, requests: list[GenerationRequest], sampling: SamplingConfig, *,
                 processor: Optional[Any] = None) -> list[Generation]:
        """One turn per request: chosen where the request lists candidates, generated (by the wrapped
        policy) elsewhere; both batched, in request order."""
        out: list[Optional[Generation]] = [None] * len(requests)
        for chosen in (False, True):
            rows = [i for i, r in enumerate(requests) if (r.candidates is not None) == chosen]
            if not rows:
                continue
            batch = [requests[i] for i in rows]
            gens = self.choose(batch, sampling) if chosen else self.policy.generate(batch, sampling,
                                                                                     processor=processor)
            for i, g in zip(rows, gens):
                out[i] = g
        return out  # type: ignore[return-value]
