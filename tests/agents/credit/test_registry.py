"""One registry of credit methods: a method registered once appears everywhere methods are listed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from twice_envs.agents.credit import registry
from twice_envs.agents.credit.registry import CreditResult, get_method, register_credit, unregister_credit
from twice_envs.agents.credit.twice import TwiceConfig

from . import toy_method


@pytest.fixture
def zero_method():
    """A toy estimator: zero credit for every turn, registered for one test."""

    @register_credit("zero-test", display="Zero", description="zero credit everywhere (a test method)")
    def zero(episodes, rollouts, ctx):
        return CreditResult([np.zeros(len(ep.turns)) for ep in episodes])

    yield "zero-test"
    unregister_credit("zero-test")


def test_built_in_methods_are_registered_in_order():
    assert registry.methods()[:9] == ("grpo", "grpo-2x", "gigpo", "twice", "crr", "crr-added", "vineppo", "tree-grpo",
                                      "tree-grpo-coupled")
    assert get_method("twice").needs == {"twins"} and get_method("vineppo").needs == {"values"}


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
        register_credit("grpo")(lambda eps, rollouts, ctx: None)
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
    assert zero_method in table and "vineppo" in table  # its value rollouts run in verl's twin phase
    # grown batches, a critic, the gold answer and exact advantages are not verl's to serve
    assert not {"tree-grpo", "tree-grpo-coupled", "ppo", "igpo", "exact-advantage"} & set(table)
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


@pytest.fixture
def toy():
    """The toy method of :mod:`.toy_method`, registered for one test."""
    with toy_method.registered() as name:
        yield name


def test_a_toy_method_with_its_own_settings_is_a_complete_plug_in(toy, tmp_path, capsys):
    """Registered in a test file only, the toy's flag is in ``twice train --help``, it trains from its flag
    (saved in config.json), refuses another method's flag by name, and gets a lab audit row.
    Break: add_flags skipping config classes -> no --toy-test.scale; settings_from_flags ignoring the flags ->
    config.json's scale 1.0; the lab audit iterating a fixed list -> no toy row."""
    from twice_envs.agents.cli.train import train_main
    from twice_envs.agents.lab.runner import LabAuditConfig, run_lab_audit
    from twice_envs.agents.training.config import read_run_config
    from twice_envs.cli import main

    from ..train_helpers import small_policy

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert "--toy-test.scale" in out and "Multiplier of the toy's credit" in out and toy in out

    policy = small_policy(0)
    model_dir, run = tmp_path / "model", tmp_path / "run"
    policy.model.save_pretrained(model_dir)
    policy.tokenizer.save_pretrained(model_dir)
    args = ["--env", "CreditToy-v0", "--model", str(model_dir), "--updates", "2", "--questions", "2",
            "--group-size", "2", "--max-new-tokens", "3", "--no-progress", "--method", toy, "--out", str(run)]
    assert train_main(args + ["--toy-test.scale", "2.5"]) == 0
    assert read_run_config(run / "config.json").credit == toy_method.ToyConfig(scale=2.5)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows] == [1, 2] and all(r["aux_tokens"] > 0 for r in rows)  # its rollouts ran
    with pytest.raises(SystemExit):
        train_main(args + ["--twice.beta", "0.5", "--overwrite"])
    assert "--twice.beta is not a setting of --method toy-test" in capsys.readouterr().err

    res = run_lab_audit(LabAuditConfig(groups=6, pairs=(1,), vine_k=(1,), n_boot=20, warmup_batches=0))
    row = next(r for r in res.rows if r["method"] == toy)
    assert row["aux_tokens"] > 0 and np.isfinite(row["pearson"]["value"])


def test_the_toy_methods_setting_reaches_its_credit_phase(toy):
    """Break: run_credit dropping ctx.config -> both runs at the default scale."""
    from twice_envs.agents.credit.registry import CreditContext, run_credit
    from twice_envs.agents.lab import toy as lab_toy
    from twice_envs.agents.lab.runner import lab_step_fns

    policy = lab_toy.toy_policy()
    eps, envs = lab_toy.toy_rollouts(policy, 4, 3, noise_seed=2)
    one, three = (run_credit(get_method(toy), eps, CreditContext(policy=policy, noise_seed=7,
                                                                  runners=lab_step_fns(envs),
                                                                  config=toy_method.ToyConfig(scale=s)))
                  for s in (1.0, 3.0))
    assert any(np.any(a != 0) for a in one.advantages)
    for a, b in zip(one.advantages, three.advantages):
        np.testing.assert_allclose(3 * a, b)
    with pytest.raises(ValueError, match="'toy-test' takes ToyConfig, but the context's config is a TwiceConfig"):
        run_credit(get_method(toy), eps, CreditContext(policy=policy, runners=lab_step_fns(envs), config=TwiceConfig()))


def test_one_vocabulary_of_needs_for_registration_requests_and_errors():
    """Break: Request accepting any name -> the typo reaches a runner lookup instead of failing here."""
    from twice_envs.agents.credit.registry import NEEDS, RUNNER_NEEDS, CreditContext, Request

    assert set(RUNNER_NEEDS) <= set(NEEDS) and {"critic", "anchor_groups"} == set(NEEDS) - set(RUNNER_NEEDS)
    assert all(get_method(m).needs <= set(NEEDS) for m in registry.methods())
    with pytest.raises(ValueError, match="a request's need must be one of twins, counterfactuals, values"):
        Request("value_rollouts")
    with pytest.raises(ValueError, match=r"needs values rollouts \(need 'values'\), but the caller's engine runs none"):
        CreditContext().run(Request("values", {"k": 1}), [])
