"""The scripted ALFWorld agent with a mistake rate, and observations that show the admissible commands."""

from __future__ import annotations

import re

import numpy as np
import pytest

import twice_envs

pytest.importorskip("alfworld")

from twice_envs.envs.alfworld.scripted import scripted_turns  # noqa: E402


def test_show_admissible_ends_each_observation_with_the_commands_and_replays():
    plain = twice_envs.make("ALFWorld-v0")
    shown = twice_envs.make("ALFWorld-v0", show_admissible=True)
    obs_p, info_p = plain.reset(seed=3)
    obs_s, info_s = shown.reset(seed=3)
    assert "Admissible actions" not in obs_p
    assert obs_s == f"{obs_p}\n\nAdmissible actions: {', '.join(info_s['admissible_actions'])}."
    command = info_s["admissible_actions"][0]
    o1, *_ = plain.step(command)
    o2, _, _, _, info2 = shown.step(command)
    assert o2 == f"{o1}\n\nAdmissible actions: {', '.join(info2['admissible_actions'])}."
    # forks and replays rebuild the same text from the recorded kwargs
    assert twice_envs.replay(shown.trajectory).trajectory.observations == shown.trajectory.observations
    with pytest.raises(ValueError, match="show_admissible"):
        twice_envs.make("ALFWorld-v0", show_admissible="yes")


def test_show_task_repeats_the_task_sentence_after_the_first_observation():
    plain = twice_envs.make("ALFWorld-v0", show_admissible=True)
    shown = twice_envs.make("ALFWorld-v0", show_admissible=True, show_task=True)
    obs_p, info = plain.reset(seed=3)
    obs_s, _ = shown.reset(seed=3)
    assert obs_s == obs_p and f"Your task is to: {info['goal']}." in obs_s  # the first already holds it
    for command in (info["admissible_actions"][0], "<action>fly away</action>"):  # a valid and an invalid turn
        o1, *_ = plain.step(command)
        o2, *_ = shown.step(command)
        head, actions = o1.split("\n\nAdmissible actions: ")
        assert o2 == f"{head}\n\nYour task is to: {info['goal']}.\n\nAdmissible actions: {actions}"
    assert twice_envs.replay(shown.trajectory).trajectory.observations == shown.trajectory.observations
    assert shown.fork(1).trajectory.observations == shown.trajectory.observations[:2]
    with pytest.raises(ValueError, match="show_task"):
        twice_envs.make("ALFWorld-v0", show_task=1)


def test_scripted_agent_wins_at_full_skill_and_errs_below_it():
    env = twice_envs.make("ALFWorld-v0")
    rng = np.random.default_rng(0)
    env.reset(seed=1)
    for _ in range(20):
        turn = scripted_turns(env, rng, skill=1.0, tagged=True)
        assert turn.startswith("<action>") and turn.endswith("</action>")
        _, reward, term, trunc, info = env.step(turn)
        assert not info["invalid"]
        if term or trunc:
            break
    assert reward == 1.0  # the planner is optimal
    # at skill 0 every command is a random admissible one: valid, but rarely the planner's
    env.reset(seed=1)
    planned = scripted_turns(env, np.random.default_rng(1), skill=1.0)
    picks = {scripted_turns(env, np.random.default_rng(s), skill=0.0) for s in range(12)}
    assert picks <= set(env.last_info["admissible_actions"]) and len(picks) > 3 and picks != {planned}


def test_a_share_of_episodes_follows_the_handcoded_expert():
    from twice_envs.envs.alfworld import scripted

    env = twice_envs.make("ALFWorld-v0")
    kinds = []
    for seed in range(40):
        env.reset(seed=seed)
        scripted_turns(env, np.random.default_rng(seed), skill=1.0, handcoded=0.5)
        kinds.append(scripted._EPISODE_EXPERT[id(env)])
    assert 10 <= kinds.count("handcoded") <= 30  # binomial(40, 0.5): outside this in < 0.2% of seeds
    # the expert is drawn once per episode: later turns keep it
    env.reset(seed=5)
    rng = np.random.default_rng(5)
    scripted_turns(env, rng, skill=1.0, handcoded=0.5)
    first = scripted._EPISODE_EXPERT[id(env)]
    for _ in range(3):
        env.step(scripted_turns(env, rng, skill=1.0, handcoded=0.5))
        assert scripted._EPISODE_EXPERT[id(env)] == first
    # at handcoded=1 the commands are the hand-coded expert's: it looks around first, the planner walks off
    env.reset(seed=2)
    assert scripted_turns(env, np.random.default_rng(0), skill=1.0, handcoded=1.0) == "look"
    assert scripted_turns(env, np.random.default_rng(0), skill=1.0, handcoded=0.0).startswith("go to ")


