"""Train sb3-contrib's MaskablePPO on one bundled ALFWorld task; report success before and after.

Run: python examples/sb3_alfworld.py [--timesteps 3000] [--episodes 10]

The text game becomes a numeric env (hashed bag-of-words observation, an index into
the admissible commands with an action mask). The game rewards only the win, which
random play almost never reaches, so expect small gains from a short budget.
Success is the game's own ``info["won"]``. Falls back to WebShop when ALFWorld's
optional dependency is missing.
"""

import argparse

import torch
from sb3_contrib import MaskablePPO

import twice_envs
from twice_envs.wrappers.sb3 import IndexActionEnv


def make_env(args):
    try:
        env = IndexActionEnv(args.env, max_turns=args.max_turns, reset_options={"index": args.task})
        return env, args.env
    except twice_envs.MissingExtra as exc:
        print(f"ALFWorld unavailable ({exc}); using WebShop-v0")
        env = IndexActionEnv("WebShop-v0", max_turns=args.max_turns, fill={"<query>": "instruction"})
        return env, "WebShop-v0"


def success_rate(model, env, episodes, seed):
    """Share of episodes the (stochastic) policy wins, on fixed episode seeds."""
    model.set_random_seed(seed)
    wins = 0
    for episode in range(episodes):
        obs, info = env.reset(seed=seed + episode)
        done = False
        while not done:
            action, _ = model.predict(obs, action_masks=env.action_masks(), deterministic=False)
            obs, reward, terminated, truncated, info = env.step(action)
            done = terminated or truncated
        wins += bool(info.get("won", reward >= 1.0))  # ALFWorld: the goal holds; WebShop: full score
    return wins / episodes


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timesteps", type=int, default=3000, help="training budget (env steps)")
    parser.add_argument("--episodes", type=int, default=10, help="evaluation episodes before and after")
    parser.add_argument("--env", default="ALFWorld-Look-v0", help="an ALFWorld id (one task type)")
    parser.add_argument("--task", type=int, default=1, help="index of the bundled game of that type")
    parser.add_argument("--max-turns", type=int, default=30)
    parser.add_argument("--n-steps", type=int, default=256, help="PPO rollout length")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)

    env, env_id = make_env(args)
    print(f"env: {env_id}, task: {env.text_env.trajectory.observations[0].split('Your task is to:')[-1].strip()}")
    model = MaskablePPO(
        "MlpPolicy", env, n_steps=args.n_steps, batch_size=min(64, args.n_steps), n_epochs=4,
        ent_coef=0.01, seed=args.seed, verbose=0,
    )
    before = success_rate(model, env, args.episodes, seed=10_000)
    model.learn(args.timesteps)
    after = success_rate(model, env, args.episodes, seed=10_000)
    print(f"success before: {before:.2f}  after {args.timesteps} steps: {after:.2f}  ({args.episodes} episodes each)")


if __name__ == "__main__":
    main()
