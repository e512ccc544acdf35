"""``twice view`` without a browser: reading records, runs and audits, and the page's embedding."""

from __future__ import annotations

import json
import re

import pytest

from twice_envs.agents.types import EpisodeRecord
from twice_envs.agents import records
from twice_envs.agents.view.cli import view_main, write_explorer
from twice_envs.agents.view.load import load
from twice_envs.agents.view.page import embed_json, render
from twice_envs.cli import COMMANDS
from twice_envs.errors import TrajectoryFormatError

from ._pairs import damaged_lines, lone_episode, resync_pair, write_records


def _index(page: str) -> dict:
    block = re.search(r'<script type="application/json" id="twice-index">(.*?)</script>', page, re.S).group(1)
    return json.loads(block)


def test_view_is_a_command():
    assert COMMANDS["view"][0] == "twice_envs.agents.view.cli:view_main"


def test_a_twin_is_joined_to_its_factual_episode(tmp_path):
    factual, twin = resync_pair()
    x = load(write_records(tmp_path / "pair.jsonl", [factual, lone_episode()], [twin]))
    assert x.problems == [] and len(x.rows) == 2
    d = x.details[0]
    assert d["task"] == "dev_3" and d["question"] == "a question" and d["U"] == 1.0
    (tw,) = d["twins"]
    assert (tw["t"], tw["k"], tw["U"], tw["U2"], tw["D"], tw["S"]) == (0, 1, 1.0, 0.0, 1.0, True)
    # each token with its key (turn, branch, line, pos), the key base's seed as text
    t1 = tw["turns"][1]
    assert t1["tt"] == ["z", "\n", "e", " f", "\n"] and t1["key"] == ["12345", 1, 0]
    assert t1["tk"] == [1, 0, 0, 0, 1, 0, 0, 1, 1, 0, 1, 0, 1, 0, 1, 1, 1, 0, 1, 2]
    assert d["turns"][0]["credit"] == {"twice": 0.25, "grpo": 0.8}
    assert d["turns"][0]["coins"] == {"q": 0.5, "B": True, "A_hat": 0.5}
    # the row: [id, source, task, question, return, turns, method, twins, mixed, batch, group]
    assert x.rows[0][7] == 1 and x.rows[1][7] == 0
    assert x.details[1]["why"].startswith("no twins in this file")


def test_mixed_groups_are_flagged(tmp_path):
    eps = [lone_episode(group=0, utility=0.0), lone_episode(group=0, utility=1.0), lone_episode(group=1, utility=0.0)]
    x = load(write_records(tmp_path / "g.jsonl", eps))
    assert [r[8] for r in x.rows] == [True, True, False]


def test_a_damaged_file_names_file_and_line_and_the_rest_is_read(tmp_path):
    factual, twin = resync_pair()
    path = write_records(tmp_path / "bad.jsonl", [factual], [twin], damaged_lines())
    with open(path, "ab") as fh:
        fh.write(b"\xff\xfe not utf-8\n")
    x = load(path)
    assert len(x.rows) == 1 and len(x.details[0]["twins"]) == 1
    *damaged, count = x.problems
    lines = sorted(int(re.search(r":(\d+):", p).group(1)) for p in damaged)
    assert lines == [4, 5, 6, 7], x.problems  # line 1 is the header counting the records
    assert count == f"{path}: holds 6 records, more than the 5 its header counts " \
                    "(an append that did not finish, or lines added by hand)"
    assert all(p.startswith(str(path)) for p in x.problems)
    page = render(x)
    assert _index(page)["problems"] == x.problems


def test_a_twin_without_its_factual_episode_is_shown_alone(tmp_path):
    _, twin = resync_pair()
    x = load(write_records(tmp_path / "orphan.jsonl", [], [twin]))
    assert len(x.rows) == 1 and "not in the file" in x.details[0]["why"]


def test_bare_trajectories_are_shown_and_say_why_they_have_no_twins(tmp_path):
    import twice_envs
    from twice_envs.trajectory import save_trajectories

    env = twice_envs.make("CreditToy-v0")
    env.reset(seed=0)
    env.step("0")
    save_trajectories(tmp_path / "t.jsonl", [env.trajectory])
    x = load(tmp_path / "t.jsonl")
    assert x.problems == [] and len(x.rows) == 1 and "bare trajectory" in x.details[0]["why"]
    assert x.details[0]["turns"][0]["text"] == "0"


