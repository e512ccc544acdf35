"""What a ``twice train`` run folder records for the explorer: tokens with their keys, credit, coins, twins."""

from __future__ import annotations

import json

from twice_envs.agents.training.trainer import train
from twice_envs.agents.types import EpisodeRecord
from twice_envs.agents.view.load import load
from twice_envs.agents.records import RUN_EPISODES
from twice_envs.noise import KeyState

from ..train_helpers import one_torch_thread, small_policy, toy_config  # noqa: F401


def _lines(run):
    """The records of a run's episode file, checked against the header that counts them (its first line)."""
    head, *lines = (run / RUN_EPISODES).read_text().splitlines()
    assert json.loads(head) == {"format": "twice_envs.records/1", "records": len(lines)}
    return [json.loads(x) for x in lines]


def test_a_twice_run_records_tokens_keys_credit_coins_and_twins(tmp_path):
    cfg = toy_config(tmp_path, method="twice", updates=2)
    train(cfg, policy=small_policy(0), progress=False)
    run = tmp_path / "run"
    lines = _lines(run)
    assert sorted({x["batch"] for x in lines}) == [1, 2]
    factual = [x for x in lines if x["episode"]["twin_of"] is None]
    twins = [x for x in lines if x["episode"]["twin_of"] is not None]
    assert factual and twins
    tok = small_policy(0).tokenizer
    for x in factual + twins:
        ep = EpisodeRecord.from_json(x["episode"])
        assert "prompt_ids" not in x["episode"]  # run folders leave the context's token ids out
        for t in ep.turns:
            # each token's text and the key it read, as the sampler's key state walks the turn
            assert t.token_texts == [tok.decode([v], skip_special_tokens=False, clean_up_tokenization_spaces=False)
                                     for v in t.token_ids]
            state = KeyState(t.noise_key)
            for v, text, key in zip(t.token_ids, t.token_texts, t.token_keys):
                assert key == list(state.row()[2:])
                state.advance(v, "\n" in text)
    for x in factual:
        ep = x["episode"]
        assert set(ep["credit"]) == {"twice", "grpo"} and len(ep["credit"]["twice"]) == len(ep["turns"])
        assert [set(c) for c in ep["coins"]] == [{"q", "B", "A_hat"}] * len(ep["turns"])
    for x in twins:
        i, t = x["episode"]["twin_of"]
        (f,) = [y for y in factual if y["batch"] == x["batch"] and y["index"] == i]
        assert f["episode"]["coins"][t]["B"] is True  # a twin exists only where the branch coin fell 1
        assert x["episode"]["turns"][0]["noise_key"][2] >= 1  # the alternative turn is on a branch k >= 1
        assert x["episode"]["self_twin"] or isinstance(x["episode"]["evidence_coin"], bool)
    # the explorer joins every twin to its factual episode
    x = load(run)
    assert x.problems == [] and sum(len(d["twins"]) for d in x.details) == len(twins)


def test_a_resumed_run_drops_the_records_of_the_updates_it_redoes(tmp_path):
    train(toy_config(tmp_path, method="grpo", updates=2), policy=small_policy(0), progress=False)
    run = tmp_path / "run"
    before = _lines(run)
    # a crash after update 2 was recorded but before its checkpoint: resume redoes update 2 from update 1's state
    train(toy_config(tmp_path / "b", method="grpo", updates=1), policy=small_policy(0), progress=False)
    b = tmp_path / "b" / "run"
    with open(b / RUN_EPISODES, "a") as fh:
        fh.write(json.dumps({"batch": 2, "episode": {}}) + "\n")
    train(toy_config(tmp_path / "b", method="grpo", updates=2), policy=small_policy(0), progress=False, resume=True)
    after = _lines(b)
    assert [x["batch"] for x in after] == [x["batch"] for x in before]
    assert [x["episode"]["utility"] for x in after] == [x["episode"]["utility"] for x in before]


def test_a_run_without_twins_says_why(tmp_path):
    train(toy_config(tmp_path, method="grpo", updates=1), policy=small_policy(0), progress=False)
    x = load(tmp_path / "run")
    assert x.rows and all("ran no twins" in d["why"] for d in x.details)
