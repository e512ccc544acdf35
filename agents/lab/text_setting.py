"""TextLab's setting: the world and action policy it shares with SearchToy, its text and memory, its key layout.

:class:`TextLabSetting` holds a :class:`~twice_envs.agents.lab.search_toy.SearchToySetting` (the world,
``SearchToy-v0``'s config, and the initial action logits) rather than a copy of its fields, and adds
what only TextLab has: the thought text, the memory of it and the noise key layout. The policy it
sets is :mod:`twice_envs.agents.lab.text_policy`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from twice_envs.agents.lab.search_toy import SearchToySetting
from twice_envs.envs.searchtoy.env import SearchToyConfig
from twice_envs.noise import KEY_MODES

#: The thought words (the first ``words`` of them are the vocabulary's word tokens).
WORDS = ("so", "hmm", "maybe", "check", "then", "note", "wait", "right", "again", "well", "next", "plan")
#: Default cap on the exact oracle's table entries.
MAX_ORACLE = 2_000_000
#: TextLab's own fields that the command line sets (``--memory-size`` sets ``memory_size``, ...).
TEXT_SETTING_ARGS = ("memory", "memory_size", "words", "max_lines", "max_words", "key_mode")


@dataclass(frozen=True)
class TextLabSetting:
    """A TextLab setting: SearchToy's world and action policy, the policy's text and memory, and its key layout."""

    search: SearchToySetting = field(default_factory=SearchToySetting)
    """The world (``search.world``: facts, queries, horizon, reward) and the initial action logits
    (``wording``, ``temperature``, which divides them, ``skill``, ``answer_slope``, ``answer_bias``); its
    ``seed`` seeds the wording and memory tables. TextLab at ``memory = 0`` is this SearchToy policy."""
    memory: float = 1.0
    """Strength of the dependence on the memory: scales the seeded tables by which the
    memory shifts the word, line-end, act and action logits. 0: no dependence (the
    policy is SearchToy's)."""
    memory_size: int = 32
    """The memory is a residue modulo this (a twin whose text differs re-merges with its
    factual episode only when the memories coincide by chance, about ``1 / memory_size`` per
    differing turn)."""
    words: int = 6
    """Thought words in the vocabulary (at most ``len(WORDS)``)."""
    max_lines: int = 4
    """Thought lines after which the policy must act."""
    max_words: int = 6
    """Words after which a thought line must end."""
    act_bias: float = -2.0
    """Logit of acting (rather than thinking) at the start of a turn ..."""
    act_slope: float = 1.0
    """... rising by this per thought line already written."""
    stop_bias: float = -1.5
    """Logit of ending a thought line after its first word ..."""
    stop_slope: float = 0.5
    """... rising by this per further word."""
    key_mode: str = "line"
    """How each token's noise key is formed (one of :data:`~twice_envs.noise.KEY_MODES`)."""
    max_oracle: int = MAX_ORACLE
    """Refuse a setting whose exact oracle has more table entries than this."""

    def __post_init__(self) -> None:
        if not isinstance(self.search, SearchToySetting):
            raise ValueError(f"TextLabSetting.search must be a SearchToySetting, got {type(self.search).__name__}")
        if not 1 <= self.words <= len(WORDS):
            raise ValueError(f"words must be in 1..{len(WORDS)}, got {self.words}")
        if self.memory_size < 1 or self.max_lines < 0 or self.max_words < 1:
            raise ValueError(f"need memory_size >= 1, max_lines >= 0, max_words >= 1; got {self.memory_size}, "
                             f"{self.max_lines}, {self.max_words}")
        if not self.memory >= 0 or not self.search.temperature > 0:
            raise ValueError(f"need memory >= 0 and temperature > 0, got {self.memory}, {self.search.temperature}")
        if self.key_mode not in KEY_MODES:
            raise ValueError(f"key_mode must be one of {KEY_MODES}, got {self.key_mode!r}")
        if self.oracle_size > self.max_oracle:
            raise ValueError(
                f"TextLab setting too large for its exact oracle: {self.oracle_size:,} table entries (values over "
                f"turn x facts found x memory x previous action, the action table, the within-turn chain) > cap "
                f"{self.max_oracle:,}; lower hops, queries, horizon, memory_size, max_lines or max_words")

    @property
    def world(self) -> SearchToyConfig:
        """The env's world (``TextLab-v0``'s kwargs): ``search.world``."""
        return self.search.world

    @property
    def oracle_size(self) -> int:
        """Entries of the oracle's tables: ``V`` and ``Q`` over ``(turn, found, memory, previous
        action)``, the action table, and the within-turn chain ``(line, position, memory)`` from
        every starting memory."""
        w = self.world
        F, M, A = 1 << w.hops, self.memory_size, w.queries + 1
        return F * M * (A + 1) * (w.horizon + 1) + w.horizon * F * M * A + F * (A + 1) * M * A \
            + (self.max_lines + 1) * (self.max_words + 1) * M * M
