"""Benchmark harness shared by the notebooks and the command line (`python -m minicompile.bench`).

Takes callables and their inputs; hands back timings and JSON-ready records.

Method (the same everywhere in the book): warm up first so compilation stays out of the numbers;
on a GPU time each call with CUDA events without synchronizing between calls (the queue stays
full, so an event pair measures the device work of that call), on a CPU with a monotonic clock;
report medians; run every variant being compared in the same process, one after another, so a
ratio never mixes two runs. Results are saved with the device, versions and date.
"""
from __future__ import annotations

import datetime as _dt
import gc
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

RESULTS_DIR = Path(__file__).resolve().parent.parent / "benchmarks" / "results"


def environment() -> dict[str, Any]:
    """Where and with what a measurement was taken."""
    env = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
    }
    try:
        import triton  # noqa: F401  (only its version is wanted)

        env["triton"] = triton.__version__
    except Exception:  # no Triton on this machine
        env["triton"] = None
    if torch.cuda.is_available():
        env["device"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
    else:
        env["device"] = f"CPU ({env['cpu_count']} cores)"
    return env


def _sync(device: torch.device | str | None) -> None:
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn: Callable, *args, warmup: int = 5, repeat: int = 50,
               device: torch.device | str | None = None, synchronize_each: bool = False) -> list[float]:
    """Milliseconds of each of `repeat` calls of fn(*args), after `warmup` untimed calls.
    On a GPU, calls are queued back to back unless synchronize_each=True, which waits for the
    device before and after every call (so the host's launch work is timed too)."""
    if device is None:
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
    for _ in range(warmup):
        fn(*args)
    _sync(device)
    if torch.device(device).type == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeat)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeat)]
        for start, end in zip(starts, ends):
            if synchronize_each:
                torch.cuda.synchronize(device)
            start.record()
            fn(*args)
            end.record()
        torch.cuda.synchronize(device)
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(*args)
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def median_ms(fn: Callable, *args, **kwargs) -> float:
    """Median milliseconds per call (see time_calls for the method)."""
    return statistics.median(time_calls(fn, *args, **kwargs))


def first_call_seconds(fn: Callable, *args) -> float:
    """Wall-clock seconds of one call, synchronized: for a fresh compiled function this is
    capture + compilation + the first run. Python's cycle collector runs first: a full
    collection comes when enough objects have outlived younger ones, so one that earlier work
    in the process made due (another model's compilation) would otherwise land in whichever
    first call came next, and cost it a walk of the whole heap (about a second, for a process
    that has compiled a few large models)."""
    device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
    _sync(device)
    gc.collect()
    t0 = time.perf_counter()
    fn(*args)
    _sync(device)
    return time.perf_counter() - t0


def copy_bandwidth(nbytes: int, device: torch.device | str, **kwargs) -> float:
    """Measured device-to-device copy bandwidth in bytes/s, counting bytes read plus written."""
    n = nbytes // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    ms = median_ms(dst.copy_, src, **kwargs)
    return 2 * n * 4 / (ms * 1e-3)


def compare(fns: dict[str, Callable], args: Sequence, *, warmup: int = 5, repeat: int = 50,
            check: bool = True, rtol: float = 1e-4, atol: float = 1e-4) -> dict[str, dict]:
    """Time several implementations of one function on the same inputs, in this one run.

    fns maps a label ("eager", "torch.compile", "minicompile", ...) to a callable. Each
    callable's first call is timed on its own (for a compiled callable: its compile time). With
    check=True every result must equal the first callable's. Then the timed calls go round-robin
    (one call of each, `repeat` times; each turn an untimed call, then a timed one),
    so a slow drift of the machine (another process, clock changes) affects every version
    alike. Returns {label: {"first_call_s", "median_ms",
    "median_ms_range", "speedup"}}, speedup over the first label; the range (the least and the
    largest median of five blocks of the calls) says how finely this run can tell two versions
    apart (see `verdict`).
    """
    device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
    records: dict[str, dict] = {}
    reference = None
    for label, fn in fns.items():
        records[label] = {"first_call_s": first_call_seconds(fn, *args)}
        out = fn(*args)
        if check:
            if reference is None:
                reference = out
            else:
                try:
                    torch.testing.assert_close(out, reference, rtol=rtol, atol=atol)
                except AssertionError as err:
                    raise AssertionError(f"{label} differs from {next(iter(fns))}: {err}") from None
    for label, fn in fns.items():
        time_calls(fn, *args, warmup=warmup, repeat=0, device=device)
    times: dict[str, list[float]] = {label: [] for label in fns}
    if torch.device(device).type == "cuda":
        # events for every call, queued back to back; one synchronization at the end. Each
        # turn makes one call untimed first: a call queues behind the one before it, and after
        # a version whose host work outlasts its GPU work (eager's many small launches) the GPU
        # has run dry, so the next version's call would be timed at its host's pace, not its
        # GPU's; the untimed call fills the queue again, whichever version ran before
        events = []
        for _ in range(repeat):
            for label, fn in fns.items():
                fn(*args)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn(*args)
                end.record()
                events.append((label, start, end))
        torch.cuda.synchronize(device)
        for label, start, end in events:
            times[label].append(start.elapsed_time(end))
    else:
        # an untimed call first here too: the timed one then finds the caches, and the memory
        # the allocator has free, as its own calls leave them, not as the version before did
        for _ in range(repeat):
            for label, fn in fns.items():
                times[label] += time_calls(fn, *args, warmup=1, repeat=1, device=device)
    for label, rec in records.items():
        rec["median_ms"] = statistics.median(times[label])
        # the run's resolution: medians of five consecutive blocks of the calls
        n = len(times[label]) // 5
        blocks = [times[label][i * n:(i + 1) * n] for i in range(5)] if n >= 5 else [times[label]]
        medians = [statistics.median(block) for block in blocks]
        rec["median_ms_range"] = [min(medians), max(medians)]
    base = next(iter(records.values()))["median_ms"]
    for rec in records.values():
        rec["speedup"] = base / rec["median_ms"]
    return records


