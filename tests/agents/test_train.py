"""The trainer on CreditToy-v0 with a small random policy: wiring, metrics, exact resume, eval,
safe checkpoints, run folders and progress lines."""

import json
from dataclasses import replace
import pickle

import numpy as np
import pytest
import torch

from twice_envs.agents.cli.train import eval_main
from twice_envs.agents.credit.registry import factual_group_size
from twice_envs.agents.credit.twice import TwiceConfig
from twice_envs.agents.models.load import load_run_policy
from twice_envs.agents.training.checkpoint import CheckpointError, read_checkpoint
from twice_envs.agents.training.config import read_run_config
from twice_envs.agents.training.trainer import (
    RunExistsError,
    TrainConfig,
    credit_generator,
    evaluate,
    keep_mixed_groups,
    mixed_group_share,
    progress_line,
    read_metrics,
    train,
)
from twice_envs.errors import DataFormatError

from .train_helpers import one_torch_thread, small_policy, toy_config  # noqa: F401


@pytest.fixture(scope="module")
def policy_factory():
    return lambda: small_policy(0)


def test_resume_continues_exactly(tmp_path, policy_factory):
    # seed 1: both of its updates carry signal (on seed 0 every return and twin ties, so no weight moves)
    straight = toy_config(tmp_path / "a", method="twice", updates=2, seed=1)
    m_straight = train(straight, policy=policy_factory(), progress=False)
    a_state = torch.load(tmp_path / "a" / "run" / "checkpoint" / "state.pt", weights_only=True)

    first = toy_config(tmp_path / "b", method="twice", updates=1, seed=1)
    train(first, policy=policy_factory(), progress=False)
    resumed = toy_config(tmp_path / "b", method="twice", updates=2, seed=1)
    m_resumed = train(resumed, policy=policy_factory(), progress=False, resume=True)
    b_state = torch.load(tmp_path / "b" / "run" / "checkpoint" / "state.pt", weights_only=True)

    assert len(m_resumed) == 1 and m_resumed[0]["update"] == 2
    for k in ("reward", "generated_tokens", "aux_tokens", "loss"):
        assert m_resumed[0][k] == m_straight[1][k], k
    for k, v in a_state["model"].items():
        assert torch.equal(v, b_state["model"][k]), k
    assert a_state["predictor"] == b_state["predictor"]
    assert a_state["rng"] == b_state["rng"]
    lines = (tmp_path / "b" / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(l)["update"] for l in lines] == [1, 2]
    # the update actually changed the weights
    init = policy_factory().model.state_dict()
    assert any(not torch.equal(v, a_state["model"][k]) for k, v in init.items())


@pytest.mark.parametrize("method", ["grpo", "crr", "vineppo", "tree-grpo", "tree-grpo-coupled", "at2po", "ppo-twice",
                                    "twice-tree", "twice-alloc"])
def test_every_method_trains_and_logs_its_metrics(tmp_path, policy_factory, method):
    m = train(toy_config(tmp_path, method=method, updates=1), policy=policy_factory(), progress=False)[0]
    for k in ("reward", "generated_tokens", "aux_tokens", "realised_beta", "loss", "kl", "time", "invalid_share"):
        assert k in m
    # the env's own measures: CreditToy reports its return
    assert m["measures"] == ["return"] and m["return"] == pytest.approx(m["reward"])
    assert 0.0 <= m["mixed_groups"] <= 1.0
    assert m["generated_tokens"] > 0
    if method == "grpo":
        assert m["aux_tokens"] == 0
    else:
        assert m["aux_tokens"] > 0
    if method == "crr":
        for k in ("mean_q", "branched_share", "aux_target", "aux_accounted"):
            assert k in m


def test_twice_logs_predictor_and_branching(tmp_path, policy_factory):
    cfg = toy_config(tmp_path, method="twice", updates=1)
    m = train(cfg, policy=policy_factory(), progress=False)[0]
    assert m["mean_q"] == pytest.approx(0.3) and m["warmup"] is True  # warm-up branching, flagged
    assert "predictor_auc" in m and "self_twin_share" in m and m["twins"] >= 1


def test_greedy_eval_reports_em_and_f1(policy_factory):
    cfg = TrainConfig(env="CreditToy-v0", indexed_tasks=False, max_new_tokens=3, max_turns=3)
    res = evaluate(policy_factory(), cfg, questions=3)
    assert res["n"] == 3 and 0.0 <= res["em"] <= 1.0 and "CreditToy-v0" in res["per_dataset"]


