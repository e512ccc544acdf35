"""Heavy shop resources (catalogue, search index, goals), built once and cached.

* Per process: :func:`get_resources` returns the same object for the same data and
  options, so ``make("WebShop-v0")`` again (what ``fork`` does) costs microseconds.
* On disk, for data files: the normalised catalogue (one JSON record per line, read on
  demand, with its line offsets), the asin table, the synthetic goal tables and the BM25
  index go in one folder, ``twice_envs._cache.cache_dir("webshop") / KEY`` (or
  ``cache_root / KEY``), where KEY digests the files' paths, sizes and modification
  times and the options. All are flat files (``.npy`` arrays opened with
  ``mmap_mode="r"``), so N worker processes on one catalogue share one copy of its pages
  instead of holding N.
* The folder is built beside its place and renamed into it when complete (two processes
  building at once keep the first); inside, every file is written to a temporary name
  and renamed, and ``manifest.json`` (sizes, checksums, array types, format version) is
  written last. Loading checks all of it first: a truncated, corrupt, foreign or
  other-version file, a missing or unparseable manifest, or a file where the folder
  belongs raises :class:`~twice_envs.errors.DataFormatError` naming the file, and
  :func:`load_catalogue` then discards the folder and rebuilds it (with a
  ``RuntimeWarning`` saying which file was bad; :func:`twice_envs._cache.cached`). A file
  is never read unchecked. The user's own data files are never part of the cache: one
  that is gone raises ``FileNotFoundError`` naming it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from twice_envs._cache import cache_dir, cached
from twice_envs.envs.webshop import catalogue_gen
from twice_envs.envs.webshop.catalogue import (
    CACHE_FORMAT,
    MANIFEST,
    AsinIndex,
    Catalogue,
    FlatFiles,
    FlatWriter,
    RecordFile,
    file_key,
    load_json_object,
    normalise_all,
    parse_human_instructions,
    validate_attributes,
    stream_products,
    write_records,
)
from twice_envs.envs.webshop.goals import GoalSet, GoalTable, synthetic_table, synthetic_weights
from twice_envs.envs.webshop.search import ANALYZER_VERSION, INDEX_ARRAYS, IndexBuilder, SearchIndex
from twice_envs.errors import DataFormatError

#: Progress of cache builds (INFO: every 100,000 products and each stage).
log = logging.getLogger("twice_envs.webshop")


@dataclass
class Resources:
    """Everything an episode reads and never writes."""

    catalogue: Catalogue
    index: SearchIndex
    goals: GoalSet


_CACHE: dict[tuple, Resources] = {}
_DATA: dict[tuple, tuple] = {}
_LOCK = threading.Lock()


def get_resources(
    products_path: Optional[str] = None,
    attributes_path: Optional[str] = None,
    human_path: Optional[str] = None,
    num_products: Optional[int] = None,
    goals: str = "auto",
    price_seed: int = 0,
    catalogue_seed: int = catalogue_gen.DEFAULT_SEED,
    cache_root: Optional[str] = None,
) -> Resources:
    """The resources for these data and options (cached per process and on disk)."""
    if goals not in ("auto", "synthetic", "human"):
        raise ValueError(f"goals must be 'auto', 'synthetic' or 'human', got {goals!r}")
    if goals == "auto":
        goals = "human" if human_path else "synthetic"
    if goals == "human" and not human_path:
        raise ValueError("goals='human' needs human_path (the items_human_ins.json file)")
    key = (products_path, attributes_path, human_path, num_products, goals, int(price_seed), catalogue_seed, cache_root)
    res = _CACHE.get(key)
    if res is not None:
        return res
    with _LOCK:
        res = _CACHE.get(key)
        if res is None:
            data_key = key[:4] + key[6:]
            data = _DATA.get(data_key)
            if data is None:
                if products_path is None:
                    data = _generated(num_products, catalogue_seed)
                else:
                    data = load_catalogue(products_path, attributes_path, human_path, num_products, cache_root)
                _DATA[data_key] = data
            cat, index, table = data
            res = Resources(cat, index, GoalSet(cat, goals, price_seed, table if goals == "synthetic" else None))
            _CACHE[key] = res
    return res


def _generated(num_products: Optional[int], seed: int):
    n = catalogue_gen.DEFAULT_PRODUCTS if num_products is None else int(num_products)
    raw, attrs = catalogue_gen.generate(n, seed)
    products = normalise_all(raw, attrs, path="<generated catalogue>")
    cat = Catalogue(products, {}, f"generated-{n}-{seed}", f"the embedded generated catalogue ({n} products, seed {seed})")
    index = SearchIndex.build(p.search_text() for p in products)
    return cat, index, GoalTable.from_counts(*synthetic_table(products))


def _check_file(path: str, what: str) -> str:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"WebShop {what} file not found: {path}")
    return path


#: Files every catalogue cache folder holds (besides ``manifest.json``).
CACHE_FILES = (
    ("records.jsonl", "offsets.npy", "asin_keys.npy", "asin_pos.npy")
    + tuple(f"goal_{n}.npy" for n in GoalTable.ARRAYS)
    + tuple(f"index_{n}.npy" for n in INDEX_ARRAYS)
)


def cache_folder(
    products_path: str,
    attributes_path: Optional[str] = None,
    num_products: Optional[int] = None,
    cache_root: Optional[str] = None,
) -> Path:
    """The cache folder of these data files and options (it may not exist yet)."""
    key = file_key(products_path, attributes_path, extra={"n": num_products, "analyzer": ANALYZER_VERSION})
    if cache_root is None:
        return cache_dir("webshop") / key
    return Path(cache_root) / key


def load_catalogue(
    products_path: str,
    attributes_path: Optional[str] = None,
    human_path: Optional[str] = None,
    num_products: Optional[int] = None,
    cache_root: Optional[str] = None,
) -> tuple[Catalogue, SearchIndex, GoalTable]:
    """Load (building the disk cache the first time, or again when a file of it is bad) a
    catalogue from the original files."""
    _check_file(products_path, "products")
    if attributes_path:
        _check_file(attributes_path, "attributes")
    if human_path:
        _check_file(human_path, "human instructions")
    root = cache_folder(products_path, attributes_path, num_products, cache_root)
    human = {}
    if human_path:
        human = parse_human_instructions(load_json_object(human_path, "a list of instructions"), human_path)
    return cached(
        root,
        lambda folder: open_cache(verify_cache(folder), human, str(products_path)),
        lambda tmp: build_cache(tmp, products_path, attributes_path, num_products, root.name),
        "WebShop catalogue",
        marker=MANIFEST,
    )


def verify_cache(root: Path) -> FlatFiles:
    """Open the cache folder ``root``, checking every file (:class:`DataFormatError` names a bad one)."""
    files = FlatFiles.open(root, CACHE_FORMAT, CACHE_FILES)
    meta = files.meta
    if meta.get("key") != Path(root).name:
        raise DataFormatError(
            files.manifest_path, None,
            f"belongs to another data set (key {meta.get('key')!r}, this folder is {Path(root).name!r})",
        )
    return files


def open_cache(files: FlatFiles, human: dict, source: str) -> tuple[Catalogue, SearchIndex, GoalTable]:
    """Catalogue, index and goal table of a verified cache folder (arrays memory-mapped read-only)."""
    meta = files.meta
    offsets = files.array("offsets.npy")
    n = meta.get("products")
    if not isinstance(n, int) or offsets.dtype != np.int64 or len(offsets) != n + 1 or offsets[0] != 0 \
            or offsets[-1] != files.files["records.jsonl"]["bytes"]:
        raise DataFormatError(files.path("offsets.npy"), None, "record offsets disagree with the records file")
    keys, pos = files.array("asin_keys.npy"), files.array("asin_pos.npy")
    if keys.dtype.kind != "S" or pos.dtype != np.int64 or len(keys) != n or len(pos) != n:
        raise DataFormatError(files.path("asin_keys.npy"), None, "the asin table disagrees with the catalogue")
    products = RecordFile(files.path("records.jsonl"), offsets)
    cat = Catalogue(products, human, meta["key"], source, asins=AsinIndex(keys, pos))
    index = SearchIndex.from_files(files, meta.get("index") or {}, prefix="index_")
    if index.num_docs != n:
        raise DataFormatError(files.manifest_path, None, f"the search index covers {index.num_docs} products, not {n}")
    table = GoalTable.from_files(files, meta.get("goals") or {}, prefix="goal_")
    if len(table.starts) != n + 1:
        raise DataFormatError(files.manifest_path, None, "the goal table covers another number of products")
    return cat, index, table


def build_cache(
    root: Path, products_path: str, attributes_path: Optional[str], num_products: Optional[int], key: str
) -> None:
    """Stream the products once into the folder ``root``: records, asin table, index, goal tables,
    and last the manifest (which names ``key``, the folder's name once published)."""
    attrs = load_json_object(attributes_path, "attributes") if attributes_path else None
    if attrs is not None:
        validate_attributes(attrs, attributes_path)
    builder = IndexBuilder()
    asins: list[str] = []
    counts: list[int] = []
    ins_attrs: list[tuple[str, ...]] = []
    pool: dict[str, str] = {}

    t0 = time.perf_counter()

    def on_product(p) -> None:
        builder.add(p.search_text())
        asins.append(p.asin)
        if len(asins) % 100_000 == 0:
            log.info("WebShop cache: %d products read and analysed (%.0f s)", len(asins), time.perf_counter() - t0)
        n = 0
        if p.instruction is not None and p.instruction_attributes:
            n = 1
            for _, values in p.options:
                n *= len(values)
        counts.append(n)
        ins_attrs.append(tuple(pool.setdefault(a, a) for a in p.instruction_attributes) if n else ())

    writer = FlatWriter(root)
    with writer.stream("records.jsonl") as out:
        offsets = write_records(stream_products(products_path, attrs, num_products), out, on_product)
    attrs = None  # what is no longer needed is let go before the index is built (the peak)
    writer.array("offsets.npy", offsets)
    asin_index = AsinIndex.build(asins)
    writer.array("asin_keys.npy", asin_index.keys)
    writer.array("asin_pos.npy", asin_index.pos)
    n_products = len(asins)
    asins.clear()
    asin_index = None
    count_arr = np.asarray(counts, dtype=np.int64)
    table = GoalTable.from_counts(count_arr, synthetic_weights(count_arr, ins_attrs))
    counts.clear()
    ins_attrs.clear()
    pool.clear()
    goals_meta = table.write_files(writer, prefix="goal_")
    table = None
    log.info("WebShop cache: %d products, %d goals; building the search index (%.0f s)", n_products,
             goals_meta["goals"], time.perf_counter() - t0)
    index_meta = builder.finish().write_files(writer, prefix="index_")
    log.info("WebShop cache: built in %.0f s", time.perf_counter() - t0)
    writer.finish(
        CACHE_FORMAT,
        {
            "key": key,
            "products": n_products,
            "source": str(products_path),
            "goals": goals_meta,
            "index": index_meta,
        },
    )


def clear_process_cache() -> None:
    """Forget the per-process resources (tests and benchmarks)."""
    _CACHE.clear()
    _DATA.clear()
