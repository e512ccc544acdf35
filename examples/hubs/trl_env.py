"""Train on a twice env with TRL's env-owned API: ``GRPOTrainer(environment_factory=Env("SearchQA-v0"))``.

    pip install torch==2.13.0 'twice-envs[trl,search]'
    python examples/hubs/trl_env.py --steps 1                           # the tiny model, on CPU
    python examples/hubs/trl_env.py --model /models/Qwen3-0.6B --rows 64 --group-size 8 --steps 100

The dataset holds one seed per row and TRL repeats each row ``num_generations`` times, so every
generation of a group starts from the same question. The model calls ``search(query)`` and
``answer(text)`` as tools; the env's reward (``get_reward``) scores each rollout.
"""

from __future__ import annotations

import argparse

import torch
from trl import GRPOConfig, GRPOTrainer
from trl.chat_template_utils import qwen3_chat_template

from twice_envs.agents.models.load import load_policy
from twice_envs.integrations.trl import Env, seed_dataset


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description="TRL GRPOTrainer with a twice env as its environment_factory")
    p.add_argument("--model", default="tiny", help="tiny, or a local HF model directory with a tool-calling template")
    p.add_argument("--env", default="SearchQA-v0")
    p.add_argument("--steps", type=int, default=1, help="optimiser steps")
    p.add_argument("--rows", type=int, default=2, help="dataset rows (episode starts)")
    p.add_argument("--group-size", type=int, default=2, help="generations per row (num_generations)")
    p.add_argument("--max-completion-length", type=int, default=32)
    p.add_argument("--out", default="runs/trl-env")
    a = p.parse_args(argv)
    torch.manual_seed(0)
    policy = load_policy(a.model)
    if a.model == "tiny":  # the tiny model's own template renders no tool calls
        policy.tokenizer.chat_template = qwen3_chat_template
    args = GRPOConfig(output_dir=a.out, per_device_train_batch_size=a.rows * a.group_size,
                      num_generations=a.group_size, max_steps=a.steps, max_completion_length=a.max_completion_length,
                      learning_rate=1e-5, beta=0.0, use_cpu=not torch.cuda.is_available(), report_to=[],
                      save_strategy="no", logging_steps=1, seed=0)
    trainer = GRPOTrainer(model=policy.model, args=args, processing_class=policy.tokenizer,
                          environment_factory=Env(a.env), train_dataset=seed_dataset(a.rows))
    trainer.train()
    name = a.env.replace("-", "_")
    rewards = [row[f"rewards/{name}/mean"] for row in trainer.state.log_history if f"rewards/{name}/mean" in row]
    print(f"{trainer.state.global_step} steps; mean env reward per step: {rewards}")
    return {"steps": trainer.state.global_step, "rewards": rewards}


if __name__ == "__main__":
    main()
