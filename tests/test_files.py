"""Record files: a header counts the records, so a file cut short is named with both counts."""

from __future__ import annotations

import json
import warnings

import pytest

from twice_envs.errors import RecordCountError, TrajectoryFormatError, UncountedRecordsWarning
from twice_envs.files import HEADER_WIDTH, append_record_lines, header_line, read_record_lines, write_record_lines

LINES = [json.dumps({"n": i, "text": "caf\udce9"}, ensure_ascii=False) for i in range(4)]


def read(path) -> list:
    """Every item :func:`read_record_lines` gives, with no warning allowed."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", UncountedRecordsWarning)
        return list(read_record_lines(path))


def test_a_record_file_starts_with_a_header_that_counts_its_records(tmp_path):
    path = write_record_lines(tmp_path / "r.jsonl", LINES)
    head, *rest = path.read_bytes().split(b"\n")[:-1]
    assert json.loads(head) == {"format": "twice_envs.records/1", "records": 4} and len(head) + 1 == HEADER_WIDTH
    got = read(path)
    assert [w for w, _ in got] == [f"{path}:{i}" for i in range(2, 6)]  # line 1 is the header
    assert [v["n"] for _, v in got] == [0, 1, 2, 3] and got[0][1]["text"] == "caf\udce9"


@pytest.mark.parametrize("keep", [0, 1, 3])
def test_a_file_cut_at_a_line_boundary_is_named_with_both_counts(tmp_path, keep):
    path = write_record_lines(tmp_path / "r.jsonl", LINES)
    path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[: 1 + keep]))
    *records, (where, error) = read(path)
    assert len(records) == keep and where == str(path) and isinstance(error, RecordCountError)
    assert (error.expected, error.found) == (4, keep)
    assert str(error) == f"{path}: cut short: its header counts 4 records, {keep} found ({4 - keep} missing)"


def test_an_older_file_without_a_header_is_read_with_a_warning(tmp_path):
    path = tmp_path / "old.jsonl"
    path.write_text("".join(line + "\n" for line in LINES[:2]), errors="surrogatepass")
    warned = r"old\.jsonl: no header counting its records .*cannot be detected"
    with pytest.warns(UncountedRecordsWarning, match=warned):
        got = list(read_record_lines(path))
    assert [w for w, _ in got] == [f"{path}:1", f"{path}:2"]
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.warns(UncountedRecordsWarning, match=r"empty\.jsonl: no header"):
        assert list(read_record_lines(empty)) == []


def test_a_damaged_header_and_a_second_header_are_named(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"format": "twice_envs.records/1", "records": -2}) + "\n" + LINES[0] + "\n",
                    errors="surrogatepass")
    (where, error), (_, value) = read(path)
    assert where == f"{path}:1" and "the header's field 'records' must be a count" in str(error) and value["n"] == 0
    joined = tmp_path / "joined.jsonl"
    joined.write_text(header_line(1) + LINES[0] + "\n" + header_line(1) + LINES[1] + "\n", errors="surrogatepass")
    items = read(joined)
    errors = [(w, str(e)) for w, e in items if isinstance(e, Exception)]
    assert errors == [(f"{joined}:3", f"{joined}:3: a second record-file header (a file has one, on its first line; "
                                      "were two files joined?)"),
                      (str(joined), f"{joined}: holds 2 records, more than the 1 its header counts (an append "
                                    "that did not finish, or lines added by hand)")]


def test_appending_rewrites_the_count_in_place(tmp_path):
    path = tmp_path / "run.jsonl"
    append_record_lines(path, LINES[:1])
    append_record_lines(path, LINES[1:3])
    append_record_lines(path, [])
    assert [v["n"] for _, v in read(path)] == [0, 1, 2]
    assert path.read_text(errors="surrogatepass").startswith(header_line(3))
    # an append cut short (its lines written, the count not yet) is named, not silently accepted
    with open(path, "a", errors="surrogatepass") as fh:
        fh.write(LINES[3] + "\n")
    *_, (where, error) = read(path)
    assert isinstance(error, RecordCountError) and (error.expected, error.found) == (3, 4)


def test_appending_to_a_torn_or_uncounted_file(tmp_path):
    torn = tmp_path / "torn.jsonl"
    append_record_lines(torn, LINES[:1])
    with open(torn, "a") as fh:
        fh.write('{"n": 9, "te')  # a line an interrupted append left half-written
    append_record_lines(torn, LINES[1:2])
    items = read(torn)
    errors = [v for _, v in items if isinstance(v, TrajectoryFormatError)]
    assert str(errors[0]).startswith(f"{torn}:3: not valid JSON")  # the torn line alone, the next one intact
    assert [v["n"] for _, v in items if isinstance(v, dict)] == [0, 1]
    assert isinstance(errors[1], RecordCountError) and (errors[1].expected, errors[1].found) == (2, 3)
    old = tmp_path / "old.jsonl"
    old.write_text(LINES[0] + "\n", errors="surrogatepass")
    append_record_lines(old, LINES[1:2])  # an older file is rewritten with a header counting both
    assert [v["n"] for _, v in read(old)] == [0, 1]
