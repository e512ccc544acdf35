"""SearchQA on the user's own files: wiki-18 corpus, FlashRAG JSONL, Search-R1 parquet; BM25 and dense."""

import itertools
import json

import numpy as np
import pytest

import twice_envs
from twice_envs.envs.searchqa import resources
from twice_envs.envs.searchqa.bm25 import BM25Index, BM25Params, Tokenizer, build_index
from twice_envs.envs.searchqa.corpus import open_corpus
from twice_envs.envs.searchqa.loaders import (
    iter_corpus_jsonl,
    load_flashrag_jsonl,
    load_questions,
    load_searchr1_parquet,
)
from twice_envs.errors import DataFormatError

PASSAGES = [
    ("0", '"Aldermoor"\nAldermoor is a river port founded by the weaver Ilsa Varn in 1702.'),
    ("1", '"Ilsa Varn"\nIlsa Varn was a weaver and the founder of Aldermoor. She was born in Quell.'),
    ("2", '"Quell"\nQuell is a mountain village known for its copper bells.'),
    ("3", '"Copper bell"\nA copper bell is a bell cast from copper; Quell is famous for them.'),
    ("4", '"Same"\nidentical text about lanterns'),
    ("5", '"Same"\nidentical text about lanterns'),
    ("6", '"Ünïcode Town"\nA town whose name has accents: Ünïcode Town, home of 日本 traders.'),
]


@pytest.fixture(scope="module", autouse=True)
def cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TWICE_CACHE", str(tmp_path_factory.mktemp("twice_cache_data")))
        resources.clear()
        yield
    resources.clear()


def write_corpus(path, rows=PASSAGES):
    path.write_text("".join(json.dumps({"id": i, "contents": c}, ensure_ascii=False) + "\n" for i, c in rows), encoding="utf-8")
    return path


