"""``twice bench webshop``: load, index, search, step and fork costs, with same-run baselines.

For each catalogue size (generated products written in the original file format):

* cold load: the first ``make`` on new data: stream the products file, normalise, write
  the record cache, build and save the BM25 index, build the goal set; baseline: building
  ``rank_bm25.BM25Okapi`` (the original's in-Python BM25) on the same analysed tokens;
* cached reload: ``make`` in a fresh process on the same files (disk cache, no parsing);

On the largest size:

* search latency p50/p95 over goal instructions as queries; baseline: ``rank_bm25``
  scoring plus a top-50 sort on the same tokens;
* click step (item page option clicks, sub pages, back); baseline: rendering the same page
  as HTML and reading its text nodes with the standard library's HTML parser (what the
  original does on every step);
* fork at turn 10 (``env.fork(10)``: a fresh env from the registry, snapshot restore,
  digest check) and the raw snapshot+restore; baseline: ``copy.deepcopy`` of the env
  (its read-only resources shared, as a fork shares them);
* peak memory (process maximum RSS).

Targets: 100k cold load < 60 s, cached reload < 5 s, search p50/p95 < 20 ms, click step
< 1 ms, fork at turn 10 < 0.1 ms.
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import sys
import tempfile
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Optional, Sequence

import numpy as np


def _peak_mb() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 1024.0 if sys.platform != "darwin" else r / (1024.0 * 1024.0)


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
    ap.add_argument("--json", type=str, default=None, help="also write the results to this JSON file")
    args = ap.parse_args(list(argv) if argv is not None else None)
    sizes = args.products or ([1000] if args.quick else [1000, 100_000])
    n_queries = min(args.queries, 30) if args.quick else args.queries
    n_base = min(args.baseline_queries, 3) if args.quick else args.baseline_queries

    import twice_envs
    from twice_envs._deps import require
    from twice_envs.envs.webshop import catalogue_gen
    from twice_envs.envs.webshop.resources import clear_process_cache
    from twice_envs.envs.webshop.search import Analyzer

    rank_bm25 = require("rank_bm25", "bench", "the WebShop benchmark baseline")
    results: dict = {"sizes": {}}
    print(f"twice bench webshop: sizes {sizes}; ratios are baseline time / our time (higher is better)")
    with tempfile.TemporaryDirectory(prefix="twice-bench-webshop-") as tmp:
        tmp = Path(tmp)
        last = None
        for n in sizes:
            t0 = time.perf_counter()
            p_path, a_path = catalogue_gen.write(tmp / f"data{n}", n, seed=0)
            t_gen = time.perf_counter() - t0
            cache_root = str(tmp / f"cache{n}")
            kw = dict(products_path=str(p_path), attributes_path=str(a_path), cache_root=cache_root, split="all")
            clear_process_cache()
            t0 = time.perf_counter()
            env = twice_envs.make("WebShop-v0", **kw)
            t_cold = time.perf_counter() - t0
            clear_process_cache()
            t0 = time.perf_counter()
            env = twice_envs.make("WebShop-v0", **kw)
            t_reload = time.perf_counter() - t0
            cat, index = env.res.catalogue, env.res.index
            # baseline: rank_bm25 on the same analysed tokens (tokenising not counted)
            analyzer = Analyzer()
            tokens = [analyzer(cat[i].search_text()) for i in range(len(cat))]
            t0 = time.perf_counter()
            base = rank_bm25.BM25Okapi(tokens, k1=0.9, b=0.4)
            t_base_build = time.perf_counter() - t0
            row = {
                "products": len(cat), "goals": len(env.res.goals), "generate_s": t_gen, "cold_load_s": t_cold, "cached_reload_s": t_reload,
                "rank_bm25_build_s": t_base_build, "peak_rss_mb": _peak_mb(),
            }
            results["sizes"][n] = row
            print(
                f"  {n:>8} products: cold load+index {t_cold:7.2f} s | cached reload {t_reload:6.3f} s | "
                f"rank_bm25 build {t_base_build:6.2f} s (index only) | peak RSS {row['peak_rss_mb']:.0f} MB"
            )
            last = (n, p_path, a_path, cache_root, cat, index, base, analyzer)
            del tokens

        n, p_path, a_path, cache_root, cat, index, base, analyzer = last
        # ---------------------------------------------------------------- search latency
        env = twice_envs.make("WebShop-v0", products_path=str(p_path), attributes_path=str(a_path), cache_root=cache_root,
                              split="all")
        goals = env.res.goals
        rng = np.random.default_rng(0)
        qs = [goals[int(i)].instruction_text for i in rng.integers(0, len(goals), size=n_queries)]
        index.search(qs[0])
        lat = []
        for q in qs:
            t0 = time.perf_counter()
            index.search(q)
            lat.append(time.perf_counter() - t0)
        base_lat = []
        for q in qs[:n_base]:
            qt = analyzer(q)
            t0 = time.perf_counter()
            s = base.get_scores(qt)
            np.argsort(-s, kind="stable")[:50]
            base_lat.append(time.perf_counter() - t0)
        p50, p95 = _pct(lat, 50), _pct(lat, 95)
        b50 = _pct(base_lat, 50)
        results["search"] = {"products": n, "p50_s": p50, "p95_s": p95, "rank_bm25_p50_s": b50, "queries": len(qs)}
        print(f"  search on {n} products ({len(qs)} queries): p50 {_fmt_ms(p50)}, p95 {_fmt_ms(p95)} | "
              f"rank_bm25 p50 {_fmt_ms(b50)} -> ratio {b50 / p50:.1f}x")

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
              f"-> ratio {h50 / c50:.1f}x")

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
              f"deepcopy baseline p50 {_fmt_ms(d50)} -> ratio {d50 / f50:.1f}x (state alone {d50 / s50:.0f}x)")
        results["peak_rss_mb"] = _peak_mb()
        print(f"  peak RSS of the run: {results['peak_rss_mb']:.0f} MB")
    if args.json:
        from twice_envs.trajectory import atomic_write_text

        atomic_write_text(args.json, json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
