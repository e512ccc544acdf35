"""The project's files: written atomically, read back line by line, record files counted.

* :func:`atomic_file` / :func:`atomic_write_text`: a file's new contents replace the old in
  one rename, so a reader sees the old file or the new one, never half.
* :func:`read_json_lines`: a JSON lines file, one value per line, a bad line named
  (``file:line``) without stopping the rest.
* Record files (episodes: trajectory records, with or without the agent's record) are JSON
  lines whose first line is a header counting them::

      {"format": "twice_envs.records/1", "records": 3}

  then one record per line. The header is padded with spaces to :data:`HEADER_WIDTH` bytes,
  so a file appended to (a training run's episodes) has its count rewritten in place after
  each append. :func:`read_record_lines` compares the count with the lines found: a file cut
  short, even exactly at a line boundary, gives a :class:`~twice_envs.errors.RecordCountError`
  naming the file and both numbers. A file without the header (written before record files
  were counted, or by hand) is still read, with an
  :class:`~twice_envs.errors.UncountedRecordsWarning` saying that its end cannot be checked.

Encoding: UTF-8, with lone surrogates written in their 3-byte form (``surrogatepass``; see
:mod:`twice_envs.trajectory`).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import IO, Any, Iterator, Sequence

from twice_envs.errors import RecordCountError, TrajectoryFormatError, UncountedRecordsWarning

#: How record files are encoded and decoded (see :mod:`twice_envs.trajectory`).
ENCODING, ERRORS = "utf-8", "surrogatepass"
#: The format of a record file's header line.
RECORDS_FORMAT = "twice_envs.records/1"
#: The header line's size in bytes, newline included (its count is rewritten in place).
HEADER_WIDTH = 64


def created_mode(directory: bool = False) -> int:
    """The permission bits ``open`` or ``mkdir`` would give a new file (or folder) under the
    process's umask: what a temporary file or folder (created private, 0o600 / 0o700) is given
    before it is renamed into place."""
    return (0o777 if directory else 0o666) & ~_umask()


def _umask() -> int:
    """The process's umask, read without changing it where the system reports it (Linux's
    ``/proc/self/status``); elsewhere set and restored at once, which another thread creating a
    file at that moment could see."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w", **open_kwargs: Any) -> Iterator[IO]:
    """A file to write whose contents replace ``path`` when the block ends without an error.

    It is written under a temporary name in the same folder, synced and renamed into place, so
    readers see the old file or the new one, never half; on an error the temporary file is
    removed and ``path`` is left as it was. ``mode`` is ``"w"`` or ``"wb"``; ``open_kwargs`` go
    to ``open`` (text files default to UTF-8).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if "b" not in mode:
        open_kwargs.setdefault("encoding", "utf-8")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **open_kwargs) as fh:
            # the file keeps the permissions of the one it replaces, else gets those of a new file
            os.chmod(fh.fileno(), path.stat().st_mode & 0o7777 if path.exists() else created_mode())
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_text(path: str | os.PathLike, text: str, errors: str = "strict") -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new one, never half.

    ``errors`` is the UTF-8 error handler (record files use ``"surrogatepass"``).
    """
    with atomic_file(path, "w", errors=errors) as fh:
        fh.write(text)


def read_json_lines(path: str | os.PathLike) -> Iterator[tuple[str, Any]]:
    """``("file:line", value or TrajectoryFormatError)`` per non-blank line; goes on past bad lines.

    Lines are read one at a time. A file that cannot be read at all (missing, a folder,
    no permission) raises :class:`TrajectoryFormatError`.
    """
    path = Path(path)
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        raise TrajectoryFormatError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TrajectoryFormatError(f"{path}: is a folder, not a trajectory file") from None
    except OSError as exc:
        raise TrajectoryFormatError(f"{path}: cannot read ({exc.strerror or exc})") from None
    with fh:
        lineno = 0
        while True:
            try:
                raw = fh.readline()
            except IsADirectoryError:
                raise TrajectoryFormatError(f"{path}: is a folder, not a trajectory file") from None
            except OSError as exc:
                raise TrajectoryFormatError(f"{path}:{lineno + 1}: cannot read ({exc.strerror or exc})") from None
            if not raw:
                return
            lineno += 1
            if raw.strip():
                where = f"{path}:{lineno}"
                yield where, _decode_line(raw, where)


def _decode_line(raw: bytes, where: str) -> Any:
    if b"\x00" in raw:
        return TrajectoryFormatError(f"{where}: binary data (NUL bytes), not a JSON lines trajectory file")
    try:
        text = raw.decode(ENCODING, ERRORS)
    except UnicodeDecodeError as exc:
        return TrajectoryFormatError(
            f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); "
            "trajectory files are UTF-8 JSON lines"
        )
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        return TrajectoryFormatError(f"{where}: not valid JSON ({exc.msg}, column {exc.colno})")
    except RecursionError:
        return TrajectoryFormatError(f"{where}: JSON nested too deeply to be a trajectory")


