"""The six memory-bound functions of book/reference_results.md: eager vs torch.compile vs minicompile.

    python benchmarks/memory_bound.py [--device cpu|cuda] [--size N] [--out DIR]

For each function, in one run: medians (CUDA events on a GPU), speedup over eager, kernels
minicompile generated, and achieved bandwidth: the minimal bytes (each input read once, each
output written once) over the time, as a fraction of a device-to-device copy measured in the
same run. Writes memory_bound_<cpu|h100|...>.json and prints a table.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import cold_caches  # noqa: E402,F401  (before torch: first calls in this run are cold)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import minicompile  # noqa: E402
from minicompile import bench  # noqa: E402


def relu_chain(x, w, b):
    return torch.relu(x + 1) * 2


def data_dependent(x, w, b):
    y = x / (torch.abs(x) + 1)
    if y.sum() < 0:
        y = y * -1
    return y * 2


def softmax(x, w, b):
    return torch.softmax(x, -1)


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


def gelu_bias(x, w, b):
    return F.gelu(x + b)


def rms_norm(x, w, b):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


FUNCTIONS = {   # name -> (function, minimal bytes as a multiple of x's bytes, source shown)
    "relu(x + 1) * 2": (relu_chain, 2),
    "x / (abs(x)+1), data-dependent if": (data_dependent, 2),
    "softmax(x, -1)": (softmax, 2),
    "layer_norm(x, w, b)": (layer_norm, 2),
    "gelu(x + b)": (gelu_bias, 2),
    "x * rsqrt(mean(x^2) + eps) * w": (rms_norm, 2),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", type=int, default=None)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    n = args.size or (8192 if args.device == "cuda" else 2048)
    x = torch.randn(n, n, device=args.device)
    w = torch.randn(n, device=args.device)
    b = torch.randn(n, device=args.device)
    copy = bench.copy_bandwidth(x.numel() * 4, args.device, repeat=args.repeat)
    results = {}
    for name, (fn, passes) in FUNCTIONS.items():
        torch._dynamo.reset()
        minicompile.reset()
        minicompile.metrics.reset()
        fns = {"eager": fn, "torch.compile": torch.compile(fn), "minicompile": minicompile.compile(fn)}
        records = bench.compare(fns, [x, w, b], repeat=args.repeat, rtol=2e-4, atol=2e-4)
        minimal = passes * x.numel() * x.element_size()
        for rec in records.values():
            rec["bandwidth_fraction_of_copy"] = minimal / (rec["median_ms"] * 1e-3) / copy
        results[name] = {"records": records, "minimal_bytes": minimal,
                         "minicompile_kernels": minicompile.metrics.kernels,
                         "minicompile_graph_breaks": minicompile.metrics.graph_breaks}
    name = "memory_bound_cpu" if args.device == "cpu" else \
        "memory_bound_" + torch.cuda.get_device_name().split()[1].lower()
    path = bench.save_results(name, {"shape": [n, n], "dtype": "float32",
                                     "copy_bandwidth_bytes_per_s": copy, "functions": results},
                              directory=args.out)
    print(f"wrote {path}; copy bandwidth {copy / 1e9:.0f} GB/s")
    print(f"{'function':<36}{'eager':>8}{'t.c':>8}{'mini':>8}{'t.c x':>7}{'mini x':>7}{'bw t.c':>8}{'bw mini':>8}{'k':>3}"
          f"  mini vs t.c")
    for fname, r in results.items():
        rec = r["records"]
        print(f"{fname:<36}{rec['eager']['median_ms']:>8.3f}{rec['torch.compile']['median_ms']:>8.3f}"
              f"{rec['minicompile']['median_ms']:>8.3f}{rec['torch.compile']['speedup']:>7.2f}"
              f"{rec['minicompile']['speedup']:>7.2f}{rec['torch.compile']['bandwidth_fraction_of_copy']:>8.0%}"
              f"{rec['minicompile']['bandwidth_fraction_of_copy']:>8.0%}{r['minicompile_kernels']:>3}"
              f"  {bench.verdict(rec['minicompile'], rec['torch.compile'])}")


if __name__ == "__main__":
    main()
