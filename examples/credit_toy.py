"""Twin credit on CreditToy-v0, where the true advantages are known exactly.

Samples factual episodes with a keyed categorical policy, branches decisions with the
square-root rule, runs coupled twins through env forks, and compares the
inverse-weighted twin credit with the exact advantage of each first action.

    python examples/credit_toy.py
"""

import numpy as np

from twice_envs.agents.credit import twice
from twice_envs.agents.credit.predictor import decision_index
from twice_envs.agents.lab import toy

policy = toy.toy_policy()
episodes, envs = toy.toy_rollouts(policy, n_groups=300, group_size=5, noise_seed=1)
config = twice.TwiceConfig(beta=0.7)
rng = np.random.default_rng(0)

index = decision_index(episodes)
eta = np.full(len(index), 0.5)  # a flat discordance guess: q then only follows the cost
plan = twice.plan_branches(episodes, config, eta, rng, update=config.warmup_updates)
twins = toy.toy_twins(policy, episodes, envs, plan.branched_decisions)
kept = twice.evidence_coins([twice.evidence_exponent(t) for t in twins], config, rng)
credit = twice.twin_credit(episodes, twins, plan, kept, config)

exact = toy.exact_advantages(policy, episodes)
print(f"{len(index)} decisions, {int(plan.branched.sum())} branched (mean q {plan.q.mean():.2f}), "
      f"{np.mean([t.self_twin for t in twins]):.0%} self-twins")
print("first action   count   mean twin credit   exact advantage")
for a in range(toy.NUM_ACTIONS):
    rows = [r for r, (i, t) in enumerate(index) if t == 0 and episodes[i].turns[0].text == str(a)]
    if rows:
        est = credit.a_hat[rows].mean()
        print(f"{a:>12} {len(rows):>7} {est:>18.3f} {toy.exact_advantage(policy, [], a):>17.3f}")
