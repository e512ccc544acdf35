"""Rollouts and twin rollouts: records, packing, coupling, budgets, determinism, the real envs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import twice_envs
from tests.agents._tiny import tiny_dir, tiny_policy
from twice_envs.agents.rollout.context import pack_episode
from twice_envs.agents.rollout.episodes import (
    BranchRequest,
    Task,
    branch_rollouts,
    episode_noise_seed,
    generate_in_batches,
    rollout,
)
from twice_envs.agents.sampling.policy import Generation, GenerationRequest, SamplingConfig
from twice_envs.errors import MissingExtra
from twice_envs.keys import NoiseKey
from twice_envs.noise import sampling_logprobs

REPO = Path(__file__).resolve().parents[2]
SAMPLING = SamplingConfig(max_new_tokens=10, temperature=1.0)


@pytest.fixture(scope="module")
def factual():
    return rollout(tiny_policy(), "CoinChain-v0", [Task(1), Task(2)], group_size=3, sampling=SAMPLING, max_turns=4,
                   noise_seed=5)


def test_groups_seeds_and_records(factual):
    assert [e.group for e in factual] == [0, 0, 0, 1, 1, 1]
    for i, ep in enumerate(factual):
        g, j = divmod(i, 3)
        seed = episode_noise_seed(5, g, j)
        assert ep.trajectory["noise"]["episode_seed"] == seed
        assert 1 <= len(ep.turns) <= 4
        for t, turn in enumerate(ep.turns):
            assert tuple(turn.noise_key) == (seed, t, 0, 0, 0)
            assert len(turn.token_ids) == len(turn.logprobs) > 0
            assert turn.digest == ep.trajectory["digests"][t + 1]
        assert ep.utility == sum(ep.trajectory["rewards"])
        assert twice_envs.first_divergence(ep.trajectory) is None
        json.dumps(ep.to_json())
    # episodes of a group share the task but not the noise
    assert len({tuple(e.turns[0].token_ids) for e in factual}) > 1


@torch.no_grad()
def test_pack_episode_is_what_the_model_saw(factual):
    policy = tiny_policy()
    ep = max(factual, key=lambda e: len(e.turns))
    ids, mask, old, turn_of = pack_episode(ep)
    assert len(ids) == len(mask) == len(old) == len(turn_of)
    assert sum(mask) == ep.num_generated_tokens
    logits = policy.model(input_ids=torch.tensor([ids])).logits[0, :-1]
    logp = sampling_logprobs(logits, SAMPLING.temperature, SAMPLING.top_p)
    new = logp.gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)
    m = torch.tensor(mask[1:], dtype=torch.bool)
    assert torch.allclose(new[m], torch.tensor(old[1:])[m], atol=1e-4)
    assert sorted(set(turn_of) - {-1}) == list(range(len(ep.turns)))


def test_prefix_reuse_does_not_change_episodes(factual):
    policy = tiny_policy()
    policy.prefix_reuse = False
    try:
        again = rollout(policy, "CoinChain-v0", [Task(1), Task(2)], group_size=3, sampling=SAMPLING, max_turns=4,
                        noise_seed=5)
    finally:
        policy.prefix_reuse = True
    assert [[t.token_ids for t in e.turns] for e in again] == [[t.token_ids for t in e.turns] for e in factual]


class _RowRecorder:
    """A policy stand-in that records the context lengths of each call's rows."""

    def __init__(self):
        self.calls = []

    def generate(self, requests, sampling):
        self.calls.append([len(r.prompt_ids) for r in requests])
        return [Generation(f"row of {len(r.prompt_ids)}", [], [], 0.0) for r in requests]


def test_calls_group_rows_by_context_length_and_answer_in_request_order():
    lengths = [5, 1, 4, 2, 3]
    reqs = [GenerationRequest([7] * n, NoiseKey(0, 0, 0)) for n in lengths]
    rec = _RowRecorder()
    out = generate_in_batches(rec, reqs, SAMPLING, 2)
    assert rec.calls == [[1, 2], [3, 4], [5]]
    assert [g.text for g in out] == [f"row of {n}" for n in lengths]
    rec = _RowRecorder()
    generate_in_batches(rec, reqs, SAMPLING, 2, by_length=False)
    assert rec.calls == [[5, 1], [4, 2], [3]]
    with pytest.raises(ValueError, match="batch_size"):
        generate_in_batches(rec, reqs, SAMPLING, 0)


