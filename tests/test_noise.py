"""Keyed noise: known answers, backend agreement, statistics, exact sampling, shortcut."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from twice_envs import noise as N  # noqa: E402
from twice_envs.keys import NoiseKey  # noqa: E402
from twice_envs.noise import keystate as K  # noqa: E402  (monkeypatch where a name is read)
from twice_envs.noise import philox as P
from twice_envs.noise import sampling as S

KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]

# p = 1e-5 upper tail of a standard normal: thresholds below reject a correct
# generator with probability ~1e-5 (and the seeds are fixed, so the runs are repeatable).
Z_CRIT = 4.265


def chi2_critical(df: int, z: float = Z_CRIT) -> float:
    """Upper critical value of chi-square(df) (Wilson-Hilferty)."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def chi2_stat(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Pearson statistic of ``counts`` against ``probs``; cells expecting < 5 are pooled.

    A count in a zero-probability cell makes the statistic infinite.
    """
    counts = np.asarray(counts, dtype=np.float64)
    n = counts.sum()
    if np.any(counts[probs == 0] > 0):
        return math.inf, 1
    exp = probs * n
    big = exp >= 5
    obs_cells = list(counts[big])
    exp_cells = list(exp[big])
    if (~big & (probs > 0)).any():
        obs_cells.append(counts[~big].sum())
        exp_cells.append(exp[~big].sum())
    obs_a, exp_a = np.array(obs_cells), np.array(exp_cells)
    return float(((obs_a - exp_a) ** 2 / exp_a).sum()), len(obs_a) - 1


def fits(counts: np.ndarray, probs: np.ndarray) -> bool:
    stat, df = chi2_stat(counts, probs)
    return stat < chi2_critical(max(df, 1))


@pytest.fixture(autouse=True)
def _one_thread():
    # The suite shares a small machine: intra-op threads only add contention here.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def random_rows(rng: np.random.Generator, B: int) -> np.ndarray:
    rows = rng.integers(0, 2**32, size=(B, 6), dtype=np.int64)
    # edge cases: seeds >= 2**63, counters at and near 2**32 - 1, zeros
    rows[0] = [0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF]
    if B > 1:
        rows[1] = [0, 0, 0, 0, 0, 0]
    if B > 2:
        rows[2] = [12345, 0x80000000, 0xFFFFFFFE, 0, 0xFFFFFFFF, 0xFFFFFFFD]
    return rows


# --------------------------------------------------------------------------- generator


@pytest.mark.parametrize("counter,key,expected", KAT)
def test_known_answers(counter, key, expected):
    got = N.philox4x32_10(np.array(counter, dtype=np.uint32), np.array(key, dtype=np.uint32))
    assert tuple(int(x) for x in got) == expected
    got_t = N.philox4x32_10_torch(torch.tensor(counter), torch.tensor(key))
    assert tuple(got_t.tolist()) == expected
    assert N._philox_int(*counter, *key) == expected


def test_known_answers_vectorised_batch():
    counters = np.array([c for c, _, _ in KAT], dtype=np.uint32)
    keys = np.array([k for _, k, _ in KAT], dtype=np.uint32)
    expected = np.array([e for _, _, e in KAT], dtype=np.uint32)
    np.testing.assert_array_equal(N.philox4x32_10(counters, keys), expected)
    got = N.philox4x32_10_torch(torch.from_numpy(counters.astype(np.int64)), torch.from_numpy(keys.astype(np.int64)))
    np.testing.assert_array_equal(got.numpy(), expected)


def test_philox_torch_matches_numpy_on_random_words():
    rng = np.random.default_rng(11)
    c = rng.integers(0, 2**32, size=(5000, 4), dtype=np.int64)
    k = rng.integers(0, 2**32, size=(5000, 2), dtype=np.int64)
    c[:50] = 0xFFFFFFFF - rng.integers(0, 3, size=(50, 4))  # products near 2**64 (int64 wrap)
    ref = N.philox4x32_10(c, k)
    got = N.philox4x32_10_torch(torch.from_numpy(c), torch.from_numpy(k)).numpy()
    np.testing.assert_array_equal(got, ref)


def test_key_rows_and_token_key():
    key = NoiseKey(episode_seed=(1 << 64) - 2, turn=7, branch=3, line=2, pos=0xFFFFFFFF)
    rows = N.key_rows([key, NoiseKey(5, 0)])
    assert rows.dtype == np.int64 and rows.shape == (2, 6)
    assert rows[0].tolist() == [0xFFFFFFFE, 0xFFFFFFFF, 7, 3, 2, 0xFFFFFFFF]
    assert rows[1].tolist() == [5, 0, 0, 0, 0, 0]
    direct = N.philox4x32_10(np.array([7, 3, 2, 0xFFFFFFFF], np.uint32), np.array([0xFFFFFFFE, 0xFFFFFFFF], np.uint32))
    assert N.token_key(key) == (int(direct[0]), int(direct[1]))
    assert N.token_keys_np(rows).dtype == np.uint32
    np.testing.assert_array_equal(N.key_tensor([key, NoiseKey(5, 0)]).numpy(), rows)
    with pytest.raises(ValueError):
        N.key_rows([NoiseKey(1 << 64, 0)])
    with pytest.raises(ValueError):
        N.key_rows([NoiseKey(1, 1 << 32)])
    with pytest.raises(ValueError):
        N.token_keys_np(np.array([[0, 0, 0, 0, 0, -1]]))
    with pytest.raises(ValueError):
        N.gumbel_torch(torch.zeros(2, 5, dtype=torch.int64), 10)


@pytest.mark.parametrize("B", [1, 3, 8, 9, 40])
def test_token_keys_torch_paths_match_numpy(B):
    rows = random_rows(np.random.default_rng(B), B)
    ref = N.token_keys_np(rows).astype(np.int64)
    t = torch.from_numpy(rows)
    np.testing.assert_array_equal(N.token_keys_torch(t).numpy(), ref)  # python-int or numpy path
    np.testing.assert_array_equal(N._token_keys_device(t).numpy(), ref)  # the tensor path (CUDA)


@pytest.mark.parametrize("B,V", [(1, 1), (1, 7), (3, 4), (5, 1001), (9, 4099), (40, 257)])
def test_words_torch_bit_identical_to_numpy(B, V, monkeypatch):
    monkeypatch.setattr(P, "_CHUNK_CALLS", 64)  # many chunks, ragged last chunk
    rows = random_rows(np.random.default_rng(100 + V), B)
    ref = N.philox_words_np(rows, V)
    got = N.philox_words_torch(torch.from_numpy(rows), V)
    assert got.dtype == torch.int64 and got.shape == (B, V)
    np.testing.assert_array_equal(got.numpy(), ref)
    # the full-size path too, and the layout: id v is word v % 4 of counter v // 4
    monkeypatch.setattr(P, "_CHUNK_CALLS", 1 << 14)
    np.testing.assert_array_equal(N.philox_words_torch(torch.from_numpy(rows), V).numpy(), ref)
    tk = N.token_keys_np(rows)
    v = V - 1
    block = N.philox4x32_10(np.array([v // 4, 0, 0, 0], np.uint32), tk[-1])
    assert ref[-1, v] == block[v % 4]


def test_candidate_words_and_gumbel_match_numpy():
    rng = np.random.default_rng(5)
    B, V = 6, 151936
    rows = random_rows(rng, B)
    ids = rng.integers(0, V, size=(B, 33))
    ids[:, 0] = V - 1
    ids[:, 1] = 0
    t = torch.from_numpy(rows)
    ref_w = N.philox_words_np(rows, V, ids)
    np.testing.assert_array_equal(N.philox_words_torch(t, V, token_ids=torch.from_numpy(ids)).numpy(), ref_w)
    full = N.philox_words_np(rows, V)
    np.testing.assert_array_equal(np.take_along_axis(full, ids, axis=1), ref_w)
    g_ref = N.gumbel_np(rows, V, ids)
    g64 = N.gumbel_torch(t, V, dtype=torch.float64, token_ids=torch.from_numpy(ids)).numpy()
    np.testing.assert_allclose(g64, g_ref, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(N.uniforms_torch(t, V, token_ids=torch.from_numpy(ids)).numpy(), N.uniforms_np(rows, V, ids), rtol=0, atol=0)


@pytest.mark.parametrize("few", [0, 10_000])
def test_single_id_words_both_paths(few, monkeypatch):
    monkeypatch.setattr(P, "_FEW_IDS", few)  # tensor path / Python-int path
    rng = np.random.default_rng(12)
    rows = random_rows(rng, 3)
    V = 2**20 + 3
    ids = rng.integers(0, V, size=(3, 7))
    ids[0, 0], ids[1, 1] = V - 1, 0
    got = N.philox_words_torch(torch.from_numpy(rows), V, token_ids=torch.from_numpy(ids))
    np.testing.assert_array_equal(got.numpy(), N.philox_words_np(rows, V, ids))
    x = torch.from_numpy((rng.standard_normal((3, 500)) * 30).astype(np.float32))
    assert torch.equal(N.keyed_sample(x, torch.from_numpy(rows)), N.keyed_sample(x, torch.from_numpy(rows), shortcut=False))


def test_gumbel_block_matches_numpy():
    rows = random_rows(np.random.default_rng(6), 4)
    V = 4098
    g_ref = N.gumbel_np(rows, V)
    t = torch.from_numpy(rows)
    g64 = N.gumbel_torch(t, V, dtype=torch.float64)
    assert g64.shape == (4, V) and g64.is_contiguous()
    np.testing.assert_allclose(g64.numpy(), g_ref, rtol=1e-13, atol=1e-13)
    g32 = N.gumbel_torch(t, V)
    assert g32.dtype == torch.float32
    np.testing.assert_allclose(g32.numpy(), g_ref.astype(np.float32), rtol=1e-6, atol=1e-6)
    u = N.uniforms_np(rows, V)
    assert u.min() > 0 and u.max() < 1
    np.testing.assert_array_equal(u, (N.philox_words_np(rows, V).astype(np.float64) + 0.5) / 2**32)


def test_noise_bounds_are_the_extreme_words():
    # g is increasing in w, so the bounds the shortcut relies on are g(0) and g(2**32 - 1)
    w = torch.tensor([0, 1, 2**31, 2**32 - 2, 2**32 - 1], dtype=torch.int64)
    g = N._words_to_gumbel(w, torch.empty(5, dtype=torch.float64))
    assert g[0].item() == pytest.approx(N.G_MIN, abs=1e-12)
    assert g[-1].item() == pytest.approx(N.G_MAX, abs=1e-9)
    assert torch.all(g[1:] > g[:-1])
    assert N.G_MIN == pytest.approx(-3.1300, abs=1e-3) and N.G_MAX == pytest.approx(22.8739, abs=1e-3)
    block = N.gumbel_torch(torch.from_numpy(random_rows(np.random.default_rng(3), 16)), 20000, dtype=torch.float64)
    assert block.min().item() >= N.G_MIN and block.max().item() <= N.G_MAX


# --------------------------------------------------------------------------- statistics


def _words(B: int, V: int, seed: int) -> np.ndarray:
    rows = np.random.default_rng(seed).integers(0, 2**32, size=(B, 6), dtype=np.int64)
    return N.philox_words_torch(torch.from_numpy(rows), V).numpy()


def test_words_are_uniform_chi_square():
    w = _words(64, 4096, seed=21).ravel()  # 262144 words
    for bits in (w >> 24, w & 0xFF, (w >> 12) & 0xFF):
        counts = np.bincount(bits, minlength=256)
        assert fits(counts, np.full(256, 1 / 256))
    # the same test has power: a generator that loses the top bit is rejected
    assert not fits(np.bincount((w & 0x7FFFFFFF) >> 24, minlength=256), np.full(256, 1 / 256))
    # uniforms on 100 equal bins, and the Gumbel mean / variance (Euler gamma, pi^2/6)
    u = (w.astype(np.float64) + 0.5) / 2**32
    assert fits(np.bincount((u * 100).astype(int), minlength=100), np.full(100, 0.01))
    g = -np.log(-np.log(u))
    se_mean = math.sqrt(math.pi**2 / 6 / g.size)
    assert abs(g.mean() - 0.5772156649) < Z_CRIT * se_mean
    assert abs(g.var() - math.pi**2 / 6) < 0.02


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a.ravel().astype(np.float64), b.ravel().astype(np.float64))[0, 1])


def test_independence_correlations():
    rng = np.random.default_rng(31)
    B, V = 256, 1024
    rows = rng.integers(0, 2**32, size=(B, 6), dtype=np.int64)
    rows[:, 2:6] = rng.integers(0, 1000, size=(B, 4))
    u = N.uniforms_torch(torch.from_numpy(rows), V).numpy()
    n = B * (V - 1)
    limit = Z_CRIT / math.sqrt(n)
    # adjacent ids (same Philox call, and across calls), ids 4 apart (same lane)
    assert abs(_corr(u[:, :-1], u[:, 1:])) < limit
    assert abs(_corr(u[:, :-4], u[:, 4:])) < Z_CRIT / math.sqrt(B * (V - 4))

    def shifted(col: int) -> np.ndarray:
        r = rows.copy()
        r[:, col] += 1
        return N.uniforms_torch(torch.from_numpy(r), V).numpy()

    limit = Z_CRIT / math.sqrt(B * V)
    for col, what in ((5, "adjacent positions"), (3, "branches"), (4, "lines"), (2, "turns")):
        assert abs(_corr(u, shifted(col))) < limit, what
    # seed words: flipping the high seed word changes everything
    r = rows.copy()
    r[:, 1] ^= 1
    assert abs(_corr(u, N.uniforms_torch(torch.from_numpy(r), V).numpy())) < limit
    # power check: noise that ignored pos would be perfectly correlated
    assert _corr(u, u) > 0.99


# --------------------------------------------------------------------------- exact sampling

LOGITS = np.array([2.0, 1.5, 1.0, 0.3, 0.0, -0.5, -1.0, -2.0, -3.0, -4.0], dtype=np.float32)


def _many_keys(n: int, seed: int, reuse: int | None = None) -> torch.Tensor:
    keys = [NoiseKey(seed, turn=(i % reuse if reuse else i), branch=0, line=0, pos=3) for i in range(n)]
    return N.key_tensor(keys)


def _counts(tokens: torch.Tensor, V: int) -> np.ndarray:
    return np.bincount(tokens.numpy(), minlength=V)


@pytest.mark.parametrize("tau,top_p", [(1.0, 1.0), (0.7, 1.0), (1.6, 1.0), (0.7, 0.8)])
def test_keyed_argmax_reproduces_sampling_distribution(tau, top_p):
    n = 20000
    keys = _many_keys(n, seed=2**63 + 99)
    logits = torch.from_numpy(np.tile(LOGITS, (n, 1)))
    probs = np.exp(N.sampling_logprobs_np(LOGITS[None], tau, top_p)[0])
    tokens = N.keyed_sample(logits, keys, temperature=tau, top_p=top_p)
    assert fits(_counts(tokens, 10), probs)
    # the numpy reference samples the same tokens
    np.testing.assert_array_equal(N.keyed_sample_np(logits.numpy(), keys.numpy(), tau, top_p), tokens.numpy())
    # deliberately biased samplers are rejected by the same test:
    if tau != 1.0:  # dropping the temperature
        assert not fits(_counts(N.keyed_sample(logits, keys, temperature=1.0, top_p=top_p), 10), probs)
    if top_p < 1.0:  # ignoring the nucleus
        assert not fits(_counts(N.keyed_sample(logits, keys, temperature=tau), 10), probs)
    # reusing keys (only 40 distinct keys for 20000 draws)
    reused = N.keyed_sample(logits, _many_keys(n, seed=2**63 + 99, reuse=40), temperature=tau, top_p=top_p)
    assert not fits(_counts(reused, 10), probs)


def test_keyed_argmax_large_vocab_goodness_of_fit():
    rng = np.random.default_rng(41)
    V, n = 1000, 5000
    base = (rng.standard_normal(V) * 2.0).astype(np.float32)
    keys = _many_keys(n, seed=77)
    tokens = N.keyed_sample(torch.from_numpy(np.tile(base, (n, 1))), keys, temperature=0.5, top_p=0.9)
    probs = np.exp(N.sampling_logprobs_np(base[None], 0.5, 0.9)[0])
    assert fits(_counts(tokens, V), probs)


def test_nucleus_definition():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.3, 0.5]], dtype=torch.float64))
    assert N.nucleus_mask(logits, 1.0, 0.5).tolist() == [[True, False, False], [False, False, True]]
    assert N.nucleus_mask(logits, 1.0, 0.79).tolist() == [[True, True, False], [False, True, True]]
    assert N.nucleus_mask(logits, 1.0, 0.81).all()
    # ties: equal probabilities enter by lower token id first
    tied = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    assert N.nucleus_mask(tied, 1.0, 0.25).tolist() == [[False, True, False, False]]
    assert N.nucleus_mask(tied, 1.0, 0.5).tolist() == [[False, True, True, False]]
    rng = np.random.default_rng(9)
    x = rng.standard_normal((20, 50)) * 3
    for tau, p in ((1.0, 0.9), (0.5, 0.3), (2.0, 0.99), (0.0, 0.5)):
        np.testing.assert_array_equal(N.nucleus_mask(torch.from_numpy(x), tau, p).numpy(), N.nucleus_mask_np(x, tau, p))


def test_sampling_logprobs():
    rng = np.random.default_rng(8)
    x = torch.from_numpy(rng.standard_normal((4, 30)).astype(np.float32)).requires_grad_(True)
    lp = N.sampling_logprobs(x, 0.8, 0.7)
    assert lp.dtype == torch.float32
    np.testing.assert_allclose(lp.detach().numpy(), N.sampling_logprobs_np(x.detach().numpy(), 0.8, 0.7), rtol=1e-6, atol=1e-6)
    mask = N.nucleus_mask(x, 0.8, 0.7)
    assert torch.isinf(lp[~mask]).all() and torch.isfinite(lp[mask]).all()
    assert torch.allclose(lp.exp().sum(-1), torch.ones(4))
    lp[mask].sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    greedy = N.sampling_logprobs(x.detach(), 0.0, 1.0)
    assert (greedy.argmax(-1) == x.argmax(-1)).all() and torch.isinf(greedy).sum() == 4 * 29


def test_greedy_and_bad_arguments():
    x = torch.tensor([[0.0, 3.0, 3.0, 1.0], [5.0, 0.0, 0.0, 0.0]])
    keys = N.key_tensor([NoiseKey(1, 0), NoiseKey(2, 0)])
    assert N.keyed_sample(x, keys, temperature=0.0).tolist() == [1, 0]
    assert N.keyed_sample(x, keys, greedy=True).tolist() == [1, 0]
    for kwargs in ({"temperature": -1.0}, {"top_p": 0.0}, {"top_p": 1.5}, {"temperature": math.nan}):
        with pytest.raises(ValueError):
            N.keyed_sample(x, keys, **kwargs)
    with pytest.raises(ValueError):
        N.keyed_sample(x, keys[:1])


# --------------------------------------------------------------------------- the exact shortcut


def test_shortcut_equals_full_computation_random():
    rng = np.random.default_rng(51)
    for trial in range(40):
        B = int(rng.integers(1, 9))
        V = int(rng.integers(2, 5000))
        scale = float(rng.choice([0.3, 3.0, 10.0, 40.0]))
        x = (rng.standard_normal((B, V)) * scale).astype(np.float32)
        rows = random_rows(rng, B)
        tau = float(rng.choice([0.25, 1.0, 1.7]))
        top_p = float(rng.choice([1.0, 0.95, 0.6]))
        xt, kt = torch.from_numpy(x), torch.from_numpy(rows)
        short = N.keyed_sample(xt, kt, temperature=tau, top_p=top_p)
        full = N.keyed_sample(xt, kt, temperature=tau, top_p=top_p, shortcut=False)
        np.testing.assert_array_equal(short.numpy(), full.numpy())
        np.testing.assert_array_equal(full.numpy(), N.keyed_sample_np(x, rows, tau, top_p))


def test_shortcut_on_adversarial_logits_near_the_bound():
    """Logits built from the noise itself so that the winner is decided by a hair."""
    rng = np.random.default_rng(61)
    B, V = 64, 20000
    rows = random_rows(rng, B)
    g = N.gumbel_np(rows, V)
    x = np.full((B, V), -1e4)
    # the leader gets the row's smallest noise, the challenger the largest: the
    # challenger wins from as far below (11 to 15 here) as these keys allow
    lead = g.argmin(axis=1)
    other = g.argmax(axis=1)
    r = np.arange(B)
    assert (g[r, other] - g[r, lead]).min() > 10.5
    x[r, lead] = 0.0
    # other - lead perturbed gap is +-1e-9: other wins iff the sign is +
    sign = np.where(np.arange(B) % 2 == 0, 1.0, -1.0)
    x[r, other] = (g[r, lead] - g[r, other]) + sign * 1e-9
    # a crowd at exactly the skip boundary and just outside it
    x[:, :16] = -N.SKIP_GAP
    x[:, 16:32] = -N.SKIP_GAP - 1e-9
    x[r, lead] = 0.0
    x[r, other] = (g[r, lead] - g[r, other]) + sign * 1e-9
    xt, kt = torch.from_numpy(x), torch.from_numpy(rows)
    expected = np.where(sign > 0, other, lead)
    for short in (True, False):
        np.testing.assert_array_equal(N.keyed_sample(xt, kt, shortcut=short).numpy(), expected)
    np.testing.assert_array_equal(N.keyed_sample_np(x, rows), expected)
    # the extreme bound itself: a token G_RANGE below the leader wins only with the
    # largest noise against the smallest, so the full block never picks a skipped token
    y = np.zeros((B, V))
    y[:, 1:] = -N.G_RANGE
    y[:, 0] = 0.0
    yt = torch.from_numpy(y)
    np.testing.assert_array_equal(N.keyed_sample(yt, kt, shortcut=False).numpy(), np.zeros(B))
    np.testing.assert_array_equal(N.keyed_sample(yt, kt).numpy(), np.zeros(B))


@pytest.mark.parametrize("dtype,tau,top_p", [(torch.float32, 0.7, 1.0), (torch.float64, 1.3, 1.0), (torch.float32, 0.9, 0.999)])
def test_shortcut_candidates_cover_the_noise_bound(dtype, tau, top_p, monkeypatch):
    """Every token within G_RANGE of the row maximum gets noise; far tokens get none."""
    seen = {}
    real = N._argmax_candidates

    def spy(s, rows, cols, key_rows, B, V):
        seen["rows"], seen["cols"] = rows.clone(), cols.clone()
        return real(s, rows, cols, key_rows, B, V)

    monkeypatch.setattr(S, "_argmax_candidates", spy)
    rng = np.random.default_rng(63)
    B, V = 3, 4000
    x = torch.full((B, V), -1e3, dtype=dtype)
    x[:, 7] = 100.0
    # scaled gaps to the maximum: exactly G_RANGE, just inside/outside SKIP_GAP, far
    gaps = torch.tensor([0.0, N.G_RANGE, N.G_RANGE - 1e-4, N.SKIP_GAP - 1e-4, N.SKIP_GAP + 1e-3, 40.0], dtype=torch.float64)
    ids = torch.tensor([7, 100, 101, 102, 103, 104])
    x[:, ids] = (100.0 - gaps * tau).to(dtype)
    kt = torch.from_numpy(random_rows(rng, B))
    out = N.keyed_sample(x, kt, temperature=tau, top_p=top_p)
    assert "rows" in seen, "the candidate path was not taken"
    for b in range(B):
        cols = set(seen["cols"][seen["rows"] == b].tolist())
        s = x[b].double() / tau
        inside = N.nucleus_mask(x[b : b + 1], tau, top_p)[0]  # top_p < 1 drops the far tokens
        must = set(torch.nonzero((s >= s.max() - N.G_RANGE) & inside).flatten().tolist())
        assert 7 in must and (top_p < 1 or 101 in must)
        assert must <= cols
        assert {103, 104}.isdisjoint(cols) and len(cols) <= 5
    assert torch.equal(out, N.keyed_sample(x, kt, temperature=tau, top_p=top_p, shortcut=False))


def test_shortcut_skips_noise_for_spread_logits(monkeypatch):
    def no_full_block(*args, **kwargs):
        raise AssertionError("the shortcut should not compute the full noise block")

    rng = np.random.default_rng(71)
    B, V = 4, 50000
    x = torch.from_numpy((rng.standard_normal((B, V)) * 20).astype(np.float32))
    kt = torch.from_numpy(random_rows(rng, B))
    full = N.keyed_sample(x, kt, shortcut=False)
    monkeypatch.setattr(S, "_argmax_full", no_full_block)
    assert torch.equal(N.keyed_sample(x, kt), full)


# --------------------------------------------------------------------------- line / pos


def test_line_pos_rule():
    texts = ["ab", "c\n", "d", "\n", "\n\n", "e", "f"]
    line, pos, seen = 0, 0, []
    for t in texts:
        seen.append((line, pos))
        line, pos = N.advance_line_pos(line, pos, "\n" in t)
    assert seen == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (3, 0), (3, 1)]
    assert (line, pos) == (3, 2)
    assert N.newline_token_mask(texts).tolist() == [False, True, False, True, True, False, False]


# --------------------------------------------------------------------------- package layout


def test_package_exports_every_public_name_of_its_modules():
    for module in (P, S, K):
        for name in module.__all__:
            assert getattr(N, name) is getattr(module, name), name
    assert set(N.__all__) <= set(P.__all__) | set(S.__all__) | set(K.__all__)
    for name in N.__all__:
        assert hasattr(N, name), name


def test_modules_import_one_way():
    """philox imports neither of the others; sampling and keystate import philox only."""
    folder = Path(N.__file__).parent
    graph = {}
    for path in folder.glob("*.py"):
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("twice_envs.noise"):
                found.add((node.module or "").rpartition(".")[2])
            elif isinstance(node, ast.Import):
                found |= {a.name.rpartition(".")[2] for a in node.names if a.name.startswith("twice_envs.noise.")}
        graph[path.stem] = found
    assert graph["philox"] == set()
    assert graph["sampling"] <= {"philox"} and graph["keystate"] <= {"philox"}
    assert graph["__init__"] == {"philox", "sampling", "keystate"}


# --------------------------------------------------------------------------- CUDA


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_bit_identical():
    rng = np.random.default_rng(91)
    rows = random_rows(rng, 37)
    V = 50001
    t = torch.from_numpy(rows).cuda()
    np.testing.assert_array_equal(N.philox_words_torch(t, V).cpu().numpy(), N.philox_words_np(rows, V))
    ids = rng.integers(0, V, size=(37, 20))
    got = N.philox_words_torch(t, V, token_ids=torch.from_numpy(ids).cuda()).cpu().numpy()
    np.testing.assert_array_equal(got, N.philox_words_np(rows, V, ids))
    c = rng.integers(0, 2**32, size=(1000, 4), dtype=np.int64)
    k = rng.integers(0, 2**32, size=(1000, 2), dtype=np.int64)
    got = N.philox4x32_10_torch(torch.from_numpy(c).cuda(), torch.from_numpy(k).cuda()).cpu().numpy()
    np.testing.assert_array_equal(got, N.philox4x32_10(c, k))
    np.testing.assert_allclose(N.gumbel_torch(t, V, dtype=torch.float64).cpu().numpy(), N.gumbel_np(rows, V), rtol=1e-13, atol=1e-13)
    x = torch.from_numpy((rng.standard_normal((37, V)) * 5).astype(np.float32))
    cpu = N.keyed_sample(x, torch.from_numpy(rows), temperature=0.8, top_p=0.9)
    gpu = N.keyed_sample(x.cuda(), t, temperature=0.8, top_p=0.9).cpu()
    assert torch.equal(cpu, gpu)
