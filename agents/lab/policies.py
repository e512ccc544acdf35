"""The lab envs: each one's initial policy, and the command-line flags that set it.

A lab env joins the credit lab with one entry in :data:`LAB_POLICIES` (its initial policy from the
settings) and, where it has flags of its own, a few lines in :func:`add_setting_args`. The settings
compose the envs' own world configs (``SearchToySetting.world`` is ``SearchToy-v0``'s
:class:`~twice_envs.envs.searchtoy.env.SearchToyConfig`; TextLab's setting holds a SearchToy setting).
"""

from __future__ import annotations

import argparse
from typing import Callable

from twice_envs.agents.lab import toy
from twice_envs.agents.lab.choice_lab import ChoiceLabSetting, add_choice_args, choice_lab_policy
from twice_envs.agents.lab.search_toy import POLICY_ARGS, WORLD_ARGS, SearchToySetting, search_toy_policy
from twice_envs.agents.lab.text_policy import text_lab_policy
from twice_envs.agents.lab.text_setting import TEXT_SETTING_ARGS, TextLabSetting
from twice_envs.envs.searchtoy.env import SearchToyConfig
from twice_envs.noise import KEY_MODES

#: Each lab env's initial policy from the settings :func:`lab_policy` is given (a lab env joins with one entry).
LAB_POLICIES: dict[str, Callable] = {
    "SearchToy-v0": lambda setting, text_setting, choice_setting: search_toy_policy(setting),
    "CreditToy-v0": lambda setting, text_setting, choice_setting: toy.toy_policy(),
    "TextLab-v0": lambda setting, text_setting, choice_setting: text_lab_policy(text_setting or TextLabSetting()),
    "ChoiceLab-v0": lambda setting, text_setting, choice_setting: choice_lab_policy(choice_setting
                                                                                    or ChoiceLabSetting()),
}
LAB_ENVS = tuple(LAB_POLICIES)


def lab_policy(env: str = "SearchToy-v0", setting: SearchToySetting = SearchToySetting(),
               text_setting: TextLabSetting | None = None, choice_setting: ChoiceLabSetting | None = None):
    """The lab's initial policy for ``env`` (``setting``: SearchToy's; ``text_setting``: TextLab's,
    default :class:`~twice_envs.agents.lab.text_setting.TextLabSetting`; ``choice_setting``: ChoiceLab's,
    default :class:`~twice_envs.agents.lab.choice_lab.ChoiceLabSetting`)."""
    if env not in LAB_POLICIES:
        raise ValueError(f"lab env must be one of {LAB_ENVS}, got {env!r}")
    return LAB_POLICIES[env](setting, text_setting, choice_setting)


def _given(a, names) -> dict:
    return {k: getattr(a, k) for k in names if getattr(a, k, None) is not None}


def setting_from_args(a) -> SearchToySetting:
    """The SearchToy setting of parsed flags (the world's and the policy's; those not given keep their defaults).
    Raises ``ValueError`` for a bad world, before anything is sampled."""
    return SearchToySetting(world=SearchToyConfig(**_given(a, WORLD_ARGS)), **_given(a, POLICY_ARGS))


def text_setting_from_args(a) -> TextLabSetting:
    """The TextLab setting of the parsed flags: the world and action flags shared with SearchToy, and
    TextLab's own (:data:`~twice_envs.agents.lab.text_setting.TEXT_SETTING_ARGS`). Raises ``ValueError``
    for a bad or too large setting."""
    return TextLabSetting(search=setting_from_args(a), **_given(a, TEXT_SETTING_ARGS))


def add_setting_args(p: argparse.ArgumentParser) -> None:
    """Every lab's setting flags (SearchToy's world and policy, TextLab's text, ChoiceLab's; a flag several labs
    read, such as ``--horizon``, is added once)."""
    for k in ("hops", "queries", "useful", "horizon"):
        p.add_argument(f"--{k}", type=int, default=None, help=f"SearchToy {k} (default {getattr(SearchToyConfig, k)})")
    p.add_argument("--reward", choices=("binary", "graded"), default=None)
    p.add_argument("--wording", type=float, default=None, help="policy's dependence on its previous action (default 1)")
    p.add_argument("--temperature", type=float, default=None)
    t = TextLabSetting
    p.add_argument("--memory", type=float, default=None,
                   help=f"TextLab: strength of the dependence on its own earlier text (default {t.memory})")
    p.add_argument("--memory-size", type=int, default=None, help=f"TextLab: memory modulus (default {t.memory_size})")
    p.add_argument("--words", type=int, default=None, help=f"TextLab: thought words (default {t.words})")
    p.add_argument("--max-lines", type=int, default=None, help=f"TextLab: thought lines per turn at most "
                   f"(default {t.max_lines})")
    p.add_argument("--max-words", type=int, default=None,
                   help=f"TextLab: words per line at most (default {t.max_words})")
    p.add_argument("--key-mode", choices=KEY_MODES, default=None, help=f"TextLab: key layout (default {t.key_mode})")
    add_choice_args(p)
