"""Seeds, noise keys and noise schedules: the addresses of an episode's sampling noise.

A sampled token reads Gumbel noise addressed by a :class:`NoiseKey`
``(episode_seed, turn, branch, line, pos)`` (see :mod:`twice_envs.noise` for the
generator). An environment never samples; it only carries a :class:`NoiseSchedule`
and reports, in ``info["noise_key"]``, the key *base* (``line = pos = 0``) of the
agent's next turn.

``branch = 0`` is the factual episode. A twin of turn ``t`` samples its alternative
turn with ``branch = k >= 1`` and every later turn with the factual keys, so the
schedule of a twin is the factual schedule with one entry changed.

Every seed derived from another seed is derived here, each purpose with its own salt
(:data:`SEED_SALTS`), so two purposes never hand out the same seed for the same numbers
and each rule is written once. The rules are part of the record format: their values
are stored and recomputed elsewhere, so none of them may change its output.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping, NamedTuple, Optional, Sequence

import numpy as np

__all__ = [
    "AUDIT_STREAMS",
    "LAB_GROUP_STRIDE",
    "LAB_PAIR_STRIDE",
    "LAB_STREAM_STRIDE",
    "NoiseKey",
    "NoiseSchedule",
    "SEED_SALTS",
    "UINT32_MAX",
    "UINT64_MAX",
    "audit_seed",
    "branch_plan_rng",
    "credit_rng",
    "check_seed",
    "derive_episode_seed",
    "draw_seed",
    "episode_noise_seed",
    "independent_seed",
    "lab_episode_seed",
    "lab_independent_seed",
    "lab_pair_seed",
    "seed_sequence_uint64",
    "stable_json_seed",
    "stable_seed",
]

UINT64_MAX = (1 << 64) - 1
UINT32_MAX = (1 << 32) - 1

#: The salt of each seed-derivation purpose: the last word of the ``SeedSequence``
#: entropy, so derivations for different purposes never meet, whatever their other
#: words. Read-only; every value is distinct. The constants spell short ASCII tags.
#:
#: * ``episode`` (``0x7457``, "tW"): the noise seed of an episode derived from its env
#:   seed (:func:`derive_episode_seed`, and the credit lab's :func:`lab_episode_seed`,
#:   :func:`lab_independent_seed` and :func:`lab_pair_seed`, which pass it a packed salt).
#: * ``rollout`` (``0x524F4C``, "ROL"): the noise seed of episode ``index`` of group
#:   ``group`` in a rollout batch (:func:`episode_noise_seed`).
#: * ``independent`` (``0x435252``, "CRR"): the fresh noise seed of an independent
#:   continuation after a branched turn (:func:`independent_seed`).
#: * ``branch_plan`` (``0x5457494E``, "TWIN"): the generator of the coins that choose
#:   which decisions of one served episode get twins (:func:`branch_plan_rng`).
#: * ``audit`` (``0x415544``, "AUD"): the noise seeds of the credit audit's auxiliary
#:   rollouts, one named stream per purpose (:func:`audit_seed`, :data:`AUDIT_STREAMS`).
#: * ``credit`` (``0xC4ED17``): the generator of the coins of the credit step of one
#:   training update (:func:`credit_rng`).
SEED_SALTS: Mapping[str, int] = MappingProxyType({
    "episode": 0x74_57,
    "rollout": 0x52_4F_4C,
    "independent": 0x43_52_52,
    "branch_plan": 0x54_57_49_4E,
    "audit": 0x41_55_44,
    "credit": 0xC4_ED_17,
})

#: The streams of :func:`audit_seed` and the number each one puts in its entropy. Read-only;
#: every number is distinct, and a stream keeps its number (the audit's seeds depend on it).
#:
#: * ``oracle``: the value rollouts of the oracle ``A*``;
#: * ``vineppo``: VinePPO's value rollouts;
#: * ``twice-pairs``: the base seed of Twice's diagnostic pairs (independent pairs ``j >= 1``);
#: * ``crr``: the base seed of CRR's independent counterfactuals;
#: * ``twice-train``: the base seed of the training-time Twice row's auxiliary rollouts;
#: * ``coins``: the generator of the evidence coins;
#: * ``update-rows``: the base seed (and coins) of every other registered method's update row
#:   (``index``: the method's place in the registry);
#: * ``extra-factual``: the further factual episodes of a method that samples more than the group size.
AUDIT_STREAMS: Mapping[str, int] = MappingProxyType({
    "oracle": 1,
    "vineppo": 2,
    "twice-pairs": 3,
    "crr": 4,
    "twice-train": 5,
    "coins": 6,
    "update-rows": 7,
    "extra-factual": 8,
})

#: Stride between groups in :func:`lab_episode_seed`'s packed salt (a prime above any group size).
LAB_GROUP_STRIDE = 100_003
#: Stride between streams in :func:`lab_independent_seed`'s packed salt (a prime above any turn count).
LAB_STREAM_STRIDE = 1_000_003
#: Stride between pairs in :func:`lab_pair_seed`'s packed salt (a prime above any turn count).
LAB_PAIR_STRIDE = 5_000_011


class NoiseKey(NamedTuple):
    """The address of one token's noise.

    Attributes:
        episode_seed: 64-bit seed shared by the factual episode and its coupled twins.
        turn: index of the agent turn in the episode (0 = the first action).
        branch: 0 for the factual episode, ``k >= 1`` for the ``k``-th alternative.
        line: number of newlines emitted in the turn before this token.
        pos: position of the token inside its line.
    """

    episode_seed: int
    turn: int
    branch: int = 0
    line: int = 0
    pos: int = 0

    def base(self) -> "NoiseKey":
        """The key of the turn's first token (``line = pos = 0``)."""
        return NoiseKey(self.episode_seed, self.turn, self.branch, 0, 0)

    def to_json(self) -> list[int]:
        return [int(v) for v in self]

    @classmethod
    def from_json(cls, value: Any) -> "NoiseKey":
        if isinstance(value, Mapping):
            return cls(**{k: int(v) for k, v in value.items()})
        return cls(*(int(v) for v in value))


