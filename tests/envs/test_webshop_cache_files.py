"""The WebShop disk cache: flat memory-mapped files, every one checked before use; a truncated,
corrupt, foreign or other-version file raises a DataFormatError naming it, and the cache rebuilds it."""

from __future__ import annotations

import json
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

import twice_envs
from tests.cache_damage import cases, damage, named
from tests.envs._webshop_data import PRODUCTS, write_shop
from twice_envs.envs.webshop.catalogue import MANIFEST, AsinIndex, FlatFiles, FlatWriter
from twice_envs.envs.webshop.resources import (
    CACHE_FILES,
    cache_folder,
    clear_process_cache,
    load_catalogue,
    open_cache,
    verify_cache,
)
from twice_envs.envs.webshop.search import INDEX_FORMAT, FlatVocabulary, SearchIndex
from twice_envs.errors import DataFormatError

QUERIES = ("shampoo", "red shampoo for dry hair", "steel hammer", "refill pouch paraben", "nothing here")


def _files(tmp_path: Path) -> dict:
    kw = write_shop(tmp_path)
    return {k: kw[k] for k in ("products_path", "attributes_path", "cache_root")}


def _root(files: dict) -> Path:
    return cache_folder(files["products_path"], files["attributes_path"], None, files["cache_root"])


def _content(cat, index, table) -> dict:
    """Everything a cache holds, as plain data (to compare a rebuilt cache with the first one)."""
    return {
        "products": [cat[i].to_record() for i in range(len(cat))],
        "asins": [cat.index_of(cat[i].asin) for i in range(len(cat))],
        "search": [index.search(q) for q in QUERIES],
        "scores": [index.scores(q).tolist() for q in QUERIES],
        "perm": table.perm.tolist(),
        "weights": table.weights.tolist(),
        "starts": table.starts.tolist(),
        "sums": [(table.split_sums(s)[0].tolist(), table.split_sums(s)[1]) for s in ("test", "eval", "train", "all")],
    }


@pytest.fixture
def built(tmp_path):
    files = _files(tmp_path)
    content = _content(*load_catalogue(**files))
    root = _root(files)
    assert (root / MANIFEST).exists()
    return files, root, content


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _garbage(path: Path) -> None:
    path.write_bytes(np.random.default_rng(0).integers(0, 256, path.stat().st_size, dtype=np.uint8).tobytes())


def _flip_one_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) - 3] ^= 0x01  # inside the data, past any header
    path.write_bytes(bytes(data))


def _foreign(path: Path) -> None:
    # a well-formed file of another build or format version: an .npy of other values/dtype, other records
    if path.suffix == ".npy":
        arr = np.load(path)
        other = arr.astype(np.int32) if arr.dtype.kind in "iu" else arr[::-1].copy()
        if other.tobytes() == arr.tobytes():
            other = np.zeros(len(arr) + 1, dtype=arr.dtype)
        np.save(path, other)
    else:
        path.write_text('["B0OTHERXX1","Other","",[],"$1.0",[1.0],[],[],"x","x","x",null,[]]\n')


def _missing(path: Path) -> None:
    path.unlink()


CORRUPTIONS = {"truncated": _truncate, "garbage": _garbage, "flipped byte": _flip_one_byte, "foreign": _foreign,
               "missing": _missing}
FILES = ("records.jsonl", "offsets.npy", "asin_keys.npy", "goal_perm.npy", "goal_cum_train.npy", "index_data.npy",
         "index_docs.npy", "index_vocab_bytes.npy")


def test_every_listed_file_is_in_the_manifest(built):
    files, root, _ = built
    manifest = json.loads((root / MANIFEST).read_text())
    assert set(CACHE_FILES) <= set(manifest["files"])
    for name, entry in manifest["files"].items():
        assert (root / name).stat().st_size == entry["bytes"] and isinstance(entry["crc32"], int)
    # no temporary file is left behind, in the folder or beside it
    assert not [p.name for p in root.iterdir() if p.name.startswith(".")]
    assert [p.name for p in root.parent.iterdir()] == [root.name]


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("how", list(CORRUPTIONS))
def test_a_bad_cache_file_is_named_and_rebuilt(built, name, how):
    files, root, content = built
    CORRUPTIONS[how](root / name)
    with pytest.raises(DataFormatError) as e:
        verify_cache(root)
    assert e.value.path == str(root / name), e.value
    with pytest.warns(RuntimeWarning, match=f"rebuilding it: .*{name}"):
        again = load_catalogue(**files)
    assert _content(*again) == content  # the rebuilt cache holds the same data
    verify_cache(root)
    assert [p.name for p in root.parent.iterdir()] == [root.name]  # the bad folder is gone


