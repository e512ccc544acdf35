"""Section (b): a forged divergence is not taken for float error; token agreement of two generations."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from twice_envs.agents.gpu_check.context import CPU_SIZES, Context  # noqa: E402
from twice_envs.agents.gpu_check.tokens import compare_rows, explain_divergence, make_requests  # noqa: E402
from twice_envs.agents.sampling.policy import SamplingConfig  # noqa: E402


def test_a_forged_divergence_is_not_float_error(tmp_path):
    ctx = Context(cpu_mode=True, device="cpu", sizes=CPU_SIZES, work=tmp_path)
    policy = ctx.policy("cpu", "float32")
    request = make_requests(ctx.tokenizer(), 1)[0]
    for greedy in (False, True):
        sampling = SamplingConfig(temperature=1.0, top_p=0.95, max_new_tokens=3, greedy=greedy)
        ref = policy.generate([request], sampling)[0].token_ids
        forged = [(ref[0] + 1) % policy.vocab_size, *ref[1:]]
        d = explain_divergence(policy, policy, request, sampling, ref, forged, 0)
        assert d["logit_diff_max"] == 0.0 and d["explained"] is False, d
        same = explain_divergence(policy, policy, request, sampling, ref, ref, 0)
        assert same["gap"] == 0.0 and same["explained"] is True


def test_compare_rows():
    cmp = compare_rows([[1, 2, 3], [4, 5], [6, 7]], [[1, 2, 3], [4, 9], [6]])
    assert cmp["first_divergence"] == [None, 1, 1]
    assert (cmp["tokens_identical"], cmp["tokens"], cmp["rows_identical"]) == (5, 7, 1)
