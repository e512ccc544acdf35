"""A GRPO group and a twin, stepped in lockstep through PettingZoo's ParallelEnv API.

Run: python examples/pettingzoo_group.py
"""

from twice_envs.wrappers.pettingzoo import GroupParallelEnv

group = GroupParallelEnv("SearchQA-v0", group_size=3, max_twins=2)
obs, infos = group.reset(seed=3)  # three worlds of one question, each with its own sampling noise
question, gold = infos["world_0"]["question"], infos["world_0"]["golden_answers"][0]
print("agents:", group.agents, "| question:", question)

# Turn 0: the members search differently (as a policy's samples would).
queries = {"world_0": question, "world_1": question, "world_2": "famous albums of 1973"}
obs, rewards, terminated, truncated, infos = group.step({a: f"<search> {q} </search>" for a, q in queries.items()})

# A twin of world_2's turn 0: the same world with the other query; it joins the lockstep.
twin, *_, info = group.add_twin("world_2", turn=0, action=f"<search> {question} </search>")
print(f"{twin} twins {info['twin_of']} at turn {info['branch_turn']} (branch {info['branch']}); agents: {group.agents}")
same_noise = info["noise_key"] == infos["world_2"]["noise_key"]
print("twin reads world_2's noise key for turn 1:", same_noise)

# Turn 1: one call for the whole group and its twin.
answers = {a: f"<answer> {gold} </answer>" for a in group.agents}
answers["world_1"] = "<answer> Paris </answer>"
obs, rewards, terminated, truncated, infos = group.step(answers)
print("rewards:", rewards)
print("live agents:", group.agents)
group.close()