def test_config_round_trips_through_json(tmp_path):
    cfg = TrainConfig(credit=TwiceConfig(star=2))
    assert TrainConfig.from_json(json.loads(json.dumps(cfg.to_json()))) == cfg
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_json(), indent=1))
    assert read_run_config(tmp_path / "config.json") == cfg


@pytest.mark.parametrize("content, problem", [
    (b'{\n "env": "SearchQA-v0",\n oops\n}', r"config.json:3: invalid JSON"),
    (b"[1, 2]", r"config.json: expected a JSON object"),
    (b'{"envv": "SearchQA-v0"}', r"config.json: not a training config: .*envv"),
    (b"\xff\xfe{}", r"config.json: not UTF-8"),
])
def test_a_damaged_run_config_gives_an_error_naming_the_file(tmp_path, content, problem):
    (tmp_path / "config.json").write_bytes(content)
    with pytest.raises(DataFormatError, match=problem):
        read_run_config(tmp_path / "config.json")


# ----------------------------------------------------------------------------- checkpoints never run code


class _Payload:
    """Unpickling this creates ``marker``: what a crafted checkpoint would do with a shell command."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _crafted_run(root, marker):
    ckpt = root / "checkpoint"
    ckpt.mkdir(parents=True)
    torch.save({"format": 1, "model": _Payload(marker), "update": 1}, ckpt / "state.pt")
    return ckpt / "state.pt"


def test_the_crafted_payload_is_live(tmp_path):
    # guards the tests below: an unsafe load of the same file does create the marker
    marker = tmp_path / "ran"
    with open(_crafted_run(tmp_path / "run", marker), "rb") as f:
        torch.load(f, weights_only=False)
    assert marker.exists()


def test_a_crafted_checkpoint_is_refused_by_resume_eval_and_audit(tmp_path, policy_factory, capsys):
    from twice_envs.agents.lab.cli import audit_main
    from twice_envs.cli import main

    marker = tmp_path / "ran"
    file = _crafted_run(tmp_path / "run", marker)
    with pytest.raises(CheckpointError, match="refused to load.*Unsupported global: GLOBAL io.open") as err:
        read_checkpoint(file)
    assert str(file) in str(err.value)
    with pytest.raises(CheckpointError, match=str(file)):
        load_run_policy(tmp_path / "run")
    with pytest.raises(CheckpointError, match=str(file)):
        eval_main(["--checkpoint", str(tmp_path / "run")])
    with pytest.raises(CheckpointError, match=str(file)):
        audit_main(["--checkpoint", str(tmp_path / "run")])
    with pytest.raises(CheckpointError, match=str(file)):
        train(toy_config(tmp_path, updates=2), policy=policy_factory(), progress=False, resume=True)
    assert main(["eval", "--checkpoint", str(tmp_path / "run")]) == 1
    assert f"twice eval: error: {file}: refused to load" in capsys.readouterr().err
    assert main(["eval", "--checkpoint", str(tmp_path / "nowhere")]) == 1
    assert f"twice eval: error: no checkpoint at {tmp_path / 'nowhere'}" in capsys.readouterr().err
    assert not marker.exists()


def test_a_run_policy_needs_a_checkpoint_and_points_a_model_name_elsewhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no folder named like the model here
    with pytest.raises(CheckpointError, match="no checkpoint at tiny-webshop .*model name"):
        load_run_policy("tiny-webshop")
    with pytest.raises(CheckpointError, match=f"no checkpoint at {tmp_path}") as err:
        load_run_policy(tmp_path)
    assert "model name" not in str(err.value)


@pytest.mark.parametrize("content, problem", [
    (b"", "not a readable checkpoint"),
    (b"PK\x03\x04 truncated", "not a readable checkpoint"),
    (None, "missing optimizer"),
    (pickle.dumps([1, 2]), "refused to load: .*Unsupported operand"),
])
@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_a_damaged_checkpoint_gives_an_error_naming_the_file(tmp_path, content, problem):
    file = tmp_path / "state.pt"
    if content is None:
        torch.save({"model": {}}, file)
    else:
        file.write_bytes(content)
    with pytest.raises(CheckpointError, match=problem) as err:
        read_checkpoint(file)
    assert str(file) in str(err.value)


def test_a_checkpoint_holds_only_tensors_and_plain_values(tmp_path, policy_factory):
    train(toy_config(tmp_path, updates=1), policy=policy_factory(), progress=False)
    blob = read_checkpoint(tmp_path / "run" / "checkpoint" / "state.pt")
    assert blob["format"] == 1 and blob["update"] == 1 and blob["optimizer"]["state"]

    def walk(x):
        if isinstance(x, dict):
            assert all(isinstance(k, (str, int)) for k in x)
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        else:
            assert x is None or isinstance(x, (torch.Tensor, str, int, float, bool)), type(x)

    walk(blob)


# ----------------------------------------------------------------------------- run folders


def _updates(run):
    return [json.loads(l)["update"] for l in (run / "metrics.jsonl").read_text().splitlines()]


def test_training_into_a_used_run_folder_needs_resume_or_overwrite(tmp_path, policy_factory, capsys):
    from twice_envs.cli import main

    run = tmp_path / "run"
    train(toy_config(tmp_path, updates=2), policy=policy_factory(), progress=False)
    before = (run / "metrics.jsonl").read_bytes()
    with pytest.raises(RunExistsError, match="--resume.*--overwrite"):
        train(toy_config(tmp_path, updates=1), policy=policy_factory(), progress=False)
    assert (run / "metrics.jsonl").read_bytes() == before
    args = ["train", "--env", "twice_envs.agents.lab.toy:CreditToy-v0", "--out", str(run), "--updates", "1"]
    assert main(args) == 1
    assert f"{run} already holds a run" in capsys.readouterr().err
    assert (run / "metrics.jsonl").read_bytes() == before
    assert train(toy_config(tmp_path, updates=1), policy=policy_factory(), progress=False, overwrite=True)
    assert _updates(run) == [1] and read_checkpoint(run / "checkpoint" / "state.pt")["update"] == 1
    # an empty folder (or one without metrics rows and checkpoint) is not a run
    (tmp_path / "empty").mkdir()
    assert train(toy_config(tmp_path / "empty", updates=1), policy=policy_factory(), progress=False)


def test_resume_drops_a_damaged_last_metrics_line(tmp_path, policy_factory):
    run = tmp_path / "run"
    train(toy_config(tmp_path, updates=1), policy=policy_factory(), progress=False)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"update": 2, "method": "twi')  # killed while writing the next row
    with pytest.warns(RuntimeWarning, match=r"metrics.jsonl:2: dropping a damaged last line"):
        m = train(toy_config(tmp_path, updates=2), policy=policy_factory(), progress=False, resume=True)
    assert [r["update"] for r in m] == [2] and _updates(run) == [1, 2]


def test_resume_rejects_a_damaged_metrics_line_before_the_last(tmp_path, policy_factory):
    run = tmp_path / "run"
    train(toy_config(tmp_path, updates=2), policy=policy_factory(), progress=False)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text(lines[0][:20] + "\n" + lines[1] + "\n")
    with pytest.raises(DataFormatError, match=r"metrics.jsonl:1: not a metrics row"):
        train(toy_config(tmp_path, updates=3), policy=policy_factory(), progress=False, resume=True)


# ----------------------------------------------------------------------------- progress


def test_training_prints_a_line_per_update_to_stderr(tmp_path, policy_factory, capsys):
    m = train(toy_config(tmp_path, updates=2, eval_every=2), policy=policy_factory())
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2, err
    for k, (line, row) in enumerate(zip(err, m), 1):
        assert line.startswith(f"[twice] update {k}/2  reward {row['reward']:.3f}  return {row['return']:.3f}  "
                               f"invalid {100 * row['invalid_share']:.1f}%  ")
        assert f"tokens {row['generated_tokens']} (+{row['aux_tokens']} aux)" in line
        assert line.endswith(f"  {row['time']:.1f} s/update")
    assert f"dev return {m[1]['eval']['return']:.3f}" in err[1] and "dev " not in err[0]
    train(toy_config(tmp_path / "quiet", updates=1), policy=policy_factory(), progress=False)
    assert capsys.readouterr().err == ""


def test_mixed_groups_are_the_groups_whose_returns_differ():
    from types import SimpleNamespace as E

    eps = [E(group=0, utility=1.0), E(group=0, utility=1.0),  # all equal: no outcome credit
           E(group=1, utility=0.0), E(group=1, utility=0.5),  # graded returns differ
           E(group=2, utility=0.0), E(group=2, utility=0.0), E(group=2, utility=1.0)]
    assert mixed_group_share(eps) == pytest.approx(2 / 3)
    assert mixed_group_share(eps[:2]) == 0.0 and mixed_group_share([]) == 0.0


def test_keep_mixed_groups_drops_the_groups_whose_returns_agree():
    from types import SimpleNamespace as E

    eps = [E(group=0, utility=1.0), E(group=0, utility=1.0),
           E(group=1, utility=0.0), E(group=1, utility=0.5),
           E(group=2, utility=0.0), E(group=2, utility=0.0), E(group=2, utility=1.0)]
    assert keep_mixed_groups(eps) == eps[2:]
    assert keep_mixed_groups(eps[:2]) == [] and keep_mixed_groups([]) == []


def _spy_updates(monkeypatch, unanimous_batches: int):
    """Record the episodes each policy update trains on; the first ``unanimous_batches`` rollouts of the
    run end every episode with return 0 (no group carries outcome signal), later ones alternate 0 and 1
    within each group."""
    from twice_envs.agents.training import trainer as trainer_mod

    calls, trained = [], []
    real_rollout, real_update = trainer_mod.rollout, trainer_mod.policy_update

    def rollout(*a, **kw):
        eps = real_rollout(*a, **kw)
        calls.append(eps)
        for k, ep in enumerate(eps):
            ep.utility = 0.0 if len(calls) <= unanimous_batches else float(k % 2)
        return eps

    def update(state, episodes, advantages, config):
        trained.append((list(episodes), advantages))
        return real_update(state, episodes, advantages, config)

    monkeypatch.setattr(trainer_mod, "rollout", rollout)
    monkeypatch.setattr(trainer_mod, "policy_update", update)
    return calls, trained


@pytest.mark.parametrize("method", ["grpo", "twice"])
def test_filter_groups_draws_batches_until_enough_groups_carry_signal(tmp_path, policy_factory, monkeypatch, method):
    calls, trained = _spy_updates(monkeypatch, unanimous_batches=1)
    cfg = toy_config(tmp_path, method=method, updates=1, filter_groups=True, max_sample_batches=4)
    m = train(cfg, policy=policy_factory(), progress=False)[0]
    # the first batch is unanimous, the second has 3 mixed groups = questions_per_update: two batches drawn
    assert len(calls) == 2 and m["sample_batches"] == 2 and m["trained_groups"] == 3
    assert "trained on 3 groups of 2 batches" in progress_line(m, 1)
    episodes, advantages = trained[0]
    assert len(episodes) == 9 and {e.group for e in episodes} == {3, 4, 5}  # the second batch, renumbered
    assert [e.trajectory for e in episodes] == [e.trajectory for e in calls[1]]  # each keeps its own noise
    if method == "grpo":
        assert all(np.any(np.asarray(a) != 0) for a in advantages)
    # the metrics describe every episode sampled (18), not only those trained on
    assert m["turns"] == sum(len(e.turns) for b in calls for e in b) == 54
    assert m["mixed_groups"] == pytest.approx(0.5)


def test_filter_groups_trains_on_the_first_batch_when_no_batch_has_signal(tmp_path, policy_factory, monkeypatch):
    calls, trained = _spy_updates(monkeypatch, unanimous_batches=10)
    cfg = toy_config(tmp_path, method="grpo", updates=1, filter_groups=True, max_sample_batches=3)
    m = train(cfg, policy=policy_factory(), progress=False)[0]
    assert len(calls) == 3 and m["sample_batches"] == 3 and m["mixed_groups"] == 0.0
    assert [e.trajectory for e in trained[0][0]] == [e.trajectory for e in calls[0]]


def test_without_filter_groups_one_batch_is_drawn_and_trained_on(tmp_path, policy_factory, monkeypatch):
    calls, trained = _spy_updates(monkeypatch, unanimous_batches=1)
    m = train(toy_config(tmp_path, method="grpo", updates=1), policy=policy_factory(), progress=False)[0]
    assert len(calls) == 1 and m["sample_batches"] == 1 and len(trained[0][0]) == 9


def test_max_sample_batches_below_one_is_refused(tmp_path, policy_factory):
    with pytest.raises(ValueError, match="max_sample_batches must be >= 1, got 0"):
        train(toy_config(tmp_path, filter_groups=True, max_sample_batches=0), policy=policy_factory(), progress=False)


def test_a_method_with_more_rollouts_samples_that_many_times_the_group(tmp_path, policy_factory, monkeypatch):
    """``grpo-2x`` (registered with ``rollouts=2``) trains on 2 G episodes per task where GRPO trains on G."""
    from twice_envs.agents.training import trainer

    seen = {}
    real = trainer.rollout

    def spy(*a, **kw):
        eps = real(*a, **kw)
        seen[kw["group_size"]] = eps
        return eps

    monkeypatch.setattr(trainer, "rollout", spy)
    m1 = train(toy_config(tmp_path / "g", method="grpo", updates=1), policy=policy_factory(), progress=False)[0]
    m2 = train(toy_config(tmp_path / "g2", method="grpo-2x", updates=1), policy=policy_factory(), progress=False)[0]
    assert sorted(seen) == [3, 6]  # toy_config: 3 tasks x G = 3
    assert len(seen[3]) == 9 and len(seen[6]) == 18
    assert sorted({ep.group for ep in seen[6]}) == sorted({ep.group for ep in seen[3]})
    assert all(sum(ep.group == g for ep in seen[6]) == 6 for g in {ep.group for ep in seen[6]})
    # CreditToy plays every episode for its 3 turns: twice the episodes, twice the turns and about twice the tokens
    assert m2["turns"] == 2 * m1["turns"] == 54
    assert 1.5 < m2["generated_tokens"] / m1["generated_tokens"] < 2.5
    assert m2["aux_tokens"] == 0 and m2["method"] == "grpo-2x"


@pytest.mark.parametrize("method", ["twice-tree", "twice-alloc"])
def test_a_method_that_grows_the_batch_trains_on_every_episode_it_grew(tmp_path, policy_factory, monkeypatch, method):
    from twice_envs.agents.training import trainer as trainer_mod

    seen, real = [], trainer_mod.policy_update

    def spy(state, episodes, advantages, config):
        seen.append((list(episodes), advantages))
        return real(state, episodes, advantages, config)

    monkeypatch.setattr(trainer_mod, "policy_update", spy)
    cfg = toy_config(tmp_path, method=method, updates=1)
    m = train(cfg, policy=policy_factory(), progress=False)[0]
    episodes, advantages = seen[0]
    n = cfg.questions_per_update * factual_group_size(method, cfg.group_size)  # fewer roots than GRPO's G per task
    roots, grown = episodes[:n], episodes[n:]
    assert n < cfg.questions_per_update * cfg.group_size and len(grown) > 0 and all(e.prefix == 0 for e in roots)
    assert [len(a) for a in advantages] == [len(e.turns) for e in episodes]
    for g in grown:  # each grown episode copies a root's first turns
        assert any(r.group == g.group and [t.token_ids for t in r.turns[:g.prefix]] ==
                   [t.token_ids for t in g.turns[:g.prefix]] for r in roots)
    assert m["aux_tokens"] >= sum(e.num_generated_tokens for e in grown) > 0
    assert m["grown_episodes"] == len(grown) and (method != "twice-alloc" or 0.0 <= m["prompt_share"] <= 1.0)


def test_micro_batches_accumulate_to_the_same_step(tmp_path, policy_factory, monkeypatch):
    """``micro_batch`` splits each minibatch's forward/backward passes; the optimiser steps are the same."""
    import copy

    from twice_envs.agents.training import trainer as trainer_mod

    seen, real = [], trainer_mod.policy_update

    def spy(state, episodes, advantages, config):
        seen.append((copy.deepcopy(state), list(episodes), advantages, config))
        return real(state, episodes, advantages, config)

    monkeypatch.setattr(trainer_mod, "policy_update", spy)
    train(toy_config(tmp_path, method="grpo", updates=1), policy=policy_factory(), progress=False)
    state, episodes, _, config = seen[0]
    advantages = [np.full(len(e.turns), 1.0 if i % 3 else -1.5) for i, e in enumerate(episodes)]  # something to learn
    start = [p.detach().clone() for p in state.policy.model.parameters()]
    whole, split, unclipped, clipped = (copy.deepcopy(state) for _ in range(4))
    for st in (whole, split, unclipped, clipped):  # plain SGD: the parameter change is the gradient itself (Adam's first step is its sign)
        st.optimizer = torch.optim.SGD(st.policy.model.parameters(), lr=0.1)
        st.scheduler = torch.optim.lr_scheduler.LambdaLR(st.optimizer, lambda step: 1.0)
    m_whole = real(whole, episodes, advantages, config)
    m_split = real(split, episodes, advantages, replace(config, micro_batch=1))
    moved = 0.0
    for p0, a, b in zip(start, whole.policy.model.parameters(), split.policy.model.parameters()):
        torch.testing.assert_close(a - p0, b - p0, rtol=1e-4, atol=1e-7)
        moved = max(moved, float((a - p0).abs().max()))
    assert moved > 1e-5  # the parameters did move
    for k in ("loss", "pg_loss", "kl", "clip_frac", "grad_norm"):
        assert m_split[k] == pytest.approx(m_whole[k], rel=1e-4, abs=1e-7)
    # grad_norm is the norm before clipping: a clip far below it leaves the figure as it was
    # (one minibatch: a second one's gradient would depend on how far the first step moved)
    one = replace(config, minibatches=1)
    m_one = real(unclipped, episodes, advantages, one)
    m_clipped = real(clipped, episodes, advantages, replace(one, max_grad_norm=1e-9))
    assert m_one["grad_norm"] > 1e-3 and m_clipped["grad_norm"] == pytest.approx(m_one["grad_norm"], rel=1e-4)


