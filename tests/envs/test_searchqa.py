"""SearchQA env: offline default, protocol behaviour, forks, noise coupling, checker on every variant."""

import hashlib
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import twice_envs
from twice_envs.envs.searchqa import protocol as P
from twice_envs.envs.searchqa import resources
from twice_envs.envs.searchqa.scripted import (
    name_words,
    plan,
    random_turn,
    renamed_copies,
    run_episode,
    scripted_turns,
    seen_passages,
)
from twice_envs.envs.searchqa.specs import VARIANTS

SMALL = {"num_entities": 60, "num_train": 40, "num_dev": 20, "num_test": 20}


@pytest.fixture(scope="module", autouse=True)
def cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TWICE_CACHE", str(tmp_path_factory.mktemp("twice_cache")))
        resources.clear()
        yield
    resources.clear()


def small(env_id="SearchQA-v0", **kw):
    return twice_envs.make(env_id, generator=SMALL, **kw)


def test_default_env_works_offline_and_names_the_question():
    env = twice_envs.make("SearchQA-v0")
    obs, info = env.reset(seed=7)
    assert obs.startswith(P.INSTRUCTIONS)
    assert obs.endswith(f"Question: {P.format_question(info['question'])}\n")
    assert env.protocol().stop == ("</search>", "</answer>")
    assert info["num_searches"] == 0 and info["well_formed"] is False
    assert len(env.resources.corpus) > 2500
    assert {k: len(v) for k, v in env.resources.questions.items()} == {"train": 4000, "dev": 500, "test": 500}


def test_reset_options_pick_the_task():
    env = small()
    _, a = env.reset(seed=1, options={"index": 3, "split": "dev"})
    assert (a["split"], a["index"], a["task_id"]) == ("dev", 3, "gen_dev_3")
    _, b = env.reset(seed=99, options={"task": "gen_dev_3"})
    assert b["question"] == a["question"]
    _, c = env.reset(seed=5)
    _, d = env.reset(seed=5)
    assert c["task_id"] == d["task_id"] and c["split"] == "train"
    for bad in ({"index": 10_000}, {"task": "nope"}, {"split": "nope"}, {"colour": 1}):
        with pytest.raises(ValueError):
            env.reset(seed=0, options=bad)


def test_search_answer_reward_and_info():
    env = small()
    env.reset(seed=0, options={"index": 0, "split": "dev"})
    hop = env.task.metadata["hops"][0]
    obs, r, term, trunc, info = env.step(f"<think> x </think>\n<search> {hop['query']} </search> trailing")
    assert obs.startswith("\n\n<information>Doc 1(Title: ") and obs.endswith("</information>\n\n")
    assert f'(Title: "{hop["title"]}")' in obs
    assert (r, term, info["num_searches"], info["invalid"]) == (0.0, False, 1, False)
    assert len(info["retrieved"]) == 3
    gold = env.task.golden_answers[0]
    obs, r, term, trunc, info = env.step(f"<answer> {gold.upper()}! </answer>")
    assert (r, term, info["em"], info["f1"], info["well_formed"]) == (1.0, True, 1.0, 1.0, True)


def test_wrong_answer_and_reward_variants():
    golds = None
    rewards = {}
    for env_id in ("SearchQA-v0", "SearchQA-SubEM-v0", "SearchQA-F1-v0", "SearchQA-Cost-v0"):
        env = small(env_id)
        env.reset(seed=0, options={"task": "gen_dev_1"})
        golds = env.task.golden_answers
        total = 0.0
        for _ in range(2):
            total += env.step("<search> anything </search>")[1]
        _, r, term, _, info = env.step(f"<answer> maybe {golds[0]} </answer>")
        rewards[env_id] = total + r
        assert term and info["em"] == 0.0
    f1 = P.f1_score(f"maybe {golds[0]}", golds)
    assert rewards["SearchQA-v0"] == 0.0
    assert rewards["SearchQA-SubEM-v0"] == 1.0
    assert rewards["SearchQA-F1-v0"] == pytest.approx(f1) and 0 < f1 < 1
    assert rewards["SearchQA-Cost-v0"] == pytest.approx(f1 - 0.05 * 2)


