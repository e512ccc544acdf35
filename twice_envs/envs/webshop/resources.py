"""Heavy shop resources (catalogue, search index, goals), built once and cached.

* Per process: :func:`get_resources` returns the same object for the same data and
  options, so ``make("WebShop-v0")`` again (what ``fork`` does) costs microseconds.
* On disk, for data files: the normalised catalogue (one JSON record per line, read on
  demand), the goal tables and the BM25 index go under
  ``twice_envs._cache.cache_dir("webshop", KEY)``, where KEY digests the files' paths,
  sizes and modification times and the options. Every file is written to a temporary
  name and renamed, and ``meta.json`` is written last, so two processes building at once
  never see a half-built cache.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from twice_envs.envs.webshop import catalogue_gen
from twice_envs.envs.webshop.catalogue import (
    Catalogue,
    RecordFile,
    file_key,
    load_json_object,
    normalise_all,
    parse_human_instructions,
    validate_attributes,
    stream_products,
    write_records,
)
from twice_envs.envs.webshop.goals import GoalSet, synthetic_table, synthetic_weights
from twice_envs.envs.webshop.search import ANALYZER_VERSION, IndexBuilder, SearchIndex
from twice_envs.trajectory import atomic_write_text


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
    return cat, index, synthetic_table(products)


def _check_file(path: str, what: str) -> str:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"WebShop {what} file not found: {path}")
    return path


def load_catalogue(
    products_path: str,
    attributes_path: Optional[str] = None,
    human_path: Optional[str] = None,
    num_products: Optional[int] = None,
    cache_root: Optional[str] = None,
) -> tuple[Catalogue, SearchIndex, tuple[np.ndarray, np.ndarray]]:
    """Load (building the disk cache the first time) a catalogue from the original files."""
    _check_file(products_path, "products")
    if attributes_path:
        _check_file(attributes_path, "attributes")
    if human_path:
        _check_file(human_path, "human instructions")
    key = file_key(products_path, attributes_path, extra={"n": num_products, "analyzer": ANALYZER_VERSION})
    if cache_root is None:
        from twice_envs._cache import cache_dir

        root = cache_dir("webshop", key)
    else:
        root = Path(cache_root) / key
        root.mkdir(parents=True, exist_ok=True)
    if not (root / "meta.json").exists():
        build_cache(root, products_path, attributes_path, num_products)
    human = {}
    if human_path:
        human = parse_human_instructions(load_json_object(human_path, "a list of instructions"), human_path)
    offsets = np.load(root / "offsets.npy", mmap_mode="r")
    products = RecordFile(root / "records.jsonl", offsets)
    with open(root / "asins.json", encoding="utf-8") as fh:
        asins = json.load(fh)
    cat = Catalogue(products, human, key, str(products_path))
    cat._asin_index = {a: i for i, a in enumerate(asins)}
    index = SearchIndex.load(root / "index")
    table = (np.load(root / "goal_counts.npy"), np.load(root / "goal_weights.npy"))
    return cat, index, table


def _save_npy(path: Path, arr: np.ndarray) -> None:
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npy")
    np.save(tmp, arr)
    os.replace(tmp, path)


def build_cache(root: Path, products_path: str, attributes_path: Optional[str], num_products: Optional[int]) -> None:
    """Stream the products once: write records, index texts and goal tables into ``root``."""
    attrs = load_json_object(attributes_path, "attributes") if attributes_path else None
    if attrs is not None:
        validate_attributes(attrs, attributes_path)
    builder = IndexBuilder()
    asins: list[str] = []
    counts: list[int] = []
    ins_attrs: list[tuple[str, ...]] = []

    def on_product(p) -> None:
        builder.add(p.search_text())
        asins.append(p.asin)
        n = 0
        if p.instruction is not None and p.instruction_attributes:
            n = 1
            for _, values in p.options:
                n *= len(values)
        counts.append(n)
        ins_attrs.append(p.instruction_attributes if n else ())

    offsets = write_records(stream_products(products_path, attrs, num_products), root / "records.jsonl", on_product)
    _save_npy(root / "offsets.npy", np.asarray(offsets, dtype=np.int64))
    count_arr = np.asarray(counts, dtype=np.int64)
    _save_npy(root / "goal_counts.npy", count_arr)
    _save_npy(root / "goal_weights.npy", synthetic_weights(count_arr, ins_attrs))
    atomic_write_text(root / "asins.json", json.dumps(asins))
    builder.finish().save(root / "index")
    atomic_write_text(root / "meta.json", json.dumps({"products": len(asins), "source": str(products_path)}))


def clear_process_cache() -> None:
    """Forget the per-process resources (tests and benchmarks)."""
    _CACHE.clear()
    _DATA.clear()
