"""Transcripts of scripted agents: what the tiny models are warm-started on.

The agents themselves live beside their envs (``twice_envs.envs.*.scripted``); this module
names them per env id, runs them for a number of episodes and collects the text.
"""

from __future__ import annotations

import importlib
from typing import Callable, Optional, Sequence

import numpy as np

import twice_envs
from twice_envs.agents.rollout.context import _kept
from twice_envs.agents.rollout.episodes import Task, rollout
from twice_envs.agents.sampling.policy import SamplingConfig
from twice_envs.envs.mistakes import Mistake, Played

#: Scripted agents used for warm-start transcripts, ``env id -> "module:function"``;
#: each is ``f(env, rng, skill) -> str`` (the next turn's text).
SCRIPTED_AGENTS: dict[str, str] = {
    "SearchQA-v0": "twice_envs.envs.searchqa.scripted:scripted_turns",
    "WebShop-v0": "twice_envs.envs.webshop.scripted:scripted_turns",
    "ALFWorld-v0": "twice_envs.envs.alfworld.scripted:scripted_turns",
}

#: Transcript augmenters, ``env id -> "module:function"``; each is
#: ``f(env, episodes, copies, rng) -> episodes`` (``copies`` altered variants of each episode).
AUGMENTERS: dict[str, str] = {
    "SearchQA-v0": "twice_envs.envs.searchqa.scripted:renamed_copies",
    "ALFWorld-v0": "twice_envs.envs.alfworld.scripted:renumbered_copies",
    "WebShop-v0": "twice_envs.envs.webshop.scripted:reassigned_ids",
}


def scripted_agent(env_id: str, table: Optional[dict] = None) -> Optional[Callable]:
    """The scripted agent of ``env_id`` (or, with ``table=AUGMENTERS`` or ``ENTITY_TOKENS``, its entry of
    that table); None when it has none or its module cannot be imported here."""
    target = (SCRIPTED_AGENTS if table is None else table).get(env_id)
    if target is None:
        return None
    module, _, func = target.partition(":")
    try:
        return getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError):
        return None


def _admissible_agent(env, rng: np.random.Generator, skill: float) -> str:
    """A generic scripted agent for envs that list their admissible actions."""
    actions = list(env.last_info.get("admissible_actions") or [])
    if not actions:
        return "look"
    return str(actions[int(rng.integers(len(actions)))])


def scripted_episodes(env_id: str, n: int, *, seed: int = 0, skill_range=(0.2, 0.95), max_turns: int = 6,
                      agent: Optional[Callable] = None, agent_options: Optional[dict] = None,
                      env_kwargs: Optional[dict] = None, reset_options: Optional[dict] = None,
                      ) -> list[tuple[str, list[tuple[str, str]]]]:
    """``n`` scripted episodes on ``env_id`` (made with ``env_kwargs``): ``(first_obs, [(action, obs), ...])``
    each; ``agent_options`` are passed to the agent as keyword arguments, ``reset_options`` to every
    ``env.reset`` (``{"split": "train"}`` draws WebShop's training goals only)."""
    agent = agent or scripted_agent(env_id) or _admissible_agent
    rng = np.random.default_rng([seed, 0x51F7])
    out = []
    env = twice_envs.make(env_id, **(env_kwargs or {}))
    for i in range(n):
        skill = float(rng.uniform(*skill_range))
        obs, info = env.reset(seed=seed * 100_003 + i, options=dict(reset_options) if reset_options else None)
        turns = []
        for _ in range(max_turns):
            action = agent(env, rng, skill, **(agent_options or {}))
            obs2, _r, term, trunc, _info = env.step(action)
            turns.append((action, obs2))
            if term or trunc:
                break
        out.append((obs, turns))
    return out


def available_envs(env_ids: Sequence[str]) -> list[str]:
    """The ids among ``env_ids`` that can be made here (their data and extras are installed)."""
    ok = []
    for env_id in env_ids:
        if env_id not in twice_envs.registry:
            continue
        try:
            env = twice_envs.make(env_id)
            env.reset(seed=0)
        except Exception:  # an env whose optional dependency is missing: skip it
            continue
        ok.append(env_id)
    return ok


