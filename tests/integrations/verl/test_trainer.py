"""The twice_envs verl trainer: the batch twin phase (plan, twins through the server, predictor) and advantages."""

import json

import numpy as np
import pytest

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")
torch = pytest.importorskip("torch")

from omegaconf import OmegaConf  # noqa: E402
from tensordict import NonTensorStack, TensorDict  # noqa: E402

from twice_envs.agents.credit import crr, grpo, predictor, twice  # noqa: E402
from twice_envs.integrations.episodes import response_row  # noqa: E402
from twice_envs.integrations.verl import estimators as est  # noqa: E402
from twice_envs.integrations.verl import trainer as trainer_mod  # noqa: E402
from twice_envs.integrations.verl import twin_phase  # noqa: E402

from . import stubs  # noqa: E402
from .test_estimators import _batch, _expected_tokens, _twin_credit, _verl_inputs  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer():
    from twice_envs.agents.models.load import load_policy

    return load_policy("tiny").tokenizer


def _trainer(server, tokenizer, method="twice", **twice_settings):
    t = object.__new__(trainer_mod.TwinCreditTrainer)
    t.config = OmegaConf.create({"algorithm": {"adv_estimator": method, "use_kl_in_reward": False,
                                               "twice": twice_settings},
                                 "trainer": {"default_local_dir": "ckpt", "resume_mode": "auto"}})
    t.init_twin_state()
    t.tokenizer, t._llm_client, t.global_steps = tokenizer, server, 1
    return t


def _step(t, monkeypatch, server, tokenizer, step, uids=("p0", "p1", "p2"), group_size=3):
    """Play a batch through the agent loop, then run the trainer's twin phase on it: ``(phase, queue, keys)``."""
    loop = stubs.agent_loop(tokenizer, server)
    keys, outputs, row_uids = stubs.play_batch(loop, [f"{u}-step{step}" for u in uids], group_size, step)
    queue = stubs.queue_rows(keys, outputs, row_uids)
    monkeypatch.setattr(trainer_mod, "tq", queue)
    t.global_steps = step
    return t.twin_phase(stubs.Batch(keys)), queue, keys


def test_registered_under_its_trainer_mode():
    from verl.trainer.ppo.v1 import get_trainer_cls

    from twice_envs.integrations.verl import plugin  # noqa: F401

    assert get_trainer_cls("twice_envs") is trainer_mod.TwinCreditTrainer


def test_lambda_is_solved_once_over_the_batch(tokenizer, monkeypatch):
    """The plan's expected accounted twin tokens are beta x the batch's policy tokens, with one lambda for
    every decision of the batch (the square-root rule), not one per episode."""
    server = stubs.ScriptedServer(tokenizer)
    t = _trainer(server, tokenizer, warmup_updates=0, beta=0.5)
    phase, _, _ = _step(t, monkeypatch, server, tokenizer, step=1)
    memo, factual = phase.rollouts[0].request.memo, phase.factual
    plan, cfg, eta = memo.plan, memo.config, memo.eta
    unit = plan.unit_costs(cfg)  # c_t for every twin and replica, net of the predicted self-twins
    assert len(plan.index) == sum(len(ep.turns) for ep in factual) and len(factual) == 9
    assert np.dot(plan.q, unit) == pytest.approx(cfg.beta * twice.policy_tokens(factual), rel=1e-9)
    one_lambda = np.clip(plan.lam * np.sqrt(eta / unit), cfg.q_min, 1.0)
    assert plan.q == pytest.approx(one_lambda, rel=1e-12)
    assert 0 < plan.branched.sum() < len(plan.index) and 0 < plan.q.min() and plan.q.max() < 1
    metrics = twin_phase.phase_metrics(phase)
    assert metrics["twice/aux_planned"] == pytest.approx(metrics["twice/aux_target"], rel=1e-9)
    # the episodes' costs differ, so a lambda per episode would differ from episode to episode
    rows = {i: [r for r, (j, _) in enumerate(plan.index) if j == i] for i in range(len(factual))}
    lams = [twice.plan_branches([ep], cfg, eta[rows[i]], np.random.default_rng(0), update=1).lam
            for i, ep in enumerate(factual)]
    assert np.ptp(lams) > 1e-3 * np.mean(lams)


