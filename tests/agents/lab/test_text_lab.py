"""TextLab: multi-line turns, a memory of the policy's own text, an exact oracle, key layouts."""

import itertools
import json
from dataclasses import replace

import numpy as np
import pytest

from twice_envs.agents.bench import learn as bench_learn
from twice_envs.agents.lab import cli, runners, toy
from twice_envs.agents.lab import text_lab as tl
from twice_envs.agents.lab.search_toy import SearchToySetting, search_toy_policy
from twice_envs.agents.lab.text_policy import TextLabState, text_lab_policy
from twice_envs.agents.lab.text_setting import TextLabSetting
from twice_envs.envs.searchtoy.env import SearchToyConfig, outcome, transition
from twice_envs.keys import NoiseKey
from twice_envs.noise import KeyState


def world(**kw) -> SearchToySetting:
    """SearchToy's default setting in the world of ``kw`` (the part a TextLab setting composes)."""
    return SearchToySetting(world=SearchToyConfig(**kw))


#: Small enough to enumerate every episode: 2 turns of at most 1 thought line of at most 2 words.
TINY = TextLabSetting(world(hops=1, queries=2, useful=1, horizon=2), words=2, memory_size=3, max_lines=1, max_words=2,
                      memory=1.5, act_bias=0.0)


def _walk(policy, texts):
    """``(found, prev, memory)`` before every turn, and after the last."""
    f, p, m, out = 0, policy.num_actions, 0, []
    for x in texts:
        out.append((f, p, m))
        ids = policy.encode(x)
        a = policy.action_of_ids(ids)
        f, p, m = transition(policy.config, f, a), a, policy.memory_after(m, ids)
    return out + [(f, p, m)]


def _grammar(s: TextLabSetting):
    """Every turn the policy's grammar allows, as token ids (independent of the policy's code)."""
    W = s.words
    lines = [list(w) + [W] for n in range(1, s.max_words + 1) for w in itertools.product(range(W), repeat=n)]
    actions = [[W + 2]] + [[W + 1, W + 3 + j] for j in range(s.world.queries)]
    for k in range(s.max_lines + 1):
        for ls in itertools.product(lines, repeat=k):
            for a in actions:
                yield [t for line in ls for t in line] + a


def _brute_value(policy, texts, turns) -> float:
    """``V`` after ``texts`` by enumerating every continuation."""
    c = policy.config
    f, p, m = _walk(policy, texts)[-1]
    if texts and (p == c.queries or len(texts) == c.horizon):
        return outcome(c, f)
    total = 0.0
    for ids in turns:
        prob = float(np.exp(policy.turn_logprobs(f, p, m, ids).sum()))
        if prob > 0:
            total += prob * _brute_value(policy, texts + [policy.decode(ids)], turns)
    return total


def test_exact_oracle_equals_brute_force_enumeration():
    policy = text_lab_policy(TINY)
    turns = list(_grammar(TINY))
    assert len(turns) == 21
    for f, p, m in [(0, 3, 0), (1, 0, 2), (0, 1, 1)]:  # every turn law sums to 1
        assert sum(np.exp(policy.turn_logprobs(f, p, m, ids).sum()) for ids in turns) == pytest.approx(1.0)
    v0 = _brute_value(policy, [], turns)
    assert policy.value == pytest.approx(v0, abs=1e-12)
    texts = [policy.decode(ids) for ids in turns]
    for y in texts[::4]:
        v1 = _brute_value(policy, [y], turns)
        for y2 in texts[::5]:
            adv = policy.episode_advantages([y, y2])
            vals = policy.episode_values([y, y2])
            assert vals[0] == pytest.approx(v0, abs=1e-12) and adv[0] == pytest.approx(v1 - v0, abs=1e-12)
            if policy.action_of_ids(policy.encode(y)) != TINY.world.queries:  # the episode goes on
                v2 = _brute_value(policy, [y, y2], turns)
                assert vals[1] == pytest.approx(v1, abs=1e-12) and adv[1] == pytest.approx(v2 - v1, abs=1e-12)
    # the law of (turns, facts found) is exact too
    law = policy.outcome_law()
    assert sum(law.values()) == pytest.approx(1.0)
    assert sum(v for (_, k), v in law.items() if k == 1) == pytest.approx(v0)


