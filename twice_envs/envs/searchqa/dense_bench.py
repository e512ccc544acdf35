"""``twice bench dense``: the dense index kinds side by side (flat, IVF-Flat, HNSW, IVF-PQ).

Per kind: build time, index file bytes, resident memory of a process that opened the
index the way the retriever does (memory-mapped) and ran the queries, recall@k
against the exact flat search, and index queries/s one query per call and in one
batch, with ratios against flat measured in the same run. Every build and every
search runs in its own child process, so each RSS figure is that kind's alone.
Queries/s count the index search only (vectors in, ids out); encoding a query with
the sentence encoder is timed once separately.

Two sources of vectors:

* ``--vectors real``: a generated corpus of ``--passages`` passages embedded with the
  default MiniLM encoder (cached like the retriever's own), queried with the generated
  questions. Encoding ran at about 50 passages/s on one thread of a shared 2-core
  machine (20,000 passages: 21 minutes, once), so this suits tens of thousands.
* ``--vectors synthetic``: ``--passages`` unit vectors in 384 dimensions drawn from a
  mixture of Gaussian clusters (:func:`synthetic_chunks`), queried with fresh draws
  from the same mixture. Fast to make at millions of rows, but recall on synthetic
  vectors is not recall on real text: ``--vectors both`` runs the two at the same size
  so they can be compared.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, Optional, Sequence

import numpy as np

from twice_envs import progress

DIM = 384

# ----------------------------------------------------------------------------- synthetic vectors
#: Rows drawn per generator chunk (row i depends only on the seed and i).
_SYN_CHUNK = 16_384


def synthetic_mixture(dim: int = DIM, clusters: int = 256, rank: int = 16, seed: int = 0) -> dict:
    """The mixture: a shared unit direction, unit centres, and a random ``rank``-dimensional spread per cluster."""
    rng = np.random.Generator(np.random.PCG64([seed, 0x5EED]))
    shared = rng.standard_normal(dim).astype(np.float32)
    shared /= np.linalg.norm(shared)
    centres = rng.standard_normal((clusters, dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    bases = (rng.standard_normal((clusters, dim, rank)) / np.sqrt(dim)).astype(np.float32)
    return {"shared": shared, "centres": centres, "bases": bases, "seed": seed}


def synthetic_chunks(n: int, mixture: dict, *, shared: float = 2.2, spread: float = 1.0, noise: float = 2.0,
                     stream: int = 0) -> Iterator[np.ndarray]:
    """``n`` unit vectors from the mixture, in chunks of up to 16,384.

    Row = normalise(``shared * u + c + spread * B z + noise * g / sqrt(dim)``): ``u`` the
    mixture's shared direction, ``c`` and ``B`` a uniformly drawn cluster's centre and
    basis, ``z`` and ``g`` standard normal. The within-cluster spread is low-rank plus
    isotropic noise, and the shared direction gives the positive mean similarity of
    sentence embeddings. With about 1,000 rows per cluster the defaults give a query
    profile close to MiniLM's on the generated corpus at 20,000 passages (mean inner
    product with the 1st / 10th / 100th nearest passage and a random one: 0.67 / 0.58
    / 0.44 / 0.20 synthetic, 0.68 / 0.52 / 0.45 / 0.19 real). ``stream`` separates draws
    from the same mixture (0: the database, 1: the queries); row i depends only on the
    seed, the stream and i.
    """
    centres, bases = mixture["centres"], mixture["bases"]
    clusters, dim, rank = bases.shape
    for ci, a in enumerate(range(0, n, _SYN_CHUNK)):
        m = min(_SYN_CHUNK, n - a)
        rng = np.random.Generator(np.random.PCG64([mixture["seed"], stream, ci]))
        which = rng.integers(0, clusters, m)
        z = rng.standard_normal((m, rank)).astype(np.float32)
        g = rng.standard_normal((m, dim)).astype(np.float32)
        x = shared * mixture["shared"] + centres[which] + spread * np.einsum("mdr,mr->md", bases[which], z)
        x += noise * g / np.sqrt(dim)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        yield x.astype(np.float32)


def _clusters(n: int) -> int:
    """Mixture components for ``n`` vectors: about one per 1,000 rows, 16 to 4,096."""
    return int(min(4096, max(16, n // 1000)))


# ----------------------------------------------------------------------------- child processes
_CHILD = r"""
import json, os, sys, time
args = json.loads(sys.argv[1])
import numpy as np
import faiss
faiss.omp_set_num_threads(args["threads"])
from twice_envs.envs.searchqa import dense_files as F
from twice_envs.envs.searchqa import dense_index as R

