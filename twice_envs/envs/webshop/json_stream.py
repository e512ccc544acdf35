"""Reading large JSON files: a top-level array one element at a time, and whole objects with their errors named.

The original WebShop product files are JSON arrays of up to a million products;
:func:`iter_json_array` decodes them a chunk at a time, yielding each element with the line it
starts on, so a malformed product is named by file and line without the file held in memory.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterator

from twice_envs.errors import DataFormatError


def iter_json_array(path: str | os.PathLike, chunk_chars: int = 1 << 22) -> Iterator[tuple[int, Any]]:
    """Yield ``(line, element)`` for each element of a top-level JSON array, reading in chunks.

    Memory stays at one chunk plus one element, so the 1.18M-product file streams.
    """
    decoder = json.JSONDecoder()
    ws = " \t\r\n"
    with open(path, encoding="utf-8") as fh:
        buf = fh.read(chunk_chars)
        eof = len(buf) < chunk_chars
        pos = 0
        # line counting is incremental (positions only move forward): line_no is the line of buf[line_pos]
        line_no, line_pos = 1, 0

        def line_at(p: int) -> int:
            nonlocal line_no, line_pos
            if p > line_pos:
                line_no += buf.count("\n", line_pos, p)
                line_pos = p
            return line_no

        def more() -> bool:
            nonlocal buf, pos, eof, line_pos
            if eof:
                return False
            line_at(pos)
            chunk = fh.read(chunk_chars)
            eof = len(chunk) < chunk_chars
            buf = buf[pos:] + chunk
            pos, line_pos = 0, 0
            return bool(chunk)

        def skip_ws() -> str:
            nonlocal pos
            while True:
                while pos < len(buf) and buf[pos] in ws:
                    pos += 1
                if pos < len(buf):
                    return buf[pos]
                if not more():
                    return ""

        c = skip_ws()
        if c != "[":
            raise DataFormatError(path, line_at(pos), "expected a JSON array of products (the file must start with '[')")
        pos += 1
        c = skip_ws()
        if c == "]":
            return
        while True:
            c = skip_ws()
            if not c:
                raise DataFormatError(path, line_at(pos), "the JSON array is not closed (file truncated?)")
            while True:
                try:
                    value, end = decoder.raw_decode(buf, pos)
                    break
                except json.JSONDecodeError as exc:
                    if more():
                        continue
                    raise DataFormatError(path, line_at(exc.pos), f"invalid JSON: {exc.msg}") from None
            yield line_at(pos), value
            pos = end
            c = skip_ws()
            if c == ",":
                pos += 1
            elif c == "]":
                return
            elif not c:
                raise DataFormatError(path, line_at(pos), "the JSON array is not closed (file truncated?)")
            else:
                raise DataFormatError(path, line_at(pos), f"expected ',' or ']' between products, found {c!r}")


def load_json_object(path: str | os.PathLike, what: str) -> dict:
    """A JSON object file, with a :class:`DataFormatError` naming the line of a syntax error."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except json.JSONDecodeError as exc:
        raise DataFormatError(path, exc.lineno, f"invalid JSON: {exc.msg}") from None
    except UnicodeDecodeError as exc:
        raise DataFormatError(path, None, f"not UTF-8 text: {exc}") from None
    if not isinstance(data, dict):
        raise DataFormatError(path, 1, f"expected a JSON object mapping asin -> {what}, got {type(data).__name__}")
    return data