def test_memory_zero_is_search_toy_and_the_setting_is_representative():
    s0 = TextLabSetting(memory=0.0)
    p0, ref = text_lab_policy(s0), search_toy_policy(s0.search)
    assert p0.value == pytest.approx(ref.value, abs=1e-12)
    st = TextLabState(0, 0, 5, ref.num_actions, 0, ())
    assert np.allclose(p0.action_probs(st), ref.action_probs((0, 0, ref.num_actions)))
    # the default's turns: several lines, a varying number of tokens, recorded token by token
    policy = text_lab_policy()
    eps, _ = toy.toy_rollouts(policy, 120, 5, noise_seed=4)
    turns = [t for e in eps for t in e.turns]
    n_tok = np.array([len(t.token_ids) for t in turns])
    assert 1.5 < np.mean([t.text.count("\n") + 1 for t in turns]) and n_tok.min() <= 3 and n_tok.max() >= 15
    assert sum(e.num_generated_tokens for e in eps) == n_tok.sum()
    for t in turns[:50]:
        assert policy.decode(t.token_ids) == t.text and policy.encode(t.text) == t.token_ids
    # keyed sampling reproduces the exact value, and the recorded log-probs are the policy's
    u = np.array([e.utility for e in eps])
    assert abs(u.mean() - policy.value) < 4 * np.sqrt(policy.value * (1 - policy.value) / len(u))
    for e in eps[:20]:
        texts = [t.text for t in e.turns]
        for t, (f, p, m) in zip(e.turns, _walk(policy, texts)):
            assert np.allclose(t.logprobs, policy.turn_logprobs(f, p, m, t.token_ids))


def _later_turns(policy, memory: float, groups: int):
    """For coupled twins (line keys): ``(texts equal, memories equal)`` of every later turn at which
    the twin and its factual episode have the same facts found and previous action."""
    pol = text_lab_policy(replace(policy.setting, memory=memory))
    r = tl.coupled_twin_run(pol, groups, seed=2)
    out = []
    for (i, t), w in zip(r["index"], r["twins"]):
        ft = [x.text for x in r["episodes"][i].turns]
        wt = ft[:t] + [x.text for x in w.turns]
        sf, sw = _walk(pol, ft), _walk(pol, wt)
        out += [(ft[u] == wt[u], sf[u][2] == sw[u][2]) for u in range(t + 1, min(len(ft), len(wt)))
                if not w.self_twin and sf[u][:2] == sw[u][:2]]
    return out


def test_twins_do_not_remerge_with_memory_and_do_without():
    policy = text_lab_policy()
    with_memory = _later_turns(policy, 1.0, 6)
    assert sum(not same_text for same_text, _ in with_memory) >= 5  # same (found, prev), different text
    without = _later_turns(policy, 0.0, 6)
    assert len(without) >= 20 and all(same_text for same_text, _ in without)


def test_key_modes_reach_the_sampler():
    policy = text_lab_policy()
    keys = [NoiseKey(1000 + i, 2, 0) for i in range(200)]
    st = TextLabState(2, 0b001, 7, 0, 23, (1, 2, 6, 7))
    moved = [st._replace(tokens_before=40), st._replace(context=(3, 3, 6, 7))]
    texts = {}
    for mode in ("line", "flat", "counter", "ngram"):
        p = policy.with_key_mode(mode)
        texts[mode] = [[t.text for t in p.sample_turns([s] * len(keys), keys)] for s in [st, *moved]]
    # the token counter moves counter keys only, the context ngram keys only
    for mode, (base, counter_moved, context_moved) in texts.items():
        assert (base == counter_moved) == (mode != "counter")
        assert (base == context_moved) == (mode != "ngram")
    # line and flat keys agree on a turn's first line and part after it
    line, flat = texts["line"][0], texts["flat"][0]
    assert all(a.split("\n")[0] == b.split("\n")[0] for a, b in zip(line, flat))
    assert sum(a != b for a, b in zip(line, flat)) > 50


def test_line_keys_resynchronise_after_a_longer_line_and_flat_keys_do_not():
    # factual: a line of 2 words, then 3; the twin's first line has one word more
    factual, twin = [0, 1, 6, 2, 3, 4, 6], [0, 1, 5, 6, 2, 3, 4, 6]
    second = {"factual": slice(3, 7), "twin": slice(4, 8)}

    def rows(tokens, mode):
        ks = KeyState(NoiseKey(5, 3, 0), mode=mode, token_counter=11)
        out = []
        for t in tokens:
            out.append(ks.row())
            ks.advance(t, t == 6)
        return out

    for mode, same in (("line", True), ("flat", False), ("counter", False)):
        f, w = rows(factual, mode), rows(twin, mode)
        assert (f[second["factual"]] == w[second["twin"]]) == same, mode


