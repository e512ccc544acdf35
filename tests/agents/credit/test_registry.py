"""One registry of credit methods: a method registered once appears everywhere methods are listed."""

from __future__ import annotations

import numpy as np
import pytest

from twice_envs.agents.credit import registry
from twice_envs.agents.credit.registry import CreditResult, get_method, register_credit, unregister_credit


@pytest.fixture
def zero_method():
    """A toy estimator: zero credit for every turn, registered for one test."""

    @register_credit("zero-test", display="Zero", description="zero credit everywhere (a test method)")
    def zero(episodes, ctx):
        return CreditResult([np.zeros(len(ep.turns)) for ep in episodes])

    yield "zero-test"
    unregister_credit("zero-test")


def test_built_in_methods_are_registered_in_order():
    assert registry.methods()[:9] == ("grpo", "grpo-2x", "gigpo", "twice", "crr", "crr-added", "vineppo", "tree-grpo",
                                      "tree-grpo-coupled")
    assert get_method("twice").needs == {"twins"} and get_method("vineppo").needs == {"value_rollouts"}


def test_rollouts_default_to_one_and_grpo_2x_doubles_them():
    assert get_method("grpo").rollouts == 1 and get_method("twice").rollouts == 1
    m = get_method("grpo-2x")
    assert (m.rollouts, m.display, m.needs, m.benches) == (2, "GRPO (2x)", frozenset(), ("learn", "games"))
    assert "grpo-2x" in registry.methods("learn") and "grpo-2x" in registry.methods("games")


@pytest.mark.parametrize("bad", [0, -1, 1.5, 2.0, True, "2", None])
def test_rollouts_must_be_an_integer_of_at_least_one(bad):
    with pytest.raises(ValueError, match="rollouts must be an integer >= 1"):
        register_credit("x-test", rollouts=bad)
    assert "x-test" not in registry.methods()


def test_a_method_with_more_rollouts_is_not_a_verl_estimator():
    pytest.importorskip("torch")
    from twice_envs.integrations.verl import estimators

    table = estimators.estimators()
    assert "grpo" in table and "grpo-2x" not in table  # verl's rollout.n sets the group size


def test_bad_registrations_and_unknown_names_are_refused():
    with pytest.raises(ValueError, match="already registered"):
        register_credit("grpo")(lambda eps, ctx: None)
    with pytest.raises(ValueError, match="unknown needs"):
        register_credit("x-test", needs=("telepathy",))
    with pytest.raises(ValueError, match="Did you mean 'twice'"):
        get_method("twise")


def test_a_registered_method_appears_in_train_help(zero_method, capsys):
    from twice_envs.cli import main

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert zero_method in capsys.readouterr().out


def test_a_registered_method_gets_a_lab_audit_row(zero_method):
    from twice_envs.agents.lab.runner import LabAuditConfig, run_lab_audit

    res = run_lab_audit(LabAuditConfig(groups=6, pairs=(1,), vine_k=(1,), n_boot=20, warmup_batches=0))
    row = next(r for r in res.rows if r["method"] == zero_method)
    # zero credit is never of the right sign: every decision that counts is a zero credit
    assert row["zero_credit"]["value"] == pytest.approx(1.0)


def test_a_registered_method_is_a_verl_estimator(zero_method):
    torch = pytest.importorskip("torch")
    from twice_envs.integrations.verl import estimators

    table = estimators.estimators()
    assert zero_method in table and "vineppo" not in table  # value rollouts only run in the project's loop
    assert "tree-grpo" not in table and "tree-grpo-coupled" not in table  # so do their siblings (no estimator)
    mask = torch.ones(2, 3)
    rewards = torch.tensor([[0, 0, 1.0], [0, 0, 0.0]])
    adv, _ = table[zero_method](rewards, mask, index=["a", "a"])
    assert torch.equal(adv, torch.zeros(2, 3))
    # the same table without the zero method: a real method gives non-zero advantages there
    adv, _ = table["grpo"](rewards, mask, index=["a", "a"])
    assert adv.abs().sum() > 0


def test_check_env_refuses_a_forking_method_on_an_env_that_cannot_fork_by_name():
    from twice_envs.agents.credit.registry import check_env

    check_env("tree-grpo", "SearchToy-v0")  # registered: forks
    with pytest.raises(ValueError, match=r"'tree-grpo'.*'Unregistered-v0' cannot fork"):
        check_env("tree-grpo", "Unregistered-v0")
    check_env("grpo", "Unregistered-v0")  # GRPO forks nothing
