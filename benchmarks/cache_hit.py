"""Per-call cost of a compiled function on a cache hit: guards + dispatch + the kernel.

    python benchmarks/cache_hit.py [--numel 8] [--batches 200] [--per-batch 200] [--out DIR]

On tiny tensors (8 elements) the kernel itself takes well under a microsecond, so what is
measured is the host's work per call: checking the cache entry's guard, fetching the graph's
inputs, calling the generated wrapper, rebuilding the output. One process measures, one after
another: eager, torch.compile (Dynamo's C++ guards, Inductor's C++ kernel) and minicompile
(its generated Python guard, its C++ kernel), and the parts of minicompile's hit path on their
own. Times are medians of batches of back-to-back calls (a batch's time over its calls), in
microseconds; the variants take turns batch by batch (a shared machine's load falls on all),
each called through a lambda (the same few tens of nanoseconds added to every variant). Writes benchmarks/results/cache_hit_cpu.json (or under --out).
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import minicompile  # noqa: E402
from minicompile import bench  # noqa: E402


def f(a, b, c):
    return torch.relu(a + b) * c


def per_call_us(fns: dict, batches: int, per_batch: int) -> dict:
    """For each variant: median (and quartiles) over `batches` of the mean time of `per_batch`
    back-to-back calls. The variants take turns batch by batch, so a change in the load of a
    shared machine falls on all of them alike."""
    for fn in fns.values():                  # warm up: compiled, caches hot
        for _ in range(per_batch):
            fn()
    samples = {name: [] for name in fns}
    for _ in range(batches):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(per_batch):
                fn()
            samples[name].append((time.perf_counter() - t0) / per_batch * 1e6)
    out = {}
    for name, times in samples.items():
        q = statistics.quantiles(times, n=4)
        out[name] = {"median_us": statistics.median(times), "p25_us": q[0], "p75_us": q[2],
                     "batches": batches, "calls_per_batch": per_batch}
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=int, default=8)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--per-batch", type=int, default=200)
    parser.add_argument("--out", default=None)
    parser.add_argument("--name", default="cache_hit_cpu")
    args = parser.parse_args()
    torch.set_num_threads(1)                # tiny tensors: no thread pool in the way
    a, b, c = (torch.randn(args.numel) for _ in range(3))
    expected = f(a, b, c)

    ours = minicompile.compile(f)
    theirs = torch.compile(f)
    for name, fn in (("minicompile", ours), ("torch.compile", theirs)):
        torch.testing.assert_close(fn(a, b, c), expected, rtol=1e-6, atol=1e-6)
    assert minicompile.metrics.graphs == 1

    # minicompile's hit path, part by part (the same calls the cache makes)
    from minicompile.api import _CACHES
    (frame,) = [v for k, v in _CACHES.items() if k[0] is f.__code__]
    (seg,) = list(frame)
    call_args, kw = (a, b, c), {}
    inputs = seg.get_inputs(call_args, kw)
    variants = {
        "eager": lambda: f(a, b, c),
        "torch.compile": lambda: theirs(a, b, c),
        "minicompile": lambda: ours(a, b, c),
        "minicompile guard": lambda: seg.guard(call_args, kw),
        "minicompile get_inputs": lambda: seg.get_inputs(call_args, kw),
        "minicompile compiled graph (wrapper + kernel)": lambda: seg.compiled(*inputs),
        "minicompile segment run (inputs, graph, output)": lambda: seg.run(call_args, kw, None),
    }
    timed = per_call_us(variants, args.batches, args.per_batch)
    records = {k: timed[k] for k in ("eager", "torch.compile", "minicompile")}
    records["minicompile_parts"] = {k[len("minicompile "):]: v for k, v in timed.items()
                                    if k.startswith("minicompile ")}
    records["ratio_minicompile_over_torch_compile"] = \
        records["minicompile"]["median_us"] / records["torch.compile"]["median_us"]

    result = {"function": "relu(a + b) * c", "numel": args.numel, "dtype": "float32",
              "torch_threads": 1, "what": "per-call time on a cache hit, microseconds",
              "records": records}
    path = bench.save_results(args.name, result, args.out)
    width = 14
    for label in ("eager", "torch.compile", "minicompile"):
        r = records[label]
        print(f"{label:<{width}}  {r['median_us']:8.2f} us  (p25 {r['p25_us']:.2f}, p75 {r['p75_us']:.2f})")
    for label, r in records["minicompile_parts"].items():
        print(f"  minicompile {label:<48} {r['median_us']:8.2f} us")
    print(f"saved {path}")


if __name__ == "__main__":
    main()