def _drawn_batches(monkeypatch, tmp_path, policy, method: str, updates: int = 3) -> list:
    """The tasks and noise seed of every factual batch a run of ``method`` samples."""
    from twice_envs.agents.training import trainer as trainer_mod

    drawn, real = [], trainer_mod.rollout

    def rollout(policy, env, tasks, **kw):
        drawn.append(([(t.seed, sorted(t.options.items())) for t in tasks], kw["noise_seed"]))
        return real(policy, env, tasks, **kw)

    monkeypatch.setattr(trainer_mod, "rollout", rollout)
    train(toy_config(tmp_path / method, method=method, updates=updates), policy=policy, progress=False)
    monkeypatch.undo()
    return drawn


def test_methods_that_draw_coins_train_on_the_tasks_and_luck_grpo_does(tmp_path, policy_factory, monkeypatch):
    """The credit step's coins come from a generator of their own: a method that draws them samples the
    same tasks with the same noise seeds as GRPO at every update, so the training metrics of two methods
    pair update by update."""
    grpo = _drawn_batches(monkeypatch, tmp_path, policy_factory(), "grpo")
    assert len(grpo) == 3 and len({seed for _, seed in grpo}) == 3
    for method in ("twice", "crr"):
        assert _drawn_batches(monkeypatch, tmp_path, policy_factory(), method) == grpo, method


