"""The twice_envs verl trainer hands the agent loop's per-turn fields to the estimator."""

import pytest

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")
torch = pytest.importorskip("torch")

from omegaconf import OmegaConf  # noqa: E402
from tensordict import NonTensorStack, TensorDict  # noqa: E402

from twice_envs.integrations.verl import trainer as trainer_mod  # noqa: E402

from .test_estimators import _batch, _expected_tokens, _twin_credit, _verl_inputs  # noqa: E402


class FakeQueue:
    """The two TransferQueue calls the advantage step makes, over one in-memory batch."""

    def __init__(self, data):
        self.data, self.put, self.asked = data, None, None

    def kv_batch_get(self, keys, partition_id, select_fields):
        self.asked = list(select_fields)
        return self.data.select(*select_fields).clone()

    def kv_batch_put(self, keys, partition_id, fields):
        self.put = fields
        return "batch"


def test_registered_under_its_trainer_mode():
    from verl.trainer.ppo.v1 import get_trainer_cls

    from twice_envs.integrations.verl import plugin  # noqa: F401

    assert get_trainer_cls("twice_envs") is trainer_mod.TwinCreditTrainer


def test_advantage_step_uses_extra_fields(monkeypatch):
    from twice_envs.agents.credit import twice

    episodes = _batch(7)
    plan, credit, a_hat = _twin_credit(episodes, 8)
    rewards, mask, uid, extra, rows = _verl_inputs(episodes, a_hat, pad=0)
    lengths = [len(r.response_ids) for r in rows]
    nested = lambda x: torch.nested.as_nested_tensor([x[b, :n] for b, n in enumerate(lengths)], layout=torch.jagged)
    data = TensorDict({"uid": NonTensorStack(*list(uid)), "response_mask": nested(mask), "rm_scores": nested(rewards),
                       "extra_fields": NonTensorStack(*extra)}, batch_size=[len(rows)])
    queue = FakeQueue(data)
    monkeypatch.setattr(trainer_mod, "tq", queue)
    t = object.__new__(trainer_mod.TwinCreditTrainer)
    t.config = OmegaConf.create({"algorithm": {"adv_estimator": "twice", "use_kl_in_reward": False}})
    batch = type("B", (), {"keys": [f"k{b}" for b in range(len(rows))], "partition_id": "train",
                           "__len__": lambda self: len(rows)})()
    assert t._compute_advantage(batch, {}) == "batch"
    assert "extra_fields" in queue.asked
    want = _expected_tokens(rows, twice.combine(episodes, plan.index, credit.a_hat, twice.TwiceConfig()), max(lengths))
    got = queue.put["advantages"].to_padded_tensor(0.0)
    assert torch.equal(got, want)
