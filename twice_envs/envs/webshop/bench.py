"""``twice bench webshop``: load, index, search, step, fork and memory costs, with same-run baselines.

For each catalogue size (generated products streamed to disk in the original file format,
``items_shuffle``-style products plus the ``items_ins_v2``-style attributes):

* generation: writing the two files (streamed; their size on disk);
* cold load: the first ``make`` on new data: stream the products file, normalise, write
  the record cache, build and save the BM25 index and the goal tables (all flat,
  memory-mapped files); baseline (sizes up to ``--baseline-max``): building
  ``rank_bm25.BM25Okapi`` (the original's in-Python BM25) on the same analysed tokens;
  the building process's RSS after the load;
* cached reload: ``make`` again in this process (the disk cache, no parsing), and in a
  new process (what every worker pays), with that process's RSS after the load;

On the largest size:

* search latency p50/p95 over goal instructions as queries; baseline: ``rank_bm25``
  scoring plus a top-50 sort on the same tokens;
* click step (item page option clicks, sub pages, back); baseline: rendering the same page
  as HTML and reading its text nodes with the standard library's HTML parser (what the
  original does on every step);
* fork at turn 10 (``env.fork(10)``: a fresh env from the registry, snapshot restore,
  digest check) and the raw snapshot+restore; baseline: ``copy.deepcopy`` of the env
  (its read-only resources shared, as a fork shares them);
* memory of worker processes (``--workers K``): one fresh process, then K at once, each
  loading the catalogue from the cache and playing ``--episodes`` short episodes; RSS,
  and PSS and USS from ``/proc/PID/smaps_rollup`` (read while all K are alive), so the
  cost of each extra process shows (the catalogue's pages are shared, not copied);
* peak memory (process maximum RSS).

Targets: 100k cold load < 60 s, cached reload < 5 s, search p50/p95 < 20 ms, click step
< 1 ms, fork at turn 10 < 0.1 ms.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import resource
import subprocess
import sys
import tempfile
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from twice_envs import progress
from twice_envs._procmem import smaps_rollup


def _peak_mb() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 1024.0 if sys.platform != "darwin" else r / (1024.0 * 1024.0)


def _rss_mb() -> float:
    """This process's current RSS (MB); the peak where ``/proc`` is missing."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return _peak_mb()


def _smaps(pid: object = "self") -> Optional[dict]:
    """RSS, PSS and USS (private clean + dirty) of a process in MB, from ``/proc/PID/smaps_rollup``
    (None where it is not readable)."""
    m = smaps_rollup(pid)
    if m is None:
        return None
    return {"rss_mb": m["rss_bytes"] / 2**20, "pss_mb": m["pss_bytes"] / 2**20, "uss_mb": m["uss_bytes"] / 2**20}


def _worker_main() -> None:
    """A worker process (see :func:`_run_workers`): load, play, report, wait for the parent."""
    args = json.loads(sys.argv[1])
    t0 = time.perf_counter()
    import twice_envs
    import twice_envs.envs.webshop.env  # noqa: F401  (the imports count in every worker)

    out: dict = {"import_s": time.perf_counter() - t0}  # past the bench module's own imports
    if args["load"]:
        t0 = time.perf_counter()
        env = twice_envs.make("WebShop-v0", **args["kw"])
        out["load_s"] = time.perf_counter() - t0
        out["rss_after_load_mb"] = _rss_mb()
        t0 = time.perf_counter()
        for seed in range(args["episodes"]):
            env.reset(seed=seed)
            *_, info = env.step(f"search[{env.goal.instruction_text}]")
            item = next((a for a in info["admissible_actions"] if a.startswith("click[b")), None)
            if item is not None:
                env.step(item)
                env.step("click[buy now]")
        out["episodes_s"] = time.perf_counter() - t0
    out["rss_mb"] = _rss_mb()
    print(json.dumps(out), flush=True)
    sys.stdin.readline()  # stay alive (and mapped) until the parent has measured every worker


