"""Benchmark for the "Why compile?" chapter: relu(x + 1) * 2 in eager, torch.compile, minicompile.

    python benchmarks/why_compile.py [--device cpu|cuda] [--size N] [--out DIR]

Measures, in one run: each version's median time (CUDA events on a GPU), the bytes each moves,
achieved bandwidth against a measured device-to-device copy (GPU), and each compiler's cold
first call in a fresh process. Writes why_compile_<cpu|h100|...>.json under benchmarks/results/
(or --out) and prints a table.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import minicompile  # noqa: E402
from minicompile import bench  # noqa: E402


def f(x):
    return torch.relu(x + 1) * 2


def eager_bytes(x):
    # three kernels (add, relu, mul): each reads one tensor and writes one
    return 3 * 2 * x.numel() * x.element_size()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", type=int, default=None, help="N for an N x N float32 input")
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--out", default=None)
    parser.add_argument("--name", default=None)
    parser.add_argument("--no-cold", action="store_true", help="skip the cold first-call runs")
    args = parser.parse_args()
    n = args.size or (8192 if args.device == "cuda" else 4096)
    x = torch.randn(n, n, device=args.device)

    minicompile.metrics.reset()
    fns = {"eager": f, "torch.compile": torch.compile(f), "minicompile": minicompile.compile(f)}
    records = bench.compare(fns, [x], repeat=args.repeat, rtol=1e-5, atol=1e-5)
    kernels = minicompile.metrics.kernels
    fused_bytes = minicompile.metrics.bytes_moved()
    records["eager"]["bytes"] = eager_bytes(x)
    records["torch.compile"]["bytes"] = records["minicompile"]["bytes"] = fused_bytes
    result = {"function": "relu(x + 1) * 2", "shape": [n, n], "dtype": "float32",
              "minicompile_kernels": kernels, "records": records}
    minimal = 2 * x.numel() * x.element_size()   # read x once, write the result once
    result["minimal_bytes"] = minimal
    if args.device == "cuda":
        copy = bench.copy_bandwidth(x.numel() * 4, args.device, repeat=args.repeat)
        result["copy_bandwidth_bytes_per_s"] = copy
        for label, rec in records.items():
            # as in book/reference_results.md: the minimal bytes over the time, against the measured copy
            rec["bandwidth_fraction_of_copy"] = minimal / (rec["median_ms"] * 1e-3) / copy
            # each call on its own (synchronized before and after): the host's work to launch
            # the call is then on the critical path too
            rec["median_ms_synchronized"] = bench.median_ms(fns[label], x, repeat=args.repeat,
                                                            synchronize_each=True)
    if not args.no_cold:
        for compiler in ("torch.compile", "minicompile"):
            records[compiler]["cold_first_call_s"] = bench.cold_first_call(compiler, args.device, n)
    name = args.name or ("why_compile_cpu" if args.device == "cpu" else
                         "why_compile_" + torch.cuda.get_device_name().split()[1].lower())
    path = bench.save_results(name, result, directory=args.out)
    print(f"wrote {path}")
    print(f"{'version':<15}{'median ms':>11}{'speedup':>9}{'bw/copy':>9}{'cold s':>8}{'sync ms':>9}")
    for label, rec in records.items():
        bw = rec.get("bandwidth_fraction_of_copy")
        print(f"{label:<15}{rec['median_ms']:>11.3f}{rec['speedup']:>8.2f}x"
              f"{'' if bw is None else f'{bw:>8.0%}':>9}{rec.get('cold_first_call_s', float('nan')):>8.2f}"
              f"{rec.get('median_ms_synchronized', float('nan')):>9.3f}")


if __name__ == "__main__":
    main()
