"""``twice bench noise``: keyed Gumbel noise against ``torch.rand`` on the same block.

For every (batch, vocab) block it times, in one run and interleaved repeat by repeat
(so load changes hit all contenders alike), the median of:

* ``rand``: ``torch.rand(B, V)`` plus the Gumbel transform ``-log(-log(u))`` (the
  baseline: unkeyed noise, what a plain sampler pays);
* ``keyed``: :func:`twice_envs.noise.gumbel_torch`, the full keyed block;
* ``sample``: :func:`twice_envs.noise.keyed_sample` with the exact shortcut on
  *peaked* logits (a bulk plus a few clear favourites, as in a confident model step),
  where most of the vocabulary is out of reach of the noise;
* ``sample-flat``: the same on flat logits (every token within reach: no shortcut).

and prints microseconds per block and each ratio to ``rand``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Callable, List, Sequence

from twice_envs import noise, progress
from twice_envs._deps import require

DEFAULT_VOCABS = (32000, 49152, 151936)
DEFAULT_BATCHES = (1, 8, 64)


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="twice bench noise",
        description="Keyed Gumbel noise and keyed sampling against torch.rand + Gumbel transform on the same block.",
    )
    p.add_argument("--vocab", type=int, nargs="+", default=list(DEFAULT_VOCABS), help="vocabulary sizes")
    p.add_argument("--batch", type=int, nargs="+", default=list(DEFAULT_BATCHES), help="batch sizes")
    p.add_argument("--repeats", type=int, default=9, help="timed repeats per block (median reported)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: torch.rand is serial, so both sides get one core; 0: torch's default)",
    )
    p.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall: elapsed time; cpu: this thread's CPU time (steadier on a shared machine; needs --threads 1)",
    )
    p.add_argument("--quick", action="store_true", help="tiny sizes and 2 repeats (smoke test)")
    progress.add_argument(p)
    args = p.parse_args(argv)
    progress.apply(args)
    if args.quick:
        args.vocab, args.batch, args.repeats = [1000, 4099], [1, 3], 2
    return args


def _median_times(
    fns: List[Callable[[], object]], repeats: int, sync: Callable[[], None], clock: Callable[[], float]
) -> List[float]:
    for fn in fns:  # warm-up (allocator, first-call dispatch)
        fn()
    sync()
    times: List[List[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = clock()
            fn()
            sync()
            times[i].append(clock() - t0)
    return [statistics.median(t) * 1e6 for t in times]


def main(argv: Sequence[str] = ()) -> int:
    args = _parse(list(argv))
    torch = require("torch", "torch", "twice bench noise")
    threads_before = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        return _run(args, torch)
    finally:
        torch.set_num_threads(threads_before)


def _run(args: argparse.Namespace, torch) -> int:
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("twice bench noise: no CUDA device here; use --device cpu")
        return 2
    if args.clock == "cpu" and (device.type != "cpu" or torch.get_num_threads() != 1):
        print("twice bench noise: --clock cpu measures one CPU thread; use it with --device cpu --threads 1")
        return 2
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    gen = torch.Generator().manual_seed(1234)
    tau, top_p = args.temperature, args.top_p

    load = f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    print(
        f"keyed noise benchmark: torch {torch.__version__}, device {device}, {torch.get_num_threads()} threads, "
        f"{args.clock} clock, temperature {tau}, top_p {top_p}, median of {args.repeats}{load}"
    )
    header = (
        f"{'batch':>5} {'vocab':>7} | {'rand us':>9} | {'keyed us':>9} {'x rand':>6} | "
        f"{'sample us':>9} {'x rand':>6} {'cand%':>6} | {'flat us':>9} {'x rand':>6}"
    )
    print(header)
    print("-" * len(header))
    for V in args.vocab:
        for B in args.batch:
            rows = torch.randint(0, 2**32, (B, 6), generator=gen, dtype=torch.int64).to(device)
            flat = (torch.randn(B, V, generator=gen) * 2.0).to(device)
            peaked = flat.clone()
            favourites = torch.randint(0, V, (B, 4), generator=gen).to(device)
            peaked.scatter_add_(1, favourites, torch.full((B, 4), 30.0, device=device))
            s = peaked.double() / max(tau, 1e-12)
            cand_share = float((s >= s.max(-1, keepdim=True).values - noise.SKIP_GAP).double().mean())

            def rand_gumbel():
                u = torch.rand(B, V, device=device)
                return u.log_().neg_().log_().neg_()

            def keyed():
                return noise.gumbel_torch(rows, V)

            def sample_peaked():
                return noise.keyed_sample(peaked, rows, temperature=tau, top_p=top_p)

            def sample_flat():
                return noise.keyed_sample(flat, rows, temperature=tau, top_p=top_p)

            t_rand, t_keyed, t_peak, t_flat = _median_times(
                [rand_gumbel, keyed, sample_peaked, sample_flat], args.repeats, sync, clock
            )
            print(
                f"{B:>5} {V:>7} | {t_rand:>9.0f} | {t_keyed:>9.0f} {t_keyed / t_rand:>6.2f} | "
                f"{t_peak:>9.0f} {t_peak / t_rand:>6.2f} {100 * cand_share:>5.2f}% | "
                f"{t_flat:>9.0f} {t_flat / t_rand:>6.2f}",
                flush=True,
            )
    print("x rand: time / time of torch.rand + Gumbel transform on the same block (target on CPU: keyed <= 3).")
    print("cand%: share of the block within reach of the noise (the exact shortcut computes noise only there).")
    return 0


if __name__ == "__main__":  # pragma: no cover
    import sys

    raise SystemExit(main(sys.argv[1:]))
