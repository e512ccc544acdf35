"""make / register / registry: helpful errors and gymnasium interop."""

from __future__ import annotations

import gymnasium
import pytest

import twice_envs
from tests import toy_envs  # noqa: F401
from twice_envs import MissingExtra, TwiceError
from twice_envs._deps import require


def test_unknown_id_suggests_close_matches():
    with pytest.raises(TwiceError, match="CoinChain-v0"):
        twice_envs.make("CoinChian-v0")
    with pytest.raises(TwiceError, match="twice envs"):
        twice_envs.make("Nothing-like-it")


def test_bad_kwargs_name_the_accepted_ones():
    with pytest.raises(TwiceError, match=r"'lenght' \(did you mean 'length'\?\)"):
        twice_envs.make("CoinChain-v0", lenght=4)
    with pytest.raises(TwiceError, match="JSON"):
        twice_envs.make("CoinChain-v0", length=object())


def test_kwargs_are_recorded_on_the_spec_and_trajectory():
    env = twice_envs.make("CoinChain-v0", length=9)
    env.reset(seed=0)
    assert env.spec.kwargs == {"length": 9}
    assert env.trajectory.kwargs == {"length": 9}
    assert env.fork(0).length == 9


def test_module_colon_id_form_imports_the_module():
    env = twice_envs.make("tests.toy_envs:CoinChain-v0")
    assert env.env_id == "CoinChain-v0"
    with pytest.raises(TwiceError, match="cannot import"):
        twice_envs.make("no_such_module_xyz:CoinChain-v0")


def test_gymnasium_make_works_through_namespace():
    env = gymnasium.make("twice_envs/CoinChain-v0", length=5)
    obs, info = env.reset(seed=0)
    assert isinstance(obs, str) and "5 cells" in obs


def test_duplicate_registration_needs_override():
    with pytest.raises(TwiceError, match="override"):
        twice_envs.register("CoinChain-v0", "tests.toy_envs:CoinChain")


def test_missing_extra_names_pip_command():
    with pytest.raises(MissingExtra, match=r"pip install 'twice-envs\[search\]'"):
        require("no_such_module_for_twice", "search", "BM25 retrieval")


def test_builtin_ids_are_registered_without_importing_their_dependencies():
    import subprocess
    import sys

    code = (
        "import sys, twice_envs\n"
        "ids = ['SearchQA-v0', 'ALFWorld-v0', 'WebShop-v0']\n"
        "assert all(i in twice_envs.registry and twice_envs.descriptions[i] for i in ids), ids\n"
        "heavy = [m for m in ('torch', 'bm25s', 'alfworld', 'textworld', 'transformers', 'faiss') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_gymnasium_make_vec_reaches_twice_make_vec():
    from twice_envs.wrappers.vector import TextSyncVectorEnv

    vec = gymnasium.make_vec("twice_envs/CoinChain-v0", num_envs=2, vectorization_mode="vector_entry_point", seeds=[3, 3])
    try:
        assert isinstance(vec, TextSyncVectorEnv)
        obs, _ = vec.reset()
        assert obs[0] == obs[1] and isinstance(obs[0], str)
    finally:
        vec.close()
