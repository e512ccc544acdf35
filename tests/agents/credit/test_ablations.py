from dataclasses import asdict

import pytest

from twice_envs.agents.credit.ablations import ABLATIONS, apply_ablations
from twice_envs.agents.credit.twice import TwiceConfig


@pytest.mark.parametrize("name", sorted(ABLATIONS))
def test_each_ablation_changes_exactly_one_setting(name):
    base = asdict(TwiceConfig())
    changed = asdict(apply_ablations(TwiceConfig(), [name]))
    assert sum(base[k] != changed[k] for k in base) == 1


def test_unknown_ablation_names_the_choices():
    with pytest.raises(ValueError, match="independent-twins"):
        apply_ablations(TwiceConfig(), ["nope"])
