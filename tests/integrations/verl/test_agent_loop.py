"""The twice_envs agent loop against a stub verl server backed by the transformers keyed sampler."""

import asyncio

import pytest

pytest.importorskip("verl")
torch = pytest.importorskip("torch")

from omegaconf import OmegaConf  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, DictConfigWrap  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

from twice_envs.agents.rollout.episodes import (  # noqa: E402
    BranchRequest,
    Task,
    branch_rollouts,
    rollout,
)
from twice_envs.agents.sampling.policy import GenerationRequest, SamplingConfig  # noqa: E402
from twice_envs.agents.types import EpisodeRecord  # noqa: E402
from twice_envs.integrations.episodes import response_row  # noqa: E402
from twice_envs.integrations.verl import estimators as est  # noqa: E402
from twice_envs.integrations.verl.agent_loop import (  # noqa: E402
    ServerPolicy,
    TwiceAgentLoop,
    sampling_of,
    task_extra_info,
)
from twice_envs.keys import NoiseKey  # noqa: E402

TASK = Task(2, {"split": "train", "index": 2})
MAX_NEW = 96


class KeyedStubServer:
    """verl's ``server_manager.generate`` answered by the project's transformers keyed sampler."""

    def __init__(self, policy):
        self.policy, self.keys = policy, []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        extra = sampling_params["extra_args"]
        key = NoiseKey(*extra["twice_key"])
        self.keys.append(tuple(key))
        sampling = SamplingConfig(temperature=extra["twice_temperature"], top_p=extra["twice_top_p"],
                                  max_new_tokens=sampling_params["max_tokens"], key_mode=extra["twice_key_mode"])
        req = GenerationRequest(list(prompt_ids), key, tuple(sampling_params.get("stop") or ()),
                                extra["twice_token_counter"])
        g = self.policy.generate([req], sampling)[0]
        return TokenOutput(token_ids=g.token_ids, log_probs=g.logprobs)


@pytest.fixture(scope="module")
def tiny():
    from twice_envs.agents.models.load import load_policy

    return load_policy("tiny")


def _loop(tiny, server, **settings):
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"response_length": 4096, "prompt_length": 2048}}})
    return TwiceAgentLoop(trainer_config=DictConfigWrap(config), server_manager=server, tokenizer=tiny.tokenizer,
                          processor=None, dataset_cls=None, data_config=DictConfigWrap(OmegaConf.create({})),
                          env_id="SearchQA-v0", max_turns=3, max_new_tokens=MAX_NEW, **settings)


def _run(loop):
    return asyncio.run(loop.run({"temperature": 1.0, "top_p": 1.0}, extra_info=task_extra_info(TASK.seed, TASK.options),
                                uid="prompt-7", session_id=1, global_steps=0))


@pytest.fixture(scope="module")
def played(tiny):
    server = KeyedStubServer(tiny)
    out = _run(_loop(tiny, server, method="twice"))
    return server, out


def test_output_is_the_cpu_rollout_of_the_same_keys(tiny, played):
    _, out = played
    assert isinstance(out, AgentLoopOutput)
    ef = out.extra_fields
    ref = rollout(tiny, "SearchQA-v0", [TASK], group_size=1, sampling=SamplingConfig(max_new_tokens=MAX_NEW),
                  noise_seed=int(ef["twice_noise_seed"]), max_turns=3)[0]
    row = response_row(ref)
    assert out.prompt_ids == row.prompt_ids and out.response_ids == row.response_ids
    assert out.response_logprobs == pytest.approx(row.logprobs, abs=1e-5)
    assert out.reward_score == ref.utility
    assert ef["twice_noise_keys"] == [list(t.noise_key) for t in ref.turns]
    assert ef["twice_digests"] == [t.digest for t in ref.turns] and all(ef["twice_digests"])


