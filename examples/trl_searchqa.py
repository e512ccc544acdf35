"""Train an agent on SearchQA with TRL's GRPOTrainer and per-token twin credit.

    pip install torch==2.13.0 'twice-envs[trl,search]'
    python examples/trl_searchqa.py --steps 2            # the tiny model, on CPU
    python examples/trl_searchqa.py --model /models/Qwen2.5-3B-Instruct --questions 64 --max-new-tokens 500
    accelerate launch --num_processes 2 examples/trl_searchqa.py --steps 2   # the same batches over 2 processes

Each optimiser step plays ``--questions`` tasks x ``--group-size`` episodes with the
project's keyed sampler (on the trainer's own model), runs the method's twins, and
lets TRL train on the factual tokens with the per-token advantages (observation
tokens are masked out). Across processes, ``--questions`` stays the whole step's tasks:
each process trains on its slice of every step's batch.
"""

from __future__ import annotations

import argparse
import json
import os


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description="TRL GRPOTrainer with twin credit on SearchQA-v0")
    p.add_argument("--model", default="tiny", help="tiny, smollm2-135m or a local HF model directory")
    p.add_argument("--method", default="twice",
                   help="a registered credit method (TwinRollout refuses one TRL cannot run, and says why)")
    p.add_argument("--steps", type=int, default=2, help="optimiser steps")
    p.add_argument("--questions", type=int, default=2, help="tasks per step")
    p.add_argument("--group-size", type=int, default=2, help="episodes per task (G)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens per turn")
    p.add_argument("--max-turns", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--reward", default="em", help="SearchQA reward: em, subem, f1 or cost_f1")
    p.add_argument("--out", default="runs/trl-searchqa")
    p.add_argument("--dump", help="a directory: each process writes its episodes' seeds, twins and advantages there")
    a = p.parse_args(argv)

    import torch
    from trl import GRPOConfig

    from twice_envs.agents.models.load import load_policy
    from twice_envs.integrations.trl import (
        TwinCreditGRPOTrainer,
        TwinRollout,
        TwinRolloutConfig,
        env_utility,
        task_dataset,
    )

    processes = int(os.environ.get("WORLD_SIZE", "1"))  # set by accelerate launch / torchrun
    if a.questions * a.group_size % processes:
        p.error(f"--questions x --group-size must be a multiple of the {processes} processes")
    torch.manual_seed(0)
    policy = load_policy(a.model)
    args = GRPOConfig(output_dir=a.out, per_device_train_batch_size=a.questions * a.group_size // processes,
                      num_generations=a.group_size, max_steps=a.steps, learning_rate=a.lr, beta=0.0, temperature=1.0,
                      use_cpu=not torch.cuda.is_available(), report_to=[], logging_steps=1, save_strategy="no",
                      gradient_checkpointing=False, seed=0)
    rollout = TwinRollout(TwinRolloutConfig(env_id="SearchQA-v0", env_kwargs={"reward": a.reward}, method=a.method,
                                            max_turns=a.max_turns, max_new_tokens=a.max_new_tokens, dump=a.dump))
    trainer = TwinCreditGRPOTrainer(model=policy.model, reward_funcs=env_utility, args=args,
                                    train_dataset=task_dataset(max(a.questions * a.steps, 8)),
                                    processing_class=policy.tokenizer, rollout_func=rollout)
    result = trainer.train()
    summary = {"steps": trainer.state.global_step, "train_loss": result.training_loss,
               "last_aux_tokens": rollout.last_aux_tokens,
               "last_mean_utility": sum(e.utility for e in rollout.last_episodes) / max(len(rollout.last_episodes), 1)}
    if trainer.accelerator.is_main_process:
        print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
