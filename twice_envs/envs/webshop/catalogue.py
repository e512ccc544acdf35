"""Products: loading the original WebShop files, validation, and the on-disk cache.

File formats (the original project's):

* products (``items_shuffle_1000.json`` / ``items_shuffle.json``): a JSON array of
  objects with ``asin``, ``name``, ``full_description``, ``small_description`` (a string
  or a list of bullet points), ``pricing`` (``"$12.99"``, ``"$10.00 - $20.00"``; missing
  or empty means $100.0), ``images``, ``category``, ``query``, ``product_category``
  (``"A › B › C"``) and ``customization_options`` (option name -> list of
  ``{"value": ..., "image": ...}``, or null). Read as a stream, one product at a time.
* attributes (``items_ins_v2_1000.json`` / ``items_ins_v2.json``): a JSON object asin ->
  ``{"attributes": [...], "instruction": "...", "instruction_attributes": [...]}``.
* human instructions (``items_human_ins.json``): a JSON object asin -> list of
  ``{"instruction": ..., "instruction_attributes": [...], "instruction_options": [...]}``.

Normalisation follows the original: products whose asin is ``"nan"`` or longer than 10
characters are skipped, a repeated asin keeps its first product, option names and values
are lower-cased and ``/`` in a value becomes `` | ``, the query is lower-cased and
stripped, a product without attributes gets ``["DUMMY_ATTR"]``. A malformed file raises
:class:`~twice_envs.errors.DataFormatError` with the file, the line and the problem.

Cache files (:class:`FlatWriter`, :class:`FlatFiles`): the built catalogue, search index
and goal tables are flat files in one folder: ``.npy`` arrays (opened with
``mmap_mode="r"``, so every process on one machine shares their pages) and a records
file, listed last in ``manifest.json`` with each file's size, CRC-32 and array type. Each
file is written under a temporary name and renamed. Opening checks the manifest's format
version and every file's size, checksum, dtype and shape before anything is read; a
truncated, corrupt, foreign or other-version file raises :class:`DataFormatError` naming
it (the loaders in :mod:`.resources` then rebuild the cache).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
from collections import OrderedDict
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Iterator, Optional, Sequence

import numpy as np

from twice_envs.envs.webshop.flat_files import MANIFEST, FlatFiles, FlatWriter, file_crc32
from twice_envs.envs.webshop.json_stream import iter_json_array, load_json_object
from twice_envs.errors import DataFormatError

#: Bump when the cached record layout, the cache files or normalisation change.
CACHE_FORMAT = "webshop-catalogue/2"


@dataclass(frozen=True)
class HumanInstruction:
    """One instruction written by a person for a product (``items_human_ins.json``)."""

    instruction: str
    attributes: tuple[str, ...]
    options: tuple[str, ...]


@dataclass(frozen=True)
class Product:
    """A normalised product (immutable).

    Attributes:
        asin: product id as in the data (upper case for real ASINs).
        title: the product name (``Title`` and ``name`` in the original).
        description: ``full_description``.
        bullets: ``small_description`` as a tuple of bullet points.
        price_tag: the price text shown on pages (``$12.99`` or ``$10.0 to $20.0``).
        pricing: one price, or (low, high) for a range.
        options: ``((name, (value, ...)), ...)`` in file order.
        attributes: attribute phrases used by the reward.
        category: top category (``beauty``, ...).
        query: the search query the product was collected for (lower case).
        product_category: the ``›``-separated breadcrumb.
        instruction: the synthetic instruction (or None).
        instruction_attributes: the attributes that instruction asks for.
    """

    asin: str
    title: str
    description: str
    bullets: tuple[str, ...]
    price_tag: str
    pricing: tuple[float, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]
    attributes: tuple[str, ...]
    category: str
    query: str
    product_category: str
    instruction: Optional[str] = None
    instruction_attributes: tuple[str, ...] = ()

    def to_record(self) -> list:
        """Compact JSON data (inverse of :meth:`from_record`)."""
        return [
            self.asin, self.title, self.description, list(self.bullets), self.price_tag, list(self.pricing),
            [[n, list(v)] for n, v in self.options], list(self.attributes), self.category, self.query,
            self.product_category, self.instruction, list(self.instruction_attributes),
        ]

    @classmethod
    def from_record(cls, r: list) -> "Product":
        return cls(
            r[0], r[1], r[2], tuple(r[3]), r[4], tuple(r[5]), tuple((n, tuple(v)) for n, v in r[6]), tuple(r[7]),
            r[8], r[9], r[10], r[11], tuple(r[12]),
        )

    def search_text(self) -> str:
        """The text the search engine indexes (title, description, first bullet, options)."""
        option_text = ", and ".join(f"{name}: {', '.join(values)}" for name, values in self.options)
        first = self.bullets[0] if self.bullets else ""
        return " ".join([self.title, self.description, first, option_text]).lower()


# --------------------------------------------------------------------------- normalisation

_NOT_PRICE = re.compile(r"[^\d.]")


def parse_pricing(value: Any, path: Any = "<pricing>", line: Optional[int] = None) -> tuple[tuple[float, ...], str]:
    """``(pricing, price_tag)`` from a product's ``pricing`` text, as the original reads it.

    ``"$12.99"`` -> ``((12.99,), "$12.99")``; ``"$10.00 - $20.00"`` -> ``((10.0, 20.0),
    "$10.0 to $20.0")``; missing or empty -> ``((100.0,), "$100.0")``. Text with no
    dollar amount, an empty amount (``"$"``) or a malformed number raises.
    """
    if value is None or value == "" or value == []:
        return (100.0,), "$100.0"
    if not isinstance(value, str):
        raise DataFormatError(path, line, f"'pricing' must be text like \"$12.99\", got {type(value).__name__}")
    parts = value.split("$")[1:]
    if not parts:
        raise DataFormatError(path, line, f"'pricing' {value!r} has no dollar amount (expected \"$12.99\" or \"$10 - $20\")")
    prices = []
    for part in parts:
        digits = _NOT_PRICE.sub("", part)
        try:
            if not digits:
                raise InvalidOperation
            prices.append(float(Decimal(digits)))
        except InvalidOperation:
            raise DataFormatError(path, line, f"'pricing' {value!r} has a malformed amount ${part.strip()!r}") from None
    if len(prices) == 1:
        return (prices[0],), f"${prices[0]}"
    return (prices[0], prices[1]), f"${prices[0]} to ${prices[1]}"


def _text(raw: dict, key: str, path: Any, line: Optional[int], required: bool = True) -> str:
    if key not in raw:
        if required:
            raise DataFormatError(path, line, f"product {raw.get('asin', '?')!r} is missing the field {key!r}")
        return ""
    v = raw[key]
    if v is None:
        return ""
    if not isinstance(v, str):
        raise DataFormatError(path, line, f"product {raw.get('asin', '?')!r}: field {key!r} must be text, got {type(v).__name__}")
    return v


def _str_list(v: Any, path: Any, line: Optional[int], what: str) -> tuple[str, ...]:
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise DataFormatError(path, line, f"{what} must be a list of strings")
    return tuple(v)


def normalise_product(
    raw: Any, attrs: Optional[dict], path: Any = "<products>", line: Optional[int] = None
) -> Optional[Product]:
    """A :class:`Product` from one raw product object, or None when the original skips it."""
    if not isinstance(raw, dict):
        raise DataFormatError(path, line, f"each product must be a JSON object, got {type(raw).__name__}")
    if "asin" not in raw:
        raise DataFormatError(path, line, "a product is missing the field 'asin'")
    asin = raw["asin"]
    if not isinstance(asin, str):
        raise DataFormatError(path, line, f"'asin' must be text, got {type(asin).__name__}")
    if asin == "nan" or len(asin) > 10:
        return None
    title = _text(raw, "name", path, line)
    description = _text(raw, "full_description", path, line)
    if "small_description" not in raw:
        raise DataFormatError(path, line, f"product {asin!r} is missing the field 'small_description'")
    small = raw["small_description"]
    if isinstance(small, list):
        if not all(isinstance(b, str) for b in small):
            raise DataFormatError(path, line, f"product {asin!r}: 'small_description' must be text or a list of text")
        bullets = tuple(small)
    elif small is None or isinstance(small, str):
        bullets = (small or "",)
    else:
        raise DataFormatError(path, line, f"product {asin!r}: 'small_description' must be text or a list of text")
    category = _text(raw, "category", path, line)
    query = _text(raw, "query", path, line).lower().strip()
    product_category = _text(raw, "product_category", path, line)
    pricing, price_tag = parse_pricing(raw.get("pricing"), path, line)
    options: list[tuple[str, tuple[str, ...]]] = []
    custom = raw.get("customization_options")
    if custom:
        if not isinstance(custom, dict):
            raise DataFormatError(path, line, f"product {asin!r}: 'customization_options' must be an object")
        for name, contents in custom.items():
            if contents is None:
                continue
            if not isinstance(contents, list):
                raise DataFormatError(path, line, f"product {asin!r}: option {name!r} must be a list of {{'value': ...}}")
            values = []
            for c in contents:
                if not isinstance(c, dict) or not isinstance(c.get("value"), str):
                    raise DataFormatError(path, line, f"product {asin!r}: option {name!r} has an entry without a text 'value'")
                values.append(c["value"].strip().replace("/", " | ").lower())
            options.append((name.lower(), tuple(values)))
    a = attrs.get(asin) if attrs else None
    attributes: tuple[str, ...] = ("DUMMY_ATTR",)
    instruction, ins_attrs = None, ()
    if a is not None:
        if not isinstance(a, dict):
            raise DataFormatError(path, line, f"attributes of {asin!r} must be an object")
        if "attributes" in a:
            attributes = _str_list(a["attributes"], path, line, f"attributes of {asin!r}")
        ins = a.get("instruction")
        if ins is not None:
            if not isinstance(ins, str):
                raise DataFormatError(path, line, f"the instruction of {asin!r} must be text")
            instruction = ins
            ins_attrs = _str_list(a.get("instruction_attributes"), path, line, f"instruction_attributes of {asin!r}")
    return Product(
        asin, title, description, bullets, price_tag, pricing, tuple(options), attributes, category, query,
        product_category, instruction, ins_attrs,
    )


def line_of_key(path: str | os.PathLike, key: str) -> Optional[int]:
    """The line of the first ``"key"`` in a JSON file (only read when reporting an error)."""
    needle = json.dumps(key, ensure_ascii=False)
    try:
        with open(path, encoding="utf-8") as fh:
            for n, text in enumerate(fh, 1):
                if needle in text:
                    return n
    except (OSError, UnicodeDecodeError):
        pass
    return None


def _at_entry(path: Any, asin: str, exc: DataFormatError) -> DataFormatError:
    """Re-raise a structural error of entry ``asin`` with the file and the entry's line."""
    return DataFormatError(path, line_of_key(path, asin) if exc.line is None else exc.line, exc.problem)