def check_seed(seed: Any, what: str = "seed") -> int:
    """``seed`` as a Python int in ``0 .. 2**64 - 1``, or a ``ValueError`` that names ``what``.

    Seeds are uint64 everywhere (episode seeds, noise seeds): a larger int would have
    to be folded into 64 bits, and two different seeds would then name one episode's
    noise. Floats, bools and strings are refused rather than truncated.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"{what} must be an int in 0..2**64-1, got {type(seed).__name__} {seed!r}")
    if not 0 <= int(seed) <= UINT64_MAX:
        raise ValueError(f"{what} must be an int in 0..2**64-1, got {seed!r}")
    return int(seed)


def draw_seed(rng: Optional[np.random.Generator] = None) -> int:
    """A new episode seed: the next draw of ``rng``, or OS entropy when ``rng`` is ``None``.

    Every place that needs a seed nobody gave (an unseeded reset, a vector sub-env, a
    group view) draws it here, so the rule is the same everywhere: an env that was
    seeded once continues its own generator, only a never-seeded one reads entropy.
    """
    if rng is None:
        return int(np.random.SeedSequence().entropy % (1 << 63))
    return int(rng.integers(0, 1 << 63))


def seed_sequence_uint64(entropy: Sequence[int]) -> int:
    """A uint64 hashed from a list of non-negative ints with numpy's ``SeedSequence``.

    Stable on every platform and numpy version (``SeedSequence`` is specified), so
    seeds derived with it can be stored in records and recomputed anywhere.
    """
    words = np.random.SeedSequence([int(e) for e in entropy]).generate_state(2, np.uint32)
    return int(words[0]) | (int(words[1]) << 32)


def derive_episode_seed(seed: int, salt: int = 0) -> int:
    """A 64-bit noise seed derived from an env seed (both uint64), stable on every platform.

    ``SeedSequence([seed, salt, SEED_SALTS["episode"]])``; ``seed`` and ``salt`` are
    checked with :func:`check_seed`.
    """
    return seed_sequence_uint64([check_seed(seed), check_seed(salt, "salt"), SEED_SALTS["episode"]])


def episode_noise_seed(noise_seed: int, group: int, index: int) -> int:
    """The 64-bit noise seed of episode ``index`` of group ``group`` of a rollout batch.

    ``SeedSequence([noise_seed mod 2**64, group, index, SEED_SALTS["rollout"]])``:
    ``noise_seed`` (the run's noise seed) is folded into 64 bits; ``group`` and
    ``index`` must be non-negative ints.
    """
    return seed_sequence_uint64([int(noise_seed) & UINT64_MAX, int(group), int(index), SEED_SALTS["rollout"]])


def independent_seed(noise_seed: int, episode: int, turn: int, branch: int) -> int:
    """The fresh 64-bit noise seed of an independent continuation (the CRR baseline).

    An independent twin of turn ``turn`` of episode ``episode`` (its index in the
    batch), sampled with ``branch``, reads this seed after the branch instead of the
    factual one. ``SeedSequence([noise_seed mod 2**64, episode, turn, branch,
    SEED_SALTS["independent"]])``; the other arguments must be non-negative ints.
    """
    return seed_sequence_uint64(
        [int(noise_seed) & UINT64_MAX, int(episode), int(turn), int(branch), SEED_SALTS["independent"]]
    )


def audit_seed(noise_seed: int, stream: str, episode: int = 0, turn: int = 0, index: int = 0) -> int:
    """The noise seed of rollout ``index`` of the audit stream ``stream`` at turn ``turn`` of audited episode ``episode``.

    ``SeedSequence([noise_seed mod 2**32, noise_seed >> 32, AUDIT_STREAMS[stream], episode,
    turn, index, SEED_SALTS["audit"]])``. ``noise_seed`` (the audit's seed) must be a uint64
    and ``episode``, ``turn`` and ``index`` ints in ``0 .. 2**32 - 1``, so each argument fills
    one fixed place of a list of seven 32-bit words: two different argument lists are two
    different entropy lists, and no stream can reach another stream's (or another purpose's)
    numbers. A stream whose rollouts derive their own seeds (:func:`independent_seed`) gets
    its base seed here with ``episode = turn = index = 0``. An unknown stream is a ``ValueError``.
    """
    if stream not in AUDIT_STREAMS:
        raise ValueError(f"unknown audit stream {stream!r}; the streams are {sorted(AUDIT_STREAMS)}")
    seed = check_seed(noise_seed, "noise_seed")
    words = [seed & UINT32_MAX, seed >> 32, AUDIT_STREAMS[stream]]
    for what, v in (("episode", episode), ("turn", turn), ("index", index)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= int(v) <= UINT32_MAX:
            raise ValueError(f"{what} must be an int in 0..2**32-1, got {v!r}")
        words.append(int(v))
    return seed_sequence_uint64(words + [SEED_SALTS["audit"]])


def lab_episode_seed(noise_seed: int, group: int, member: int) -> int:
    """The noise seed of member ``member`` of group ``group`` of the credit lab's toy episodes.

    ``derive_episode_seed(noise_seed, group * LAB_GROUP_STRIDE + member)``; the packed
    salt must be a uint64 (so ``noise_seed``, ``group`` and ``member`` are non-negative).
    """
    return derive_episode_seed(noise_seed, group * LAB_GROUP_STRIDE + member)


def lab_independent_seed(noise_seed: int, stream: int, turn: int) -> int:
    """The fresh noise seed of a credit-lab independent twin branched at ``turn``.

    ``noise_seed`` is the factual episode's noise seed and ``stream`` tells apart the
    independent draws made for one decision (one per replica).
    ``derive_episode_seed(noise_seed, stream * LAB_STREAM_STRIDE + turn)``.
    """
    return derive_episode_seed(noise_seed, stream * LAB_STREAM_STRIDE + turn)


def lab_pair_seed(noise_seed: int, pair: int, turn: int) -> int:
    """The shared fresh noise seed of independent pair ``pair`` of a credit-lab decision at ``turn``.

    The pair's replica (the factual turn) and its twin (a fresh alternative) both read
    it after ``turn``, so they are coupled to each other and independent of the factual
    episode (``noise_seed``). ``derive_episode_seed(noise_seed, pair * LAB_PAIR_STRIDE + turn)``.
    """
    return derive_episode_seed(noise_seed, pair * LAB_PAIR_STRIDE + turn)


def branch_plan_rng(noise_seed: int) -> np.random.Generator:
    """The generator of the branch coins of one served episode with noise seed ``noise_seed``.

    ``default_rng(SeedSequence([noise_seed mod 2**64, SEED_SALTS["branch_plan"]]))``: the
    plan of which decisions get twins is a function of the episode's noise seed.
    """
    return np.random.default_rng(np.random.SeedSequence([int(noise_seed) & UINT64_MAX, SEED_SALTS["branch_plan"]]))


def credit_rng(seed: int, update: int) -> np.random.Generator:
    """The generator of every coin the credit step of training update ``update`` (0-based) of a
    run seeded ``seed`` draws.

    ``default_rng(SeedSequence([seed, update, SEED_SALTS["credit"]]))``, apart from the run's own
    generator (which draws the tasks, the noise seeds and the minibatch order), so that a method's
    coins leave the run's draws where every other method leaves them
    (:mod:`twice_envs.agents.training.trainer`).
    """
    return np.random.default_rng([int(seed), int(update), SEED_SALTS["credit"]])


def _sha256_uint64(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def stable_seed(*parts: object) -> int:
    """A uint64 hashed from ``parts`` read as text, joined by ``/``: seeds of generated content.

    The first 8 bytes (little-endian) of the SHA-256 of ``"/".join(map(str, parts))``.
    Stable in every process and under any ``PYTHONHASHSEED``; used where the parts are
    plain names and counters (an ALFWorld room name and its attempt). Parts that
    contain ``/`` can meet (``("a/b", "c")`` and ``("a", "b/c")`` give one seed): use
    :func:`stable_json_seed` for arbitrary text.
    """
    return _sha256_uint64("/".join(map(str, parts)))


def stable_json_seed(*parts: object) -> int:
    """A uint64 hashed from ``parts`` read as text, framed as a JSON list: seeds of requests.

    The first 8 bytes (little-endian) of the SHA-256 of ``json.dumps([str(p) for p in
    parts])``. The framing keeps every list of parts apart, whatever text they hold;
    used for the noise seed of an agent-loop request from its run seed, prompt id,
    session and step (ids are arbitrary text).
    """
    return _sha256_uint64(json.dumps([str(p) for p in parts]))


@dataclass(frozen=True)
class NoiseSchedule:
    """Which noise each turn of an episode reads.

    Attributes:
        episode_seed: the 64-bit noise seed of the episode.
        branches: turn -> branch for turns that do not read the factual noise
            (``branch = 0``); empty for a factual episode.
    """

    episode_seed: int
    branches: Mapping[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 <= int(self.episode_seed) <= UINT64_MAX:
            raise ValueError(f"episode_seed must be a uint64, got {self.episode_seed!r}")
        object.__setattr__(self, "branches", {int(t): int(b) for t, b in dict(self.branches).items()})

    def key(self, turn: int) -> NoiseKey:
        """The key base of ``turn``."""
        return NoiseKey(int(self.episode_seed), int(turn), self.branches.get(int(turn), 0), 0, 0)

    def with_branch(self, turn: int, branch: int) -> "NoiseSchedule":
        """The schedule of a twin that samples ``turn`` with ``branch``."""
        branches = dict(self.branches)
        if branch == 0:
            branches.pop(int(turn), None)
        else:
            branches[int(turn)] = int(branch)
        return NoiseSchedule(self.episode_seed, branches)

    def to_json(self) -> dict:
        return {"episode_seed": int(self.episode_seed), "branches": {str(t): b for t, b in sorted(self.branches.items())}}

    @classmethod
    def from_json(cls, value: Mapping) -> "NoiseSchedule":
        return cls(int(value["episode_seed"]), {int(t): int(b) for t, b in value.get("branches", {}).items()})

    @classmethod
    def coerce(cls, value: "NoiseSchedule | int | Mapping") -> "NoiseSchedule":
        """Accept a schedule, a bare ``episode_seed`` or the JSON form of a schedule."""
        if isinstance(value, NoiseSchedule):
            return value
        if isinstance(value, (int, np.integer)):
            return cls(int(value))
        if isinstance(value, Mapping):
            return cls.from_json(value)
        raise TypeError(
            f"noise_keys must be a NoiseSchedule, an episode_seed (int) or its JSON dict, got {type(value).__name__}"
        )