def write_flashrag(path):
    rows = [
        {"id": "q1", "question": "who founded aldermoor", "golden_answers": ["Ilsa Varn"]},
        {"id": "q2", "question": "Where was Ilsa Varn born?", "golden_answers": ["Quell", "Quell village"]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_parquet(path, rows=None):
    import pyarrow as pa
    import pyarrow.parquet as pq

    def prompt(q):
        return [{"role": "user", "content": f"Answer the given question. Use <search>. Question: {q}\n"}]

    rows = rows or [
        {"data_source": "nq", "prompt": prompt("what is quell known for?"), "ability": "fact-reasoning",
         "reward_model": {"style": "rule", "ground_truth": {"target": ["copper bells"]}},
         "extra_info": {"split": "test", "index": 0}},
        {"data_source": "hotpotqa", "prompt": prompt("In which year was Aldermoor founded?"), "ability": "fact-reasoning",
         "reward_model": {"style": "rule", "ground_truth": {"target": ["1702"]}},
         "extra_info": {"split": "test", "index": 1}},
    ]
    pq.write_table(pa.Table.from_pylist(rows), str(path))
    return path


def test_three_real_formats_load(tmp_path):
    rows = list(iter_corpus_jsonl(write_corpus(tmp_path / "wiki.jsonl")))
    assert rows[0] == (1, "0", PASSAGES[0][1]) and len(rows) == len(PASSAGES)
    fr = load_flashrag_jsonl(write_flashrag(tmp_path / "q.jsonl"))
    assert [(q.id, q.golden_answers) for q in fr] == [("q1", ("Ilsa Varn",)), ("q2", ("Quell", "Quell village"))]
    pr = load_searchr1_parquet(write_parquet(tmp_path / "q.parquet"))
    assert [q.question for q in pr] == ["what is quell known for?", "In which year was Aldermoor founded?"]
    assert [q.id for q in pr] == ["nq_test_0", "hotpotqa_test_1"] and pr[1].golden_answers == ("1702",)
    assert load_questions(tmp_path / "q.parquet")[0].metadata["data_source"] == "nq"


def test_env_on_user_files(tmp_path):
    corpus = write_corpus(tmp_path / "wiki.jsonl")
    env = twice_envs.make(
        "SearchQA-v0", corpus=str(corpus),
        questions={"train": str(write_flashrag(tmp_path / "q.jsonl")), "test": str(write_parquet(tmp_path / "q.parquet"))},
    )
    obs, info = env.reset(seed=0, options={"task": "q1"})
    assert obs.endswith("Question: who founded aldermoor?\n")
    obs, *_ , info = env.step("<search> founder of Aldermoor </search>")
    assert obs.startswith('\n\n<information>Doc 1(Title: "Ilsa Varn") Ilsa Varn was a weaver')
    assert info["retrieved"][0] == "1"
    _, r, term, _, info = env.step("<answer> Ilsa Varn </answer>")
    assert (r, term) == (1.0, True)
    _, info = env.reset(seed=0, options={"split": "test", "index": 1})
    assert info["golden_answers"] == ["1702"]
    assert twice_envs.check_env(env, extra_actions=["<search> quell </search>", "<answer> 1702 </answer>"], num_episodes=2, num_steps=4, subprocess_check=False)


@pytest.mark.parametrize(
    "content, line, problem",
    [
        ('{"id": "0", "contents": "\\"A\\"\\nx"}\n{"id": "1", "contents": "\\"B\\"\\ny"}\n{not json\n', 3, "not a valid JSON"),
        ('{"id": "0", "contents": "\\"A\\"\\nx"}\n{"id": "1", "text": "y"}\n', 2, "contents"),
        ('["a", "b"]\n', 1, "JSON object"),
        ('{"id": 1.5, "contents": "x"}\n', 1, "'id'"),
    ],
)
def test_bad_corpus_lines_name_file_and_line(tmp_path, content, line, problem):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(DataFormatError) as err:
        list(iter_corpus_jsonl(path))
    assert err.value.line == line and problem in err.value.problem and str(path) in str(err.value)
    with pytest.raises(DataFormatError):
        open_corpus(path)


def test_corpus_reading_streams(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "0", "contents": "\\"A\\"\\nx"}\n' * 3 + "broken\n")
    it = iter_corpus_jsonl(path)
    assert [r[1] for r in itertools.islice(it, 3)] == ["0", "0", "0"]  # read before the bad line is reached
    with pytest.raises(DataFormatError):
        next(it)


@pytest.mark.parametrize(
    "content, line, problem",
    [
        ('{"id": "a", "question": "q?", "golden_answers": ["x"]}\n{"id": "b", "question": "q?", "golden_answers": []}\n', 2, "empty gold answers"),
        ('{"id": "a", "question": "q?"}\n', 1, "golden_answers"),
        ('{"id": "a", "question": "", "golden_answers": ["x"]}\n', 1, "question"),
        ('{"id": "a", "question": "q", "golden_answers": [3]}\n', 1, "strings"),
        ('\n\n{"id": "a", "question": "q", "golden_answers": ["x"]\n', 3, "JSON"),
        ('{"id": "a", "question": "q", "golden_answers": ["x"]}\n{"id": "b", "question": "q", "golden_answers": {"x": 1}}\n',
         2, "'golden_answers' must be a string or a list of strings, got an object"),
        ('{"id": {"n": 1}, "question": "q", "golden_answers": ["x"]}\n', 1, "'id' must be a string or an integer, got an object"),
        ('{"id": true, "question": "q", "golden_answers": ["x"]}\n', 1, "'id' must be a string or an integer, got a boolean"),
        ('{"id": [1], "question": "q", "golden_answers": ["x"]}\n', 1, "'id' must be a string or an integer, got an array"),
    ],
)
def test_bad_question_files(tmp_path, content, line, problem):
    path = tmp_path / "q.jsonl"
    path.write_text(content)
    with pytest.raises(DataFormatError) as err:
        load_flashrag_jsonl(path)
    assert err.value.line == line and problem in err.value.problem


def test_bad_parquet_answers_and_ids_name_the_row(tmp_path):
    good = {"data_source": "nq", "prompt": [{"role": "user", "content": "Question: a?"}],
            "reward_model": {"style": "rule", "ground_truth": {"target": ["x"]}}}
    as_dict = {"data_source": "nq", "prompt": [{"role": "user", "content": "Question: b?"}],
               "reward_model": {"style": "rule", "ground_truth": {"target": {"x": "y"}}}}
    path = write_parquet(tmp_path / "answers.parquet", [as_dict, as_dict])  # one column type per file
    with pytest.raises(DataFormatError) as err:
        load_searchr1_parquet(path)
    assert err.value.line == 1 and str(path) in str(err.value)
    assert "'reward_model.ground_truth.target' must be a string or a list of strings, got an object" in err.value.problem
    path = write_parquet(tmp_path / "ids.parquet", [{**good, "id": {"n": 1}}, {**good, "id": {"n": 2}}])
    with pytest.raises(DataFormatError) as err:
        load_searchr1_parquet(path)
    assert err.value.line == 1 and "'id' must be a string or an integer, got an object" in err.value.problem


def test_duplicate_corpus_ids_are_refused_naming_both_lines(tmp_path):
    rows = [("a", '"A"\nx'), ("b", '"B"\ny'), ("c", '"C"\nz'), ("b", '"B2"\nw')]
    path = write_corpus(tmp_path / "dup.jsonl", rows)
    with pytest.raises(DataFormatError) as err:
        open_corpus(path)
    assert err.value.line == 4 and str(path) in str(err.value)
    assert "duplicate passage id 'b' (first on line 2)" in err.value.problem
    # an integer id and the same id written as a string are the same passage id
    path = tmp_path / "mixed.jsonl"
    path.write_text('{"id": 7, "contents": "\\"A\\"\\nx"}\n{"id": "7", "contents": "\\"B\\"\\ny"}\n')
    with pytest.raises(DataFormatError, match=r"mixed.jsonl:2: duplicate passage id '7' \(first on line 1\)"):
        open_corpus(path)
    # rows without ids are numbered by position, which an explicit id may collide with
    path = tmp_path / "implicit.jsonl"
    path.write_text('{"contents": "\\"A\\"\\nx"}\n{"id": "0", "contents": "\\"B\\"\\ny"}\n')
    with pytest.raises(DataFormatError, match="implicit.jsonl:2: duplicate passage id '0'"):
        open_corpus(path)


def test_bad_parquet_and_missing_files(tmp_path):
    good = {"data_source": "nq", "prompt": [{"role": "user", "content": "Question: a?"}],
            "reward_model": {"style": "rule", "ground_truth": {"target": ["x"]}}}
    bad = {"data_source": "nq", "prompt": [{"role": "user", "content": "Question: b?"}],
           "reward_model": {"style": "rule", "ground_truth": {"target": []}}}
    path = write_parquet(tmp_path / "bad.parquet", [good, good, bad])
    with pytest.raises(DataFormatError) as err:
        load_searchr1_parquet(path)
    assert err.value.line == 3 and "empty gold answers" in err.value.problem
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataFormatError):
        load_searchr1_parquet(tmp_path / "junk.parquet")
    for loader in (load_flashrag_jsonl, load_searchr1_parquet, open_corpus):
        with pytest.raises(DataFormatError):
            loader(tmp_path / "missing.file")
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DataFormatError):
        open_corpus(tmp_path / "empty.jsonl")
    with pytest.raises(ValueError):
        twice_envs.make("SearchQA-v0", corpus=str(write_corpus(tmp_path / "w.jsonl")))  # no questions