def test_scripted_turns_mark_their_random_commands_as_mistakes():
    from twice_envs.envs.mistakes import Mistake

    env = twice_envs.make("ALFWorld-v0", show_admissible=True)
    env.reset(seed=2)
    rng = np.random.default_rng(0)
    assert not isinstance(scripted_turns(env, rng, skill=1.0), Mistake)
    for tagged in (False, True):
        turn = scripted_turns(env, rng, skill=0.0, tagged=tagged)
        assert isinstance(turn, Mistake)
        assert turn.removeprefix("<action>").removesuffix("</action>") in env.last_info["admissible_actions"]
        assert turn.startswith("<action>") == tagged


def test_renumbered_copies_permute_instance_numbers_consistently_and_keep_the_play_right():
    import re

    from twice_envs.agents.models.transcripts import (
        AUGMENTERS,
        scripted_agent,
        scripted_episodes,
    )
    from twice_envs.envs.alfworld.scripted import renumbered_copies

    assert scripted_agent("ALFWorld-v0", AUGMENTERS) is renumbered_copies
    episodes = scripted_episodes("ALFWorld-v0", 3, seed=2, skill_range=(0.7, 1.0), max_turns=6,
                                 agent_options={"tagged": True}, env_kwargs={"show_admissible": True})
    copies = renumbered_copies(None, episodes, 2, np.random.default_rng(5))
    assert len(copies) == 2 * len(episodes)
    entity = re.compile(r"\b([a-z]+) (\d+)\b")
    changed = 0
    for k, (first, turns) in enumerate(copies):
        orig_first, orig_turns = episodes[k // 2]
        orig_texts = [orig_first] + [t for pair in orig_turns for t in pair]
        new_texts = [first] + [t for pair in turns for t in pair]
        # only the numbers change, one to one and the same way in every text of the episode
        mapping = {}
        for old, new in zip(orig_texts, new_texts):
            assert entity.sub(r"\1 #", old).split("Admissible")[0] == entity.sub(r"\1 #", new).split("Admissible")[0]
            old_e, new_e = entity.findall(old.split("Admissible")[0]), entity.findall(new.split("Admissible")[0])
            for (name, a), (name2, b) in zip(old_e, new_e):
                assert name == name2
                assert mapping.setdefault((name, a), b) == b
        per_name: dict = {}
        for (name, _a), b in mapping.items():
            per_name.setdefault(name, []).append(b)
        assert all(len(set(v)) == len(v) for v in per_name.values())
        changed += any(a != b for (_n, a), b in mapping.items())
        # every action is still admissible where it was, and the lists are sorted again
        obs = [first] + [o for _a, o in turns]
        for (action, _o), before in zip(turns, obs):
            listed = before.split("Admissible actions: ")[1].rstrip(".").split(", ")
            assert listed == sorted(listed)
            command = action.removeprefix("<action>").removesuffix("</action>")
            assert command in listed
    assert changed >= len(copies) - 1
    # a deliberate mistake stays marked in its copies
    from twice_envs.envs.mistakes import Mistake

    marks = [[isinstance(a, Mistake) for a, _o in turns] for _first, turns in episodes]
    assert any(any(m) for m in marks)
    assert [[isinstance(a, Mistake) for a, _o in turns] for _first, turns in copies] == [m for m in marks for _ in range(2)]


def test_notes_name_the_object_to_find_then_where_it_goes():
    from twice_envs.envs.alfworld.scripted import task_note

    env = twice_envs.make("ALFWorld-v0", task_types=["pick_two_obj_and_place"])
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    params = env.unwrapped.game.pddl_params
    obj, target = params["object_target"].lower(), params["parent_target"].lower()
    assert obj in env.unwrapped.game.goal and target in env.unwrapped.game.goal  # the note reads only the task
    notes, term = [], False
    while not term and len(notes) < 30:
        turn = scripted_turns(env, rng, skill=1.0, notes=True)
        assert turn.startswith("<think>") and turn.endswith("</action>")
        notes.append(turn.split("</think>")[0].removeprefix("<think>"))
        _, _, term, _, info = env.step(turn)
        assert not info["invalid"]
    assert term
    # find, carry, find the second, carry it: the note follows what the engine said was picked up and put down
    phases = [n for k, n in enumerate(notes) if k == 0 or n != notes[k - 1]]
    assert phases == [f"find {obj}", f"{obj} to {target}", f"find {obj}", f"{obj} to {target}"]
    assert task_note(env) == f"find {obj}"


def test_type_names_are_whole_tokens_in_the_task_the_observation_and_the_command():
    import re

    from twice_envs.agents.models.tokenizer import train_tokenizer
    from twice_envs.envs.alfworld.scripted import type_names

    names = type_names()
    assert len(set(names)) == len(names) and all(n.startswith(" ") and n[1:].isalpha() for n in names)
    env = twice_envs.make("ALFWorld-v0", show_admissible=True)
    texts, seen = [], set()
    rng = np.random.default_rng(0)
    for seed in range(6):
        obs, info = env.reset(seed=seed)
        texts.append(obs)
        for _ in range(4):
            command = scripted_turns(env, rng, 0.5)
            obs, *_ = env.step(command)
            texts += [command, obs]
    for text in texts:
        seen |= {" " + w for w in re.findall(r"\b([a-z]+) \d+\b", text)}
    assert seen and seen <= set(names)  # every instance name the games show is a whole token
    tok = train_tokenizer(texts, 400, names)
    for text in texts:
        pieces = tok.convert_ids_to_tokens(tok.encode(text, add_special_tokens=False))
        for word in re.findall(r" [a-z]+(?= \d)", text):
            assert word in pieces, (word, text[:80])
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    # a name never matches inside another word ("pen" in "open")
    pieces = tok.convert_ids_to_tokens(tok.encode("you open it", add_special_tokens=False))
    assert not set(pieces) & ({n for n in names} | {n.strip() for n in names})


def _searcher_episode(env, index: int, max_turns: int = 30):
    from twice_envs.envs.alfworld.scripted import WindowSearcher

    searcher = WindowSearcher()
    env.reset(seed=0, options={"index": index})
    windows, info = [], {}
    for _ in range(max_turns):
        command = searcher.act(env)
        traj = env.unwrapped.trajectory
        windows.append((traj.observations[0], traj.actions[-1:], traj.observations[-1], dict(env.unwrapped.last_info), command))
        _, _, term, trunc, info = env.step(f"<action>{command}</action>")
        if term or trunc:
            break
    return windows, info


def test_the_window_searcher_wins_the_held_out_games_from_what_a_one_turn_window_shows():
    from types import SimpleNamespace

    from twice_envs.envs.alfworld.scripted import WindowSearcher

    env = twice_envs.make("ALFWorld-v0", show_admissible=True, split="valid_unseen")
    searcher, won, checked = WindowSearcher(), 0, 0
    for index in range(8):
        windows, info = _searcher_episode(env, index)
        won += bool(info.get("won"))
        game = env.unwrapped.game
        for first, last, current, last_info, command in windows:
            # the same command from an env that keeps nothing but the window
            seen = SimpleNamespace(game=game, last_info=last_info,
                                   trajectory=SimpleNamespace(actions=last, observations=[first, current]))
            assert searcher.act(seen) == command
            checked += 1
    assert won >= 7, won
    assert checked > 8 * 8


def test_scripted_turns_follow_the_searcher_when_asked():
    env = twice_envs.make("ALFWorld-v0", show_admissible=True, split="valid_unseen")
    windows, _ = _searcher_episode(env, 2)
    rng = np.random.default_rng(0)
    env.reset(seed=0, options={"index": 2})
    for *_, command in windows[:10]:
        turn = scripted_turns(env, rng, skill=1.0, tagged=True, searcher=True)
        assert turn == f"<action>{command}</action>"
        env.step(turn)


def test_searcher_notes_name_the_instance_it_takes_and_where_the_held_object_goes():
    env = twice_envs.make("ALFWorld-v0", show_admissible=True, split="valid_unseen")
    rng = np.random.default_rng(0)
    env.reset(seed=0, options={"index": 0})
    params = env.unwrapped.game.pddl_params
    obj = params["object_target"].lower()
    dest = (params.get("parent_target") or params.get("toggle_target")).lower()
    kinds = set()
    for _ in range(30):
        turn = scripted_turns(env, rng, skill=1.0, searcher=True, notes=True)
        note, command = re.match(r"<think>(.*)</think><action>(.*)</action>$", turn).groups()
        holding = any(a.startswith(f"move {obj} ") for a in env.unwrapped.last_info["admissible_actions"])
        taken = re.match(rf"take ({obj} \d+) from ", command)
        expected = f"{obj} to {dest}" if holding else taken.group(1) if taken else obj
        assert note == expected, (note, command)
        kinds.add("holding" if holding else "take" if taken else "search")
        _, _, term, trunc, info = env.step(turn)
        if term or trunc:
            break
    assert info["won"] and kinds == {"holding", "take", "search"}