def test_each_update_names_its_batch_so_runs_pair_where_they_sampled_alike(tmp_path, policy_factory):
    """``batch`` in the metrics digests the tasks and noise an update sampled: equal for GRPO and Twice
    at every update, different between updates, and different for GRPO (2x), which samples 2 G episodes."""
    digests = {}
    for method in ("grpo", "twice", "grpo-2x"):
        train(toy_config(tmp_path / method, method=method, updates=2), policy=policy_factory(), progress=False)
        digests[method] = [r["batch"] for r in read_metrics(tmp_path / method / "run" / "metrics.jsonl")]
    assert digests["grpo"] == digests["twice"] and len(set(digests["grpo"])) == 2
    assert all(len(d) == 16 for d in digests["grpo"])
    assert not set(digests["grpo-2x"]) & set(digests["grpo"])


def test_the_credit_generator_is_keyed_by_seed_and_update():
    a = credit_generator(0, 1).random(4)
    assert np.array_equal(a, credit_generator(0, 1).random(4))
    assert not np.array_equal(a, credit_generator(0, 2).random(4))
    assert not np.array_equal(a, credit_generator(1, 1).random(4))


def test_a_run_that_chose_is_loaded_choosing(tmp_path, policy_factory):
    """``twice eval`` and a resumed run play as the run trained. Break: load_run_policy ignoring ``choose``."""
    policy = policy_factory()
    policy.model.save_pretrained(tmp_path / "model")
    policy.tokenizer.save_pretrained(tmp_path / "model")
    train(toy_config(tmp_path / "c", updates=1, choose="sum"), policy=policy, progress=False)
    train(toy_config(tmp_path / "g", updates=1), policy=policy_factory(), progress=False)
    chose, _ = load_run_policy(tmp_path / "c" / "run", model=str(tmp_path / "model"))
    wrote, _ = load_run_policy(tmp_path / "g" / "run", model=str(tmp_path / "model"))
    assert getattr(chose, "chooses", False) and chose.score == "sum"
    assert not getattr(wrote, "chooses", False)
