"""Seeds, noise keys and noise schedules: the addresses of an episode's sampling noise.

A sampled token reads Gumbel noise addressed by a :class:`NoiseKey`
``(episode_seed, turn, branch, line, pos)`` (see :mod:`twice_envs.noise` for the
generator). An environment never samples; it only carries a :class:`NoiseSchedule`
and reports, in ``info["noise_key"]``, the key *base* (``line = pos = 0``) of the
agent's next turn.

``branch = 0`` is the factual episode. A twin of turn ``t`` samples its alternative
turn with ``branch = k >= 1`` and every later turn with the factual keys, so the
schedule of a twin is the factual schedule with one entry changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, NamedTuple, Optional, Sequence

import numpy as np

UINT64_MAX = (1 << 64) - 1
UINT32_MAX = (1 << 32) - 1


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
    """A 64-bit noise seed derived from an env seed (both uint64), stable on every platform."""
    return seed_sequence_uint64([check_seed(seed), check_seed(salt, "salt"), 0x7457])


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
