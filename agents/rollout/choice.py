"""Choice turns in a rollout: the candidates an env offers, and the exact replay of a choice episode.

:func:`turn_candidates` is what a rollout asks before a turn of a policy that chooses
(:class:`~twice_envs.agents.sampling.choice.ChoicePolicy`): the env's ``info["admissible_actions"]``,
each written as the model writes a turn, or None where the env lists no actions or leaves a slot to
fill (WebShop's ``search[<query>]``), so that turn is generated as text.

* A listed action is written in the env's ``protocol().action_format`` when that format has a
  ``COMMAND`` slot (ALFWorld: ``<action>go to shelf 1</action>``), else as it is.
* Where the observation ends with the list as the page shows it (``show_admissible``), each
  action takes that spelling (WebShop's ``click[Buy Now]`` for ``click[buy now]``): the env reads
  both alike, and the shown form is the one the model saw.

:func:`replay_choices` checks a recorded choice episode: the env replays it (digest chain), and at
every chosen turn the candidates, the key and the drawn index are derived again from the env and
the recorded scores (and, given the policy, the scores from the model); it returns the fields that
differ, none for an exact replay.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import twice_envs
from twice_envs.agents.sampling.candidates import score_candidates
from twice_envs.agents.sampling.choice import SCORES, choice_key, keyed_candidate
from twice_envs.agents.sampling.policy import SamplingConfig
from twice_envs.agents.rollout.context import turn_context
from twice_envs.agents.types import EpisodeRecord
from twice_envs.envs.admissible import HEADER
from twice_envs.keys import NoiseKey

#: A slot the agent fills in a listed action (``search[<query>]``): such a turn is generated.
SLOT = re.compile(r"<[A-Za-z_]+>")
#: The placeholder of an env's ``action_format`` that a listed command fills.
COMMAND = "COMMAND"


def _shown(obs: str, actions: Sequence[str]) -> list[str]:
    """``actions`` as the observation's trailing list spells them (same text up to case), else as they are."""
    if HEADER not in obs:
        return list(actions)
    shown = obs.rsplit(HEADER, 1)[1]
    out, at = [], 0
    for a in actions:
        seg = shown[at: at + len(a)]
        if seg.lower() != a.lower():
            return list(actions)
        out.append(seg)
        at += len(a) + 2  # ", "
    return out


def turn_candidates(env) -> Optional[tuple[str, ...]]:
    """The candidate turns of ``env``'s next turn (see the module docstring), or None: generate it."""
    base = getattr(env, "unwrapped", env)
    actions = env.last_info.get("admissible_actions")
    if actions is None or any(SLOT.search(str(a)) for a in actions):
        return None
    actions = [str(a) for a in actions]
    obs = base.trajectory.observations[-1] if base.trajectory.observations else ""
    actions = _shown(obs, actions)
    fmt = base.protocol().action_format
    if COMMAND in fmt and " | " not in fmt:
        actions = [fmt.replace(COMMAND, a) for a in actions]
    return tuple(actions)


@dataclass
class Difference:
    """A field of a recorded choice that its replay does not reproduce."""

    turn: int
    field: str
    recorded: Any
    replayed: Any

    def __str__(self) -> str:
        return f"turn {self.turn}: {self.field} recorded {self.recorded!r}, replayed {self.replayed!r}"


def _check_turn(k: int, choice: dict, text: str, candidates, key: NoiseKey, scores: Optional[list[float]],
                tol: float) -> list[Difference]:
    out = []
    if candidates is not None and list(choice["candidates"]) != list(candidates):
        out.append(Difference(k, "candidates", choice["candidates"], list(candidates)))
    key_now = [int(v) for v in choice_key(key)]
    if list(choice["key"]) != key_now:
        out.append(Difference(k, "key", choice["key"], key_now))
    if scores is not None:
        worst = max((abs(a - b) for a, b in zip(choice["scores"], scores)), default=0.0)
        if len(scores) != len(choice["scores"]) or not worst <= tol:
            out.append(Difference(k, "scores", choice["scores"], scores))
    index, logprob, _ = keyed_candidate(choice["scores"], NoiseKey(*choice["key"]), choice["temperature"],
                                        choice["greedy"])
    if index != choice["index"]:
        out.append(Difference(k, "index", choice["index"], index))
    elif not math.isclose(logprob, choice["logprob"], rel_tol=1e-12, abs_tol=1e-12):
        out.append(Difference(k, "logprob", choice["logprob"], logprob))
    if text != choice["candidates"][choice["index"]]:
        out.append(Difference(k, "text", text, choice["candidates"][choice["index"]]))
    return out


def replay_choices(ep: EpisodeRecord, policy=None, *, sampling: Optional[SamplingConfig] = None,
                   tol: float = 1e-4, trusted: bool = False) -> list[Difference]:
    """The fields of ``ep``'s chosen turns that a replay does not reproduce (empty: it replays exactly).

    The env is rebuilt from the record (:func:`twice_envs.replay`, which raises on a digest
    mismatch) and stepped with the recorded turns; before each chosen turn the candidates and the
    key come from the env, the index and log-prob from the keyed draw over the recorded scores, and,
    given ``policy`` (a :class:`~twice_envs.agents.sampling.choice.ChoicePolicy`), the scores from the
    model over the recorded context (``tol``: the largest score difference allowed, for float
    rounding between batch shapes). A twin record is checked from its branch turn on. ``trusted``
    lets the record's path kwargs through (the trust rule of :func:`twice_envs.replay`).
    """
    if ep.trajectory is None:
        raise ValueError("the record has no trajectory: there is nothing to replay")
    first = ep.twin_of[1] if ep.twin_of is not None else 0
    env = twice_envs.replay(ep.trajectory, turn=first, trusted=trusted)
    sampling = sampling or SamplingConfig()
    out: list[Difference] = []
    try:
        for k, t in enumerate(ep.turns):
            turn = first + k
            if t.choice is not None:
                # a twin's first turn was drawn on its own branch; every other turn on the env's key
                alt = ep.twin_of is not None and k == 0
                key = NoiseKey(*tuple(t.noise_key)[:3]) if alt else NoiseKey(*tuple(env.last_info["noise_key"])[:3])
                scores = None
                if policy is not None:
                    toks = [policy.candidate_tokens(c, tuple(env.unwrapped.protocol().stop))
                            for c in t.choice["candidates"]]
                    lp, _, _ = score_candidates(policy, turn_context(ep, k), toks, sampling)
                    scores = [SCORES[t.choice["score"]](x) for x in lp]
                out += _check_turn(turn, t.choice, t.text, turn_candidates(env), key, scores, tol)
            env.step(t.text)
    finally:
        env.close()
    return out
