"""Choice turns in rollouts and twins, and the replay of a choice episode (twice_envs.agents.rollout.choice)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import twice_envs
from tests.agents._tiny import tiny_policy
from tests.toy_envs import CoinChain, CoinChainReplayOnly
from twice_envs import Protocol
from twice_envs.agents.rollout.choice import replay_choices, turn_candidates
from twice_envs.agents.rollout.episodes import BranchRequest, Task, branch_rollouts, rollout
from twice_envs.agents.sampling.choice import CHOICE_LINE, CandidateError, ChoicePolicy
from twice_envs.agents.sampling.policy import SamplingConfig
from twice_envs.agents.types import EpisodeRecord
from twice_envs.envs.admissible import with_actions
from twice_envs.keys import NoiseKey, NoiseSchedule

SAMPLING = SamplingConfig(max_new_tokens=8)


class MixedCoin(CoinChainReplayOnly):
    """CoinChain that leaves a slot to fill every third turn (a generated turn) and lists ``jump`` (rejected)."""

    def _reset(self, options: dict) -> tuple[str, dict]:
        self.steps = 0
        return super()._reset(options)

    def _step(self, action: str):
        self.steps += 1
        return super()._step(action)

    def _info(self) -> dict:
        listed = ["say[<words>]"] if self.steps % 3 == 0 else ["left", "look", "right", "jump"]
        return {"admissible_actions": listed, "position": self.pos}


class ListedCoin(CoinChain):
    """CoinChain that lists ``listing`` as its admissible actions."""

    def __init__(self, *, listing=(), **kwargs) -> None:
        super().__init__(**kwargs)
        self.listing = list(listing)

    def _info(self) -> dict:
        return {"admissible_actions": list(self.listing), "position": getattr(self, "pos", 0)}


twice_envs.register("MixedCoin-v0", "tests.agents.test_choice_rollout:MixedCoin", description="test env",
                    override=True)
twice_envs.register("ListedCoin-v0", "tests.agents.test_choice_rollout:ListedCoin", description="test env",
                    override=True)


def _choice_policy():
    return ChoicePolicy(tiny_policy())


def _episodes(env_id="MixedCoin-v0", tasks=3, group=2, **kwargs):
    return rollout(_choice_policy(), env_id, [Task(s) for s in range(tasks)], group_size=group, sampling=SAMPLING,
                   max_turns=6, noise_seed=11, **kwargs)


def test_a_choice_episode_mixes_chosen_and_generated_turns_and_replays_exactly():
    eps = _episodes()
    turns = [t for e in eps for t in e.turns]
    assert any(t.choice is None for t in turns) and any(t.choice is not None for t in turns)
    policy = _choice_policy()
    for e in eps:
        for k, t in enumerate(e.turns):
            if t.choice is None:
                assert t.token_keys  # generated: each token's key is recorded
                continue
            c = t.choice
            assert c["candidates"] == ["left", "look", "right", "jump"] and len(c["scores"]) == 4
            assert t.text == c["candidates"][c["index"]] and t.token_keys == []
            assert c["key"] == [t.noise_key.episode_seed, k, 0, CHOICE_LINE, 0]
        again = EpisodeRecord.from_json(e.to_json())
        assert again.turns == e.turns
        assert replay_choices(again) == []
        assert replay_choices(again, policy) == []


def test_a_replay_names_the_field_of_a_choice_record_that_differs():
    ep = next(e for e in _episodes() if any(t.choice for t in e.turns))
    k = next(k for k, t in enumerate(ep.turns) if t.choice)
    c = ep.turns[k].choice
    c["scores"] = [0.0 if i == (c["index"] + 1) % 4 else -50.0 for i in range(4)]
    assert {d.field for d in replay_choices(ep)} == {"index"}
    assert {d.field for d in replay_choices(ep, _choice_policy())} == {"index", "scores"}
    c["candidates"] = list(reversed(c["candidates"]))
    assert "candidates" in {d.field for d in replay_choices(ep)}


def test_a_listed_candidate_the_env_rejects_is_an_invalid_turn():
    eps = _episodes("ListedCoin-v0", tasks=1, group=1, env_kwargs={"listing": ["jump"]})
    assert len(eps[0].turns) == 6
    for t in eps[0].turns:
        assert t.text == "jump" and t.choice["candidates"] == ["jump"] and t.invalid
        assert "Unknown action" in t.obs


@pytest.mark.parametrize("listing, words", [([], "turn 0 .* is empty"), (["left", "left"], "repeats candidate 0")])
def test_a_bad_listed_candidate_list_stops_the_rollout_with_a_clear_error(listing, words):
    with pytest.raises(CandidateError, match=words):
        _episodes("ListedCoin-v0", tasks=1, group=1, env_kwargs={"listing": listing})


def test_a_twin_of_a_choice_turn_reads_the_factual_keys_downstream():
    policy = _choice_policy()
    eps = rollout(policy, "CoinChain-v0", [Task(s, {"goal": 5}) for s in range(2)], group_size=2, sampling=SAMPLING,
                  max_turns=6, noise_seed=3)
    branch = 1
    i = next(i for i, e in enumerate(eps) if len(e.turns) > branch + 2)
    fact = eps[i]
    seed = NoiseSchedule.from_json(fact.trajectory["noise"]).episode_seed
    reqs = [BranchRequest(i, branch, branch=k) for k in range(1, 9)]
    twins = branch_rollouts(policy, eps, reqs, sampling=SAMPLING)
    assert any(w.self_twin for w in twins) and any(not w.self_twin for w in twins)
    for k, w in enumerate(twins, start=1):
        assert w.turns[0].choice["key"] == [seed, branch, k, CHOICE_LINE, 0]
        if w.self_twin:  # the same choice: the factual episode, nothing run after it
            assert len(w.turns) == 1 and w.utility == fact.utility
            assert w.turns[0].text == fact.turns[branch].text
            continue
        assert w.turns[0].text != fact.turns[branch].text
        for u, t in enumerate(w.turns[1:], start=branch + 1):
            assert tuple(t.noise_key)[:3] == (seed, u, 0)
            assert t.choice["key"] == [seed, u, 0, CHOICE_LINE, 0]
    # continued anyway, a twin that chose the factual candidate is the factual episode: the same luck downstream
    same = [k for k, w in enumerate(twins, start=1) if w.self_twin]
    full = branch_rollouts(policy, eps, [BranchRequest(i, branch, branch=same[0])], sampling=SAMPLING,
                           detect_self_twins=False)[0]
    assert [t.text for t in full.turns] == [t.text for t in fact.turns[branch:]]
    assert full.utility == fact.utility


def test_listed_actions_are_written_as_the_model_writes_a_turn():
    def env(actions, fmt, obs=""):
        traj = SimpleNamespace(observations=[obs])
        return SimpleNamespace(last_info={"admissible_actions": actions}, trajectory=traj,
                               protocol=lambda: Protocol("", (), fmt))

    assert turn_candidates(env(["go to shelf 1", "look"], "<action>COMMAND</action>")) == (
        "<action>go to shelf 1</action>", "<action>look</action>")
    page = with_actions("Results [SEP] ...", ["click[Back to Search]", "click[B0ABC]", "click[< Prev]"])
    assert turn_candidates(env(["click[back to search]", "click[b0abc]", "click[< prev]"],
                               "search[<query>] | click[<element>]", page)) == (
        "click[Back to Search]", "click[B0ABC]", "click[< Prev]")
    assert turn_candidates(env(["search[<query>]"], "search[<query>] | click[<element>]")) is None
    assert turn_candidates(SimpleNamespace(last_info={}, trajectory=None)) is None



def test_a_choice_replay_keeps_the_trust_rule_for_path_kwargs(monkeypatch):
    # a record's path kwargs pass only with the caller's consent, as in twice_envs.replay
    seen, real = [], twice_envs.replay
    monkeypatch.setattr(twice_envs, "replay", lambda *a, **kw: seen.append(kw["trusted"]) or real(*a, **kw))
    ep = next(e for e in _episodes() if any(t.choice for t in e.turns))
    assert replay_choices(ep) == [] and replay_choices(ep, trusted=True) == []
    assert seen == [False, True]
