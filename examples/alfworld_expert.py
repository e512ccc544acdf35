"""Play a bundled ALFWorld game with the engine's planner, then fork the episode and replay it.

Needs the engine: pip install 'twice-envs[alfworld]'
"""

import twice_envs
from twice_envs.envs.alfworld.expert import ALFWorldExpert, as_turn

env = twice_envs.make("ALFWorld-v0")
obs, info = env.reset(seed=7)
print(obs)
expert = ALFWorldExpert(timeout_s=20)
while not env.done:
    command = expert.act(env)
    obs, reward, terminated, truncated, info = env.step(as_turn(command))
    print(f"> {command}\n{obs}")
print(f"won: {info['won']} in {env.turn} turns, reward {reward}")

# A fork is an independent env in the state after 2 turns; the same actions give the same episode.
branch = env.fork(2)
for action in env.trajectory.actions[2:]:
    branch.step(action)
print("fork replays the episode:", branch.trajectory.digests == env.trajectory.digests)