def test_invalid_actions_budget_and_truncation():
    env = small()
    env.reset(seed=0)
    obs, r, term, trunc, info = env.step("I think the answer is Paris")
    assert obs == P.INVALID_ACTION and info["invalid"] and not term and r == 0.0
    for i in range(4):
        obs, _, _, _, info = env.step(f"<search> query {i} </search>")
        assert not info.get("search_refused")
        assert obs.endswith(P.budget_note(4)) == (i == 3)
    obs, _, _, trunc, info = env.step("<search> one more </search>")
    assert info["search_refused"] and info["num_searches"] == 4 and "limit of 4 searches" in obs
    assert env.max_turns == 10
    while not (trunc or term):
        _, r, term, trunc, info = env.step("no tags")
    assert trunc and not term and r == 0.0 and info["well_formed"] is False and env.turn == 10


def test_odd_queries_never_crash():
    env = small()
    env.reset(seed=0)
    for q in ("", "   ", "x" * 200_000, "\ud800\udfff\x00\x07", "日本語 🙂 \u202e", "<b>html</b>", "the of and"):
        obs, r, term, trunc, info = env.step(f"<search>{q}</search>")
        assert isinstance(obs, str) and "<information>" in obs
        if term or trunc:
            env.reset(seed=0)
    env.reset(seed=0)
    _, _, _, _, info = env.step("<search>" + "word " * 100_000 + "</search>")
    assert len(info["query"]) <= P.MAX_QUERY_CHARS
    _, _, _, _, info = env.step("<search> \u200b </search>")
    assert info["query"] == "" and info["retrieved"] == []


def test_forks_reuse_journaled_results_and_never_search_again():
    env = small()
    env.reset(seed=3)
    for q in ("alpha born", "beta founded", "gamma published", "delta"):
        env.step(f"<search> {q} </search>")
    tool_calls = env.resources.journal.misses
    branches = [env.fork(t) for t in range(5)]
    assert env.resources.journal.misses == tool_calls
    f = env.fork(2)
    f.step("<search> gamma published </search>")  # the same query as the factual turn: a journal hit
    assert env.resources.journal.misses == tool_calls
    assert f.trajectory.observations[3] == env.trajectory.observations[3]
    assert branches[4].trajectory.digests == env.trajectory.digests


def _episode_obs(env, seed, actions, options=None):
    env.reset(seed=seed, options=options)
    return [env.step(a)[0] for a in actions]


def test_noisy_retrieval_is_replayable_and_per_branch():
    env = small("SearchQA-Noisy-v0", noise_epsilon=0.5)
    clean = small()
    acts = ["<search> born </search>", "<search> founded </search>", "<search> published </search>"]
    a = _episode_obs(env, 11, acts, {"index": 0})
    assert _episode_obs(env, 11, acts, {"index": 0}) == a  # same seed: same noise
    assert a != _episode_obs(clean, 11, acts, {"index": 0})  # noise does something
    seeds_differ = any(_episode_obs(env, s, acts, {"index": 0}) != a for s in (12, 13, 14))
    assert seeds_differ
    # a branch with another first action draws its own noise for the same later query
    env.reset(seed=11, options={"index": 0})
    env.step(acts[0])
    fork = env.fork(0)
    fork.step("<search> town </search>")
    later_f = [fork.step(a)[0] for a in acts[1:]]
    later_e = [env.step(a)[0] for a in acts[1:]]
    assert later_f != later_e
    # 'episode' coupling shares the tool's luck for the same (turn, query)
    shared = small("SearchQA-Noisy-v0", noise_epsilon=0.5, noise_coupling="episode")
    shared.reset(seed=11, options={"index": 0})
    shared.step(acts[0])
    g = shared.fork(0)
    g.step("<search> town </search>")
    assert [g.step(a)[0] for a in acts[1:]] == [shared.step(a)[0] for a in acts[1:]]


def _extra_actions(env):
    env.reset(seed=0, options={"index": 0, "split": "dev"})
    hops = [h["query"] for q in env.resources.questions["dev"][:3] for h in q.metadata["hops"]]
    return [f"<search> {h} </search>" for h in hops] + ["<answer> 1850 </answer>", "<think> hmm </think>"]