def test_response_mask_excludes_observation_tokens(played):
    _, out = played
    mask, ids, turn_of = out.response_mask, out.response_ids, out.extra_fields[est.TURN_OF_TOKEN]
    assert 0 in mask and 1 in mask
    assert [m for m in mask] == [int(t >= 0) for t in turn_of]
    # the masked tokens are exactly the observations' tokens, in order
    n_turns = len(out.extra_fields["twice_noise_keys"])
    assert n_turns >= 2, "pick a task whose episode has several turns"
    obs_tokens = [tok for tok, m in zip(ids, mask) if m == 0]
    assert len(obs_tokens) > 0 and len(obs_tokens) == len(ids) - sum(mask)


def test_the_loop_plays_the_factual_episode_only_and_carries_its_record(tiny, played):
    """No twins in the loop (the trainer plans them over the whole batch): every request is a factual
    turn (branch 0), and the row carries the full record and the sampling that rebuild and fork it."""
    server, out = played
    ef = out.extra_fields
    n = len(ef["twice_noise_keys"])
    assert sorted({(k[1], k[2]) for k in server.keys}) == [(t, 0) for t in range(n)]
    assert est.TURN_CREDIT not in ef
    ep = EpisodeRecord.from_json(ef[est.EPISODE])
    ref = rollout(tiny, "SearchQA-v0", [TASK], group_size=1, sampling=SamplingConfig(max_new_tokens=MAX_NEW),
                  noise_seed=int(ef["twice_noise_seed"]), max_turns=3)[0]
    got, want = ep.to_json(), ref.to_json()
    for a, b in zip(got["turns"], want["turns"]):  # the server's log-probs are float32; it reports no entropy
        assert a.pop("logprobs") == pytest.approx(b.pop("logprobs"), abs=1e-5)
        assert a.pop("entropy") == 0.0 and b.pop("entropy") > 0
    assert got == want
    assert SamplingConfig(**ef[est.SAMPLING]) == SamplingConfig(max_new_tokens=MAX_NEW)
    assert ef[est.ENV_ID] == "SearchQA-v0"


def test_planning_settings_belong_to_the_trainer(tiny):
    with pytest.raises(ValueError, match="algorithm.twice"):
        _loop(tiny, KeyedStubServer(tiny), method="twice", twice={"warmup_q": 1.0})
    loop = _loop(tiny, KeyedStubServer(tiny), method="twice", twice={"key_mode": "flat"})
    assert loop.key_mode == "flat"


def test_greedy_validation_requests_are_greedy():
    """verl validates with temperature 0: the loop samples greedily rather than rejecting it."""
    s = sampling_of({"temperature": 0.0, "top_p": 1.0}, 32, "line")
    assert s.greedy and s.max_new_tokens == 32
    assert not sampling_of({"temperature": 0.7}, 32, "line").greedy


def test_a_self_twin_through_the_server_reproduces_the_factual_tokens(tiny, played):
    """A coupled twin forced to the factual first turn continues with exactly the factual tokens."""
    server, out = played
    ef = out.extra_fields
    ep = rollout(tiny, "SearchQA-v0", [TASK], group_size=1, sampling=SamplingConfig(max_new_tokens=MAX_NEW),
                 noise_seed=int(ef["twice_noise_seed"]), max_turns=3)[0]

    async def twin():
        policy = ServerPolicy(server, tiny.tokenizer, asyncio.get_running_loop())
        return await asyncio.get_running_loop().run_in_executor(
            None, lambda: branch_rollouts(policy, [ep], [BranchRequest(0, 0, branch=1, action=ep.turns[0].text)],
                                          sampling=SamplingConfig(max_new_tokens=MAX_NEW),
                                          detect_self_twins=False)[0])

    tw = asyncio.run(twin())
    assert len(tw.turns) == len(ep.turns) >= 2
    assert [t.token_ids for t in tw.turns[1:]] == [t.token_ids for t in ep.turns[1:]]
    assert tw.utility == ep.utility


def test_a_row_without_a_task_is_a_clear_error(tiny):
    loop = _loop(tiny, KeyedStubServer(tiny), method="grpo")
    with pytest.raises(ValueError, match="twice_task"):
        asyncio.run(loop.run({"temperature": 1.0}, extra_info={}, uid="u", session_id=0))
