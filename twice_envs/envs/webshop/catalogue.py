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
import zlib
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Iterator, Optional, Sequence

import numpy as np

from twice_envs._cache import read_json
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


# --------------------------------------------------------------------------- streaming JSON


def iter_json_array(path: str | os.PathLike, chunk_chars: int = 1 << 22) -> Iterator[tuple[int, Any]]:
    """Yield ``(line, element)`` for each element of a top-level JSON array, reading in chunks.

    Memory stays at one chunk plus one element, so the 1.18M-product file streams.
    """
    decoder = json.JSONDecoder()
    ws = " \t\r\n"
    with open(path, encoding="utf-8") as fh:
        buf = fh.read(chunk_chars)
        eof = len(buf) < chunk_chars
        pos = 0
        # line counting is incremental (positions only move forward): line_no is the line of buf[line_pos]
        line_no, line_pos = 1, 0

        def line_at(p: int) -> int:
            nonlocal line_no, line_pos
            if p > line_pos:
                line_no += buf.count("\n", line_pos, p)
                line_pos = p
            return line_no

        def more() -> bool:
            nonlocal buf, pos, eof, line_pos
            if eof:
                return False
            line_at(pos)
            chunk = fh.read(chunk_chars)
            eof = len(chunk) < chunk_chars
            buf = buf[pos:] + chunk
            pos, line_pos = 0, 0
            return bool(chunk)

        def skip_ws() -> str:
            nonlocal pos
            while True:
                while pos < len(buf) and buf[pos] in ws:
                    pos += 1
                if pos < len(buf):
                    return buf[pos]
                if not more():
                    return ""

        c = skip_ws()
        if c != "[":
            raise DataFormatError(path, line_at(pos), "expected a JSON array of products (the file must start with '[')")
        pos += 1
        c = skip_ws()
        if c == "]":
            return
        while True:
            c = skip_ws()
            if not c:
                raise DataFormatError(path, line_at(pos), "the JSON array is not closed (file truncated?)")
            while True:
                try:
                    value, end = decoder.raw_decode(buf, pos)
                    break
                except json.JSONDecodeError as exc:
                    if more():
                        continue
                    raise DataFormatError(path, line_at(exc.pos), f"invalid JSON: {exc.msg}") from None
            yield line_at(pos), value
            pos = end
            c = skip_ws()
            if c == ",":
                pos += 1
            elif c == "]":
                return
            elif not c:
                raise DataFormatError(path, line_at(pos), "the JSON array is not closed (file truncated?)")
            else:
                raise DataFormatError(path, line_at(pos), f"expected ',' or ']' between products, found {c!r}")


def load_json_object(path: str | os.PathLike, what: str) -> dict:
    """A JSON object file, with a :class:`DataFormatError` naming the line of a syntax error."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except json.JSONDecodeError as exc:
        raise DataFormatError(path, exc.lineno, f"invalid JSON: {exc.msg}") from None
    except UnicodeDecodeError as exc:
        raise DataFormatError(path, None, f"not UTF-8 text: {exc}") from None
    if not isinstance(data, dict):
        raise DataFormatError(path, 1, f"expected a JSON object mapping asin -> {what}, got {type(data).__name__}")
    return data


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


# --------------------------------------------------------------------------- flat cache files

#: The file that lists a cache folder's files; written last.
MANIFEST = "manifest.json"
_MAGIC = "twice_envs flat cache"
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_CHUNK = 1 << 22


def _check_name(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(f"bad cache file name {name!r}")
    return name


class _CrcWriter:
    """A binary file wrapper that keeps the CRC-32 and size of what went through it."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh, self.crc, self.size = fh, 0, 0

    def write(self, data: bytes) -> int:
        self.crc = zlib.crc32(data, self.crc)
        self.size += len(data)
        return self.fh.write(data)


def file_crc32(path: str | os.PathLike) -> tuple[int, int]:
    """``(crc32, size)`` of a file, read in chunks (no memory map, so no resident pages)."""
    crc, size = 0, 0
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while True:
            n = fh.readinto(buf)
            if not n:
                break
            crc = zlib.crc32(view[:n], crc)
            size += n
    return crc, size


