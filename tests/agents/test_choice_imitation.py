"""Choice start models by imitation (twice_envs.agents.models.choice_imitation)."""

from __future__ import annotations

import json

import pytest

from tests.agents._tiny import tiny_dir, tiny_policy
from tests.agents.test_choice_rollout import MixedCoin  # noqa: F401  (registers MixedCoin-v0)
from twice_envs.agents.models import transcripts
from twice_envs.agents.models.choice_imitation import ImitationConfig, TeacherPolicy, imitate_choices
from twice_envs.agents.models.cli import models_main
from twice_envs.agents.rollout.episodes import Task, rollout
from twice_envs.agents.sampling.choice import ChoicePolicy
from twice_envs.agents.sampling.policy import HFPolicy, SamplingConfig


def _teacher(env, rng, skill):
    """Takes "right" where it is listed, else writes a word into the slot."""
    listed = env.last_info.get("admissible_actions") or []
    return "right" if "right" in listed else "say[hi]"


def test_the_teacher_plays_through_the_rollout_its_listed_turns_as_choices_of_its_action():
    tasks = [Task(s) for s in range(3)]
    teacher = TeacherPolicy(tiny_policy(), "MixedCoin-v0", tasks, noise_seed=5, agent=_teacher)
    eps = rollout(teacher, "MixedCoin-v0", tasks, group_size=1, sampling=SamplingConfig(max_new_tokens=4),
                  noise_seed=5, max_turns=6)
    chosen = [t for e in eps for t in e.turns if t.choice is not None]
    written = [t for e in eps for t in e.turns if t.choice is None]
    assert chosen and written and teacher.unmatched == 0
    assert all(t.text == "right" and t.choice["candidates"][t.choice["index"]] == "right" for t in chosen)
    assert all(t.text == "say[hi]" for t in written)
    # the shadow envs stayed with the rollout's: each took the same turns
    for g, e in enumerate(eps):
        shadow = next(env for env, _ in teacher.shadow.values() if env.trajectory.seed == e.seed)
        assert [a for a in shadow.trajectory.actions] == [t.text for t in e.turns]


def test_imitation_lowers_the_teachers_loss_and_writes_a_model_that_chooses(tmp_path, monkeypatch):
    """Break: the choice term left out of the loss -> -log pi(teacher's choice) falls by less than 0.3."""
    monkeypatch.setitem(transcripts.SCRIPTED_AGENTS, "MixedCoin-v0", "tests.agents.test_choice_imitation:_teacher")
    out = tmp_path / "chooser"
    cfg = ImitationConfig(env="MixedCoin-v0", episodes=6, steps=6, batch_size=3, lr=1e-2)
    figures = imitate_choices(str(tiny_dir()), str(out), cfg, log=lambda m: None)
    assert figures["chosen_turns"] > 0 and figures["loss_after"] < figures["loss_before"] - 0.05
    assert figures["choice_nll_after"] < figures["choice_nll_before"] - 0.3
    meta = json.loads((out / "twice_model.json").read_text())
    assert meta["choice_imitation"]["loss_after"] == figures["loss_after"]
    policy = ChoicePolicy(HFPolicy.from_pretrained(out))
    eps = rollout(policy, "MixedCoin-v0", [Task(0)], group_size=1, sampling=SamplingConfig(max_new_tokens=4),
                  noise_seed=1, max_turns=4)
    assert any(t.choice is not None for t in eps[0].turns)


@pytest.mark.parametrize("bad", [["--steps", "0"], ["--episodes", "-1"], ["--lr", "0"], ["--score", "max"]])
def test_bad_imitation_settings_are_named(bad, tmp_path, capsys):
    with pytest.raises(SystemExit):
        models_main(["imitate-choices", "--model", str(tiny_dir()), "--out", str(tmp_path / "m"), *bad])
    err = capsys.readouterr().err
    assert any(w in err for w in ("steps", "episodes", "lr", "score"))