@pytest.mark.slow
@pytest.mark.parametrize("env_id", sorted(VARIANTS))
def test_check_env_passes_on_every_variant(env_id):
    env = small(env_id)
    report = twice_envs.check_env(env, extra_actions=_extra_actions(env), num_episodes=2, num_steps=6, max_forks=4)
    assert "determinism across processes (different PYTHONHASHSEED)" in report.passed


def test_gold_hop_agent_solves_the_default_dev_set_and_random_agent_does_not():
    env = twice_envs.make("SearchQA-v0")
    n = len(env.resources.questions["dev"])
    gold = [run_episode(env, scripted_turns, 0, {"index": i, "split": "dev"})["em"] for i in range(n)]
    assert np.mean(gold) >= 0.95
    rng = np.random.default_rng(0)
    rand = [run_episode(env, lambda e: random_turn(e, rng), 0, {"index": i, "split": "dev"})["em"] for i in range(n)]
    assert np.mean(rand) <= 0.03


def test_mixed_agent_quality_follows_skill_and_turn_format():
    env = small()
    means = []
    for skill in (0.0, 0.6, 1.0):
        rng = np.random.default_rng(1)
        ems = [run_episode(env, lambda e: scripted_turns(e, rng, skill), 0, {"index": i, "split": "train"})["em"] for i in range(40)]
        means.append(np.mean(ems))
    assert means[0] < means[1] < means[2] and means[2] >= 0.95
    env.reset(seed=0)
    turn = scripted_turns(env, np.random.default_rng(0), 0.5)
    assert turn.startswith("<think> ") and P.parse_action(turn).kind in ("search", "answer")


def test_scripted_mistakes_are_marked_and_gold_turns_are_not():
    from twice_envs.envs.mistakes import Mistake

    env = small()
    env.reset(seed=0, options={"index": 0, "split": "train"})
    rng = np.random.default_rng(3)
    assert not any(isinstance(scripted_turns(env, rng, 1.0), Mistake) for _ in range(20))
    turns = [scripted_turns(env, rng, 0.0) for _ in range(50)]
    marked = [t for t in turns if isinstance(t, Mistake)]
    assert 20 <= len(marked) <= 50  # skill 0: a mistake on 80% of first turns
    assert all("I need the" not in t for t in marked) and all("I need the" in t for t in turns if t not in marked)
    # renamed copies keep the marks
    first, _ = env.reset(seed=0, options={"index": 0, "split": "train"})
    episode = (first, [(marked[0], "obs one"), (scripted_turns(env, rng, 1.0), "obs two")])
    copies = renamed_copies(env, [episode], 2, np.random.default_rng(0))
    assert [[isinstance(a, Mistake) for a, _o in turns] for _f, turns in copies] == [[True, False]] * 2


def test_scripted_reasoning_quotes_the_sentence_it_reads():
    env = small()
    for i in range(20):
        env.reset(seed=0, options={"index": i, "split": "train"})
        while not env.done:
            turn = scripted_turns(env, quote=True)
            plain = scripted_turns(env).split("</think>")[0]
            kind, what = plan(env)
            if what.get("evidence"):
                think = turn.split("</think>")[0]
                for sentence in what["evidence"]:
                    assert sentence and sentence in think and sentence not in plain
                    assert any(sentence in text for text in seen_passages(env).values())
            env.step(turn)