def iter_json_lines(path: str | os.PathLike) -> Iterator[tuple[str, Any]]:
    """``("file:line", value)`` for each non-blank line of a JSON lines file; errors name the line."""
    for where, data in read_json_lines(path):
        if isinstance(data, TrajectoryFormatError):
            raise data
        yield where, data


def header_line(count: int) -> str:
    """A record file's first line: the header counting its ``count`` records, padded to :data:`HEADER_WIDTH`."""
    text = json.dumps({"format": RECORDS_FORMAT, "records": int(count)})
    return text.ljust(HEADER_WIDTH - 1) + "\n"


def is_header(value: Any) -> bool:
    """Whether a line's value is a record file's header (a record never has this format)."""
    return isinstance(value, dict) and value.get("format") == RECORDS_FORMAT


def write_record_lines(path: str | os.PathLike, lines: Sequence[str]) -> Path:
    """Write a record file atomically: the header counting ``lines``, then one JSON line each.

    ``lines`` are JSON texts without newlines. Returns the path.
    """
    text = header_line(len(lines)) + "".join(line + "\n" for line in lines)
    atomic_write_text(path, text, errors=ERRORS)
    return Path(path)


def append_record_lines(path: str | os.PathLike, lines: Sequence[str]) -> None:
    """Append records to a record file (created if missing) and count them in its header.

    The lines are written and synced first, then the header's count is rewritten in place,
    so an append cut short leaves more lines than the header counts, which a reader reports.
    A file without a room-sized header (empty, or from before record files were counted) is
    rewritten atomically with one.
    """
    path = Path(path)
    try:
        fh = open(path, "r+b")
    except FileNotFoundError:
        write_record_lines(path, lines)
        return
    with fh:
        head = fh.readline(HEADER_WIDTH)
        count = _header_count(head)
        if count is None or len(head) != HEADER_WIDTH or not head.endswith(b"\n"):
            fh.close()
            _recount(path, lines)
            return
        end = fh.seek(0, os.SEEK_END)
        fh.seek(end - 1)
        torn = fh.read(1) != b"\n"  # a line an earlier append left half-written stays a line of its own
        data = ("\n" if torn else "") + "".join(line + "\n" for line in lines)
        fh.write(data.encode(ENCODING, ERRORS))
        fh.flush()
        os.fsync(fh.fileno())
        fh.seek(0)
        fh.write(header_line(count + len(lines)).encode("ascii"))
        fh.flush()
        os.fsync(fh.fileno())


def _header_count(head: bytes) -> int | None:
    """The count of a header line's bytes, or None if it is not a well-formed header."""
    try:
        value = json.loads(head.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None
    count = value.get("records") if is_header(value) else None
    return count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else None


def _recount(path: Path, lines: Sequence[str]) -> None:
    """Rewrite ``path`` as a counted record file: its lines (less a header) and then ``lines``."""
    with open(path, encoding=ENCODING, errors=ERRORS) as fh:
        old = [line.rstrip("\n") for line in fh if line.strip()]
    if old and _header_count(old[0].encode(ENCODING, ERRORS)) is not None:
        old = old[1:]
    write_record_lines(path, old + list(lines))


def read_record_lines(path: str | os.PathLike) -> Iterator[tuple[str, Any]]:
    """``("file:line", value or TrajectoryFormatError)`` per record of a record file, checked against its header.

    Like :func:`read_json_lines`, without the header line. After the last line, a count that
    differs from the lines found is yielded as ``(file, RecordCountError)``; a malformed header
    or a second one (two files joined) as a :class:`TrajectoryFormatError` naming the line.
    A file without a header is read with an :class:`UncountedRecordsWarning`.
    """
    path = Path(path)
    count, found = None, 0
    for where, value in read_json_lines(path):
        if is_header(value):
            if found or count is not None:
                yield where, TrajectoryFormatError(
                    f"{where}: a second record-file header (a file has one, on its first line; "
                    "were two files joined?)"
                )
                continue
            count = value.get("records")
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                yield where, TrajectoryFormatError(
                    f"{where}: the header's field 'records' must be a count (an integer >= 0), got {count!r:.40}"
                )
                count = -1
            continue
        if found == 0 and count is None:
            _warn_uncounted(path)
        found += 1
        yield where, value
    if found == 0 and count is None:
        _warn_uncounted(path)
    if count is not None and count >= 0 and count != found:
        yield str(path), RecordCountError(path, count, found)


def _warn_uncounted(path: Path) -> None:
    warnings.warn(
        UncountedRecordsWarning(
            f"{path}: no header counting its records (a file written before record files were counted, "
            "or by hand): read as it is, but a cut at a line boundary cannot be detected in it"
        ),
        stacklevel=3,
    )