def validate_attributes(data: dict, path: Any) -> None:
    """Check ``items_ins_v2.json``-style data (asin -> attributes, instruction); errors name the line."""
    for asin, a in data.items():
        try:
            if not isinstance(a, dict):
                raise DataFormatError(path, None, f"attributes of {asin!r} must be an object")
            if "attributes" in a:
                _str_list(a["attributes"], path, None, f"attributes of {asin!r}")
            if a.get("instruction") is not None and not isinstance(a["instruction"], str):
                raise DataFormatError(path, None, f"the instruction of {asin!r} must be text")
            _str_list(a.get("instruction_attributes"), path, None, f"instruction_attributes of {asin!r}")
        except DataFormatError as exc:
            raise _at_entry(path, asin, exc) from None


def parse_human_instructions(data: dict, path: Any) -> dict[str, tuple[HumanInstruction, ...]]:
    """Validate ``items_human_ins.json`` data into asin -> instructions (errors name the entry's line)."""
    out: dict[str, tuple[HumanInstruction, ...]] = {}
    for asin, items in data.items():
        try:
            out[asin] = _parse_human_entry(asin, items, path)
        except DataFormatError as exc:
            raise _at_entry(path, asin, exc) from None
    return out


def _parse_human_entry(asin: str, items: Any, path: Any) -> tuple[HumanInstruction, ...]:
    if not isinstance(items, list):
        raise DataFormatError(path, None, f"human instructions of {asin!r} must be a list")
    parsed = []
    for k, it in enumerate(items):
        if not isinstance(it, dict) or not isinstance(it.get("instruction"), str):
            raise DataFormatError(path, None, f"human instruction {k} of {asin!r} needs a text 'instruction'")
        parsed.append(
            HumanInstruction(
                it["instruction"],
                _str_list(it.get("instruction_attributes", []), path, None, f"instruction_attributes of {asin!r}[{k}]"),
                _str_list(it.get("instruction_options", []), path, None, f"instruction_options of {asin!r}[{k}]"),
            )
        )
    return tuple(parsed)


