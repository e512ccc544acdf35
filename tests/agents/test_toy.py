"""CreditToy-v0: the contract checker, and exact values that match keyed sampling."""

import numpy as np

import twice_envs
from twice_envs.agents.lab import toy
from twice_envs.envs.credittoy import env as credittoy


def test_credit_toy_passes_the_contract_checker():
    twice_envs.check_env(twice_envs.make(toy.TOY_ID))


def test_keyed_sampling_reproduces_the_exact_values():
    policy = toy.toy_policy()
    eps, _ = toy.toy_rollouts(policy, 400, 5, noise_seed=3)
    u = np.array([e.utility for e in eps])
    v = toy.exact_value(policy, ())
    assert abs(u.mean() - v) < 4 * np.sqrt(v * (1 - v) / len(u))
    # first-action frequencies follow the policy
    first = np.bincount([int(e.turns[0].text) for e in eps], minlength=4) / len(eps)
    p = policy.probs(0, toy.NUM_ACTIONS)
    assert np.all(np.abs(first - p) < 4 * np.sqrt(p * (1 - p) / len(eps)) + 1e-9)
    # log-probs and utilities in the records are the policy's and the env's
    e = eps[0]
    acts = [int(t.text) for t in e.turns]
    assert e.utility == toy.utility_of(acts)
    assert e.turns[0].logprobs[0] == np.log(p[acts[0]])


def test_bad_actions_waste_a_turn_without_crashing():
    env = twice_envs.make(toy.TOY_ID)
    env.reset(seed=0)
    obs, r, term, trunc, info = env.step("seven")
    assert info["invalid"] and "Invalid" in obs and not term
    assert env.unwrapped.history == [credittoy.INVALID]
