"""Section (a): Philox on the device is bit-identical to the numpy reference.

For about a million key rows that include the edge values of every key field: Philox words,
per-token keys, full-vocabulary and per-candidate noise words and uniforms bit for bit, Gumbel
noise in float64 within :data:`GUMBEL_TOL` (the share that is bitwise equal reported), and the
keyed argmax on the device against ``keyed_sample_np``. :class:`CorruptedReference` flips one bit
of every reference result, so that the section can be seen to fail.
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import torch

from twice_envs import noise
from twice_envs.agents.gpu_check.context import Context
from twice_envs.agents.gpu_check.report import Section, skip, worst

#: Largest difference between a float64 Gumbel value of two backends (each backend's ``log``).
GUMBEL_TOL = 1e-13


class NumpyReference:
    """The reference side of section a: the numpy functions of :mod:`twice_envs.noise`."""

    name = "numpy reference (twice_envs.noise: philox4x32_10, token_keys_np, philox_words_np, uniforms_np, gumbel_np)"

    def philox(self, counter, key):
        return noise.philox4x32_10(counter, key)

    def token_keys(self, rows):
        return noise.token_keys_np(rows)

    def words(self, rows, vocab, ids=None):
        return noise.philox_words_np(rows, vocab, ids)

    def uniforms(self, rows, vocab, ids=None):
        return noise.uniforms_np(rows, vocab, ids)

    def gumbel(self, rows, vocab, ids=None):
        return noise.gumbel_np(rows, vocab, ids)


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


def compare_arrays(name: str, got, ref, *, kind: str = "bits", tol: float = 0.0) -> dict:
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


def section_philox(ctx: Context, sec: dict, deadline: float) -> None:
    """(a): every Philox quantity on ``ctx.device`` against the numpy reference (``ctx.reference``)."""
    if not ctx.device:
        return skip(sec, "no CUDA")
    ref = ctx.reference or NumpyReference()
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
    device_words = noise.philox4x32_10_torch(t(counters.astype(np.int64)), t(keys.astype(np.int64)))
    add(compare_arrays(f"known-answer vectors on {ctx.dev_label}", device_words, want))
    add(compare_arrays("known-answer vectors of the reference", ref.philox(counters, keys), want))

    rows = edge_key_rows(z.keys, z.edge_values)
    rows_d = t(rows)
    sec["results"]["key_rows"] = len(rows)
    # raw Philox of every row: counter (turn, branch, line, pos), key (seed_lo, seed_hi)
    add(compare_arrays("Philox4x32-10 words of every key row",
                       noise.philox4x32_10_torch(rows_d[:, 2:6], rows_d[:, 0:2]),
                       ref.philox(rows[:, 2:6].astype(np.uint32), rows[:, 0:2].astype(np.uint32))))
    ref_keys = ref.token_keys(rows)
    add(compare_arrays("token keys (token_keys_torch)", noise.token_keys_torch(rows_d), ref_keys))
    add(compare_arrays("token keys (tensor kernel)", noise._token_keys_device(rows_d), ref_keys))

    # whole vocabulary blocks of rows spread over the set (edges first, then random)
    pick = np.unique(np.linspace(0, len(rows) - 1, z.full_rows).astype(np.int64))
    fr, fr_d = rows[pick], rows_d[t(pick)]
    for vocab in (z.vocab, z.vocab + 3):
        add(compare_arrays(f"noise words, {len(pick)} rows x vocab {vocab}", noise.philox_words_torch(fr_d, vocab),
                           ref.words(fr, vocab)))
    vocab = z.vocab
    add(compare_arrays(f"uniforms (float64), {len(pick)} x {vocab}", noise.uniforms_torch(fr_d, vocab),
                       ref.uniforms(fr, vocab)))
    g_ref = ref.gumbel(fr, vocab)
    add(compare_arrays(f"Gumbel float64, {len(pick)} x {vocab}", noise.gumbel_torch(fr_d, vocab, dtype=torch.float64),
                       g_ref, kind="tol", tol=GUMBEL_TOL))
    add(compare_arrays(f"Gumbel float32 (default dtype), {len(pick)} x {vocab}", noise.gumbel_torch(fr_d, vocab),
                       g_ref.astype(np.float32), kind="info"))

    # candidates: four ids per key row (ids 0-3, the last ids of the vocabulary, random ones)
    rng = np.random.default_rng(1)
    for vocab, label in ((z.vocab, str(z.vocab)), ((1 << 30) - 1, "2**30-1")):
        ids = np.stack([np.arange(len(rows)) % 4, vocab - 1 - (np.arange(len(rows)) % 4),
                        rng.integers(0, vocab, len(rows)), rng.integers(0, vocab, len(rows))], axis=1)
        ids_d = t(ids)
        add(compare_arrays(f"noise words at 4 ids per row, vocab {label}",
                           noise.philox_words_torch(rows_d, vocab, token_ids=ids_d), ref.words(rows, vocab, ids)))
        if vocab == z.vocab:
            add(compare_arrays("uniforms at 4 ids per row", noise.uniforms_torch(rows_d, vocab, token_ids=ids_d),
                               ref.uniforms(rows, vocab, ids)))
            add(compare_arrays("Gumbel float64 at 4 ids per row",
                               noise.gumbel_torch(rows_d, vocab, dtype=torch.float64, token_ids=ids_d),
                               ref.gumbel(rows, vocab, ids), kind="tol", tol=GUMBEL_TOL))
        if time.monotonic() > deadline:
            sec["lines"].append("time budget reached: the larger vocabulary's candidates were not checked")
            break

    if time.monotonic() < deadline:
        add(_keyed_argmax_check(ctx, rows, dev, deadline))
    else:
        sec["lines"].append("time budget reached: the keyed argmax was not checked")
    sec["status"] = worst(c["status"] for c in checks)


def _keyed_argmax_check(ctx: Context, rows: np.ndarray, dev, deadline: float) -> dict:
    """``keyed_sample`` (candidate shortcut and full block) and ``keyed_choice`` on the device vs
    ``keyed_sample_np`` for random logits of several spreads, temperatures and nucleus sizes."""
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


PHILOX = Section("a", "Philox on {dev} bit-identical to the numpy reference", section_philox,
                 gpu_budget_s=300, cpu_budget_s=60)
