"""First call of a compiled model, cold and warm: what a user waits for before the first result.

    python benchmarks/first_call.py [--device cuda] [--out DIR]

For each model of the book (benchmarks/models.py) and each compiler, two fresh processes share
one new cache folder (minicompile's, Triton's and Inductor's caches all point into it):

- cold: the first process, caches empty: capture, code generation and every kernel compiled;
- warm: a second process afterwards: the same work, but kernels (and Inductor's compiled graphs)
  come from the on-disk caches, as on every run of a program after its first.

Each process builds the model, runs it once eagerly (CUDA initialized, libraries loaded), then
times the first compiled call, synchronized. Python's own bytecode cache is not part of a
compiler's cold start: a pip-installed package has its modules compiled already, but an
installation without them, in an environment that forbids writing them
(PYTHONDONTWRITEBYTECODE, as on the GPU machine these results come from), makes every process
compile the sources of every module it imports (Triton's and Inductor's). So all processes share
one bytecode cache folder (PYTHONPYCACHEPREFIX), filled by one untimed run of each model and
compiler first (with writing bytecode allowed). Results: first_call_<device>.json.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import sys, time, torch
sys.path.insert(0, "benchmarks"); sys.path.insert(0, ".")
import minicompile, models
name, compiler, device = sys.argv[1:4]
torch.backends.cuda.matmul.allow_tf32 = True
model, x = models.model_and_input(name, device, scale=1.0 if device == "cuda" else 1 / 16)
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
with torch.no_grad():
    model(x); sync()
    fn = minicompile.compile(model) if compiler == "minicompile" else torch.compile(model)
    t0 = time.perf_counter(); fn(x); sync(); t = time.perf_counter() - t0
print("SECONDS", t)
"""


def one(name, compiler, device, cache, bytecode):
    env = dict(os.environ, MINICOMPILE_CACHE_DIR=f"{cache}/mc", TRITON_CACHE_DIR=f"{cache}/triton",
               TORCHINDUCTOR_CACHE_DIR=f"{cache}/inductor", PYTHONPYCACHEPREFIX=bytecode)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    root = os.path.join(os.path.dirname(__file__), "..")
    proc = subprocess.run([sys.executable, "-c", CHILD, name, compiler, device], env=env, cwd=root,
                          capture_output=True, text=True)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("SECONDS")), None)
    if line is None:
        raise RuntimeError(f"{name} / {compiler} failed:\n{proc.stderr[-3000:]}")
    return float(line.split()[1])


def main():
    import torch
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from minicompile import bench
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    results = {}
    print(f"{'model':10}{'compiler':>15}{'cold s':>9}{'warm s':>9}")
    bytecode = tempfile.mkdtemp(prefix="pycache-")
    pairs = [(name, compiler) for name in ("mlp", "cnn", "gpt_block") for compiler in ("torch.compile", "minicompile")]
    for name, compiler in pairs:            # untimed: fills the bytecode cache, nothing else
        with tempfile.TemporaryDirectory() as cache:
            one(name, compiler, args.device, cache, bytecode)
    for name, compiler in pairs:
        with tempfile.TemporaryDirectory() as cache:
            cold = one(name, compiler, args.device, cache, bytecode)
            warm = one(name, compiler, args.device, cache, bytecode)
        results.setdefault(name, {})[compiler] = {"cold_s": cold, "warm_s": warm}
        print(f"{name:10}{compiler:>15}{cold:9.2f}{warm:9.2f}", flush=True)
    for r in results.values():
        for kind in ("cold_s", "warm_s"):
            r[f"ratio_{kind[:-2]}"] = r["minicompile"][kind] / r["torch.compile"][kind]
    out_name = "first_call_cpu" if args.device == "cpu" else "first_call_" + torch.cuda.get_device_name().split()[1].lower()
    path = bench.save_results(out_name, {"method": __doc__.split("\n\n", 2)[2].strip(), "models": results},
                              directory=None if args.out is None else __import__("pathlib").Path(args.out))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