def test_twins_of_the_plan_run_through_the_server(tokenizer, monkeypatch):
    """Each branched decision gets its twin, sampled on branch 1 of its turn through the LLM client,
    and the twin results are kept per row for the advantage step."""
    server = stubs.ScriptedServer(tokenizer)
    t = _trainer(server, tokenizer, warmup_updates=0)
    phase, _, keys = _step(t, monkeypatch, server, tokenizer, step=1)
    branched = phase.rollouts[0].request.memo.plan.branched_decisions
    assert sorted(tw.twin_of for tw in phase.twins) == sorted(branched)
    twin_keys = {k for k in server.keys if k[2] == 1}
    noise = {i: int(ep.trajectory["noise"]["episode_seed"]) for i, ep in enumerate(phase.factual)}
    assert twin_keys == {(noise[i], tt, 1) for i, tt in branched}
    assert set(t._twin_rows) == set(keys)
    row = t._twin_rows[keys[branched[0][0]]]
    assert branched[0][1] in row["twice_branched"] and len(row[est.TURN_CREDIT]) == len(row["twice_branch_q"])
    assert row[est.TURN_CREDIT] == list(phase.result.advantages[branched[0][0]])


def test_the_predictor_fitted_on_step_k_plans_step_k_plus_1(tokenizer, monkeypatch):
    """Step k's predictor fit sees step k's twins; its result is the trainer's state and the state that
    plans step k + 1 (the first step plans with the untrained prior)."""
    planned, fitted = [], []
    plan_batch, fit_predictor = twice.plan_batch, twice.fit_predictor

    def plan_spy(factual, config, state, rng, *, update):
        planned.append(state.to_json())
        return plan_batch(factual, config, state, rng, update=update)

    def fit_spy(state, factual, plan, X, eta, credit, config, rng):
        out = fit_predictor(state, factual, plan, X, eta, credit, config, rng)
        fitted.append({"plan": plan, "credit": credit, "state": out[0].to_json()})
        return out

    monkeypatch.setattr(twice, "plan_batch", plan_spy)
    monkeypatch.setattr(twice, "fit_predictor", fit_spy)
    server = stubs.ScriptedServer(tokenizer)
    t = _trainer(server, tokenizer, warmup_updates=0)
    prior = predictor.PredictorState().to_json()
    phases = [_step(t, monkeypatch, server, tokenizer, step=k)[0] for k in (1, 2)]
    assert len(planned) == len(fitted) == 2
    assert planned[0] == prior
    for k, phase in enumerate(phases):
        # the fit of step k saw step k's plan and one (U, U') pair per twin of step k
        assert fitted[k]["plan"] is phase.rollouts[0].request.memo.plan
        assert len(fitted[k]["credit"].pairs) == len(phase.twins) > 0
        assert phase.state.to_json() == fitted[k]["state"]
    assert fitted[0]["state"] != prior and fitted[0]["state"]["updates"] == 1
    assert planned[1] == fitted[0]["state"]
    assert t.predictor_state.to_json() == fitted[1]["state"] and t.predictor_state.updates == 2
    # step 2's eta is the fitted predictor's, not the prior's 0.5
    fitted_state = predictor.PredictorState.from_json(fitted[0]["state"])
    memo = phases[1].rollouts[0].request.memo
    assert memo.eta == pytest.approx(predictor.predict(fitted_state, memo.features))
    assert np.abs(memo.eta - 0.5).max() > 1e-3


def test_crr_through_verl_replaces_branched_turns_with_u_minus_u_prime(tokenizer, monkeypatch):
    """Published CRR: a branched turn's advantage is U - U' of its independent counterfactual, every
    other turn keeps GRPO's A_traj."""
    server = stubs.ScriptedServer(tokenizer)
    t = _trainer(server, tokenizer, method="crr")
    phase, queue, keys = _step(t, monkeypatch, server, tokenizer, step=1)
    factual, cfs = phase.factual, phase.twins
    assert cfs and all(not tw.coupled for tw in cfs)
    assert t._compute_advantage(stubs.Batch(keys), {}) == "batch"
    got = queue.put["advantages"].to_padded_tensor(0.0)
    a_traj = grpo.episode_advantages([ep.utility for ep in factual], [ep.group for ep in factual])
    u_prime = {tuple(tw.twin_of): tw.utility for tw in cfs}
    want = [[ep.utility - u_prime[(i, tt)] if (i, tt) in u_prime else a_traj[i]
             for tt in range(len(ep.turns))] for i, ep in enumerate(factual)]
    assert want == [list(a) for a in crr.crr_advantages(factual, cfs)]
    rows = [response_row(ep) for ep in factual]
    assert torch.equal(got, _expected_tokens(rows, want, got.shape[1]))
    # the batch is not degenerate: branched turns whose U - U' differs from A_traj, unbranched turns with A_traj != 0
    assert any(want[i][tt] != a_traj[i] for i, tt in u_prime)
    assert any(a_traj[i] != 0 and (i, tt) not in u_prime for i, ep in enumerate(factual) for tt in range(len(ep.turns)))


