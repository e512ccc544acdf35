"""Cache builds: temporary folders of killed builds are removed by the next build, never those of live ones;
every cache folder is checked against its manifest, and a damaged one is named and built again."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings

import pytest

from tests.cache_damage import cases, damage, named
from twice_envs import _cache
from twice_envs._cache import build_dir, sweep_stale_builds
from twice_envs.errors import DataFormatError

KILLED_BUILD = """
import sys, time
from pathlib import Path
from twice_envs._cache import build_dir
tmp = build_dir(Path(sys.argv[1]))
(tmp / "part.bin").write_bytes(b"half")
print(tmp, flush=True)
time.sleep(600)
"""


def _killed_build(target) -> str:
    proc = subprocess.Popen([sys.executable, "-c", KILLED_BUILD, str(target)], stdout=subprocess.PIPE, text=True)
    tmp = proc.stdout.readline().strip()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    return tmp


def test_next_build_removes_a_killed_builds_folder(tmp_path, monkeypatch):
    from twice_envs.envs.searchqa.bm25 import build_index

    target = tmp_path / "index"
    left = _killed_build(target)
    assert os.path.isdir(left) and os.path.basename(left).startswith(".index.")
    build_index(["a first text", "a second text"], target)
    assert os.path.isdir(left)  # too recent: it might be a build that is only slow
    monkeypatch.setattr(_cache, "STALE_S", 0.0)
    build_index(["a first text", "a second text"], target.with_name("other"))  # another target: not swept
    assert os.path.isdir(left)
    os.utime(left, (time.time() - 5, time.time() - 5))
    os.utime(os.path.join(left, "part.bin"), (time.time() - 5, time.time() - 5))
    import shutil

    shutil.rmtree(target)
    build_index(["a first text", "a second text"], target)
    assert not os.path.exists(left)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index", "other"]


def test_live_builds_and_recent_ones_are_kept(tmp_path):
    target = tmp_path / "store"
    mine = build_dir(target)  # this process is alive
    later = time.time() + 10 * _cache.FOREIGN_STALE_S
    assert sweep_stale_builds(target, now=later) == [] and mine.is_dir()
    dead = _killed_build(target)
    assert sweep_stale_builds(target, now=time.time()) == []  # untouched for less than STALE_S
    assert sweep_stale_builds(target, now=time.time() + _cache.STALE_S + 60) == [type(mine)(dead)]
    foreign = tmp_path / ".store.otherhost-1.abc.build"
    foreign.mkdir()
    assert sweep_stale_builds(target, now=time.time() + _cache.STALE_S + 60) == []  # another machine's pid
    assert sweep_stale_builds(target, now=time.time() + _cache.FOREIGN_STALE_S + 60) == [foreign]
    assert mine.is_dir()


def test_a_published_folder_gets_the_umask_mode(tmp_path):
    old = os.umask(0o022)
    try:
        tmp = build_dir(tmp_path / "store")  # created private by mkdtemp
        (tmp / "marker").write_text("built")
        _cache.publish_dir(tmp, tmp_path / "store", "marker")
        assert (tmp_path / "store").stat().st_mode & 0o777 == 0o755
    finally:
        os.umask(old)


# ----------------------------------------------------------------------------- the manifest layer and healing
TOY_FILES = ("a.txt", "b.bin")


def _build_toy(tmp, log):
    log.append(tmp)
    (tmp / "a.txt").write_text("alpha " * 50)
    (tmp / "b.bin").write_bytes(bytes(range(256)) * 4)
    _cache.write_manifest(tmp, "toy/1", TOY_FILES, {"n": 2})


def _open_toy(d):
    meta = _cache.read_manifest(d, "toy/1", TOY_FILES)
    return meta, [(d / name).read_bytes() for name in TOY_FILES]


@pytest.mark.parametrize("kind, name", cases(TOY_FILES, _cache.MANIFEST))
def test_every_damage_is_named_then_healed_with_the_same_contents(tmp_path, kind, name):
    builds = []
    target = tmp_path / "toy"
    first = _cache.cached(target, _open_toy, lambda tmp: _build_toy(tmp, builds), "toy cache")
    damage(kind, target, name)
    with pytest.raises(DataFormatError) as err:
        _open_toy(target)
    assert err.value.path == named(kind, target, name)
    bad = re.escape(named(kind, target, name))
    with pytest.warns(RuntimeWarning, match=f"toy cache unusable, rebuilding it: {bad}"):
        again = _cache.cached(target, _open_toy, lambda tmp: _build_toy(tmp, builds), "toy cache")
    assert again == first and len(builds) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["toy"]  # the damaged copy and the build folder are gone
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _cache.cached(target, _open_toy, lambda tmp: pytest.fail("rebuilt a sound cache"), "toy cache") == first


def test_a_large_file_is_checked_by_size_and_sampled_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(_cache, "DIGEST_WHOLE", 1024)
    monkeypatch.setattr(_cache, "DIGEST_BLOCKS", 4)
    monkeypatch.setattr(_cache, "DIGEST_BLOCK", 16)
    path = tmp_path / "big.bin"
    path.write_bytes(bytes(4096))
    digest = _cache.file_digest(path)
    path.write_bytes(bytes(4095) + b"\1")  # the last block is sampled
    assert _cache.file_digest(path) != digest
    path.write_bytes(bytes(1000) + b"\1" + bytes(3095))  # between samples: unseen by the digest
    assert _cache.file_digest(path) == digest
    path.write_bytes(bytes(4095))
    assert _cache.file_digest(path) != digest  # the size is always part of it


def test_a_manifest_of_another_format_or_file_list_is_refused(tmp_path):
    _build_toy(tmp_path, [])
    with pytest.raises(DataFormatError, match=r"cache format 'toy/1'; this version reads 'toy/2'"):
        _cache.read_manifest(tmp_path, "toy/2", TOY_FILES)
    with pytest.raises(DataFormatError, match=r"lists the files \['a.txt', 'b.bin'\], expected \['a.txt'\]"):
        _cache.read_manifest(tmp_path, "toy/1", ["a.txt"])
    manifest = json.loads((tmp_path / _cache.MANIFEST).read_text())
    del manifest["layout"]  # what an earlier version wrote
    (tmp_path / _cache.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(DataFormatError, match="not a twice_envs.manifest/1 cache manifest"):
        _cache.read_manifest(tmp_path, "toy/1", TOY_FILES)


def test_read_json_names_the_file_for_any_failure(tmp_path):
    path = tmp_path / "meta.json"
    for content, problem in (("[" * 100_000 + "]" * 100_000, "RecursionError"), ("{", "JSONDecodeError"),
                             (b"\xff\xfe", "UnicodeDecodeError")):
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        with pytest.raises(DataFormatError, match=problem) as err:
            _cache.read_json(path)
        assert err.value.path == str(path)
    path.unlink()
    with pytest.raises(DataFormatError, match="gone for good"):
        _cache.read_json(path, "gone for good")


def test_a_fresh_build_that_fails_its_own_check_raises(tmp_path):
    builds = []

    def build(tmp):
        builds.append(tmp)
        (tmp / _cache.MANIFEST).write_text("{}")

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(DataFormatError, match="not a twice_envs.manifest/1"):
            _cache.cached(tmp_path / "c", _open_toy, build, "toy cache")
    assert len(builds) == 1  # not built again and again
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]  # published, then refused: no build folder left


def test_a_folder_replaced_by_another_process_is_opened_not_discarded(tmp_path):
    target = tmp_path / "toy"
    target.mkdir()
    (target / "junk").write_text("half a build")
    calls = []

    def open_fn(d):
        calls.append(d)
        if len(calls) == 1:  # while this one is refused, another process publishes a sound copy
            fresh = tmp_path / "fresh"
            fresh.mkdir()
            _build_toy(fresh, [])
            shutil.rmtree(d)
            os.replace(fresh, d)
            raise DataFormatError(d / _cache.MANIFEST, None, "missing")
        return _open_toy(d)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = _cache.cached(target, open_fn, lambda tmp: pytest.fail("built again"), "toy cache")
    assert got[0] == {"n": 2} and len(calls) == 2


def test_an_empty_folder_is_built_quietly(tmp_path):
    (tmp_path / "toy").mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _cache.cached(tmp_path / "toy", _open_toy, lambda tmp: _build_toy(tmp, []), "toy cache")[0] == {"n": 2}


def test_cache_dir_replaces_a_file_in_its_way_but_never_the_root(tmp_path, monkeypatch):
    monkeypatch.setenv("TWICE_CACHE", str(tmp_path / "root"))
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "searchqa").write_text("not a folder")
    with pytest.warns(RuntimeWarning, match="searchqa is not a folder"):
        path = _cache.cache_dir("searchqa", "bm25")
    assert path.is_dir() and path == tmp_path / "root" / "searchqa" / "bm25"
    assert sorted(p.name for p in (tmp_path / "root").iterdir()) == ["searchqa"]
    monkeypatch.setenv("TWICE_CACHE", str(tmp_path / "root" / "searchqa" / "bm25" / "file"))
    (path / "file").write_text("the user's")
    with pytest.raises(NotADirectoryError, match="bm25/file"):
        _cache.cache_dir("searchqa")
    assert (path / "file").read_text() == "the user's"


def test_discard_removes_a_file_a_folder_or_a_link(tmp_path):
    (tmp_path / "f").write_text("x")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "inner").write_text("x")
    (tmp_path / "target").mkdir()
    os.symlink(tmp_path / "target", tmp_path / "link")
    for name in ("f", "d", "link"):
        _cache.discard(tmp_path / name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["target"]


def test_folder_digest_is_stable_and_sees_names_sizes_and_first_mib(tmp_path):
    folder = tmp_path / "model"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.bin").write_bytes(b"weights")
    (folder / "config.json").write_bytes(b'{"x": 1}')
    (folder / "sub" / "inner").write_bytes(b"ignored")
    # cache folders are named after it (the dense retriever's embeddings): its value must never change
    assert _cache.folder_digest(folder) == "2b36d9574a27b6abac24475fedd6b62dd053617b47c83438d70a3068ab9ab474"
    before = _cache.folder_digest(folder)
    (folder / "sub" / "inner").write_bytes(b"subfolders are not read")
    assert _cache.folder_digest(folder) == before
    (folder / "a.bin").write_bytes(b"weighTs")  # same size, another byte in the first MiB
    assert _cache.folder_digest(folder) != before
    (folder / "a.bin").write_bytes(b"weights")
    (folder / "a.bin").rename(folder / "b.bin")
    assert _cache.folder_digest(folder) != before
    big = folder / "b.bin"
    big.write_bytes(b"\0" * (1 << 20) + b"x")
    first = _cache.folder_digest(folder)
    big.write_bytes(b"\0" * (1 << 20) + b"y")  # beyond the first MiB, same size: not seen (by design)
    assert _cache.folder_digest(folder) == first
