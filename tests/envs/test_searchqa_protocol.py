"""Golden tests of the Search-R1 protocol pieces: parsing, formatting, normalisation, scoring."""

import pytest

from twice_envs.envs.searchqa import protocol as P


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("The  Eiffel Tower!", "eiffel tower"),
        ("an Apple a day", "apple day"),
        ("  A.B.C.  ", "abc"),
        ("Theatre of the Absurd", "theatre of absurd"),
        ("1,234,500", "1234500"),
        ("Ünïcödé  Straße", "ünïcödé straße"),
        ("", ""),
    ],
)
def test_normalize_answer_golden(raw, expected):
    assert P.normalize_answer(raw) == expected


def test_exact_match_any_gold_after_normalisation():
    assert P.exact_match("the Eiffel tower.", ["Eiffel Tower"]) == 1.0
    assert P.exact_match("Eiffel", ["Eiffel Tower"]) == 0.0
    assert P.exact_match("Paris", ["Lyon", "paris"]) == 1.0
    assert P.exact_match("", ["Paris"]) == 0.0


def test_sub_exact_match_is_gold_inside_prediction():
    assert P.sub_exact_match("It is the Eiffel Tower in Paris", ["eiffel tower"]) == 1.0
    assert P.sub_exact_match("Eiffel", ["Eiffel Tower"]) == 0.0
    # a blank gold never matches everything
    assert P.sub_exact_match("anything", ["the", "zzz"]) == 0.0


def test_f1_golden_values():
    assert P.f1_score("Eiffel Tower", ["Eiffel Tower"]) == 1.0
    # prediction "eiffel tower paris" vs gold "eiffel tower": p=2/3, r=1 -> 0.8
    assert P.f1_score("the Eiffel Tower, Paris", ["Eiffel Tower"]) == pytest.approx(0.8)
    assert P.f1_score("Tower", ["Eiffel Tower", "Big Ben"]) == pytest.approx(2 / 3)
    assert P.f1_score("nothing", ["Eiffel Tower"]) == 0.0
    assert P.f1_score("yes", ["no"]) == 0.0
    assert P.f1_score("yes", ["yes"]) == 1.0
    assert P.f1_score("", ["x"]) == 0.0


@pytest.mark.parametrize(
    "turn, kind, content",
    [
        ("<think>hmm</think>\n<search> who founded X </search>", "search", "who founded X"),
        ("<answer> Paris </answer>", "answer", "Paris"),
        ("<answer>\nmulti\nline\n</answer>", "answer", "multi\nline"),
        ("<search> a </search><answer> b </answer>", "search", "a"),
        ("<answer> b </answer> then <search> a </search>", "answer", "b"),
        # the turn ends at the first stop string, so the later search is never seen
        ("<search> a </answer> <search> b </search>", None, ""),
        ("<search>unclosed", None, ""),
        ("<search> a </answer>", None, ""),
        ("</answer></search><answer>", None, ""),
        ("plain text", None, ""),
        ("<search></search>", "search", ""),
        ("<SEARCH> a </SEARCH>", None, ""),
    ],
)
def test_parse_action_golden(turn, kind, content):
    act = P.parse_action(turn)
    assert act.kind == kind
    if kind is not None:
        assert act.content == content


def test_cut_at_stop_uses_the_earliest_stop():
    assert P.cut_at_stop("x </answer> y </search>") == "x </answer>"
    assert P.cut_at_stop("x </search> y </answer>") == "x </search>"
    assert P.cut_at_stop("no stop") == "no stop"


def test_first_prompt_and_question_format():
    assert P.format_question("  Who is X  ") == "Who is X?"
    assert P.format_question("Who is X?") == "Who is X?"
    prompt = P.first_prompt(" who is x")
    assert prompt.startswith(P.INSTRUCTIONS)
    assert prompt.endswith(" Question: who is x?\n")
    for tag in ("<think>", "<search>", "</search>", "<information>", "<answer>", "</answer>"):
        assert tag in P.INSTRUCTIONS


def test_passage_formatting_golden():
    body = P.format_passages(['"Alpha"\nAlpha is a town.', '"Beta"\nBeta is\na river.', "no title line"])
    assert body == 'Doc 1(Title: "Alpha") Alpha is a town.\nDoc 2(Title: "Beta") Beta is\na river.\nDoc 3(Title: no title line) '
    assert P.information_block(body + "\n") == f"\n\n<information>{body.strip()}</information>\n\n"


def test_invalid_action_message_names_both_tags():
    for tag in ("<search>", "</search>", "<answer>", "</answer>"):
        assert tag in P.INVALID_ACTION
    assert "invalid" in P.INVALID_ACTION


def test_clean_query_handles_odd_input():
    assert P.clean_query("  a \n\t b  ") == "a b"
    assert P.clean_query("x" * 5000) == "x" * P.MAX_QUERY_CHARS
    assert P.clean_query("bad \ud800 surrogate \x00 nul") == "bad ? surrogate nul"
    assert P.clean_query("\u200b\u202e") == ""
    assert P.clean_query("日本 🙂") == "日本 🙂"


@pytest.mark.parametrize("shape", ["<search>", "<answer>", "<search>x</answer>", "<"])
def test_parse_action_takes_linear_time(shape):
    from tests.envs._timing import growth

    assert growth(P.parse_action, shape) < 20  # 8x the input: linear ~8, quadratic ~64
