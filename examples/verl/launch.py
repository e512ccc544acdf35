"""Train Qwen2.5-3B-Instruct on SearchQA with twin credit in verl (GPUs), in the published setting.

Published setting: lr 1e-6, 256 questions per update x G = 5 episodes, up to 4
searches, 500 tokens per turn, temperature 1, top-p 1.

    pip install torch==2.11.0 'twice-envs[verl,search]' 'verl[vllm]==0.9.1'
    python examples/verl/launch.py --model /models/Qwen2.5-3B-Instruct --gpus 8

The launcher writes the task datasets (one parquet row per question, naming the task
by split and index; the agent loop builds the prompt from the env), then runs verl's
``main_ppo`` with the overrides below. ``--dry-run`` writes the data and prints the
command. Extra ``key=value`` arguments are appended as further verl overrides.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def write_tasks(path: Path, split: str, n: int) -> Path:
    """A verl RLHF parquet of ``n`` SearchQA tasks of ``split`` for the ``twice_envs`` agent loop."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from twice_envs.integrations.verl.agent_loop import AGENT_NAME, task_extra_info

    rows = [{"data_source": "twice_envs/SearchQA-v0", "agent_name": AGENT_NAME, "ability": "search",
             # the agent loop builds the real prompt from the env's first observation
             "prompt": [{"role": "user", "content": f"SearchQA {split} question {i}"}],
             "reward_model": {"style": "env", "ground_truth": ""},
             "extra_info": {**task_extra_info(i, {"split": split, "index": i}), "index": i, "split": split}}
            for i in range(n)]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    os.replace(tmp, path)
    return path


def overrides(a: argparse.Namespace, train: Path, val: Path) -> list[str]:
    """verl's hydra overrides for the published setting."""
    return [
        f"algorithm.adv_estimator={a.method}",
        "trainer.use_v1=true", "trainer.v1.trainer_mode=twice_envs",
        f"data.train_files={train}", f"data.val_files={val}",
        f"data.train_batch_size={a.questions}", "data.max_prompt_length=1024", "data.max_response_length=4096",
        "data.return_raw_chat=true",
        f"actor_rollout_ref.model.path={a.model}",
        "actor_rollout_ref.actor.optim.lr=1e-6", f"actor_rollout_ref.actor.ppo_mini_batch_size={a.questions // 4}",
        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.clip_ratio=0.2",
        "actor_rollout_ref.rollout.name=vllm", f"actor_rollout_ref.rollout.n={a.group_size}",
        "actor_rollout_ref.rollout.temperature=1.0", "actor_rollout_ref.rollout.top_p=1.0",
        # the keyed processor forces each token; raw log-probs are the model's, processed ones would be 0
        "actor_rollout_ref.rollout.logprobs_mode=raw_logprobs",
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.logits_processors="
        "[twice_envs.agents.sampling.vllm_engine:TwiceKeyedProcessor]",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={HERE / 'agent_loops.yaml'}",
        "actor_rollout_ref.rollout.agent.default_agent_loop=twice_envs",
        f"trainer.n_gpus_per_node={a.gpus}", "trainer.nnodes=1", f"trainer.total_training_steps={a.updates}",
        "trainer.project_name=twice_envs", f"trainer.experiment_name=searchqa-qwen2.5-3b-{a.method}",
        "trainer.logger=[console]", "trainer.test_freq=10", "trainer.save_freq=10",
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="local directory of Qwen2.5-3B-Instruct (nothing is downloaded)")
    p.add_argument("--method", default="twice", choices=["twice", "crr", "crr-added", "gigpo", "grpo"])
    p.add_argument("--questions", type=int, default=256, help="questions per update (published: 256)")
    p.add_argument("--group-size", type=int, default=5, help="episodes per question (G; published: 5)")
    p.add_argument("--updates", type=int, default=200)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--train-questions", type=int, default=None, help="training tasks (default: the whole split)")
    p.add_argument("--val-questions", type=int, default=500)
    p.add_argument("--data-dir", default="runs/verl-searchqa/data")
    p.add_argument("--dry-run", action="store_true", help="write the data, print the command, do not train")
    a, extra = p.parse_known_args(argv)
    if a.train_questions is None:
        from twice_envs.agents.training.evaluate import split_size

        a.train_questions = split_size("SearchQA-v0", {}, "train") or 10_000
    data = Path(a.data_dir)
    train = write_tasks(data / "train.parquet", "train", a.train_questions)
    val = write_tasks(data / "dev.parquet", "dev", a.val_questions)
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *overrides(a, train, val), *extra]
    print(shlex.join(cmd))
    if a.dry_run:
        return 0
    # batch-invariant kernels keep a twin's tokens independent of which requests share its batch
    env = dict(os.environ, VLLM_BATCH_INVARIANT=os.environ.get("VLLM_BATCH_INVARIANT", "1"))
    return subprocess.call(cmd, env=env)


if __name__ == "__main__":
    raise SystemExit(main())
