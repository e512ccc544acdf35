"""Plain data that flows rollout -> credit -> loss: turns, episodes, twins.

Everything here is JSON-serialisable data (lists, floats, strings), so a batch of
episodes can be saved, inspected and fed to any credit estimator, which are pure
functions of these records.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

from twice_envs.keys import NoiseKey

#: The noise branch a grown episode's first own turn is drawn on (:meth:`EpisodeRecord.grow`): never a twin's
#: ``1 .. K``, so a twin of that turn draws its alternative independently of it.
GROWN_BRANCH = 2**31 - 1


@dataclass
class TurnRecord:
    """One agent turn: what was generated and what the env answered.

    Attributes:
        token_ids: the generated tokens (loss mask 1).
        logprobs: log-prob of each generated token under the sampling distribution
            (``softmax(logits / temperature)`` renormalised over the top-p nucleus,
            :func:`twice_envs.noise.sampling_logprobs`), from the policy that generated
            it; the PPO loss recomputes the same quantity, so its ratio starts at 1.
        text: the decoded turn (the env's action).
        noise_key: key base ``(episode_seed, turn, branch, 0, 0)`` the turn was sampled with.
        obs: the env's answer to the turn.
        obs_token_ids: the observation's tokens as they enter the next prompt (loss mask 0).
        reward: the env reward for the turn.
        digest: the env digest after the turn.
        entropy: mean per-token entropy of the sampling distribution over the turn.
        invalid: the env flagged the action as invalid.
        token_texts: the text of each generated token, decoded alone (empty where not recorded).
        token_keys: the noise key each generated token read, as ``[turn, branch, line, pos]``
            (the key row after the episode seed, in the sampler's key mode; empty where not recorded,
            and for a chosen turn, whose tokens were not sampled).
        choice: for a turn chosen among the env's listed actions, the candidates, their scores, the
            index drawn and its key (:class:`~twice_envs.agents.sampling.choice.Choice`); None for a
            generated turn.
    """

    token_ids: list[int]
    logprobs: list[float]
    text: str
    noise_key: NoiseKey
    obs: str = ""
    obs_token_ids: list[int] = field(default_factory=list)
    reward: float = 0.0
    digest: str = ""
    entropy: float = 0.0
    invalid: bool = False
    token_texts: list[str] = field(default_factory=list)
    token_keys: list[list[int]] = field(default_factory=list)
    choice: Optional[dict] = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class EpisodeRecord:
    """One episode of an agent on an env.

    Attributes:
        env_id: the env's registered id.
        seed: the env reset seed (identifies the task together with ``options``).
        options: the reset options.
        group: index of the task group (GRPO groups are episodes with the same task).
        prompt_ids: tokens of the first prompt (chat template applied).
        turns: the agent turns in order.
        utility: the episode's outcome used for credit (sum of rewards by default).
        trajectory: the env's :class:`~twice_envs.Trajectory` as JSON.
        terminated, truncated: how the episode ended.
        info: the final env info entries worth keeping (e.g. ``em``, ``f1``, ``won``), and
            ``measures``: the env's own measures of the episode, headline first
            (:meth:`~twice_envs.core.TextEnv.measures`).
            On an env with gold answers, also ``gold_answers`` (the task's accepted answers) and
            ``gold_actions`` (each as the env's final-answer action text).
        twin_of: for a twin, ``(index of the factual episode in its batch, branch turn)``.
        branch: 0 for a factual episode, ``k >= 1`` for a twin's alternative.
        coupled: for a twin, whether it reads the factual noise after the branch.
        self_twin: the twin's alternative turn has the factual turn's token ids (D = 0,
            nothing generated after it).
        same_evidence: the alternative turn's observation equals the factual one, and
            neither turn ended the episode (see :func:`~twice_envs.agents.credit.twice.same_evidence`).
        pair: for a twin, 0 when paired with the factual episode; ``j >= 1`` for the
            ``j``-th independent pair of its decision, whose factual side is a replay
            of the factual turn on fresh downstream noise shared with the twin.
        pair_utility: for a twin with ``pair >= 1``, the utility ``U_j`` of its pair's
            factual side (None: the factual episode's ``utility``).
        window: the history window the episode was generated with: before each turn the
            model saw ``prompt_ids`` and the last ``window`` turns with their observations
            (:func:`~twice_envs.agents.rollout.context.turn_context`); None: the whole episode.
        history: for a twin of a windowed episode, the factual turns before the branch
            that its window can still see (its ``prompt_ids`` are then the factual first
            prompt); empty otherwise.
        prefix: for a factual episode that grew from another one's prefix (tree sampling,
            :mod:`~twice_envs.agents.credit.allocation`), the number of leading turns copied
            from it: they were not generated for this episode, and its own decisions start
            at turn ``prefix``; 0 otherwise.
        evidence_coin: for a twin, its evidence coin ``S`` (False: not continued after its
            alternative turn); None where no coin was drawn (a self-twin, no twin).
        credit: for a factual episode, per-turn credit by name, as the step that used it gave it:
            the method's advantage and, beside it, GRPO's (audits: every audited row and ``A*``);
            empty where not recorded.
        coins: for a factual episode under twin credit, per turn ``{"q", "B", "A_hat"}``: the branch
            probability, the branch coin and the turn's twin credit in utility units; empty otherwise.
    """

    env_id: str
    seed: int
    options: dict
    group: int = 0
    prompt_ids: list[int] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    utility: float = 0.0
    trajectory: Optional[dict] = None
    terminated: bool = False
    truncated: bool = False
    info: dict = field(default_factory=dict)
    twin_of: Optional[tuple[int, int]] = None
    branch: int = 0
    coupled: bool = True
    self_twin: bool = False
    same_evidence: bool = False
    pair: int = 0
    pair_utility: Optional[float] = None
    window: Optional[int] = None
    history: list[TurnRecord] = field(default_factory=list)
    prefix: int = 0
    evidence_coin: Optional[bool] = None
    credit: dict = field(default_factory=dict)
    coins: list[dict] = field(default_factory=list)

    @property
    def num_generated_tokens(self) -> int:
        """Tokens generated for this episode (its turns from ``prefix`` on)."""
        return sum(t.num_tokens for t in self.turns[self.prefix:])

    def remaining_tokens(self, turn: int) -> int:
        """Generated tokens from ``turn`` (inclusive) to the end: a twin's cost bound."""
        return sum(t.num_tokens for t in self.turns[turn:])

    @property
    def measures(self) -> dict:
        """The env's measures of this episode (``info["measures"]``, headline first; an episode recorded
        without them: ``{"return": utility}``)."""
        return dict(self.info.get("measures") or {"return": float(self.utility)})

    def grow(self, continuation: "EpisodeRecord") -> "EpisodeRecord":
        """A new factual episode grown from this one: its turns before the continuation's branch turn
        ``t`` (``continuation.twin_of[1]``), copied as ``prefix``, then the continuation's turns, outcome
        and record (an independent rollout from this episode's boundary ``s_t``, which takes turn ``t``
        afresh)."""
        if continuation.twin_of is None:
            raise ValueError("a continuation names its boundary (twin_of = (episode, turn))")
        t = int(continuation.twin_of[1])
        return EpisodeRecord(self.env_id, self.seed, dict(self.options), group=self.group,
                             prompt_ids=list(self.prompt_ids), turns=list(self.turns[:t]) + list(continuation.turns),
                             utility=continuation.utility, trajectory=continuation.trajectory,
                             terminated=continuation.terminated, truncated=continuation.truncated,
                             info=dict(continuation.info), window=self.window, prefix=t)

    def to_json(self) -> dict:
        d = asdict(self)
        for t in d["turns"] + d["history"]:
            t["noise_key"] = list(t["noise_key"])
        return d

    @classmethod
    def from_json(cls, d: dict) -> "EpisodeRecord":
        d = dict(d)

        def turns_of(rows) -> list[TurnRecord]:
            out = []
            for t in rows:
                t = dict(t)
                t["noise_key"] = NoiseKey.from_json(t["noise_key"])
                out.append(TurnRecord(**t))
            return out

        turns = turns_of(d.pop("turns", []))
        history = turns_of(d.pop("history", []))
        if d.get("twin_of") is not None:
            d["twin_of"] = tuple(d["twin_of"])
        return cls(turns=turns, history=history, **d)


def measure_means(episodes) -> dict:
    """The mean of each of the env's measures over ``episodes`` (the first episode's names, headline first)."""
    if not episodes:
        return {}
    names = list(episodes[0].measures)
    return {k: sum(float(e.measures.get(k, 0.0)) for e in episodes) / len(episodes) for k in names}
