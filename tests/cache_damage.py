"""Ways a cache folder gets damaged on disk, shared by the cache fuzz tests.

``FILE_DAMAGES`` damage one file of a folder; ``FOLDER_DAMAGES`` damage the folder's
manifest or the folder itself. Each takes ``(folder, name)`` (``name`` is the file, or the
manifest for the folder damages).
"""

from __future__ import annotations

import shutil
from pathlib import Path


def edit_byte(folder: Path, name: str) -> None:
    """Change one byte in the middle of the file (its case, for text: the size stays)."""
    path = folder / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x20
    path.write_bytes(bytes(data))


def truncate(folder: Path, name: str) -> None:
    path = folder / name
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def delete(folder: Path, name: str) -> None:
    (folder / name).unlink()


def file_to_folder(folder: Path, name: str) -> None:
    """The file replaced by a folder of the same name (holding a file)."""
    (folder / name).unlink()
    (folder / name).mkdir()
    (folder / name / "x").write_text("x")


def unparseable(folder: Path, name: str) -> None:
    (folder / name).write_text('{"format": ')


def deeply_nested(folder: Path, name: str) -> None:
    """Valid JSON nested too deeply for the parser (``json.loads`` raises ``RecursionError``)."""
    (folder / name).write_text("[" * 200_000 + "]" * 200_000)


def folder_to_file(folder: Path, name: str) -> None:
    """The whole cache folder replaced by a file of the same name."""
    shutil.rmtree(folder)
    folder.write_text("not a folder")


FILE_DAMAGES = {
    "edited byte": edit_byte,
    "truncated": truncate,
    "deleted": delete,
    "replaced by a folder": file_to_folder,
}
FOLDER_DAMAGES = {
    "manifest missing": delete,
    "manifest unparseable": unparseable,
    "manifest deeply nested": deeply_nested,
    "manifest replaced by a folder": file_to_folder,
    "folder replaced by a file": folder_to_file,
}


def cases(files, manifest: str) -> list[tuple[str, str]]:
    """``(damage, file name)`` pairs: every file damage on every file, every folder damage on ``manifest``."""
    return [(kind, name) for name in files for kind in FILE_DAMAGES] + [(kind, manifest) for kind in FOLDER_DAMAGES]


def damage(kind: str, folder: Path, name: str) -> None:
    """Apply the damage ``kind`` to ``folder`` (its file ``name``)."""
    (FILE_DAMAGES.get(kind) or FOLDER_DAMAGES[kind])(Path(folder), name)


def named(kind: str, folder: Path, name: str) -> str:
    """The path a clear error about this damage names: the file, or the folder when it was replaced."""
    return str(folder if kind == "folder replaced by a file" else Path(folder) / name)