def rss():
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out

if args["job"] == "build":
    vectors = F.open_vectors(args["vectors"])
    t = time.perf_counter()
    with R.BuildProgress("adding", len(vectors), unit="vectors") as progress:
        index = R.build_faiss_index(faiss, vectors, args["spec"], progress)
    build_s = time.perf_counter() - t
    os.makedirs(args["out"], exist_ok=True)
    F.write_index_dir(faiss, index, args["out"], args["spec"])
    # VmHWM: this process's own peak (ru_maxrss would include the parent's memory at fork)
    print(json.dumps({"build_s": build_s, "peak_rss": rss()["VmHWM"]}))
else:
    queries = np.load(args["queries"])
    if args["spec"]["kind"] == "flat":
        index = R.FlatVectors(faiss, F.open_vectors(args["vectors"]))
    else:
        index = F.open_index_dir(faiss, args["index"], args["spec"])
        R.configure_search(faiss, index, args["search"])
    opened = rss()
    k, extra = args["k"], min(index.ntotal, args["k"] + 8)
    index.search(queries[: min(len(queries), 100)], extra)  # warm the page cache
    single = queries[: args["single"]]
    t = time.perf_counter()
    for i in range(len(single)):
        index.search(single[i : i + 1], extra)
    single_s = time.perf_counter() - t
    t = time.perf_counter()
    scores, ids = index.search(queries, extra)
    batch_s = time.perf_counter() - t
    ranked = R.rank_rows(scores, ids, k)
    np.save(args["ids_out"], np.array([r[0] + [-1] * (k - len(r[0])) for r in ranked], dtype=np.int64))
    after = rss()
    print(json.dumps({"single_qps": len(single) / single_s, "batch_qps": len(queries) / batch_s,
                      "rss": after["VmRSS"], "rss_anon": after["RssAnon"], "rss_file": after["RssFile"],
                      "rss_opened": opened["VmRSS"]}))