def test_bm25_scores_equal_bm25s_and_chunking_does_not_matter(tmp_path):
    import bm25s

    texts = [c for _, c in PASSAGES] * 3
    params = BM25Params(k1=1.2, b=0.75)
    build_index(texts, tmp_path / "one", params)
    build_index(texts, tmp_path / "chunked", params, chunk_size=4)
    one, chunked = BM25Index(tmp_path / "one"), BM25Index(tmp_path / "chunked")
    for name in ("data", "indices", "indptr"):
        assert np.array_equal(getattr(one, name), getattr(chunked, name))
    tok = Tokenizer()
    ref = bm25s.BM25(k1=1.2, b=0.75, method="lucene")
    ref.index([tok(t) for t in texts], show_progress=False)
    for q in ("founder of Aldermoor", "copper bells quell", "lanterns", "weaver born Quell village"):
        mine = one.scores(one.term_ids(q))
        theirs = ref.get_scores(tok(q))
        assert np.allclose(mine, theirs, rtol=1e-5, atol=1e-6)
    queries = ["founder of Aldermoor", "lanterns lanterns copper", "", "zzz", "Ünïcode 日本", "the of and"]
    assert one.search_batch(queries, 5) == [one.search(q, 5) for q in queries]
    ids, _ = one.search("identical lanterns", 4)
    assert ids == [4, 5, 11, 12]  # equal scores: lower position first
    assert one.search("zzzz unknownword", 3) == ([], [])


