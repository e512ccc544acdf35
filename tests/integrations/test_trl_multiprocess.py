"""TRL across processes: ``examples/trl_searchqa.py`` under ``accelerate launch`` with 2 CPU processes (gloo)
gives each episode the seed, keys, twins and advantages of a one-process run of the same batches."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("accelerate")
pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
# 3 tasks x 2 episodes a step: each process gets 3 rows, so the second group straddles the processes;
# with 3 steps (9 tasks) the first step has twins whose outcomes differ from their factual episodes'
ARGS = ["--steps", "3", "--questions", "3", "--group-size", "2", "--max-new-tokens", "32", "--max-turns", "2",
        "--reward", "cost_f1"]
#: a branch plan that reads the model's entropies sees them change in the last bits with the generation batch
TOL = {"rel": 1e-6, "abs": 1e-9}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd, tmp_path, name) -> dict:
    env = dict(os.environ, TRL_EXPERIMENTAL_SILENCE="1", PYTHONHASHSEED=name)  # hash seeds differ on purpose
    dump = tmp_path / name
    proc = subprocess.run([*cmd, str(ROOT / "examples" / "trl_searchqa.py"), *ARGS, "--out", str(tmp_path / "out"),
                           "--dump", str(dump)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    rows = {}
    for f in sorted(dump.glob("rank*.jsonl")):
        for line in f.read_text().splitlines():
            d = json.loads(line)
            assert int(f.stem[4:]) == d["rank"]
            rows[d["update"], d["row"]] = d
    return rows


def _exact(d):
    return {k: v for k, v in d.items() if k not in ("rank", "generated_by", "advantages")}


def test_two_processes_give_the_episodes_and_advantages_of_one(tmp_path):
    one = _run([sys.executable], tmp_path, "1")
    two = _run([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                "--main_process_port", str(_free_port())], tmp_path, "2")
    assert len(one) == 18 and sorted(one) == sorted(two)
    # TRL's slices: rows 0-2 on process 0, rows 3-5 on process 1
    assert {r["rank"] for r in one.values()} == {0}
    assert all(r["rank"] == r["row"] // 3 for r in two.values())
    for key, a in one.items():
        b = two[key]
        # seeds, keys, env digests, utilities and twins (turn, branch, seed, outcome, coin) are exact
        assert _exact(b) == _exact(a), key
        assert b["advantages"] == pytest.approx(a["advantages"], **TOL), key
        # a process generates the turns of its own episodes and of their twins, no one else's
        assert b["generated_by"] == [b["rank"]], key
    seeds = {r: {d["episode_seed"] for d in two.values() if d["rank"] == r} for r in (0, 1)}
    assert len(seeds[0]) == len(seeds[1]) == 9 and not seeds[0] & seeds[1]
    twins = [t for d in two.values() for t in d["twins"]]
    assert twins, "no twins ran"
    assert all(t["seed"] == d["episode_seed"] for d in two.values() for t in d["twins"] if t["pair"] == 0)
    assert any(x != 0 for d in one.values() for x in d["advantages"]), "all advantages are 0: nothing compared"
    # the twin credit moved some advantage off GRPO's (one number per episode)
    assert any(len(set(d["advantages"])) > 1 for d in one.values() if d["twins"])
