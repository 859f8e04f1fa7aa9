"""Compile time on a 12-block transformer: cold, warm cache in a new process, and regional.

    python benchmarks/compile_time.py [--device cpu|cuda] [--dim D] [--tokens T] [--out DIR]

Each first call is measured in a fresh process (imports excluded), for torch.compile and for
minicompile:
- cold: empty caches (a new cache directory for each compiler: TORCHINDUCTOR_CACHE_DIR,
  MINICOMPILE_CACHE_DIR);
- warm: a second process on the cache the cold one filled (Inductor's FX graph cache;
  minicompile's whole-graph cache and kernel caches);
- regional: empty caches, every block compiled on its own (torch.compile: `block.compile()`;
  minicompile: `minicompile.compile_regions(model)`), so one block's graph serves all 12;
- minicompile's "warm, graphs only": a third process on the same caches with saved frames off
  (MINICOMPILE_FRAME_CACHE=0), so the frame is captured again and only its graph is loaded.
Each process also reports the steady-state time per call after warm-up (median); the regional
process also compiles the whole model and times the two in turns, so that regional and
whole-model speed are compared in one process. Results checked against eager in each process. Writes
compile_time_<device>.json; with another width or length than the default (256 wide, 8 x 128
tokens, where a GPU call is all host work), compile_time_<device>_dim<D>_tokens<T>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import copy, json, os, statistics, sys, time
import torch
sys.path.insert(0, os.path.join(os.environ["REPO"], "benchmarks"))
sys.path.insert(0, os.environ["REPO"])
import minicompile
from capture_transformer import Block, Transformer

device, compiler, how = os.environ["DEVICE"], os.environ["COMPILER"], os.environ["HOW"]
torch.manual_seed(0)
dim, tokens = int(os.environ["DIM"]), int(os.environ["TOKENS"])
model = Transformer(12, dim=dim, heads=max(4, dim // 64)).to(device).eval()
x = torch.randn(8, tokens, dim, device=device)
whole_model = copy.deepcopy(model)
with torch.no_grad():
    expected = model(x)
if how == "regional":
    if compiler == "torch.compile":
        for m in model.modules():
            if isinstance(m, Block):
                m.compile()
    else:
        minicompile.compile_regions(model, Block)
    fn = model
else:
    fn = torch.compile(model) if compiler == "torch.compile" else minicompile.compile(model)

def sync():
    if device == "cuda":
        torch.cuda.synchronize()
with torch.no_grad():
    sync()
    start = time.perf_counter()
    out = fn(x)
    sync()
    first = time.perf_counter() - start
    torch.testing.assert_close(out, expected, rtol=2e-3, atol=2e-3)
    for _ in range(3):
        fn(x)
    def per_call(f, n=15):
        times = []
        for _ in range(n):
            sync()
            s = time.perf_counter()
            f(x)
            sync()
            times.append(time.perf_counter() - s)
        return statistics.median(times) * 1e3
    result = {"first_call_s": first, "per_call_ms": per_call(fn)}
    if compiler == "minicompile":        # what the first call found in the caches
        result["cache"] = {k: minicompile.cache_info()[k] for k in ("hits", "misses", "frames_loaded")}
    if how == "regional":
        # per-call times differ between processes by more than regions cost: the whole model
        # compiled here too, and both timed in turns
        whole = torch.compile(whole_model) if compiler == "torch.compile" else minicompile.compile(whole_model)
        for _ in range(3):
            whole(x)
        turns = [(per_call(fn, 5), per_call(whole, 5)) for _ in range(4)]
        result["per_call_ms_regional_in_turns"] = statistics.median(r for r, _ in turns)
        result["per_call_ms_whole_in_turns"] = statistics.median(w for _, w in turns)
print(json.dumps(result))
"""


def measure(device, compiler, how, cache_dir, repo, dim, tokens, **extra):
    env = {**os.environ, **extra, "DEVICE": device, "COMPILER": compiler, "HOW": how, "REPO": repo,
           "DIM": str(dim), "TOKENS": str(tokens),
           "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache_dir, "inductor"),
           "MINICOMPILE_CACHE_DIR": os.path.join(cache_dir, "minicompile"), "MINICOMPILE_GRAPH_CACHE": "1"}
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{compiler} {how}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if __import__("torch").cuda.is_available() else "cpu")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--out", default=os.environ.get("OUT"))
    args = p.parse_args()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, repo)
    from minicompile.bench import save_results
    results = {}
    for compiler in ("torch.compile", "minicompile"):
        with tempfile.TemporaryDirectory() as whole, tempfile.TemporaryDirectory() as regional:
            results[compiler] = {
                "cold": measure(args.device, compiler, "whole", whole, repo, args.dim, args.tokens),
                "warm": measure(args.device, compiler, "whole", whole, repo, args.dim, args.tokens),
                "regional": measure(args.device, compiler, "regional", regional, repo, args.dim, args.tokens),
            }
            if compiler == "minicompile":
                results[compiler]["warm, graphs only"] = measure(args.device, compiler, "whole", whole, repo,
                                                                 args.dim, args.tokens, MINICOMPILE_FRAME_CACHE="0")
        for how, r in results[compiler].items():
            turns = (f" (in turns with the whole model: {r['per_call_ms_regional_in_turns']:.2f} against "
                     f"{r['per_call_ms_whole_in_turns']:.2f} ms)" if "per_call_ms_whole_in_turns" in r else "")
            print(f"{compiler:14s} {how:9s} first call {r['first_call_s']:7.2f} s, "
                  f"then {r['per_call_ms']:8.2f} ms per call{turns}", flush=True)
    torch = __import__("torch")
    tag = torch.cuda.get_device_name().split()[1].lower() if args.device == "cuda" else args.device
    size = "" if (args.dim, args.tokens) == (256, 128) else f"_dim{args.dim}_tokens{args.tokens}"
    path = save_results(f"compile_time_{tag}{size}", {
        "model": f"12-block transformer (benchmarks/capture_transformer.py), dim {args.dim}, "
                 f"{max(4, args.dim // 64)} heads, input (8, {args.tokens}, {args.dim}), no_grad",
        "results": results}, args.out)
    print("wrote", path)


if __name__ == "__main__":
    main()
