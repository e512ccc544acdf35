"""Vector envs: step several text envs at once, then reach one sub-env's record and fork it.

Run: python examples/vector_envs.py
"""

import twice_envs

# Two questions, two sub-envs each; "async" steps them in two worker processes.
vec = twice_envs.make_vec("SearchQA-v0", 4, vectorization_mode="async", seeds=[3, 3, 8, 8])
obs, infos = vec.reset()
questions = [str(q) for q in infos["question"]]
print("questions:", questions)

# One action per sub-env; observations come back as a tuple of strings.
obs, rewards, terminated, truncated, infos = vec.step(tuple(f"<search> {q} </search>" for q in questions))
print("first result of sub-env 0:", obs[0].strip().removeprefix("<information>").splitlines()[0][:90])

# Sub-envs 1 and 3 answer; 0 and 2 do not.
answers = ["", "<answer> I do not know </answer>", "", "<answer> no idea </answer>"]
obs, rewards, terminated, truncated, infos = vec.step(tuple(answers))
print("terminated:", terminated.tolist(), "rewards:", rewards.tolist())
print("finished record of sub-env 1:", infos["trajectory"][1].actions)

# A live env at turn 1 of sub-env 1, rebuilt here from the worker's record (digest-checked).
branch = vec.fork(1, turn=1)
gold = infos["golden_answers"][1][0]
_, reward, done, _, _ = branch.step(f"<answer> {gold} </answer>")
print(f"fork of sub-env 1 answers {gold!r}: reward {reward}, sub-env 1 still has reward {vec.trajectory(1).rewards[-1]}")
vec.close()