def _run_workers(k: int, kw: dict, episodes: int, load: bool = True) -> dict:
    """Start ``k`` worker processes at once; when all are loaded and have played, read their
    ``smaps_rollup`` together, then let them exit. Returns per-worker reports and sums."""
    code = "from twice_envs.envs.webshop.bench import _worker_main; _worker_main()"
    arg = json.dumps({"kw": kw, "episodes": episodes, "load": load})
    procs = []
    with tempfile.TemporaryFile("w+") as err:
        try:
            t_start = time.perf_counter()
            for _ in range(k):
                procs.append(subprocess.Popen([sys.executable, "-c", code, arg], stdin=subprocess.PIPE,
                                              stdout=subprocess.PIPE, stderr=err, text=True))
            reports = []
            for p in procs:
                line = p.stdout.readline()  # type: ignore[union-attr]
                if not line:
                    p.wait()
                    err.seek(0)
                    raise RuntimeError(f"a bench worker failed (exit {p.returncode}):\n{err.read()[-4000:]}")
                reports.append(json.loads(line))
                reports[-1]["ready_s"] = time.perf_counter() - t_start  # from start to loaded (and played)
            for p, r in zip(procs, reports):  # every worker is alive and loaded now
                r["smaps"] = _smaps(p.pid)
        finally:
            for p in procs:
                try:
                    p.stdin.close()  # type: ignore[union-attr]
                except OSError:
                    pass
            for p in procs:
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
    out: dict = {"workers": k, "reports": reports, "rss_sum_mb": sum(r["rss_mb"] for r in reports)}
    if all(r["smaps"] for r in reports):
        out["pss_sum_mb"] = sum(r["smaps"]["pss_mb"] for r in reports)
        out["uss_mean_mb"] = sum(r["smaps"]["uss_mb"] for r in reports) / k
        out["rss_sum_mb"] = sum(r["smaps"]["rss_mb"] for r in reports)
    if load:
        out["load_p50_s"] = float(np.median([r["load_s"] for r in reports]))
    return out


def _maps_path(path: Path) -> bool:
    """Whether this process still maps a file under ``path``."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            return any(str(path) in line for line in fh)
    except OSError:
        return False


def _folder_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file()) / 1e6


class _TextNodes(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.out: list[str] = []

    def handle_data(self, data: str) -> None:
        if data.strip():
            self.out.append(data.strip())


def _html_baseline(obs: str) -> str:
    """Render ``obs``'s segments into an HTML page and read its text back, as the original does."""
    import html as html_mod

    body = "".join(f'<div class="row"><h4 class="x">{html_mod.escape(s)}</h4></div>\n' for s in obs.split(" [SEP] "))
    page = f"<!DOCTYPE html><html><head><title>t</title></head><body>\n{body}</body></html>"
    p = _TextNodes()
    p.feed(page)
    return " [SEP] ".join(p.out)


def _pct(xs: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))