def test_embedded_text_cannot_close_the_script_block():
    text = embed_json({"a": "</script><script>alert(1)</script> & <!--"})
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == {"a": "</script><script>alert(1)</script> & <!--"}


def test_the_page_embeds_each_detail_at_its_offsets(tmp_path):
    factual, twin = resync_pair(text="caf\u00e9 \U0001f600 </script>")
    page = render(load(write_records(tmp_path / "p.jsonl", [factual, lone_episode()], [twin])))
    index = _index(page)
    details = re.search(r'id="twice-details">(.*?)</script>', page, re.S).group(1)
    assert details.isascii()  # so Python offsets are JavaScript's
    for k, (a, b) in enumerate(index["offsets"]):
        assert json.loads(details[a:b])["id"] == k
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "") and "https://" not in page
    assert "Content-Security-Policy" in page


def test_records_keep_their_batch_and_index_and_replay(tmp_path):
    factual, twin = resync_pair()
    line = records.record_line(factual, batch=3, index=0, slim=True)
    assert line["batch"] == 3 and line["index"] == 0 and "prompt_ids" not in line["episode"]
    back = EpisodeRecord.from_json(line["episode"])
    assert back.credit == factual.credit and back.coins == factual.coins
    assert back.turns[0].token_keys == factual.turns[0].token_keys
    # a resumed run keeps the batches it will not redo
    path = tmp_path / "episodes.jsonl"
    records.append_lines(path, records.batch_lines([factual], [twin], batch=1))
    records.append_lines(path, records.batch_lines([factual], batch=2))
    records.keep_batches(path, 1)
    head, *kept = path.read_text().splitlines()
    assert json.loads(head) == {"format": "twice_envs.records/1", "records": 2}  # recounted
    assert [json.loads(x)["batch"] for x in kept] == [1, 1]


def test_nan_credit_is_written_as_null(tmp_path):
    factual, _ = resync_pair()
    factual.credit = {"twice": [float("nan"), 1.0]}
    line = records.dumps(records.record_line(factual))
    assert json.loads(line)["episode"]["credit"]["twice"] == [None, 1.0]


def test_a_run_folder_gives_curves_with_intervals(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"method": "twice"}))
    rows = [{"update": 0, "eval": {"measure": "em", "em": 0.1, "em_ci": [0.0, 0.3]}},
            {"update": 1, "reward": 0.5}, {"update": 2, "reward": 0.25},
            {"update": 2, "eval": {"measure": "em", "em": 0.2, "em_ci": [0.1, 0.4]}}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "{broken\n")
    eps = [lone_episode(utility=u) for u in (0.0, 1.0)]
    records.append_lines(run / records.RUN_EPISODES, records.batch_lines(eps, batch=1))
    records.append_lines(run / records.RUN_EPISODES, records.batch_lines(eps[:1], batch=2))
    x = load(run)
    assert len(x.rows) == 3 and x.rows[0][6] == "twice"
    reward, em = x.curves
    s = reward["series"][0]
    assert s["x"] == [1, 2] and s["y"] == [0.5, 0.0]
    assert s["lo"][0] < 0.5 < s["hi"][0]  # the first update's 95% interval from its episodes
    assert em["series"][0]["lo"] == [0.0, 0.1]
    assert any("metrics.jsonl:5" in p for p in x.problems)


def test_an_audit_folder_gives_a_scatter_whose_points_open_episodes(tmp_path):
    factual, twin = resync_pair()
    lines = records.decision_lines([factual], [twin], [(0, 0), (0, 1)], {"grpo": [0.8, 0.8], "twice J1": [1.0, 0.0]},
                                   [0.6, -0.1])
    audit = tmp_path / "audit"
    audit.mkdir()
    (audit / "audit.json").write_text(json.dumps({"config": {"env": "SearchQA-v0"}}))
    records.write_lines(audit / records.AUDIT_EPISODES, lines)
    x = load(audit)
    (sc,) = x.scatters
    assert sc["methods"]["twice J1"] == [[0.6, 1.0, 0, 0], [-0.1, 0.0, 0, 1]]
    assert x.details[0]["turns"][0]["credit"]["A*"] == 0.6