@pytest.mark.parametrize("kind, name", cases(("records.jsonl", "offsets.npy", "index_data.npy"), MANIFEST))
def test_every_damage_kind_is_named_then_healed(built, kind, name):
    files, root, content = built
    damage(kind, root, name)
    with pytest.raises(DataFormatError) as e:
        verify_cache(root)
    assert e.value.path == named(kind, root, name)
    with pytest.warns(RuntimeWarning, match=f"rebuilding it: {re.escape(named(kind, root, name))}"):
        assert _content(*load_catalogue(**files)) == content
    verify_cache(root)
    assert [p.name for p in root.parent.iterdir()] == [root.name]


@pytest.mark.parametrize(
    "edit, problem",
    [
        (lambda m: m.update(format="webshop-catalogue/1"), "cache format 'webshop-catalogue/1'"),
        (lambda m: m.update(format="webshop-catalogue/3"), "cache format 'webshop-catalogue/3'"),
        (lambda m: m.pop("magic"), "not a twice_envs cache manifest"),
        (lambda m: m["files"].pop("goal_weights.npy"), "lists no 'goal_weights.npy'"),
        (lambda m: m["meta"].update(key="0123456789abcdef01234567"), "another data set"),
        (lambda m: m["files"]["offsets.npy"].update(bytes=1), "says 1"),
    ],
)
def test_a_manifest_of_another_version_or_data_set_is_refused_and_rebuilt(built, edit, problem):
    files, root, content = built
    manifest = json.loads((root / MANIFEST).read_text())
    edit(manifest)
    (root / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(DataFormatError, match=problem):
        verify_cache(root)
    with pytest.warns(RuntimeWarning, match="rebuilding"):
        assert _content(*load_catalogue(**files)) == content
    verify_cache(root)


@pytest.mark.parametrize("how", ["truncated", "garbage", "missing", "not json"])
def test_a_broken_manifest_is_named_and_rebuilt(built, how):
    files, root, content = built
    mpath = root / MANIFEST
    if how == "not json":
        mpath.write_text("[1, 2")
    else:
        CORRUPTIONS[how](mpath)
    with pytest.raises(DataFormatError) as e:
        verify_cache(root)
    assert e.value.path == str(mpath)
    with pytest.warns(RuntimeWarning, match="manifest.json"):
        assert _content(*load_catalogue(**files)) == content


def test_an_array_that_is_not_what_the_manifest_says_is_refused(built):
    # a checksum that matches but a dtype that does not: refused when the array is opened
    files, root, content = built
    manifest = json.loads((root / MANIFEST).read_text())
    manifest["files"]["offsets.npy"]["dtype"] = "<i4"
    (root / MANIFEST).write_text(json.dumps(manifest))
    flat = verify_cache(root)
    with pytest.raises(DataFormatError, match="holds <i8") as e:
        open_cache(flat, {}, "x")
    assert e.value.path == str(root / "offsets.npy")
    with pytest.warns(RuntimeWarning, match="offsets.npy"):
        assert _content(*load_catalogue(**files)) == content


def test_a_cache_folder_copied_from_other_data_is_refused(tmp_path):
    a = _files(tmp_path / "a")
    content_a = _content(*load_catalogue(**a))
    products = json.loads(json.dumps(PRODUCTS))
    products[1]["name"] = "Zen Shampoo Refill Bag"
    b = write_shop(tmp_path / "b", products=products)
    b = {k: b[k] for k in ("products_path", "attributes_path", "cache_root")}
    content_b = _content(*load_catalogue(**b))
    shutil.rmtree(_root(b))
    shutil.copytree(_root(a), _root(b))
    with pytest.raises(DataFormatError, match="another data set"):
        verify_cache(_root(b))
    with pytest.warns(RuntimeWarning, match="another data set"):
        got = _content(*load_catalogue(**b))
    assert got == content_b != content_a


def test_make_rebuilds_a_bad_cache(tmp_path):
    kw = write_shop(tmp_path)
    env = twice_envs.make("WebShop-v0", **kw)
    goals = [env.res.goals[i] for i in range(len(env.res.goals))]
    clear_process_cache()
    root = _root({k: kw[k] for k in ("products_path", "attributes_path", "cache_root")})
    _garbage(root / "index_data.npy")
    with pytest.warns(RuntimeWarning, match="index_data.npy"):
        env2 = twice_envs.make("WebShop-v0", **kw)
    assert [env2.res.goals[i] for i in range(len(goals))] == goals
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        clear_process_cache()
        twice_envs.make("WebShop-v0", **kw)  # the rebuilt cache loads quietly


def test_a_failed_build_leaves_nothing(tmp_path):
    products = json.loads(json.dumps(PRODUCTS))
    products[3]["pricing"] = "$"  # the fourth product is bad: the build fails part way
    kw = write_shop(tmp_path, products=products)
    with pytest.raises(DataFormatError, match="malformed amount"):
        twice_envs.make("WebShop-v0", **kw)
    root = Path(kw["cache_root"])
    assert not root.exists() or list(root.iterdir()) == []


def test_cache_arrays_are_memory_mapped_read_only(built):
    files, root, _ = built
    clear_process_cache()
    cat, index, table = load_catalogue(**files)
    for arr in (index.data, index.docs, index.ptr, index.vocab.blob, table.perm, table.weights, table.starts,
                table.split_sums("train")[0], cat.products._offsets, cat.asins.keys, cat.asins.pos):
        assert isinstance(arr.base, np.memmap) and not arr.flags.writeable
        with pytest.raises(ValueError):
            arr[...] = 0


# --------------------------------------------------------------------------- the flat file layer


def test_flat_writer_is_atomic(tmp_path):
    w = FlatWriter(tmp_path / "f")
    w.array("a.npy", np.arange(5))
    with pytest.raises(RuntimeError):
        with w.stream("s.bin") as out:
            out.write(b"half")
            raise RuntimeError("killed")
    assert sorted(p.name for p in (tmp_path / "f").iterdir()) == ["a.npy"]  # no temp file, no half file
    with pytest.raises(DataFormatError, match="never finished"):
        FlatFiles.open(tmp_path / "f", "x/1")  # no manifest yet: not a cache
    with w.stream("s.bin") as out:
        out.write(b"whole")
    w.finish("x/1", {"k": 1})
    f = FlatFiles.open(tmp_path / "f", "x/1", ["a.npy", "s.bin"])
    assert f.array("a.npy").tolist() == [0, 1, 2, 3, 4] and f.path("s.bin").read_bytes() == b"whole"
    assert f.meta == {"k": 1}
    with pytest.raises(DataFormatError, match="cache format 'x/1'; this version reads 'x/2'"):
        FlatFiles.open(tmp_path / "f", "x/2")
    with pytest.raises(TypeError):
        w.array("o.npy", np.array([object()]))


def test_saved_index_files_are_checked(tmp_path):
    index = SearchIndex.build(["red shoes", "blue shoes", "green tea"])
    index.save(tmp_path / "idx")
    loaded = SearchIndex.load(tmp_path / "idx")
    assert loaded.search("shoes") == index.search("shoes")
    _flip_one_byte(tmp_path / "idx" / "data.npy")
    with pytest.raises(DataFormatError, match="checksum") as e:
        SearchIndex.load(tmp_path / "idx")
    assert e.value.path == str(tmp_path / "idx" / "data.npy")
    manifest = json.loads((tmp_path / "idx" / MANIFEST).read_text())
    assert manifest["format"] == INDEX_FORMAT


def test_flat_vocabulary_matches_the_dict():
    texts = ["Crème brûlée 6.76 oz", "naïve café l'eau", "zebra apple mango", "日本 茶", "x" * 300]
    index = SearchIndex.build(texts)
    blob, offsets, ids = FlatVocabulary.arrays(index.vocab)
    flat = FlatVocabulary(blob, offsets, ids)
    assert len(flat) == len(index.vocab)
    for term, i in index.vocab.items():
        assert flat.get(term) == i and flat[term] == i and term in flat
    assert dict(flat.items()) == index.vocab
    for missing in ("", "a", "zzz", "crème", "日", "x" * 301):
        if missing not in index.vocab:
            assert flat.get(missing) is None and missing not in flat


def test_asin_index_finds_every_asin():
    asins = ["B0ZZZ", "B0AAA", "ÄSIN1", "B0MMM", "", "B0AA"]
    idx = AsinIndex.build(asins)
    assert [idx.get(a) for a in asins] == list(range(len(asins)))
    for missing in ("B0A", "B0AAAA", "B0ZZZZZZZZZZ", "x", "B0AA\0"):
        assert idx.get(missing) is None


# --------------------------------------------------------------------------- search over the flat arrays


def _plain_top_k(scores, k):
    hits = np.flatnonzero(scores > 0)
    if len(hits) > k:
        kth = np.partition(scores[hits], len(hits) - k)[len(hits) - k]
        hits = hits[scores[hits] >= kth]
    order = np.lexsort((hits, -scores[hits]))
    return tuple(int(i) for i in hits[order[:k]])


def test_top_k_equals_the_plain_selection():
    # large arrays take a threshold from a sample first; the result must not change, ties included
    from twice_envs.envs.webshop.search import top_k

    rng = np.random.default_rng(1)
    for n in (10, 4095, 4096, 70_000):
        for frac in (0.0, 0.0005, 0.01, 0.5, 1.0):
            for levels in (1, 3, 1000, 10**6):
                s = np.zeros(n, np.float32)
                m = rng.random(n) < frac
                s[m] = (rng.integers(1, levels + 1, int(m.sum())) / levels).astype(np.float32)
                assert top_k(s, 0) == ()
                for k in (1, 50, 300):
                    assert top_k(s, k) == _plain_top_k(s, k), (n, frac, levels, k)