"""


def _child(args: dict, threads: int) -> dict:
    """Run one build or search in a fresh process (a build's progress and messages go to this stderr)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads), **({} if progress.enabled() else {"TWICE_PROGRESS": "0"}))
    build = args["job"] == "build"
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps({**args, "threads": threads})], check=False,
                          stdout=subprocess.PIPE, stderr=None if build else subprocess.PIPE, text=True, env=env)
    if proc.returncode != 0:
        detail = "see the messages above" if build else proc.stderr[-3000:]
        raise RuntimeError(f"benchmark child ({args['job']} {args['spec']['kind']}) failed: {detail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- vectors
def _real_vectors(passages: int, n_queries: int, log) -> tuple[str, np.ndarray, dict]:
    """Embeddings of a generated corpus (through the retriever's cache) and of its questions."""
    from twice_envs._cache import cache_dir
    from twice_envs.envs.searchqa.corpus import open_corpus
    from twice_envs.envs.searchqa.corpus_gen import GENERATOR_VERSION, config_for_passages, write_generated
    from twice_envs.envs.searchqa.loaders import load_questions
    from twice_envs.envs.searchqa.retrievers import DenseParams, DenseRetriever

    cfg = config_for_passages(passages)
    paths = write_generated(cfg, cache_dir("searchqa", "generated") / f"g{GENERATOR_VERSION}-{cfg.digest()[:16]}")
    store = open_corpus(str(paths["corpus"]))
    params = DenseParams()
    log(f"  embedding {len(store):,} passages (cached after the first run) ...")
    t = time.perf_counter()
    retriever = DenseRetriever(store, params)
    embed_s = time.perf_counter() - t
    questions = [q.question for split in ("dev", "test", "train") for q in load_questions(str(paths[split]))]
    questions = questions[:n_queries]
    texts = [params.query_prefix + q for q in questions]
    enc = retriever.encoder
    enc.encode(texts[:1])
    t = time.perf_counter()
    for text in texts[:50]:
        enc.encode([text])
    encode_query_ms = 1000 * (time.perf_counter() - t) / min(50, len(texts))
    sample = [params.passage_prefix + store.contents(i) for i in range(min(512, len(store)))]
    t = time.perf_counter()
    enc.encode(sample, params.batch_size)
    passages_per_s = len(sample) / (time.perf_counter() - t)
    queries = enc.encode(texts, params.batch_size)
    info = {"passages": len(store), "queries": len(queries), "embed_s_this_run": embed_s,
            "encode_query_ms": encode_query_ms, "encode_passages_per_s": passages_per_s,
            "corpus_version": store.version}
    return str(retriever.vectors_dir), queries, info


def _synthetic_vectors(passages: int, n_queries: int, work: Path, seed: int, log) -> tuple[str, np.ndarray, dict]:
    from twice_envs.envs.searchqa.dense_files import write_vectors
    from twice_envs.envs.searchqa.dense_index import BuildProgress

    mixture = synthetic_mixture(seed=seed, clusters=_clusters(passages))
    directory = work / "synthetic.vectors"
    directory.mkdir(parents=True, exist_ok=True)
    log(f"  drawing {passages:,} synthetic vectors ...")
    t = time.perf_counter()
    with BuildProgress("drawn", passages, unit="vectors") as drawn:
        write_vectors(directory, synthetic_chunks(passages, mixture), passages, DIM, {"synthetic": True, "seed": seed},
                      progress=drawn)
    queries = np.concatenate(list(synthetic_chunks(n_queries, mixture, stream=1)))
    info = {"passages": passages, "queries": n_queries, "draw_s": time.perf_counter() - t,
            "clusters": int(mixture["centres"].shape[0])}
    return str(directory), queries, info


def similarity_profile(vectors: np.ndarray, queries: np.ndarray) -> dict:
    """Mean inner product of a query with its 1st, 3rd, 10th and 100th nearest vector, and with a random one."""
    import faiss

    q = np.ascontiguousarray(queries[:200], dtype=np.float32)
    scores, _ = faiss.knn(q, vectors, min(100, len(vectors)), faiss.METRIC_INNER_PRODUCT)
    rows = np.sort(np.random.default_rng(0).integers(0, len(vectors), len(q)))
    out = {f"top{r}": float(scores[:, min(r, scores.shape[1]) - 1].mean()) for r in (1, 3, 10, 100)}
    out["random"] = float(np.mean(np.sum(q * np.asarray(vectors[rows]), axis=1)))
    return out


# ----------------------------------------------------------------------------- runs
def _settings(args) -> list[tuple[str, object, dict]]:
    """(kind, DenseParams, search settings) rows for the requested kinds and sweeps."""
    from twice_envs.envs.searchqa.dense_index import DenseParams

    rows = []
    base = dict(nlist=args.nlist, hnsw_m=args.hnsw_m, ef_construction=args.ef_construction, pq_m=args.pq_m,
                nbits=args.nbits, seed=args.seed)
    for kind in [k.strip() for k in args.kinds.split(",") if k.strip()]:
        params = DenseParams(index_kind=kind, **{k: v for k, v in base.items() if v is not None})
        if kind in ("ivf", "ivfpq"):
            sweep = [{"nprobe": int(v)} for v in (args.nprobe or str(params.nprobe)).split(",")]
        elif kind == "hnsw":
            sweep = [{"ef_search": int(v)} for v in (args.ef_search or str(params.ef_search)).split(",")]
        else:
            sweep = [{}]
        rows += [(kind, params, search) for search in sweep]
    return rows


def run(args, source: str, log) -> dict:
    """Measure every requested kind on one source of vectors (``"real"`` or ``"synthetic"``)."""
    from twice_envs.envs.searchqa.dense_files import VECTORS_FILE, open_vectors
    from twice_envs.envs.searchqa.dense_index import index_spec

    work = Path(args.workdir or tempfile.mkdtemp(prefix="twice-dense-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        if source == "real":
            vectors_dir, queries, info = _real_vectors(args.passages, args.queries, log)
        else:
            vectors_dir, queries, info = _synthetic_vectors(args.passages, args.queries, work, args.seed, log)
        vectors = open_vectors(Path(vectors_dir))
        n, dim = vectors.shape
        info["similarity"] = similarity_profile(vectors, queries)
        del vectors
        qpath = work / f"{source}-queries.npy"
        np.save(qpath, np.ascontiguousarray(queries, dtype=np.float32))
        results, built = [], {}
        for kind, params, search in _settings(args):
            spec = index_spec(params, n, dim)
            row: dict = {"kind": kind, "spec": spec, "search": search}
            if kind == "flat":
                row.update(build_s=0.0, bytes=os.path.getsize(Path(vectors_dir) / VECTORS_FILE))
            else:
                key = json.dumps(spec, sort_keys=True)
                if key not in built:
                    out = work / f"{source}-{kind}-{len(built)}"
                    shutil.rmtree(out, ignore_errors=True)
                    log(f"  building {kind} {spec} ...")
                    job = {"job": "build", "spec": spec, "vectors": vectors_dir, "out": str(out)}
                    built[key] = (out, _child(job, args.threads))
                out, b = built[key]
                row.update(build_s=b["build_s"], build_peak_rss=b["peak_rss"],
                           bytes=os.path.getsize(out / "index.faiss"), index=str(out))
            log(f"  searching {kind} {search or ''} ...")
            ids_out = work / f"{source}-ids-{len(results)}.npy"
            job = {"job": "search", "spec": spec, "search": search, "vectors": vectors_dir, "index": row.get("index"),
                   "queries": str(qpath), "k": args.k, "single": args.single, "ids_out": str(ids_out)}
            row.update(_child(job, args.threads))
            row["ids"] = np.load(ids_out)
            results.append(row)
        flat = next(r for r in results if r["kind"] == "flat")
        vectors = open_vectors(Path(vectors_dir))
        flat_scores = _exact_scores(vectors, queries, flat["ids"])
        for r in results:
            hits = [len(set(a[a >= 0].tolist()) & set(b[b >= 0].tolist())) / args.k
                    for a, b in zip(r["ids"], flat["ids"])]
            loss = (flat_scores - _exact_scores(vectors, queries, r["ids"])).mean()
            r.update(recall=float(np.mean(hits)), score_loss=float(loss),
                     single_vs_flat=r["single_qps"] / flat["single_qps"],
                     batch_vs_flat=r["batch_qps"] / flat["batch_qps"], bytes_vs_flat=r["bytes"] / flat["bytes"])
        del vectors
        for r in results:
            del r["ids"]
            r.pop("index", None)
        return {"source": source, **info, "k": args.k, "threads": args.threads,
                "single_queries": min(args.single, len(queries)), "rows": results}
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


def _exact_scores(vectors: np.ndarray, queries: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Exact inner products of each query with its returned ids (a missing id scores -1)."""
    rows = np.asarray(vectors[np.clip(ids, 0, None).ravel()]).reshape(ids.shape + (vectors.shape[1],))
    scores = np.einsum("qkd,qd->qk", rows, queries.astype(np.float32))
    return np.where(ids >= 0, scores, -1.0)


def _label(r: dict) -> str:
    spec, search = r["spec"], r["search"]
    parts = {"flat": [], "ivf": [f"nlist={spec.get('nlist')}"],
             "hnsw": [f"M={spec.get('hnsw_m')}", f"efC={spec.get('ef_construction')}"],
             "ivfpq": [f"nlist={spec.get('nlist')}", f"m={spec.get('pq_m')}", f"nbits={spec.get('nbits')}"]}[r["kind"]]
    parts += [f"{'efS' if k == 'ef_search' else k}={v}" for k, v in search.items()]
    return r["kind"] + (f" ({', '.join(parts)})" if parts else "")


def table(report: dict) -> str:
    """One report as a Markdown table."""
    mb = 1 << 20
    lines = [(f"| kind | build s | index MB | RSS MB (anon) | recall@{report['k']} | score loss | q/s single "
              "| q/s batched | vs flat: single / batched / bytes |"),
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in report["rows"]:
        ratio = f"{r['single_vs_flat']:.1f}x / {r['batch_vs_flat']:.1f}x / {r['bytes_vs_flat']:.3f}"
        lines.append(f"| {_label(r)} | {r['build_s']:.1f} | {r['bytes'] / mb:.1f} "
                     f"| {r['rss'] / mb:.0f} ({r['rss_anon'] / mb:.0f}) | {r['recall']:.3f} | {r['score_loss']:.4f} "
                     f"| {r['single_qps']:,.0f} | {r['batch_qps']:,.0f} | {ratio} |")
    return "\n".join(lines)


def header(report: dict) -> str:
    sim = report["similarity"]
    text = (f"{report['source']} vectors: {report['passages']:,} x {DIM}, {report['queries']:,} queries "
            f"({report['single_queries']} also one per call), {report['threads']} thread(s)")
    if report["source"] == "real":
        text += (f"; MiniLM encodes {report['encode_passages_per_s']:.0f} passages/s and a query in "
                 f"{report['encode_query_ms']:.1f} ms (not in the q/s columns)")
    else:
        text += f"; {report['clusters']} clusters"
    text += ("\nmean inner product of a query with its 1st / 3rd / 10th / 100th nearest vector and with a random one: "
             f"{sim['top1']:.3f} / {sim['top3']:.3f} / {sim['top10']:.3f} / {sim['top100']:.3f} / {sim['random']:.3f}")
    return text


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="twice bench dense", description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--passages", type=int, default=20_000, help="corpus size (default 20,000)")
    ap.add_argument("--vectors", choices=("real", "synthetic", "both"), default="both",
                    help="MiniLM embeddings of a generated corpus, synthetic mixture vectors, or both (default)")
    ap.add_argument("--kinds", default="flat,ivf,hnsw,ivfpq",
                    help="comma-separated index kinds (flat, the reference, is always run)")
    ap.add_argument("--queries", type=int, default=1000, help="queries searched in one batch (default 1000)")
    ap.add_argument("--single", type=int, default=200,
                    help="how many of them are also searched one per call (default 200)")
    ap.add_argument("--k", type=int, default=3, help="recall@k against flat (default 3)")
    ap.add_argument("--threads", type=int, default=1,
                    help="faiss/BLAS threads in the build and search processes (default 1)")
    ap.add_argument("--seed", type=int, default=0, help="IVF/PQ training seed and synthetic draw seed")
    ap.add_argument("--nlist", type=int, help="IVF lists (default: DenseParams' automatic choice)")
    ap.add_argument("--nprobe", help="IVF lists probed; a comma list sweeps it without rebuilding")
    ap.add_argument("--hnsw-m", dest="hnsw_m", type=int, help="HNSW links per node")
    ap.add_argument("--ef-construction", dest="ef_construction", type=int, help="HNSW build beam")
    ap.add_argument("--ef-search", dest="ef_search", help="HNSW search beam; a comma list sweeps it without rebuilding")
    ap.add_argument("--pq-m", dest="pq_m", type=int, help="IVF-PQ sub-quantizers")
    ap.add_argument("--nbits", type=int, help="IVF-PQ bits per sub-code")
    ap.add_argument("--workdir", help="keep the built files here (default: a temporary folder, removed at the end)")
    ap.add_argument("--json", help="also write the full report to this JSON file")
    progress.add_argument(ap)
    args = ap.parse_args(argv)
    progress.apply(args)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    args.kinds = ",".join(["flat"] + [k for k in kinds if k != "flat"])

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    reports = []
    for source in (("real", "synthetic") if args.vectors == "both" else (args.vectors,)):
        log(f"{source} vectors, {args.passages:,} passages:")
        report = run(args, source, log)
        reports.append(report)
        print(header(report) + "\n\n" + table(report) + "\n", flush=True)
    k = args.k
    print(f"recall@{k}: share of flat's top {k} found in the kind's top {k} (ties broken by passage position); "
          f"score loss: mean exact inner product of flat's top {k} minus the kind's (small when the misses are "
          "near-ties); q/s: index search only; ratios against flat in the same run.")
    if args.json:
        Path(args.json).write_text(json.dumps(reports, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
