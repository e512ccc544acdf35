"""Credit estimators: pure functions from episodes (and their twins) to per-turn advantages.

* :mod:`.grpo` -- group-normalised episode return broadcast to every turn.
* :mod:`.twice` -- twin credit: branch and evidence coins, inverse-probability weights.
* :mod:`.budget` -- the square-root branching rule and the budget bisection.
* :mod:`.predictor` -- the discordance predictor that feeds the branching rule.
* :mod:`.crr` -- independent counterfactuals branched uniformly.
* :mod:`.vineppo` -- Monte Carlo values from forks.
* :mod:`.ablations` -- one-change variants of Twice, selected by name.

The trainer only calls these; none of them touches a model or an env.
"""