def test_grouping_by_length_changes_no_sample(factual):
    """Rows are keyed by their own noise, so the calls' make-up changes the cost only: the same
    episodes and twins (turns at every depth, so the calls mix context lengths) either way."""
    policy = tiny_policy()
    kw = dict(group_size=3, sampling=SAMPLING, max_turns=4, noise_seed=5, batch_size=2)
    tasks = [Task(1), Task(2)]
    ungrouped = rollout(policy, "CoinChain-v0", tasks, by_length=False, **kw)
    assert [[t.token_ids for t in e.turns] for e in ungrouped] == [[t.token_ids for t in e.turns] for e in factual]
    reqs = [BranchRequest(i, t, branch=1) for i, e in enumerate(factual) for t in range(len(e.turns))]
    grouped = branch_rollouts(policy, factual, reqs, sampling=SAMPLING, batch_size=2)
    plain = branch_rollouts(policy, factual, reqs, sampling=SAMPLING, batch_size=2, by_length=False)
    assert len({r.turn for r in reqs}) > 1  # calls that mix context lengths
    assert [[t.token_ids for t in w.turns] for w in grouped] == [[t.token_ids for t in w.turns] for w in plain]


def test_coupled_twin_with_the_factual_turn_reproduces_the_episode(factual):
    policy = tiny_policy()
    ep_i = max(range(len(factual)), key=lambda i: len(factual[i].turns))
    ep = factual[ep_i]
    assert len(ep.turns) >= 2
    req = BranchRequest(ep_i, 0, branch=1, action=ep.turns[0].text)
    full = branch_rollouts(policy, factual, [req], sampling=SAMPLING, detect_self_twins=False)[0]
    assert not full.self_twin
    assert [t.token_ids for t in full.turns[1:]] == [t.token_ids for t in ep.turns[1:]]
    assert full.trajectory["digests"] == ep.trajectory["digests"]
    assert full.utility == ep.utility
    short = branch_rollouts(policy, factual, [req], sampling=SAMPLING)[0]
    assert short.self_twin and short.utility == ep.utility and len(short.turns) == 1


def test_twins_read_factual_keys_and_respect_the_budget(factual):
    policy = tiny_policy()
    reqs = [BranchRequest(i, 0, branch=2) for i in range(len(factual))]
    reqs += [BranchRequest(i, 0, branch=1, coupled=False, noise_seed=999 + i) for i in range(len(factual))]
    twins = branch_rollouts(policy, factual, reqs, sampling=SAMPLING)
    assert len(twins) == 2 * len(factual)
    for r, tw in zip(reqs, twins):
        ep = factual[r.episode]
        assert tw.twin_of == (r.episode, 0) and tw.branch == r.branch and tw.coupled == r.coupled
        seed = ep.trajectory["noise"]["episode_seed"] if r.coupled else r.noise_seed
        assert tuple(tw.turns[0].noise_key) == (seed, 0, r.branch, 0, 0)
        for u, turn in enumerate(tw.turns[1:], start=1):
            assert tuple(turn.noise_key) == (seed, u, 0, 0, 0)
        assert len(tw.turns) <= ep.info["turn_cap"]
        assert twice_envs.first_divergence(tw.trajectory) is None
        if not tw.self_twin:
            assert tw.trajectory["actions"][0] == tw.turns[0].text
    # a coupled twin's later turns read exactly the factual keys
    coupled = [t for t in twins if t.coupled and not t.self_twin and len(t.turns) > 1]
    assert coupled


def test_same_evidence_and_forced_actions():
    policy = tiny_policy()
    base = rollout(policy, "CoinChain-v0", [Task(3, {"goal": 5})], group_size=1, sampling=SAMPLING, max_turns=3)
    looked = branch_rollouts(policy, base, [BranchRequest(0, 0, action="look")], sampling=SAMPLING)
    looked[0].twin_of = None  # use it as a factual episode whose first turn is "look"
    twin = branch_rollouts(policy, looked, [BranchRequest(0, 0, action="  look  ")], sampling=SAMPLING)[0]
    assert twin.same_evidence and not twin.self_twin
    assert len(twin.turns[0].logprobs) == len(twin.turns[0].token_ids)
    other = branch_rollouts(policy, looked, [BranchRequest(0, 0, action="right")], sampling=SAMPLING)[0]
    assert not other.same_evidence