def _fmt_ms(s: float) -> str:
    return f"{s * 1e3:.3f} ms"


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="twice bench webshop", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--products", type=int, nargs="+", default=None, help="catalogue sizes (default: 1000 100000)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 1000 products, few repetitions")
    ap.add_argument("--queries", type=int, default=200, help="search queries timed on the largest size")
    ap.add_argument("--baseline-queries", type=int, default=10, help="queries timed with rank_bm25")
    ap.add_argument("--baseline-max", type=int, default=200_000,
                    help="build the rank_bm25 baseline only up to this many products (it holds every document "
                         "in Python)")
    ap.add_argument("--workers", type=int, default=None,
                    help="worker processes loading the largest catalogue at once, for memory (default 8; --quick 2; "
                         "0: skip)")
    ap.add_argument("--episodes", type=int, default=None,
                    help="episodes each worker plays before it is measured (default 50)")
    ap.add_argument("--dir", type=str, default=None,
                    help="keep the generated files and caches in this folder (default: a temporary one, removed)")
    ap.add_argument("--json", type=str, default=None, help="also write the results to this JSON file")
    progress.add_argument(ap)
    args = ap.parse_args(list(argv) if argv is not None else None)
    progress.apply(args)
    sizes = args.products or ([1000] if args.quick else [1000, 100_000])
    n_queries = min(args.queries, 30) if args.quick else args.queries
    n_base = min(args.baseline_queries, 3) if args.quick else args.baseline_queries
    n_workers = args.workers if args.workers is not None else (2 if args.quick else 8)
    n_episodes = args.episodes if args.episodes is not None else (5 if args.quick else 50)

    import twice_envs
    from twice_envs._deps import require
    from twice_envs.envs.webshop import catalogue_gen
    from twice_envs.envs.webshop.resources import cache_folder, clear_process_cache
    from twice_envs.envs.webshop.search import Analyzer

    rank_bm25 = require("rank_bm25", "bench", "the WebShop benchmark baseline")
    if max(sizes) >= 100_000 and progress.enabled():  # long cache builds report their progress (on stderr)
        import logging

        build_log = logging.getLogger("twice_envs.webshop")
        if not build_log.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("    %(message)s"))
            build_log.addHandler(handler)
            build_log.setLevel(logging.INFO)
    results: dict = {"sizes": {}}
    print(f"twice bench webshop: sizes {sizes}; ratios are baseline time / our time (higher is better)", flush=True)
    with tempfile.TemporaryDirectory(prefix="twice-bench-webshop-") as tmp:
        tmp = Path(args.dir) if args.dir else Path(tmp)
        tmp.mkdir(parents=True, exist_ok=True)
        last = None
        for n in sizes:
            t0, c0 = time.perf_counter(), time.process_time()
            p_path, a_path = catalogue_gen.write(tmp / f"data{n}", n, seed=0)
            t_gen, c_gen = time.perf_counter() - t0, time.process_time() - c0
            files_mb = (p_path.stat().st_size + a_path.stat().st_size) / 1e6
            print(f"  {n:>8} products: generated in {t_gen:.1f} s (CPU {c_gen:.1f} s; {files_mb:.0f} MB: products + "
                  "attributes files)", flush=True)
            cache_root = str(tmp / f"cache{n}")
            kw = dict(products_path=str(p_path), attributes_path=str(a_path), cache_root=cache_root, split="all")
            clear_process_cache()
            t0, c0 = time.perf_counter(), time.process_time()
            env = twice_envs.make("WebShop-v0", **kw)
            t_cold, c_cold = time.perf_counter() - t0, time.process_time() - c0
            rss_cold = _rss_mb()
            clear_process_cache()
            t0 = time.perf_counter()
            env = twice_envs.make("WebShop-v0", **kw)
            t_reload = time.perf_counter() - t0
            cat, index = env.res.catalogue, env.res.index
            fresh = _run_workers(1, kw, 0)["reports"][0]
            row = {
                "products": len(cat), "goals": len(env.res.goals), "generate_s": t_gen, "generate_cpu_s": c_gen,
                "files_mb": files_mb, "cold_load_s": t_cold, "cold_load_cpu_s": c_cold, "cached_reload_s": t_reload,
                "process_reload_s": fresh["load_s"], "process_start_to_loaded_s": fresh["ready_s"],
                "process_rss_after_load_mb": fresh["rss_after_load_mb"],
                "rss_after_cold_load_mb": rss_cold,
                "cache_mb": _folder_mb(cache_folder(str(p_path), str(a_path), None, cache_root)),
                "peak_rss_mb": _peak_mb(),
            }
            base = analyzer = None
            if n <= args.baseline_max:
                # baseline: rank_bm25 on the same analysed tokens (tokenising not counted)
                analyzer = Analyzer()
                tokens = [analyzer(cat[i].search_text()) for i in range(len(cat))]
                t0 = time.perf_counter()
                base = rank_bm25.BM25Okapi(tokens, k1=0.9, b=0.4)
                row["rank_bm25_build_s"] = time.perf_counter() - t0
                del tokens
            results["sizes"][n] = row
            base_text = (f"rank_bm25 build {row['rank_bm25_build_s']:6.2f} s (index only)" if base is not None
                         else f"rank_bm25 baseline skipped (> {args.baseline_max} products)")
            print(
                f"  {n:>8} products: cold load+index {t_cold:7.2f} s | cached reload {t_reload:6.3f} s | "
                f"{base_text} | peak RSS {row['peak_rss_mb']:.0f} MB",
                flush=True,
            )
            print(
                f"  {n:>8} products: {row['goals']} goals | cold load CPU {c_cold:.1f} s | cache "
                f"{row['cache_mb']:.0f} MB on disk | RSS after the cold load {rss_cold:.0f} MB | reload in a new "
                f"process {fresh['load_s']:.3f} s ({fresh['ready_s']:.2f} s from its start, imports included), its RSS "
                f"after load {fresh['rss_after_load_mb']:.0f} MB",
                flush=True,
            )
            last = (n, p_path, a_path, cache_root, cat, index, base, analyzer)
            del env, cat, index

        n, p_path, a_path, cache_root, cat, index, base, analyzer = last
        if len(sizes) >= 2:
            (n0, r0), (n1, r1) = sorted(results["sizes"].items())[-2:]
            per = 100_000 / (n1 - n0) if n1 != n0 else 0.0
            keys = ("cold_load_s", "cold_load_cpu_s", "process_reload_s", "cache_mb", "process_rss_after_load_mb",
                    "files_mb", "generate_s")
            growth = {k: (r1[k] - r0[k]) * per for k in keys}
            results["growth_per_100k"] = growth
            print(f"  growth per 100k products ({n0} -> {n1}): generate +{growth['generate_s']:.1f} s, cold load "
                  f"+{growth['cold_load_s']:.1f} s (CPU +{growth['cold_load_cpu_s']:.1f} s), reload "
                  f"+{growth['process_reload_s']:.2f} s, files "
                  f"+{growth['files_mb']:.0f} MB, cache +{growth['cache_mb']:.0f} MB, worker RSS after load "
                  f"+{growth['process_rss_after_load_mb']:.0f} MB", flush=True)
        # ---------------------------------------------------------------- search latency
        env = twice_envs.make("WebShop-v0", products_path=str(p_path), attributes_path=str(a_path), cache_root=cache_root,
                              split="all")
        goals = env.res.goals
        rng = np.random.default_rng(0)
        qs = [goals[int(i)].instruction_text for i in rng.integers(0, len(goals), size=n_queries)]
        index.search(qs[0])
        lat, cpu = [], []
        for q in qs:
            t0, c0 = time.perf_counter(), time.process_time()
            index.search(q)
            lat.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        p50, p95 = _pct(lat, 50), _pct(lat, 95)
        results["search"] = {"products": n, "p50_s": p50, "p95_s": p95, "cpu_p50_s": _pct(cpu, 50),
                             "cpu_p95_s": _pct(cpu, 95), "rank_bm25_p50_s": None, "queries": len(qs)}
        if base is not None:
            base_lat = []
            for q in qs[:n_base]:
                qt = analyzer(q)
                t0 = time.perf_counter()
                s = base.get_scores(qt)
                np.argsort(-s, kind="stable")[:50]
                base_lat.append(time.perf_counter() - t0)
            b50 = _pct(base_lat, 50)
            results["search"]["rank_bm25_p50_s"] = b50
            print(f"  search on {n} products ({len(qs)} queries): p50 {_fmt_ms(p50)}, p95 {_fmt_ms(p95)} | "
                  f"rank_bm25 p50 {_fmt_ms(b50)} -> ratio {b50 / p50:.1f}x", flush=True)
        else:
            print(f"  search on {n} products ({len(qs)} queries): p50 {_fmt_ms(p50)}, p95 {_fmt_ms(p95)} | "
                  f"rank_bm25 baseline skipped (> {args.baseline_max} products)", flush=True)
        print(f"  search CPU time (this process): p50 {_fmt_ms(results['search']['cpu_p50_s'])}, "
              f"p95 {_fmt_ms(results['search']['cpu_p95_s'])}", flush=True)
        base = analyzer = None

        # ---------------------------------------------------------------- click step
        obs, info = env.reset(seed=0, options={"goal": 0})
        obs, *_ , info = env.step(f"search[{env.goal.instruction_text}]")
        item_click = next(a for a in info["admissible_actions"] if a.startswith("click[") and a not in
                          ("click[back to search]", "click[next >]", "click[< prev]"))
        obs, *_, info = env.step(item_click)
        cycle = [a for a in info["admissible_actions"] if a not in ("click[buy now]", "click[back to search]", "click[< prev]")]
        env = twice_envs.make("WebShop-v0", products_path=str(p_path), attributes_path=str(a_path), cache_root=cache_root,
                              split="all", max_turns=100_000)
        env.reset(seed=0, options={"goal": 0})
        env.step(f"search[{goals[0].instruction_text}]")
        env.step(item_click)
        steps, page_obs = [], []
        reps = 200 if args.quick else 2000
        for k in range(reps):
            a = cycle[k % len(cycle)]
            t0 = time.perf_counter()
            o, *_ = env.step(a)
            steps.append(time.perf_counter() - t0)
            if a in ("click[description]", "click[features]", "click[reviews]"):
                t0 = time.perf_counter()
                env.step("click[< prev]")
                steps.append(time.perf_counter() - t0)
            page_obs.append(o)
        base_steps = []
        for o in page_obs[:500]:
            t0 = time.perf_counter()
            _html_baseline(o)
            base_steps.append(time.perf_counter() - t0)
        c50, c95, h50 = _pct(steps, 50), _pct(steps, 95), _pct(base_steps, 50)
        results["click"] = {"p50_s": c50, "p95_s": c95, "html_parse_baseline_p50_s": h50}
        print(f"  click step: p50 {_fmt_ms(c50)}, p95 {_fmt_ms(c95)} | HTML render+parse baseline p50 {_fmt_ms(h50)} "
              f"-> ratio {h50 / c50:.1f}x", flush=True)

        # ---------------------------------------------------------------- fork at turn 10
        env = twice_envs.make("WebShop-v0", products_path=str(p_path), attributes_path=str(a_path), cache_root=cache_root,
                              split="all", max_turns=50)
        env.reset(seed=0, options={"goal": 0})
        plan = [f"search[{goals[0].instruction_text}]", item_click] + ["click[description]", "click[< prev]"] * 4
        for a in plan[:10]:
            env.step(a)
        assert env.turn == 10
        reps = 200 if args.quick else 2000
        fk = []
        for _ in range(reps):
            t0 = time.perf_counter()
            env.fork(10)
            fk.append(time.perf_counter() - t0)
        snap = []
        for _ in range(reps):
            t0 = time.perf_counter()
            env._restore(env._snapshot())
            snap.append(time.perf_counter() - t0)
        dc = []
        for _ in range(max(20, reps // 20)):
            t0 = time.perf_counter()
            copy.deepcopy(env, {id(env.res): env.res})  # resources shared, as a fork shares them
            dc.append(time.perf_counter() - t0)
        f50, s50, d50 = _pct(fk, 50), _pct(snap, 50), _pct(dc, 50)
        results["fork"] = {"fork_p50_s": f50, "snapshot_restore_p50_s": s50, "deepcopy_p50_s": d50}
        print(f"  fork at turn 10: env.fork p50 {_fmt_ms(f50)} (env state snapshot+restore {_fmt_ms(s50)}) | "
              f"deepcopy baseline p50 {_fmt_ms(d50)} -> ratio {d50 / f50:.1f}x (state alone {d50 / s50:.0f}x)", flush=True)
        results["peak_rss_mb"] = _peak_mb()

        # ---------------------------------------------------------------- worker memory
        if n_workers > 0:
            # this process lets go of the catalogue first, so the workers share its pages only with each other
            del env, goals, cat, index, last
            clear_process_cache()
            gc.collect()
            kw = dict(products_path=str(p_path), attributes_path=str(a_path), cache_root=cache_root, split="all")
            bare = _run_workers(1, kw, 0, load=False)
            one = _run_workers(1, kw, n_episodes)
            many = _run_workers(n_workers, kw, n_episodes)
            mem = {"products": n, "episodes": n_episodes, "bench_maps_cache": _maps_path(Path(cache_root)),
                   "bare": bare, "one": one, "many": many}
            results["workers"] = mem
            b, o = bare["reports"][0], one["reports"][0]
            if o.get("smaps") and many.get("pss_sum_mb") is not None and b.get("smaps"):
                extra_pss = (many["pss_sum_mb"] - o["smaps"]["pss_mb"]) / max(1, n_workers - 1)
                mem["extra_process_pss_mb"] = extra_pss
                print(f"  memory on {n} products, 1 worker (load, {n_episodes} episodes): "
                      f"RSS {o['smaps']['rss_mb']:.0f} MB, PSS {o['smaps']['pss_mb']:.0f} MB, "
                      f"USS {o['smaps']['uss_mb']:.0f} MB | an idle interpreter with "
                      f"the imports: RSS {b['smaps']['rss_mb']:.0f} MB, USS {b['smaps']['uss_mb']:.0f} MB", flush=True)
                print(f"  memory on {n} products, {n_workers} workers at once: RSS sum {many['rss_sum_mb']:.0f} MB, "
                      f"PSS sum {many['pss_sum_mb']:.0f} MB, USS mean {many['uss_mean_mb']:.0f} MB | each extra "
                      f"process +{extra_pss:.0f} MB PSS | load p50 {many['load_p50_s']:.2f} s", flush=True)
            else:
                print(f"  memory on {n} products: 1 worker RSS {one['rss_sum_mb']:.0f} MB, {n_workers} workers RSS sum "
                      f"{many['rss_sum_mb']:.0f} MB (PSS/USS: /proc/PID/smaps_rollup not readable here)", flush=True)
        print(f"  peak RSS of the run: {results['peak_rss_mb']:.0f} MB", flush=True)
    if args.json:
        from twice_envs.trajectory import atomic_write_text

        atomic_write_text(args.json, json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
