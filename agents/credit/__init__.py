"""Credit estimators: pure functions from episodes (and their twins) to per-turn advantages.

* :mod:`.registry` -- the one registry of credit methods (:func:`~.registry.get_method`): needs, requests,
  the two phases (:func:`~.registry.run_credit`).
* :mod:`.settings` -- a method's settings class as ``twice train`` flags and as JSON.
* :mod:`.grpo` -- group-normalised episode return broadcast to every turn.
* :mod:`.gigpo` -- GiGPO: the episode term plus anchor-state step groups.
* :mod:`.twice` -- twin credit: branch and evidence coins, inverse-probability weights.
* :mod:`.budget` -- the square-root branching rule, the budget bisection and what a twin costs.
* :mod:`.diagnostics` -- per-update diagnostics of twin credit.
* :mod:`.predictor` -- the discordance predictor that feeds the branching rule.
* :mod:`.crr` -- independent counterfactuals branched uniformly.
* :mod:`.vineppo` -- Monte Carlo values from forks.
* :mod:`.ablations` -- one-change variants of Twice, selected by name.
* :mod:`.tree` -- Tree-GRPO: trees grown within GRPO's tokens from fewer roots, every leaf trained on.
* :mod:`.ppo` -- PPO: turn-level GAE on the caller's critic, alone and with twin terms.
* :mod:`.igpo` -- IGPO: information-gain turn rewards on the gold answer, alone and with twin terms.
* :mod:`.at2po` -- AT2PO: an entropy-guided tree within GRPO's tokens, each turn credited with its node's value.
* :mod:`.allocation` -- Twice on batches grown by tree sampling or prefix-level allocation, at Twice's budget.
* :mod:`.exact` -- Exact A*: the credit lab's exact advantages themselves (a diagnostic).

Importing this package registers the built-in methods, in this order. None of them
touches a model or an env: the auxiliary rollouts a method's plan asks for are run by the
caller's engine (:class:`~.registry.Runners`).
"""

# isort: skip_file
# The order of these imports is the order of registration (and of every method list).
from twice_envs.agents.credit import grpo  # noqa: F401
from twice_envs.agents.credit import gigpo  # noqa: F401
from twice_envs.agents.credit import twice  # noqa: F401
from twice_envs.agents.credit import crr  # noqa: F401
from twice_envs.agents.credit import vineppo  # noqa: F401
from twice_envs.agents.credit import tree  # noqa: F401
from twice_envs.agents.credit import ppo  # noqa: F401
from twice_envs.agents.credit import igpo  # noqa: F401
from twice_envs.agents.credit import at2po  # noqa: F401
from twice_envs.agents.credit import allocation  # noqa: F401
from twice_envs.agents.credit import exact  # noqa: F401
from twice_envs.agents.credit.registry import (  # noqa: F401
    CreditContext, CreditMethod, CreditResult, Request, Rollout, Runners, get_method, methods, register_credit,
    run_credit,
)
