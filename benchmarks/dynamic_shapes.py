"""Changing sizes: how many compiles, and what the whole run costs, for three ways of feeding a
compiled function inputs whose length varies.

    python benchmarks/dynamic_shapes.py [--device cuda] [--calls 60] [--out DIR]

The function is the row-wise work of a transformer block on a batch of sequences of varying
length T (layer norm, a GELU MLP's pointwise part, softmax over the features), called with
lengths drawn at random from 2..64 (seeded), in three ways, by minicompile and torch.compile
(Inductor), in one process:

- static:    dynamic=False, every new length is a compile (until the recompile limit of 8, then eager);
- automatic: dynamic=None (both compilers' default): one static compile, then one generic in T;
- padded:    dynamic=False on inputs padded up to a multiple of 16 (4 buckets), results sliced.

For each: the number of compiles, the wall time of the whole sequence (compiles included) and the
median time of one call afterwards (all lengths compiled, CUDA events on a GPU). Each of the six
runs is a fresh process with empty compile caches (minicompile's, Triton's, Inductor's), so no
run reuses another's kernels. Results: JSON with the device, versions and date
(benchmarks/results/dynamic_shapes_<device>.json).
"""
import json
import subprocess
import tempfile
import argparse
import os
import random
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import minicompile  # noqa: E402
from minicompile import bench  # noqa: E402

FEATURES = 256


def block(x, w, b):
    h = F.layer_norm(x, (FEATURES,), w, b)
    h = F.gelu(h * 1.702) + x
    return torch.softmax(h, -1)


def padded(fn, bucket):
    """Call fn on x padded along dim 1 to a multiple of `bucket`; slice the result back."""
    def call(x, w, b):
        t = x.shape[1]
        target = -(-t // bucket) * bucket
        if target != t:
            x = F.pad(x, (0, 0, 0, target - t))
        return fn(x, w, b)[:, :t]
    return call


def counting_backend(counter, inner):
    def backend(gm, example_inputs):
        counter.append(1)
        return inner(gm, example_inputs)
    backend.supports_dynamic_shapes = getattr(inner, "supports_dynamic_shapes", False)
    return backend


def run(compiler, strategy, lengths, device, batch):
    torch._dynamo.reset()
    minicompile.reset()
    compiles = []
    dynamic = None if strategy == "automatic" else False
    if compiler == "minicompile":
        fn = minicompile.compile(block, dynamic=dynamic, backend=counting_backend(compiles, minicompile.backend))
    else:
        from torch._inductor.compile_fx import compile_fx
        fn = torch.compile(block, dynamic=dynamic, backend=counting_backend(compiles, compile_fx))
    call = padded(fn, 16) if strategy == "padded" else fn
    w, b = torch.randn(FEATURES, device=device), torch.randn(FEATURES, device=device)
    inputs = [torch.randn(batch, t, FEATURES, device=device) for t in lengths]
    worst = 0.0
    bench._sync(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        for x in inputs:
            out = call(x, w, b)
            worst = max(worst, (out - block(x, w, b)).abs().max().item())
    bench._sync(device)
    total = time.perf_counter() - t0
    with torch.no_grad():
        per_call = statistics.median(bench.median_ms(call, x, w, b, warmup=2, repeat=10) for x in inputs[:12])
    return {"compiles": len(compiles), "total_s": total, "per_call_ms": per_call, "max_abs_error": worst}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--out", default=None)
    parser.add_argument("--one", nargs=2, metavar=("COMPILER", "STRATEGY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    rng = random.Random(0)
    lengths = [rng.randint(2, 64) for _ in range(args.calls)]
    if args.one:                      # one run, in this (fresh) process: print its result
        print("RESULT " + json.dumps(run(*args.one, lengths, args.device, args.batch)))
        return
    results = {}
    for compiler in ("minicompile", "torch.compile"):
        for strategy in ("static", "automatic", "padded"):
            with tempfile.TemporaryDirectory() as cache:
                env = dict(os.environ, MINICOMPILE_CACHE_DIR=f"{cache}/mc", TRITON_CACHE_DIR=f"{cache}/triton",
                           TORCHINDUCTOR_CACHE_DIR=f"{cache}/inductor")
                proc = subprocess.run([sys.executable, __file__, "--device", args.device, "--calls", str(args.calls),
                                       "--batch", str(args.batch), "--one", compiler, strategy],
                                      env=env, capture_output=True, text=True)
            line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
            if line is None:
                raise RuntimeError(f"{compiler} / {strategy} failed:\n{proc.stderr[-3000:]}")
            r = results[f"{compiler} / {strategy}"] = json.loads(line[7:])
            print(f"{compiler:14s} {strategy:10s} compiles {r['compiles']:3d}  whole run {r['total_s']:7.2f} s  "
                  f"per call {r['per_call_ms']:.3f} ms  max error {r['max_abs_error']:.1e}", flush=True)
    payload = {"environment": bench.environment(), "device": args.device, "lengths": lengths,
               "distinct_lengths": len(set(lengths)), "batch": args.batch, "features": FEATURES,
               "recompile_limit": minicompile.config.recompile_limit, "results": results}
    name = f"dynamic_shapes_{'h100' if args.device == 'cuda' else 'cpu'}"
    print(bench.save_results(name, payload, None if args.out is None else __import__("pathlib").Path(args.out)))


if __name__ == "__main__":
    main()