# --------------------------------------------------------------------------- product stores


class RecordFile(Sequence[Product]):
    """Products stored one JSON record per line, read on demand through ``mmap``.

    ``offsets`` (``N + 1`` line starts) is usually a memory-mapped array, so a reload costs
    no parse of the catalogue and every process shares the pages it reads. A small memo
    keeps the products read last.
    """

    def __init__(self, records_path: Path, offsets: Sequence[int], memo_size: int = 4096) -> None:
        self.path = Path(records_path)
        self._fh = open(records_path, "rb")
        size = os.fstat(self._fh.fileno()).st_size
        self._mm = mmap.mmap(self._fh.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        self._offsets = offsets
        self._memo: OrderedDict[int, Product] = OrderedDict()
        self._memo_size = memo_size

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        p = self._memo.get(i)
        if p is None:
            if not 0 <= i < len(self):
                raise IndexError(i)
            start, end = int(self._offsets[i]), int(self._offsets[i + 1])
            try:
                p = Product.from_record(json.loads(self._mm[start:end]))
            except (ValueError, TypeError, IndexError) as exc:
                raise DataFormatError(self.path, i + 1, f"unreadable catalogue record ({exc})") from None
            self._memo[i] = p
            if len(self._memo) > self._memo_size:
                try:
                    self._memo.popitem(last=False)
                except KeyError:  # emptied meanwhile by another thread
                    pass
        return p


class AsinIndex:
    """asin -> catalogue position, over flat arrays: the asins' UTF-8 bytes sorted (``keys``,
    a fixed-width bytes array) and their positions (``pos``). A lookup is a binary search,
    so the table can stay memory-mapped and shared instead of a dict per process."""

    def __init__(self, keys: np.ndarray, pos: np.ndarray) -> None:
        self.keys, self.pos = keys, pos

    @classmethod
    def build(cls, asins: Sequence[str]) -> "AsinIndex":
        encoded = [a.encode("utf-8") for a in asins]
        width = max([1] + [len(e) for e in encoded])
        arr = np.array(encoded, dtype=f"S{width}") if encoded else np.zeros(0, dtype="S1")
        order = np.argsort(arr, kind="stable")
        return cls(arr[order], order.astype(np.int64))

    def __len__(self) -> int:
        return len(self.pos)

    def get(self, asin: str) -> Optional[int]:
        key = asin.encode("utf-8")
        if len(key) > self.keys.dtype.itemsize or key.endswith(b"\0"):
            return None
        i = int(np.searchsorted(self.keys, np.bytes_(key)))
        if i < len(self.keys) and self.keys[i] == key:
            return int(self.pos[i])
        return None


@dataclass
class Catalogue:
    """The products of one shop, with optional human instructions.

    Attributes:
        products: the products in catalogue order (a list, or a :class:`RecordFile`).
        human: asin -> human instructions (empty without ``items_human_ins.json``).
        key: a digest naming the data (files, sizes, times, options), used for caches.
        source: where it came from, for messages.
        asins: an :class:`AsinIndex` (file catalogues); else a dict is built on first use.
    """

    products: Sequence[Product]
    human: dict
    key: str
    source: str

    def __len__(self) -> int:
        return len(self.products)

    def __getitem__(self, i: int) -> Product:
        return self.products[i]

    _asin_index: Optional[dict] = None
    asins: Optional[AsinIndex] = None

    def index_of(self, asin: str) -> int:
        """Catalogue position of ``asin`` (KeyError when absent)."""
        if self.asins is not None:
            i = self.asins.get(asin)
            if i is None:
                raise KeyError(asin)
            return i
        if self._asin_index is None:
            self._asin_index = {self.products[i].asin: i for i in range(len(self.products))}
        return self._asin_index[asin]


def normalise_all(
    raw_products: Sequence[dict], attrs: Optional[dict], num_products: Optional[int] = None, path: Any = "<products>"
) -> list[Product]:
    """Normalise an in-memory product list (skips and dedups as the original)."""
    if num_products is not None:
        raw_products = raw_products[:num_products]
    seen: set[str] = set()
    out = []
    for i, raw in enumerate(raw_products):
        p = normalise_product(raw, attrs, path, None)
        if p is None or p.asin in seen:
            continue
        seen.add(p.asin)
        out.append(p)
    return out


def file_key(*paths: Optional[str | os.PathLike], extra: Any = None) -> str:
    """A digest of file identities (absolute path, size, mtime) plus ``extra``."""
    h = hashlib.sha256(CACHE_FORMAT.encode())
    for p in paths:
        if p is None:
            h.update(b"-")
            continue
        st = os.stat(p)
        h.update(f"{os.path.abspath(p)}|{st.st_size}|{st.st_mtime_ns}".encode())
    h.update(json.dumps(extra, sort_keys=True).encode())
    return h.hexdigest()[:24]


def stream_products(
    products_path: str | os.PathLike, attrs: Optional[dict], num_products: Optional[int] = None
) -> Iterator[Product]:
    """Normalised products from a products file, one at a time."""
    seen: set[str] = set()
    for n, (line, raw) in enumerate(iter_json_array(products_path)):
        if num_products is not None and n >= num_products:
            break
        p = normalise_product(raw, attrs, products_path, line)
        if p is None or p.asin in seen:
            continue
        seen.add(p.asin)
        yield p


def write_records(products: Iterable[Product], out: BinaryIO, on_product=None) -> np.ndarray:
    """Write one JSON record per line to ``out``; return the ``N + 1`` line offsets (int64).

    ``on_product(product)`` is called for each one (e.g. to feed the search indexer).
    """
    offsets = [0]
    pos = 0
    batch: list[bytes] = []
    for p in products:
        if on_product is not None:
            on_product(p)
        data = json.dumps(p.to_record(), ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        batch.append(data)
        pos += len(data)
        offsets.append(pos)
        if len(batch) >= 1024:
            out.write(b"".join(batch))
            batch.clear()
    out.write(b"".join(batch))
    return np.asarray(offsets, dtype=np.int64)
