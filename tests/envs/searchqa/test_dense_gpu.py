"""Where the dense index lives: GPUs when faiss has them, the CPU otherwise (no GPU needed to test)."""

import types

import pytest

from twice_envs.envs.searchqa.dense_index import faiss_gpus, place_index


def _fake_faiss(gpus):
    moved = []
    mod = types.SimpleNamespace(get_num_gpus=lambda: gpus, index_cpu_to_all_gpus=lambda ix: moved.append(ix) or ("gpu", ix))
    return mod, moved


def test_cpu_build_has_no_gpus():
    assert faiss_gpus(types.SimpleNamespace()) == 0  # faiss-cpu: no GPU functions at all

    def broken():
        raise RuntimeError("no CUDA driver")

    assert faiss_gpus(types.SimpleNamespace(get_num_gpus=broken, index_cpu_to_all_gpus=None)) == 0


def test_auto_uses_gpus_only_when_present():
    faiss, moved = _fake_faiss(2)
    assert place_index(faiss, "ix", None) == ("gpu", "ix") and moved == ["ix"]
    faiss, moved = _fake_faiss(0)
    assert place_index(faiss, "ix", None) == "ix" and moved == []


def test_explicit_choices():
    faiss, moved = _fake_faiss(1)
    assert place_index(faiss, "ix", False) == "ix" and moved == []
    with pytest.raises(RuntimeError, match=r"twice-envs\[gpu\]"):
        place_index(_fake_faiss(0)[0], "ix", True)


def test_installed_faiss_on_this_machine():
    faiss = pytest.importorskip("faiss")
    import numpy as np

    index = faiss.IndexFlatIP(4)
    index.add(np.eye(4, dtype=np.float32))
    placed = place_index(faiss, index, None)
    assert placed.search(np.eye(4, dtype=np.float32)[:1], 1)[1][0, 0] == 0
    if faiss_gpus(faiss) == 0:
        assert placed is index
