"""Streaming readers for the user's own data files.

* corpus: JSONL rows ``{"id": ..., "contents": '"Title"\\ntext'}`` (the wiki-18 format),
  read one line at a time (a 21M-passage file is never held in Python objects);
* questions: FlashRAG JSONL rows ``{"id", "question", "golden_answers"}``, or
  Search-R1 parquet rows (``data_source``, ``prompt``, ``reward_model.ground_truth.target``),
  read in record batches.

A malformed file raises :class:`~twice_envs.errors.DataFormatError` naming the file
and the line (the 1-based row for parquet): among others, gold answers that are not a
string or a list of strings (an object is refused, not read as its keys), and ids that
are not a string or an integer. Duplicate passage ids are refused when the corpus store
is built (:mod:`twice_envs.envs.searchqa.corpus`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

from twice_envs.errors import DataFormatError
from twice_envs.trajectory import json_kind


@dataclass(frozen=True)
class Question:
    """One question.

    Attributes:
        id: unique id (used by ``reset(options={"task": id})``).
        question: the question text.
        golden_answers: accepted answers (at least one).
        metadata: anything else the file holds (for generated data: type, program, hops).
    """

    id: str
    question: str
    golden_answers: tuple[str, ...]
    metadata: dict = field(default_factory=dict, compare=False)


def iter_corpus_jsonl(path: str | Path) -> Iterator[tuple[int, str, str]]:
    """Yield ``(line_number, id, contents)`` for each passage of a wiki-18 style JSONL file."""
    path = Path(path)
    for line_no, row in _json_lines(path, "corpus", "with 'id' and 'contents'"):
        contents = row.get("contents")
        if contents is None and "title" in row and "text" in row:
            contents = f'"{row["title"]}"\n{row["text"]}'
        if not isinstance(contents, str):
            raise DataFormatError(path, line_no, "missing or non-string 'contents' (expected '\"Title\"\\ntext')")
        pid = _check_id(row.get("id", line_no - 1), path, line_no)
        yield line_no, str(pid), contents


def _json_lines(path: Path, what: str, shape: str = "") -> Iterator[tuple[int, dict]]:
    """``(line_number, object)`` for each non-blank line of a JSONL file; errors name the line."""
    if not path.is_file():
        raise DataFormatError(path, None, f"{what} file not found")
    with open(path, "rb") as fh:
        for line_no, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except (ValueError, UnicodeDecodeError) as exc:
                raise DataFormatError(path, line_no, f"not a valid JSON line ({exc})") from None
            if not isinstance(row, dict):
                raise DataFormatError(path, line_no, f"each line must be a JSON object{' ' + shape if shape else ''}")
            yield line_no, row


def _check_id(value: Any, path: Path, line: int) -> Any:
    """An id as a string or an int, or a :class:`DataFormatError` naming the line."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise DataFormatError(path, line, f"'id' must be a string or an integer, got {json_kind(value)} {value!r:.60}")
    return value


def _answers(value: Any, path: Path, line: int, name: str = "golden_answers") -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if value is None:
        raise DataFormatError(path, line, f"missing '{name}' (a non-empty list of strings)")
    if not isinstance(value, (list, tuple)):
        raise DataFormatError(
            path, line, f"'{name}' must be a string or a list of strings, got {json_kind(value)} {value!r:.60}"
        )
    answers = list(value)
    if not answers:
        raise DataFormatError(path, line, "empty gold answers")
    if not all(isinstance(a, str) for a in answers):
        raise DataFormatError(path, line, "gold answers must be strings")
    if not any(a.strip() for a in answers):
        raise DataFormatError(path, line, "all gold answers are blank")
    return tuple(answers)


def load_flashrag_jsonl(path: str | Path) -> list[Question]:
    """Questions from FlashRAG JSONL (``{"id", "question", "golden_answers", ...}`` per line)."""
    path = Path(path)
    out: list[Question] = []
    for line_no, row in _json_lines(path, "question"):
        q = row.get("question")
        if not isinstance(q, str) or not q.strip():
            raise DataFormatError(path, line_no, "missing or empty 'question'")
        answers = _answers(row.get("golden_answers"), path, line_no)
        qid = _check_id(row.get("id", f"{path.stem}_{line_no}"), path, line_no)
        meta = row.get("metadata") if isinstance(row.get("metadata"), dict) else {}
        out.append(Question(str(qid), q, answers, meta))
    if not out:
        raise DataFormatError(path, None, "no questions in the file")
    return out


_QUESTION_RE = re.compile(r"Question:\s*(.*)", re.DOTALL)


def _question_from_prompt(prompt: Any) -> Optional[str]:
    if isinstance(prompt, str):
        text = prompt
    elif isinstance(prompt, (list, tuple)) and prompt:
        contents = [m.get("content") for m in prompt if isinstance(m, dict) and isinstance(m.get("content"), str)]
        if not contents:
            return None
        text = contents[-1]
    else:
        return None
    idx = text.rfind("Question:")
    q = text[idx + len("Question:") :] if idx >= 0 else text
    q = q.strip()
    return q or None


def load_searchr1_parquet(path: str | Path, batch_size: int = 4096) -> list[Question]:
    """Questions from a Search-R1 parquet file (read in record batches)."""
    from twice_envs._deps import require

    pq = require("pyarrow.parquet", "search", "reading Search-R1 parquet files")
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(path, None, "question file not found")
    try:
        pf = pq.ParquetFile(str(path))
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise DataFormatError(path, None, f"not a readable parquet file ({exc})") from None
    names = set(pf.schema_arrow.names)
    missing = [c for c in ("reward_model",) if c not in names]
    if missing or ("prompt" not in names and "question" not in names):
        raise DataFormatError(path, None, f"missing columns: need 'prompt' (or 'question') and 'reward_model', found {sorted(names)}")
    out: list[Question] = []
    row_no = 0
    for batch in pf.iter_batches(batch_size=batch_size):
        for row in batch.to_pylist():
            row_no += 1
            q = row.get("question") if isinstance(row.get("question"), str) and row.get("question").strip() else None
            if q is None:
                q = _question_from_prompt(row.get("prompt"))
            if q is None:
                raise DataFormatError(path, row_no, "no question text in 'prompt' (expected '... Question: ...')")
            rm = row.get("reward_model")
            gt = rm.get("ground_truth") if isinstance(rm, dict) else None
            target = gt.get("target") if isinstance(gt, dict) else None
            if target is None:
                raise DataFormatError(path, row_no, "missing reward_model.ground_truth.target")
            answers = _answers(target, path, row_no, "reward_model.ground_truth.target")
            extra = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
            qid = row.get("id")
            if qid is not None:
                _check_id(qid, path, row_no)
            else:
                source = row.get("data_source") or path.stem
                qid = f"{source}_{extra.get('split', '')}_{extra.get('index', row_no - 1)}"
            meta = {"data_source": row.get("data_source")}
            out.append(Question(str(qid), q, answers, meta))
    if not out:
        raise DataFormatError(path, None, "no questions in the file")
    return out


def load_questions(path: str | Path) -> list[Question]:
    """Questions from ``.jsonl``/``.json`` (FlashRAG) or ``.parquet`` (Search-R1) files."""
    p = Path(path)
    if p.suffix == ".parquet":
        return load_searchr1_parquet(p)
    return load_flashrag_jsonl(p)
