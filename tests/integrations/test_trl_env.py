"""TRL's env-owned API (``environment_factory``) over twice envs, through GRPOTrainer's own rollout path
(CPU, the tiny model with TRL's Qwen3 chat template so tools can be rendered and parsed)."""

import json
import runpy
from pathlib import Path

import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")
pytest.importorskip("jmespath")  # TRL's tool-call parsing on transformers < 5.13

import twice_envs  # noqa: E402
from twice_envs.errors import TwiceError  # noqa: E402
from twice_envs.integrations import trl as twice_trl  # noqa: E402
from twice_envs.integrations.trl_env import Env, RowError, seed_dataset, start_of  # noqa: E402

G = 2


def _trainer(tmp_path, factory, dataset, length=32):
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_chat_template

    from twice_envs.agents.models.load import load_policy

    torch.manual_seed(0)
    policy = load_policy("tiny")
    policy.tokenizer.chat_template = qwen3_chat_template  # the tiny model's own template has no tool calls
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=G, max_steps=1,
                      max_completion_length=length, learning_rate=1e-3, beta=0.0, use_cpu=True, report_to=[],
                      save_strategy="no", seed=0, gradient_checkpointing=False)
    return GRPOTrainer(model=policy.model, args=args, train_dataset=dataset, processing_class=policy.tokenizer,
                       environment_factory=factory)


def _rows(dataset, n):
    """The first ``n`` rows, each repeated G times, as TRL's sampler hands them to a batch."""
    return [dict(dataset[i]) for i in range(n) for _ in range(G)]


def test_generations_of_a_row_start_from_one_state_and_the_env_owns_the_reward(tmp_path):
    dataset = seed_dataset(2, start=5)
    trainer = _trainer(tmp_path, Env("SearchQA-v0"), dataset)
    assert {t.__name__ for t in trainer.tools} == {"search", "answer"}
    assert trainer.reward_func_names == ["SearchQA_v0"]  # get_reward is the (only) reward source
    trainer.model.train()
    out = trainer._generate_and_score_completions(_rows(dataset, 2))
    digests = [e.env.trajectory.digests[0] for e in trainer.environments]
    for seed, group in zip((5, 6), (digests[:G], digests[G:])):
        expected = twice_envs.make("SearchQA-v0")
        expected.reset(seed=seed)
        assert group == [expected.trajectory.digest] * G
    assert digests[0] != digests[G]
    # the first observation is the prompt: it reached the model's input
    prompt_text = trainer.processing_class.decode(out["prompt_ids"][0], skip_special_tokens=True)
    assert "Question:" in prompt_text


def _scripted(trainer, turns):
    """Replace the model's sampling by ``turns`` (one completion text per call, for every rollout)."""
    calls = iter(turns)

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        text = next(calls)
        ids = trainer.processing_class.encode(text, add_special_tokens=False)
        return [list(ids) for _ in prompt_ids], [[0.0] * len(ids) for _ in prompt_ids]

    trainer._generate_single_turn = generate


def _call(name, **arguments):
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call><|im_end|>'


def test_tool_calls_step_the_env_and_get_reward_scores_the_episode(tmp_path):
    dataset = seed_dataset(1, start=1, split="train")
    trainer = _trainer(tmp_path, Env("SearchQA-v0", topk=1), dataset, length=1024)  # room for one passage
    probe = twice_envs.make("SearchQA-v0")
    _, info = probe.reset(seed=1, options={"split": "train", "index": 1})
    gold = info["golden_answers"][0]
    _scripted(trainer, [_call("search", query=info["question"]), _call("answer", text=gold), "done<|im_end|>"])
    trainer.model.train()
    out = trainer._generate_and_score_completions(_rows(dataset, 1))
    for env in trainer.environments:
        traj = env.env.trajectory
        assert traj.actions == [f"<search> {info['question']} </search>", f"<answer> {gold} </answer>"]
        assert traj.terminated and env.get_reward() == 1.0
    rewards = trainer._metrics["train"]["rewards/SearchQA_v0/mean"]
    assert rewards[-1] == pytest.approx(1.0)
    assert out["tool_mask"].min() == 0  # the tool's observation tokens are masked out of the loss


def test_any_other_env_gets_one_act_tool_and_a_call_after_the_end_is_refused():
    env = Env("SearchToy-v0")()
    first = env.reset(seed=3, prompt="ignored")
    assert first == twice_envs.make("SearchToy-v0").reset(seed=3)[0]
    assert [m for m in dir(type(env)) if not m.startswith("_") and callable(getattr(env, m))] == \
        ["act", "get_reward", "reset"]
    while not env.env.done:
        env.act("answer")
    with pytest.raises(RuntimeError, match="the episode is over"):
        env.act("answer")


def test_rows_must_name_their_start_state():
    assert start_of({"prompt": "x", "seed": 4}) == (4, {})
    assert start_of({"task": twice_trl.task_prompt(2, {"split": "dev", "index": 2})}) == (2, {"split": "dev",
                                                                                                "index": 2})
    assert start_of({"seed": 1, "options": {"split": "train", "index": None}}) == (1, {"split": "train"})
    with pytest.raises(RowError, match="'seed' column .* or a 'task' column"):
        start_of({"prompt": "what is 2+2?"})
    with pytest.raises(RowError, match="column seed must be an int"):
        start_of({"seed": "7"})
    with pytest.raises(RowError, match="column 'task' must be JSON"):
        start_of({"task": "task seven"})
    with pytest.raises(TwiceError, match="unknown env id 'not-an-env-v0'"):
        Env("not-an-env-v0")


def test_the_hubs_page_example_trains_one_step(tmp_path, capsys):
    example = Path(__file__).resolve().parents[2] / "examples" / "hubs" / "trl_env.py"
    out = runpy.run_path(str(example))["main"](["--steps", "1", "--out", str(tmp_path / "run")])
    assert out["steps"] == 1 and len(out["rewards"]) == 1
    assert "1 steps; mean env reward per step" in capsys.readouterr().out
