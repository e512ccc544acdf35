"""Run a language-model agent on SearchQA-v0, then a coupled twin of one of its turns.

    python examples/agent_rollout.py                 # the tiny model shipped with the package
    python examples/agent_rollout.py --model smollm2-135m
    python examples/agent_rollout.py --model /path/to/a/local/hf/model
"""

import argparse

from twice_envs.agents.models.load import load_policy
from twice_envs.agents.rollout.episodes import (
    BranchRequest,
    Task,
    branch_rollouts,
    rollout,
)
from twice_envs.agents.sampling.policy import SamplingConfig

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="tiny")
parser.add_argument("--env", default="SearchQA-v0")
args = parser.parse_args()

policy = load_policy(args.model)
sampling = SamplingConfig(temperature=1.0, max_new_tokens=128)

# Two tasks, a group of two episodes each: batched generation across all four.
episodes = rollout(policy, args.env, [Task(0), Task(1)], group_size=2, sampling=sampling, max_turns=3)
for i, ep in enumerate(episodes):
    print(f"episode {i} (task seed {ep.seed}): utility {ep.utility:g}")
    for t, turn in enumerate(ep.turns):
        print(f"  turn {t} key {tuple(turn.noise_key)[1:3]}: {turn.text[:80]!r}")

# A coupled twin of episode 0's first turn: a different draw (branch 1) for turn 0,
# then the factual noise for every later turn.
twin = branch_rollouts(policy, episodes, [BranchRequest(episode=0, turn=0, branch=1)], sampling=sampling)[0]
print(f"twin of turn 0: self-twin {twin.self_twin}, same evidence {twin.same_evidence}, "
      f"utility {twin.utility:g} vs factual {episodes[0].utility:g}, D = {episodes[0].utility - twin.utility:g}")
