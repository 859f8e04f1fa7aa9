"""mode="reduce-overhead" (CUDA graphs) beside the default mode, for torch.compile and minicompile.

    python benchmarks/modes.py [--repeat N] [--out DIR]

On a GPU, in one run: eager, torch.compile (default, reduce-overhead) and minicompile (default,
reduce-overhead) on
- tiny: relu(a + b) * c on 1,024 float32 elements (host work per call is all there is);
- mlp: an 8-layer MLP, width 256, batch 8, inference (many small kernels per call);
- large: relu(x + 1) * 2 on 8192 x 8192 float32 (one memory-bound kernel);
- dynamic: the MLP called with 16 batch sizes (8, 16, ..., 128), one pass after warm-up, and how
  many graphs each compiler compiled and recorded.
Medians of CUDA-event times after warm-up (bench.compare), results checked against eager.
Writes modes_<gpu>.json to --out, else $OUT, else benchmarks/results/.
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import minicompile  # noqa: E402
from minicompile import bench  # noqa: E402


def pointwise(a, b, c):
    return torch.relu(a + b) * c


def relu_plus(x):
    return torch.relu(x + 1) * 2


def mlp(width=256, depth=8):
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers).cuda().eval()


def versions(fn, **kw):
    torch._dynamo.reset()
    minicompile.reset()
    return {"eager": fn,
            "torch.compile": torch.compile(fn, **kw),
            "torch.compile reduce-overhead": torch.compile(fn, mode="reduce-overhead", **kw),
            "minicompile": minicompile.compile(fn, **kw),
            "minicompile reduce-overhead": minicompile.compile(fn, mode="reduce-overhead", **kw)}


def dynamic_pass(fns, model_sizes):
    """Each version over the 16 batch sizes: the first pass (compiles, recordings) and the
    median of five warm passes, in ms."""
    out = {}
    for label, fn in fns.items():
        torch.cuda.synchronize()
        start = time.perf_counter()
        for x in model_sizes:
            fn(x)
        torch.cuda.synchronize()
        first = time.perf_counter() - start
        warm = []
        for _ in range(5):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for x in model_sizes:
                fn(x)
            e.record()
            torch.cuda.synchronize()
            warm.append(s.elapsed_time(e))
        out[label] = {"first_pass_s": first, "warm_pass_ms": sorted(warm)[2]}
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=200)
    p.add_argument("--out", default=os.environ.get("OUT"))
    args = p.parse_args()
    assert torch.cuda.is_available(), "CUDA graphs need a GPU"
    torch.backends.cuda.matmul.allow_tf32 = True
    results = {}
    with torch.no_grad():
        tiny = [torch.randn(1024, device="cuda") for _ in range(3)]
        results["tiny"] = bench.compare(versions(pointwise), tiny, repeat=args.repeat, warmup=20)
        model = mlp()
        x = torch.randn(8, 256, device="cuda")
        results["mlp"] = bench.compare(versions(model), [x], repeat=args.repeat, warmup=20,
                                       rtol=1e-3, atol=1e-3)
        big = [torch.randn(8192, 8192, device="cuda")]
        results["large"] = bench.compare(versions(relu_plus), big, repeat=50, warmup=5)
        sizes = [torch.randn(b, 256, device="cuda") for b in range(8, 129, 8)]
        minicompile.metrics.reset()
        fns = versions(model)
        dyn = dynamic_pass(fns, sizes)
        dyn_ro = fns["minicompile reduce-overhead"]
        results["dynamic"] = {"sizes": [t.shape[0] for t in sizes], "passes": dyn,
                              "minicompile_graphs_compiled": minicompile.metrics.graphs,
                              "cudagraph_max_recordings": minicompile.config.cudagraph_max_recordings,
                              "note": "minicompile reduce-overhead records one CUDA graph per batch size "
                                      "up to cudagraph_max_recordings; later sizes run its default path"}
        del dyn_ro
    for case in ("tiny", "mlp", "large"):
        print(case)
        for label, r in results[case].items():
            print(f"  {label:32s} {r['median_ms'] * 1e3:10.1f} us  {r['speedup']:5.2f}x")
    for label, r in results["dynamic"]["passes"].items():
        print(f"dynamic {label:32s} first pass {r['first_pass_s']:.2f} s, warm pass {r['warm_pass_ms']:.2f} ms")
    gpu = "h100" if "H100" in torch.cuda.get_device_name() else "gpu"
    path = bench.save_results(f"modes_{gpu}", {"cases": results}, args.out)
    print("wrote", path)


if __name__ == "__main__":
    main()