def test_journal_from_another_corpus_version_is_never_reused(tmp_path):
    journal = str(tmp_path / "search.sqlite")
    qfile = str(write_flashrag(tmp_path / "q.jsonl"))
    a = write_corpus(tmp_path / "a.jsonl")
    env_a = twice_envs.make("SearchQA-v0", corpus=str(a), questions=qfile, journal=journal)
    env_a.reset(seed=0)
    obs_a = env_a.step("<search> copper bells </search>")[0]
    assert '"Quell"' in obs_a
    b = write_corpus(tmp_path / "b.jsonl", [(i, c.replace("Quell", "Vorn")) for i, c in PASSAGES])
    env_b = twice_envs.make("SearchQA-v0", corpus=str(b), questions=qfile, journal=journal)
    assert env_b.resources.tool.version != env_a.resources.tool.version
    env_b.reset(seed=0)
    obs_b = env_b.step("<search> copper bells </search>")[0]
    assert '"Vorn"' in obs_b and "Quell" not in obs_b
    assert len(env_b.resources.journal) == 2
    # the same file changed in place gets a new version too
    write_corpus(a, PASSAGES[:3])
    resources.clear()
    env_c = twice_envs.make("SearchQA-v0", corpus=str(a), questions=qfile, journal=journal)
    assert len(env_c.resources.corpus) == 3 and env_c.resources.tool.version != env_a.resources.tool.version


@pytest.mark.slow
def test_dense_retrieval_and_prebuilt_index(tmp_path):
    import faiss

    from twice_envs.envs.searchqa.retrievers import DenseParams, DenseRetriever

    store = open_corpus(write_corpus(tmp_path / "wiki.jsonl"))
    dense = DenseRetriever(store, DenseParams())
    ids, scores = dense.search("Ilsa Varn, the weaver who founded Aldermoor", 3)
    assert ids[0] in (0, 1) and scores == sorted(scores, reverse=True) and len(ids) == 3
    same, _ = dense.search("identical text about lanterns", 2)
    assert same == [4, 5]  # equal vectors: lower position first
    emb = dense.encoder.encode([dense.params.passage_prefix + c for c in store.iter_contents()])
    index = faiss.IndexFlatIP(emb.shape[1])
    index.add(emb)
    faiss.write_index(index, str(tmp_path / "prebuilt.index"))
    pre = DenseRetriever(store, DenseParams(index_path=str(tmp_path / "prebuilt.index")))
    assert pre.search("copper bells", 3)[0] == dense.search("copper bells", 3)[0]
    assert pre.version != dense.version
    small = faiss.IndexFlatIP(emb.shape[1])
    small.add(emb[:2])
    faiss.write_index(small, str(tmp_path / "small.index"))
    with pytest.raises(ValueError):
        DenseRetriever(store, DenseParams(index_path=str(tmp_path / "small.index")))


def test_a_repeated_question_id_warns_at_load_and_a_task_reset_refuses_it(tmp_path):
    corpus = write_corpus(tmp_path / "wiki.jsonl")
    rows = [{"id": "train_0", "question": "who founded aldermoor", "golden_answers": ["Ilsa Varn"]},
            {"id": "train_0", "question": "Where was Ilsa Varn born?", "golden_answers": ["Quell"]},
            {"id": "train_1", "question": "what is quell known for", "golden_answers": ["copper bells"]}]
    path = tmp_path / "merged.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.warns(UserWarning, match=r"1 question ids name more than one question in .*merged\.jsonl "
                                         r"\(e\.g\. 'train_0' at train 0, train 1\)"):
        env = twice_envs.make("SearchQA-v0", corpus=str(corpus), questions={"train": str(path)})
    with pytest.raises(ValueError, match=r"question id 'train_0' names 2 questions \(train 0, train 1\)"):
        env.reset(seed=0, options={"task": "train_0"})
    # each question stays reachable by split and index, and a unique id still resets by id
    _, info = env.reset(seed=0, options={"split": "train", "index": 1})
    assert info["question"] == "Where was Ilsa Varn born?"
    _, info = env.reset(seed=0, options={"task": "train_1"})
    assert info["golden_answers"] == ["copper bells"]