def verdict(record: dict, reference: dict) -> str:
    """How a version's time compares with a reference's in one `compare` run: "faster" or
    "slower" when their ranges of block medians do not overlap, else "tie" (a difference
    smaller than the run can resolve, in either direction)."""
    lo, hi = record.get("median_ms_range") or [record["median_ms"]] * 2
    ref_lo, ref_hi = reference.get("median_ms_range") or [reference["median_ms"]] * 2
    return "faster" if hi < ref_lo else "slower" if lo > ref_hi else "tie"


def save_results(name: str, payload: dict, directory: Path | None = None) -> Path:
    """Write benchmarks/results/<name>.json with the environment it was measured in."""
    directory = Path(directory or RESULTS_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    path.write_text(json.dumps({"environment": environment(), **payload}, indent=2) + "\n")
    return path


def load_results(name: str) -> dict:
    """Committed results: from the checkout when there is one, else (an installed package on
    Colab) from the repository named in the package's metadata."""
    path = RESULTS_DIR / f"{name}.json"
    if path.exists():
        return json.loads(path.read_text())
    if (RESULTS_DIR.parent.parent / "pyproject.toml").exists():     # a checkout without it
        raise FileNotFoundError(f"no committed results named {name!r} in {RESULTS_DIR}")
    from importlib.metadata import metadata
    from urllib.request import urlopen

    repo = dict(u.split(", ", 1) for u in metadata("minicompile").get_all("Project-URL"))["Repository"]
    raw = repo.replace("https://github.com/", "https://raw.githubusercontent.com/") + \
        f"/main/benchmarks/results/{name}.json"
    with urlopen(raw, timeout=30) as response:
        return json.loads(response.read())


# --------------------------------------------------------------------------- cold first calls

COLD_SNIPPET = r"""
import os, sys, time, torch
compiler, device, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
x = torch.randn(n, n, device=device)
def f(x):
    return torch.relu(x + 1) * 2
if device == "cuda":
    torch.relu(x + 1).sum().item()      # CUDA context and eager kernels are not compile time
t0 = time.perf_counter()
if compiler == "minicompile":
    import minicompile
    g = minicompile.compile(f)
else:
    g = torch.compile(f)
g(x)
if device == "cuda":
    torch.cuda.synchronize()
print(time.perf_counter() - t0)
"""


def cold_first_call(compiler: str, device: str, n: int) -> float:
    """Seconds for the first call of a freshly compiled `relu(x + 1) * 2` in a new process with
    empty compile caches: importing the compiler, capture, code generation, the kernel
    compiler, and the first run. Both compilers are timed the same way."""
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=f"{tmp}/inductor", TRITON_CACHE_DIR=f"{tmp}/triton",
                   MINICOMPILE_CACHE_DIR=f"{tmp}/minicompile")
        env.pop("TRITON_INTERPRET", None)
        out = subprocess.run([sys.executable, "-c", COLD_SNIPPET, compiler, device, str(n)],
                             env=env, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"cold first call of {compiler} failed:\n{out.stderr[-2000:]}")
        return float(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    """Command line: time eager, torch.compile and minicompile on an expression of x.

        python -m minicompile.bench "torch.relu(x + 1) * 2" --shape 4096 4096 [--device cuda]
    """
    import argparse

    parser = argparse.ArgumentParser(prog="python -m minicompile.bench", description=main.__doc__.splitlines()[0])
    parser.add_argument("expression", help="a Python expression of the tensor x, e.g. 'x.softmax(-1)'")
    parser.add_argument("--shape", type=int, nargs="+", default=[4096, 4096])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--save", metavar="NAME", help="write benchmarks/results/NAME.json")
    args = parser.parse_args(argv)
    import minicompile

    fn = eval(f"lambda x: {args.expression}", {"torch": torch, "F": torch.nn.functional})
    x = torch.randn(*args.shape, dtype=getattr(torch, args.dtype), device=args.device)
    records = compare({"eager": fn, "torch.compile": torch.compile(fn), "minicompile": minicompile.compile(fn)},
                      [x], repeat=args.repeat)
    for label, rec in records.items():
        print(f"{label:<15} first call {rec['first_call_s']:7.3f} s   median {rec['median_ms']:9.3f} ms"
              f"   speedup {rec['speedup']:.2f}x")
    if args.save:
        print("wrote", save_results(args.save, {"expression": args.expression, "shape": args.shape,
                                                "dtype": args.dtype, "records": records}))


if __name__ == "__main__":
    main()
