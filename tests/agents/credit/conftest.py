import numpy as np
import pytest

from twice_envs.agents.credit.predictor import decision_index
from twice_envs.agents.lab import toy


@pytest.fixture(scope="package")
def toy_batch():
    """4000 factual CreditToy episodes (800 groups of 5) with their envs and exact advantages."""
    policy = toy.toy_policy()
    episodes, envs = toy.toy_rollouts(policy, 800, 5, noise_seed=11)
    index = decision_index(episodes)
    exact_per_ep = toy.exact_advantages(policy, episodes)
    exact = np.array([exact_per_ep[i][t] for i, t in index])
    return policy, episodes, envs, index, exact


@pytest.fixture(scope="package")
def coupled_twins(toy_batch):
    """One coupled twin for every decision of the toy batch."""
    policy, episodes, envs, index, _ = toy_batch
    return toy.toy_twins(policy, episodes, envs, index, coupled=True)


@pytest.fixture(scope="package")
def independent_twins(toy_batch):
    """One independent counterfactual for every decision of the toy batch."""
    policy, episodes, envs, index, _ = toy_batch
    return toy.toy_twins(policy, episodes, envs, index, coupled=False, fresh_salt=7)