def test_key_layout_rho_and_ngram_bias_report_cis():
    s = TextLabSetting(world(horizon=4))
    rho = tl.key_layout_rho(s, groups=12, seed=1, n_boot=100)
    assert set(rho) == {"line", "flat", "counter", "ngram", "independent"}
    for r in rho.values():
        assert r["lo"] <= r["value"] <= r["hi"] and r["decisions"] > 100 and r["mean_tokens"] > 4
    tv = tl.ngram_bias(s, groups=12, seed=1, n_boot=100)
    assert set(tv) == {"ngram", "line", "ngram - line"}
    for r in tv.values():
        assert r["lo"] <= r["value"] <= r["hi"]
    assert 0 < tv["line"]["value"] < 1 and tv["ngram - line"]["value"] == pytest.approx(
        tv["ngram"]["value"] - tv["line"]["value"])
    assert "rho-bar of coupled twins" in tl.format_measurements(rho, tv, "outcome")


def test_the_size_guard_refuses_a_too_large_oracle_before_sampling(tmp_path):
    with pytest.raises(ValueError, match=r"too large for its exact oracle: 387,723,264 table entries .* cap 2,000,000"):
        TextLabSetting(world(hops=10, queries=40, useful=20, horizon=50), memory_size=64)
    assert TextLabSetting(world(hops=6, useful=6), max_oracle=10**12).oracle_size > TextLabSetting().oracle_size
    with pytest.raises(SystemExit):
        cli.lab_main(["--env", "TextLab-v0", "--hops", "10", "--queries", "40", "--useful", "20", "--horizon", "50",
                         "--out", str(tmp_path)])
    assert not (tmp_path / "lab_audit.json").exists()


def test_twice_audit_on_textlab_writes_its_json(tmp_path, capsys):
    assert cli.lab_main(["--env", "TextLab-v0", "--groups", "8", "--n-boot", "50", "--pairs", "1", "--vine-k", "1",
                            "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "lab_audit.json").read_text())
    assert doc["config"]["env"] == "TextLab-v0" and doc["config"]["text_setting"]["memory"] == 1.0
    assert "twice J1" in capsys.readouterr().out


def test_replica_pairs_count_every_generated_token():
    # decisions at the last of 2 turns: after them nothing is generated, so the pair's tokens are
    # the replica's turn (the factual turn's tokens) and the twin's alternative turn
    policy = text_lab_policy(TextLabSetting(world(horizon=2)))
    eps, envs = toy.toy_rollouts(policy, 4, 3, noise_seed=5)
    decisions = [(i, 1) for i, e in enumerate(eps) if len(e.turns) == 2]
    u, u2, tokens = runners.replica_pairs(policy, eps, envs, decisions, 1)
    factual_tokens = sum(len(eps[i].turns[t].token_ids) for i, t in decisions)
    assert len(u) == len(u2) == len(decisions) >= 4
    assert factual_tokens < tokens <= factual_tokens + 30 * len(decisions)  # a turn has at most 4 x 7 + 2 tokens


def test_policy_gradient_is_the_score_of_the_log_probabilities():
    s = TextLabSetting(world(hops=2, queries=3, useful=2, horizon=3), words=3, memory_size=5, max_lines=2, max_words=3)
    policy = text_lab_policy(s)
    eps, _ = toy.toy_rollouts(policy, 4, 5, noise_seed=1)
    # episodes of several turns whose thoughts move the memory within a turn
    eps = [e for e in eps if len(e.turns) > 1 and sum(t < s.words for x in e.turns for t in x.token_ids) > 2]
    assert len(eps) >= 3

    def logprob(logits, ep):
        p = policy.with_logits(logits)
        texts = [t.text for t in ep.turns]
        return sum(p.turn_logprobs(f, pr, m, t.token_ids).sum() for t, (f, pr, m) in zip(ep.turns, _walk(p, texts)))

    h = 1e-6
    for ep in eps[:3]:
        g = policy.policy_gradient([ep], [np.ones(len(ep.turns))])
        fd = np.zeros_like(policy.logits)
        for idx in np.ndindex(policy.logits.shape):
            e = np.zeros_like(policy.logits)
            e[idx] = h
            fd[idx] = (logprob(policy.logits + e, ep) - logprob(policy.logits - e, ep)) / (2 * h)
        assert np.allclose(g, fd, atol=1e-6) and np.abs(g).max() > 0.01
    # bench learn trains the TextLab policy through the same call
    cfg = bench_learn.LearnConfig(env="TextLab-v0", text_setting=TextLabSetting(world(horizon=4)), seeds=1,
                                  updates=2, groups=3, methods=("grpo",), lr_grid=())
    res = bench_learn.run_learn(cfg)
    assert len(res["methods"]["grpo"]["curve"]) == 3
    assert res["methods"]["grpo"]["curve"][0] == pytest.approx(text_lab_policy(cfg.text_setting).value)