class FlatWriter:
    """Writes a folder of flat files, then (:meth:`finish`) its manifest.

    Every file goes to a temporary name in the folder and is renamed when complete; the
    manifest comes last, so a folder without one was never finished.
    """

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.files: dict[str, dict] = {}

    def _tmp(self, name: str) -> Path:
        return self.directory / f".{name}.{os.getpid()}.tmp"

    def array(self, name: str, arr: Any) -> None:
        """Save ``arr`` as ``name`` (``.npy``, C order, no pickled objects)."""
        _check_name(name)
        arr = np.ascontiguousarray(arr)
        if arr.dtype.hasobject:
            raise TypeError(f"cache array {name} holds Python objects")
        tmp = self._tmp(name)
        try:
            with open(tmp, "wb") as fh:
                w = _CrcWriter(fh)
                np.lib.format.write_array(w, arr, allow_pickle=False)  # type: ignore[arg-type]
            os.replace(tmp, self.directory / name)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self.files[name] = {"bytes": w.size, "crc32": w.crc, "dtype": arr.dtype.str, "shape": list(arr.shape)}

    @contextmanager
    def stream(self, name: str) -> Iterator[_CrcWriter]:
        """A binary stream written to ``name`` (renamed into place when the block ends)."""
        _check_name(name)
        tmp = self._tmp(name)
        try:
            with open(tmp, "wb") as fh:
                w = _CrcWriter(fh)
                yield w
            os.replace(tmp, self.directory / name)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self.files[name] = {"bytes": w.size, "crc32": w.crc}

    def finish(self, fmt: str, meta: dict) -> None:
        """Write the manifest (format, ``meta``, the files written)."""
        from twice_envs.trajectory import atomic_write_text

        manifest = {"magic": _MAGIC, "format": fmt, "meta": meta, "files": self.files}
        atomic_write_text(self.directory / MANIFEST, json.dumps(manifest, sort_keys=True))


class FlatFiles:
    """A verified folder of flat files (see :meth:`open`); arrays come memory-mapped read-only."""

    def __init__(self, directory: Path, fmt: str, meta: dict, files: dict) -> None:
        self.directory, self.format, self.meta, self.files = directory, fmt, meta, files
        self.manifest_path = directory / MANIFEST

    @classmethod
    def open(cls, directory: str | os.PathLike, fmt: str, required: Iterable[str] = ()) -> "FlatFiles":
        """Check the manifest and every file it lists, then return the folder.

        Raises :class:`DataFormatError` naming the file when the manifest is missing, not
        one of ours, of another format version, or lacks a ``required`` file, or when a
        file is missing, of another size (truncated), fails its checksum (corrupt or
        replaced) or is not the array the manifest describes.
        """
        directory = Path(directory)
        mpath = directory / MANIFEST
        if not directory.is_dir():
            raise DataFormatError(directory, None, "not a folder (a cache folder was expected here)")
        m = read_json(mpath, "missing: the cache folder was never finished")
        if not isinstance(m, dict) or m.get("magic") != _MAGIC:
            raise DataFormatError(mpath, None, "not a twice_envs cache manifest")
        if m.get("format") != fmt:
            raise DataFormatError(
                mpath, None, f"written in cache format {m.get('format')!r}; this version reads {fmt!r}"
            )
        files, meta = m.get("files"), m.get("meta")
        if not isinstance(files, dict) or not isinstance(meta, dict):
            raise DataFormatError(mpath, None, "the manifest lacks its 'files' or 'meta' table")
        for name in required:
            if name not in files:
                raise DataFormatError(mpath, None, f"the manifest lists no {name!r}")
        for name, entry in files.items():
            if not isinstance(name, str) or not _NAME.match(name) or not isinstance(entry, dict):
                raise DataFormatError(mpath, None, f"bad file entry {name!r}")
            cls._verify(directory / name, entry)
        return cls(directory, fmt, meta, files)

    @staticmethod
    def _verify(path: Path, entry: dict) -> None:
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise DataFormatError(path, None, f"missing (listed in {MANIFEST})") from None
        if size != entry.get("bytes"):
            raise DataFormatError(
                path, None, f"is {size} bytes, {MANIFEST} says {entry.get('bytes')} (truncated or replaced)"
            )
        try:
            crc, _ = file_crc32(path)
        except OSError as exc:
            raise DataFormatError(path, None, f"unreadable: {exc}") from None
        if crc != entry.get("crc32"):
            raise DataFormatError(path, None, "its content does not match its checksum (corrupt or replaced)")

    def path(self, name: str) -> Path:
        if name not in self.files:
            raise DataFormatError(self.manifest_path, None, f"the manifest lists no {name!r}")
        return self.directory / name

    def array(self, name: str) -> np.ndarray:
        """The array ``name``, memory-mapped read-only (checked against the manifest's dtype and shape)."""
        path = self.path(name)
        entry = self.files[name]
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise DataFormatError(path, None, f"not a valid .npy array ({exc})") from None
        if arr.dtype.str != entry.get("dtype") or list(arr.shape) != entry.get("shape") or not arr.flags.c_contiguous:
            raise DataFormatError(
                path, None,
                f"holds {arr.dtype.str} {list(arr.shape)}, {MANIFEST} says {entry.get('dtype')} {entry.get('shape')}",
            )
        return arr.view(np.ndarray)