def test_an_audit_without_episodes_still_gives_its_scatter(tmp_path):
    lab = tmp_path / "lab"
    lab.mkdir()
    (lab / "lab_audit.json").write_text("{}")
    (lab / "lab_decisions.csv").write_text("group,turn,oracle,grpo,twice J1\n0,0,0.5,0.1,1\n0,1,oops\n")
    x = load(lab)
    assert x.scatters[0]["methods"]["twice J1"] == [[0.5, 1.0, None, None]]
    assert any("lab_decisions.csv:3" in p for p in x.problems)


def test_a_folder_of_runs_and_audits_is_searched(tmp_path):
    factual, twin = resync_pair()
    (tmp_path / "a").mkdir()
    write_records(tmp_path / "a" / "eps.jsonl", [factual], [twin])
    write_records(tmp_path / "b.jsonl", [lone_episode()])
    (tmp_path / "learn").mkdir()
    (tmp_path / "learn" / "learn.json").write_text(json.dumps({"config": {"env": "SearchToy-v0"}, "methods": {
        "grpo": {"curve": [0.1, 0.2], "lo": [0.0, 0.1], "hi": [0.2, 0.3]}}}))
    x = load(tmp_path)
    assert sorted(s["name"] for s in x.sources) == ["a/eps.jsonl", "b.jsonl", "learn/learn.json"]
    assert len(x.rows) == 2 and x.curves[0]["series"][0]["y"] == [0.1, 0.2]


def test_nothing_to_show_is_an_error(tmp_path):
    with pytest.raises(TrajectoryFormatError, match="nothing to show"):
        load(tmp_path)
    with pytest.raises(TrajectoryFormatError, match="no such file"):
        load(tmp_path / "missing.jsonl")


def test_the_command_writes_the_page_beside_the_input(tmp_path, capsys):
    factual, twin = resync_pair()
    path = write_records(tmp_path / "eps.jsonl", [factual], [twin])
    assert view_main([str(path)]) == 0
    assert capsys.readouterr().out.strip() == f"explorer: {tmp_path / 'eps.html'}"
    assert (tmp_path / "eps.html").read_text().startswith("<!DOCTYPE html>")
    out = write_explorer(tmp_path, tmp_path / "x" / "page.html", title="mine")
    assert "<title>mine</title>" in out.read_text()


def test_serve_binds_to_localhost_only(tmp_path, monkeypatch):
    from twice_envs.agents.view import cli

    seen = {}

    class Server:
        def __init__(self, address, handler):
            seen["address"] = address
            self.server_address = address

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def serve_forever(self):
            raise KeyboardInterrupt

    monkeypatch.setattr(cli.http.server, "ThreadingHTTPServer", Server)
    factual, _ = resync_pair()
    path = write_records(tmp_path / "eps.jsonl", [factual])
    assert view_main([str(path), "--serve", "--port", "0"]) == 0
    assert seen["address"] == ("127.0.0.1", 0)


def test_the_policy_lets_only_the_pages_own_script_run(tmp_path):
    import base64
    import hashlib

    page = render(load(write_records(tmp_path / "p.jsonl", [lone_episode()], [])))
    csp = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]*)">', page).group(1)
    scripts = re.findall(r"<script>(.*?)</script>", page, re.S)  # executable: those without a data type
    assert len(scripts) == 1
    digest = base64.b64encode(hashlib.sha256(scripts[0].encode("utf-8")).digest()).decode()
    script_src = next(d for d in csp.split(";") if d.strip().startswith("script-src")).split()[1:]
    assert script_src == [f"'sha256-{digest}'"]
    assert "'unsafe-inline'" not in script_src and "default-src 'none'" in csp


def test_an_env_id_that_names_a_module_is_shown_never_imported(tmp_path, monkeypatch):
    import sys

    code = tmp_path / "code"
    code.mkdir()
    (code / "planted_view_mod.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(code))
    episode = lone_episode()
    episode.env_id = "planted_view_mod:Planted-v0"
    page = write_explorer(write_records(tmp_path / "p.jsonl", [episode]))
    assert "planted_view_mod:Planted-v0" in page.read_text(encoding="utf-8")
    assert not (tmp_path / "imported").exists() and "planted_view_mod" not in sys.modules