def test_renamed_copies_change_every_name_and_nothing_else():
    env = small()
    env.reset(seed=0)
    words = name_words(env)
    assert words and not words & {"The", "House", "Company", "Old", "Harbour", "Question", "Paris"}
    rng = np.random.default_rng(0)
    episodes = []
    for i in range(6):
        obs, _ = env.reset(seed=0, options={"index": i, "split": "train"})
        turns = []
        while not env.done:
            action = scripted_turns(env, quote=True)
            turns.append((action, env.step(action)[0]))
        episodes.append((obs, turns))
    copies = renamed_copies(env, episodes, 2, rng)
    assert len(copies) == 12
    word = re.compile(r"\b[A-Z][a-z]+\b")
    changed = total = 0
    for k, (first, turns) in enumerate(copies):
        orig_first, orig_turns = episodes[k // 2]
        orig = [orig_first] + [x for t in orig_turns for x in t]
        new = [first] + [x for t in turns for x in t]
        mapping = {}
        for a, b in zip(orig, new):
            # same text with name words swapped one for one, consistently within the episode
            assert word.sub("W", a) == word.sub("W", b)
            for wa, wb in zip(word.findall(a), word.findall(b)):
                assert (wa not in words and wa == wb) or (wa in words and wb in words)
                assert mapping.setdefault(wa, wb) == wb
        assert len(set(mapping.values())) == len(mapping)
        names = [w for w in mapping if w in words]
        changed += sum(mapping[w] != w for w in names)
        total += len(names)
        # the answer is still the fact the quoted passage sentence states
        last = turns[-1][0]
        answer = P.parse_action(last).content
        assert answer in last.split("</think>")[0]
        assert any(answer in obs for _, obs in turns)  # renamed alike in the passages
    assert copies[0] != copies[1] and total > 20 and changed >= 0.9 * total


def test_generated_files_are_byte_identical_across_processes(tmp_path):
    code = (
        "import hashlib, pathlib, sys\n"
        "from twice_envs.envs.searchqa.corpus_gen import GeneratorConfig, write_generated\n"
        "p = write_generated(GeneratorConfig(seed=5, num_entities=80, num_train=30, num_dev=10, num_test=10), pathlib.Path(sys.argv[1]))\n"
        "print(','.join(hashlib.sha256(p[k].read_bytes()).hexdigest() for k in sorted(p)))\n"
    )
    out = []
    for i, hashseed in enumerate(("1", "999")):
        envv = dict(os.environ, PYTHONHASHSEED=hashseed)
        proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / f"g{i}")], capture_output=True, text=True, env=envv, check=True)
        out.append(proc.stdout.strip())
    assert out[0] == out[1] and len(out[0].split(",")) == 4
    from twice_envs.envs.searchqa.corpus_gen import GeneratorConfig, write_generated

    other = write_generated(GeneratorConfig(seed=6, num_entities=80, num_train=30, num_dev=10, num_test=10), tmp_path / "g2")
    assert hashlib.sha256(other["corpus"].read_bytes()).hexdigest() not in out[0]
    rows = [json.loads(l) for l in other["corpus"].read_text().splitlines()]
    assert all(set(r) == {"id", "contents"} and r["contents"].startswith('"') for r in rows)


def test_generator_sizes_and_question_types():
    from twice_envs.envs.searchqa.corpus_gen import GeneratorConfig, generate

    corpus, qs = generate(GeneratorConfig(seed=1, num_entities=300, num_train=200, num_dev=50, num_test=50))
    assert 300 < len(corpus) < 600  # base entities plus near-duplicates
    assert [len(qs[s]) for s in ("train", "dev", "test")] == [200, 50, 50]
    types = {q["metadata"]["type"] for s in qs.values() for q in s}
    assert types == {"single", "compose2", "compose3", "compare"}
    texts = [q["question"] for s in qs.values() for q in s]
    assert len(set(texts)) == len(texts)
    titles = [r["contents"].split("\n")[0] for r in corpus]
    assert len(set(titles)) == len(titles)
    # near-duplicates exist: titles that differ by one character or share a surname
    surnames = [t.strip('"').split()[-1] for t in titles]
    assert len(set(surnames)) < len(surnames)


def test_make_again_is_cheap_because_resources_are_shared():
    a = small()
    b = small()
    assert a.resources is b.resources
    c = small(topk=5)
    assert c.resources is a.resources  # only data settings key the resources


def test_registered_search_tool_replaces_the_retriever():
    from twice_envs.envs.searchqa import register_search_tool
    from twice_envs.tools import FunctionTool

    calls = []

    def factory(res):
        def search(query, k):
            calls.append(query)
            return {"ids": list(range(len(res.corpus)))[-k:][::-1]}

        return FunctionTool("last_passages", "1", search)

    register_search_tool("last", factory)
    env = small(search_tool="last")
    env.reset(seed=0)
    obs, *_, info = env.step("<search> anything at all </search>")
    n = len(env.resources.corpus)
    assert info["retrieved"] == [env.resources.corpus.passage_id(i) for i in (n - 1, n - 2, n - 3)]
    env.fork(1).step("<search> anything at all </search>")
    assert calls == ["anything at all"]  # the fork read the journal
    with pytest.raises(ValueError):
        small(search_tool="never-registered")