def test_the_sampler_runs_the_twin_phase_on_training_batches_only():
    calls = []

    class Inner:
        poll_interval = 7

        def sample(self, global_steps, partition_id, batch_size):
            return f"{partition_id}-batch", {"inner": 1.0}

    sampler = trainer_mod.TwinPhaseSampler(Inner(), lambda batch: calls.append(batch) or {"twice/x": 2.0})
    assert sampler.sample(global_steps=1, partition_id="train", batch_size=4) == ("train-batch",
                                                                                  {"inner": 1.0, "twice/x": 2.0})
    assert sampler.sample(global_steps=1, partition_id="val", batch_size=4) == ("val-batch", {"inner": 1.0})
    assert calls == ["train-batch"] and sampler.poll_interval == 7


def test_the_predictor_state_is_checkpointed(tmp_path, monkeypatch):
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    t = _trainer(None, None)
    t.config.trainer.default_local_dir = str(tmp_path)
    t.predictor_state = predictor.PredictorState(weights=np.arange(predictor.NUM_FEATURES) / 10, bias=0.3, updates=4)
    t.global_steps = 4
    monkeypatch.setattr(PPOTrainer, "_save_checkpoint", lambda self: None)
    t._save_checkpoint()
    saved = json.loads((tmp_path / "global_step_4" / trainer_mod.PREDICTOR_FILE).read_text())
    assert saved == t.predictor_state.to_json()

    fresh = _trainer(None, None)
    fresh.config.trainer.default_local_dir = str(tmp_path)

    def load(self):
        self.global_steps = 4

    monkeypatch.setattr(PPOTrainer, "_load_checkpoint", load)
    fresh._load_checkpoint()
    assert fresh.predictor_state.to_json() == saved


def test_advantage_step_uses_extra_fields_and_the_twin_rows(monkeypatch):
    """The agent loop's fields come from the queue, each turn's credit from the twin phase's rows (the
    trainer computes it now; the agent loop plays factual episodes only)."""
    episodes = _batch(7)
    plan, credit, _ = _twin_credit(episodes, 8)
    per_turn = twice.combine(episodes, plan.index, credit.a_hat, twice.TwiceConfig())
    rewards, mask, uid, extra, rows = _verl_inputs(episodes, pad=0)
    twin_rows = [{est.TURN_CREDIT: [float(a) for a in adv]} for adv in per_turn]
    lengths = [len(r.response_ids) for r in rows]
    nested = lambda x: torch.nested.as_nested_tensor([x[b, :n] for b, n in enumerate(lengths)], layout=torch.jagged)
    keys = [f"k{b}" for b in range(len(rows))]
    data = TensorDict({"uid": NonTensorStack(*list(uid)), "response_mask": nested(mask), "rm_scores": nested(rewards),
                       "extra_fields": NonTensorStack(*extra)}, batch_size=[len(rows)])
    queue = stubs.FakeQueue(keys, data)
    monkeypatch.setattr(trainer_mod, "tq", queue)
    t = _trainer(None, None)
    with pytest.raises(RuntimeError, match="no twin results"):
        t._compute_advantage(stubs.Batch(keys), {})
    t._twin_rows = dict(zip(keys, twin_rows))
    assert t._compute_advantage(stubs.Batch(keys), {}) == "batch"
    assert "extra_fields" in queue.asked[-1] and t._twin_rows == {}
    want = _expected_tokens(rows, per_turn, max(lengths))
    got = queue.put["advantages"].to_padded_tensor(0.0)
    assert torch.equal(got, want)


def test_a_toy_method_registered_in_a_test_runs_through_the_twin_phase(tokenizer, monkeypatch):
    """The toy method (tests/agents/credit/toy_method.py) asks for value rollouts: verl's twin phase runs them
    through the server and its credit reaches the advantages, with no name of it anywhere in the trainer.
    Break: runs_phase keyed by a list of names -> the toy batch gets no twin phase."""
    from tests.agents.credit import toy_method
    from twice_envs.agents.credit.vineppo import vine_credit

    with toy_method.registered() as name:
        assert est.runs_phase(name) and name in est.verl_estimators()
        server = stubs.ScriptedServer(tokenizer)
        t = _trainer(server, tokenizer, method=name)
        t.config.algorithm[name] = {"scale": 2.0}
        phase, queue, keys = _step(t, monkeypatch, server, tokenizer, step=1)
        values = phase.rollouts[0].result
        assert phase.rollouts[0].request.need == "values" and values.records and values.aux_tokens > 0
        want = [2.0 * a for a in vine_credit(phase.factual, values.records)]
        assert all(np.allclose(a, w) for a, w in zip(phase.result.advantages, want))
        assert t._compute_advantage(stubs.Batch(keys), {}) == "batch"
        got = queue.put["advantages"].to_padded_tensor(0.0)
        rows = [response_row(ep) for ep in phase.factual]
        assert torch.allclose(got, _expected_tokens(rows, want, got.shape[1]))