def test_bad_branch_requests_are_rejected(factual):
    policy = tiny_policy()
    with pytest.raises(ValueError):
        branch_rollouts(policy, factual, [BranchRequest(0, 0, branch=0)], sampling=SAMPLING)
    with pytest.raises(ValueError):
        branch_rollouts(policy, factual, [BranchRequest(0, 99)], sampling=SAMPLING)
    with pytest.raises(ValueError):
        branch_rollouts(policy, factual, [BranchRequest(0, 0, coupled=False)], sampling=SAMPLING)


_DETERMINISM = """
import hashlib, json, sys
import tests.toy_envs
from twice_envs.agents.sampling.policy import HFPolicy, SamplingConfig
from twice_envs.agents.rollout.episodes import Task, rollout, branch_rollouts, BranchRequest
pol = HFPolicy.from_pretrained(sys.argv[1])
s = SamplingConfig(max_new_tokens=10, top_p=0.9)
eps = rollout(pol, "CoinChain-v0", [Task(4), Task(8)], group_size=2, sampling=s, max_turns=3, noise_seed=11)
tw = branch_rollouts(pol, eps, [BranchRequest(0, 0, 1), BranchRequest(1, 0, 1, coupled=False, noise_seed=3)], sampling=s)
blob = json.dumps([e.to_json() for e in eps + tw], sort_keys=True)
print(hashlib.sha256(blob.encode()).hexdigest())
"""


def test_same_keys_same_episodes_across_processes():
    path = str(tiny_dir())
    out = []
    for hashseed in ("0", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=hashseed, PYTHONPATH=str(REPO))
        res = subprocess.run([sys.executable, "-c", _DETERMINISM, path], capture_output=True, text=True, env=env,
                             cwd=REPO, timeout=300)
        assert res.returncode == 0, res.stderr[-2000:]
        out.append(res.stdout.strip().splitlines()[-1])
    assert out[0] == out[1]


def _skip_unless_installed(env_id: str) -> None:
    """Skip when the env's optional dependency is missing; any other failure is the test's to report."""
    try:
        twice_envs.make(env_id).reset(seed=0)
    except MissingExtra as exc:
        pytest.skip(f"{env_id}: {exc}")
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] == "twice_envs":
            raise
        pytest.skip(f"{env_id} needs {exc.name}, which is not installed")


@pytest.mark.parametrize("env_id", ["SearchQA-v0", "WebShop-v0", "ALFWorld-v0"])
def test_rollouts_and_twins_on_the_real_envs(env_id):
    if env_id == "ALFWorld-v0":
        pytest.importorskip("alfworld")
    _skip_unless_installed(env_id)
    policy = tiny_policy()
    s = SamplingConfig(max_new_tokens=12)
    eps = rollout(policy, env_id, [Task(0), Task(1)], group_size=2, sampling=s, max_turns=2, noise_seed=1)
    assert len(eps) == 4 and all(e.turns for e in eps)
    for e in eps:
        assert twice_envs.first_divergence(e.trajectory) is None
    twins = branch_rollouts(policy, eps, [BranchRequest(i, 0, branch=1) for i in range(4)], sampling=s)
    for e, tw in zip(eps, twins):
        assert tw.twin_of[1] == 0 and len(tw.turns) <= e.info["turn_cap"]
        assert twice_envs.first_divergence(tw.trajectory) is None


def test_prefix_cache_is_dropped_when_the_weights_change():
    from twice_envs.agents.sampling.policy import GenerationRequest, HFPolicy

    policy = HFPolicy.from_pretrained(tiny_dir())
    req = [GenerationRequest(list(range(5, 40)), NoiseKey(1, 0, 0))]
    policy.generate(req, SAMPLING)
    assert len(policy.prefix_cache) > 0
    assert policy.generate(req, SAMPLING)[0].reused_tokens > 0
    with torch.no_grad():
        for p in policy.model.parameters():
            p.mul_(1.01)
    assert policy.generate(req, SAMPLING)[0].reused_tokens == 0
