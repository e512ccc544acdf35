"""Cache builds: temporary folders of killed builds are removed by the next build, never those of live ones."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from twice_envs import _cache
from twice_envs._cache import build_dir, sweep_stale_builds

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