#: Whole-token providers, ``env id -> "module:function"``; each is ``f(env) -> list[str]``: strings
#: that the env's observations show and its actions copy, each to become one token of the tiny
#: model's tokenizer (``TinyModelConfig.id_tokens``).
ENTITY_TOKENS: dict[str, str] = {
    "WebShop-v0": "twice_envs.envs.webshop.scripted:catalogue_ids",
    "ALFWorld-v0": "twice_envs.envs.alfworld.scripted:type_names",
}


def entity_ids(env_ids: Sequence[str]) -> list[str]:
    """Whole tokens of ``env_ids`` (:data:`ENTITY_TOKENS`: WebShop's product ids, ALFWorld's object
    and receptacle type names); envs without a provider add none."""
    out: list[str] = []
    for env_id in env_ids:
        provider = scripted_agent(env_id, ENTITY_TOKENS)
        if provider is None:
            continue
        env = twice_envs.make(env_id)
        env.reset(seed=0)
        out += list(provider(env))
    return out


def corpus_texts(env_ids: Sequence[str]) -> list[str]:
    """Passages and training-split questions of the envs that expose a corpus (SearchQA)."""
    out: list[str] = []
    for env_id in env_ids:
        env = twice_envs.make(env_id)
        env.reset(seed=0)
        res = getattr(env.unwrapped, "resources", None)
        corpus = getattr(res, "corpus", None)
        if corpus is None or not hasattr(corpus, "iter_contents"):
            continue
        out += [str(c) for c in corpus.iter_contents()]
        questions = getattr(res, "questions", None) or {}
        out += [q.question for q in questions.get("train", [])]
    return out


def relabelled_episodes(policy, env_id: str, n: int, *, seed: int = 0, max_turns: int = 6,
                        window: Optional[int] = None, max_new_tokens: int = 64, agent_options: Optional[dict] = None,
                        env_kwargs: Optional[dict] = None, reset_options: Optional[dict] = None,
                        agent: Optional[Callable] = None) -> list[tuple[str, list[tuple[str, str]]]]:
    """Transcripts of the states a model reaches, labelled by the scripted agent (DAgger).

    ``policy`` plays ``n`` episodes of ``env_id`` at temperature 1 (task ``i`` is reset with seed
    ``seed * 100_003 + i``, as in :func:`scripted_episodes`, and ``reset_options``) with the history
    ``window`` it is used with. Each episode is then replayed in a fresh env, and before each of the
    model's turns the env's scripted agent (or ``agent``), at skill 1 with ``agent_options``, names its own next
    turn. Every such state gives one transcript ``(first_obs, [(played, obs), ..., (label, "")])``:
    the model's turns that its context shows (the last ``window`` of them, all without a window),
    marked :class:`~twice_envs.envs.mistakes.Played` (never imitated), then the scripted agent's turn.
    A turn the agent plays as a :class:`~twice_envs.envs.mistakes.Mistake` (its expert gave up) is
    no label and is skipped; an episode whose replay leaves the recorded one is dropped from there on.
    """

    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"the number of relabelled episodes must be an int >= 0, got {n!r}")
    agent = agent or scripted_agent(env_id) or _admissible_agent
    options = dict(reset_options or {})
    tasks = [Task(seed * 100_003 + i, dict(options)) for i in range(n)]
    episodes = rollout(policy, env_id, tasks, group_size=1, env_kwargs=env_kwargs, noise_seed=seed, max_turns=max_turns,
                       window=window, sampling=SamplingConfig(temperature=1.0, max_new_tokens=max_new_tokens))
    env = twice_envs.make(env_id, **(env_kwargs or {}))
    rng = np.random.default_rng([seed, 0xDA66])
    out = []
    for ep in episodes:
        first_obs, _ = env.reset(seed=ep.seed, options=dict(ep.options) or None)
        played: list[tuple[str, str]] = []
        for turn in ep.turns:
            label = agent(env, rng, 1.0, **(agent_options or {}))
            if not isinstance(label, Mistake):
                out.append((first_obs, [(Played(a), o) for a, o in _kept(played, window)] + [(str(label), "")]))
            obs, _r, term, trunc, _info = env.step(turn.text)
            if obs != turn.obs:
                break
            played.append((turn.text, obs))
            if term or trunc:
                break
    return out
