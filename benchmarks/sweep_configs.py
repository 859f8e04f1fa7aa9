"""Launch settings tried on a GPU: how the block size and warps of minicompile's kernels change
their time, beside torch.compile's kernels for the same functions. Used to choose
_pointwise_config and _reduction_config in minicompile/codegen/triton.py.

    python benchmarks/sweep_configs.py [--out DIR]

Times are GPU time per call (the sum of the call's kernels, from PyTorch's profiler, averaged
over 100 calls), so the host's launch work does not hide a kernel's. Pointwise: gelu(x + b) + r
(the MLP's residual kernel) over 2^14 to 2^26 float32 elements. Reductions: layer_norm, and
gelu + residual + layer_norm (the MLP's last kernel), over rows of 256 to 8192.
Results: sweep_configs_<device>.json. With --heavy, only arithmetic-heavy pointwise kernels: the
tanh GELU's backward (a tanh and some twenty operations an element, two inputs read whole: the
GPT block's largest backward kernel; float32 and bfloat16 at 3 x 2^23 elements, float32 at 2^22)
and SiLU's (float32, 3 x 2^23). Results: sweep_heavy_pointwise_<device>.json.
"""
import argparse
import os
import sys
import warnings

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import minicompile  # noqa: E402
from minicompile import bench  # noqa: E402
from minicompile.codegen import triton as triton_codegen  # noqa: E402

POINTWISE = [(256, 2), (512, 4), (512, 8), (1024, 4), (1024, 8), (1024, 16), (2048, 8), (4096, 8)]
REDUCTION = [(1, 2), (1, 4), (1, 8), (2, 4), (2, 8), (2, 16), (4, 8), (4, 16), (8, 16)]   # XBLOCK, warps


warnings.filterwarnings("ignore", message=".*Profiler clears events")   # one profile per call of gpu_us


def gpu_us(fn, *args, calls=100) -> float:
    """GPU microseconds per call: every kernel the calls ran, summed, over the number of calls."""
    for _ in range(5):
        fn(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(*args)
        torch.cuda.synchronize()
    return sum(e.self_device_time_total for e in prof.key_averages() if e.device_type.name == "CUDA") / calls


def minicompile_with(fn, args, pointwise=None, reduction=None):
    """fn compiled by minicompile with these launch settings (None: its own), checked against eager."""
    saved = triton_codegen._pointwise_config, triton_codegen._reduction_config
    if pointwise:
        triton_codegen._pointwise_config = lambda xnumel, *_: pointwise
    if reduction:
        triton_codegen._reduction_config = lambda xnumel, rnumel, *_: (True, reduction[0],
                                                                   triton_codegen._next_pow2(rnumel), reduction[1])
    try:
        minicompile.reset()
        compiled = minicompile.compile(fn)
        tolerance = 1e-4 if args[0].dtype == torch.float32 else 0.1   # eager rounds each bf16 step
        torch.testing.assert_close(compiled(*args), fn(*args), rtol=tolerance, atol=tolerance)
        return compiled
    finally:
        triton_codegen._pointwise_config, triton_codegen._reduction_config = saved


def sweep(name, fn, args, candidates, kind):
    torch._dynamo.reset()       # each sweep's function is a fresh compile, never a recompile
    times = {"torch.compile": gpu_us(torch.compile(fn), *args),
             "minicompile": gpu_us(minicompile_with(fn, args), *args)}
    for c in candidates:
        times[str(c)] = gpu_us(minicompile_with(fn, args, **{kind: c}), *args)
    best = min(times, key=times.get)
    print(f"{name:34} " + "  ".join(f"{k}:{v:.2f}" for k, v in times.items()) + f"  best {best}", flush=True)
    return times


def gelu_tanh_backward(g, x):
    """What the tanh GELU's backward computes (aten.gelu_backward, approximate="tanh")."""
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    t = torch.tanh(inner)
    return g * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 0.134145 * x * x))


def silu_backward(g, x):
    s = torch.sigmoid(x)
    return g * s * (1 + x * (1 - s))


def heavy(args):
    results = {}
    for name, fn, dtype, numel in (("gelu_tanh_backward", gelu_tanh_backward, torch.float32, 3 * 2**23),
                                   ("gelu_tanh_backward", gelu_tanh_backward, torch.bfloat16, 3 * 2**23),
                                   ("gelu_tanh_backward", gelu_tanh_backward, torch.float32, 2**22),
                                   ("silu_backward", silu_backward, torch.float32, 3 * 2**23)):
        g, x = (torch.randn(numel // 3072, 3072, device="cuda", dtype=dtype) for _ in range(2))
        key = f"{name} {str(dtype)[6:]} {numel}"
        results[key] = sweep(key, fn, (g, x), POINTWISE + [(2048, 4), (4096, 16)], "pointwise")
    name = "sweep_heavy_pointwise_" + torch.cuda.get_device_name().split()[1].lower()
    path = bench.save_results(name, {"method": __doc__, "unit": "GPU microseconds per call",
                                     "pointwise": results}, directory=args.out)
    print(f"wrote {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--heavy", action="store_true", help="only the arithmetic-heavy pointwise sweep")
    args = parser.parse_args()
    if args.heavy:
        return heavy(args)
    results = {"pointwise": {}, "reduction": {}}
    print("GPU microseconds per call; candidates are (XBLOCK, num_warps); 'minicompile' is its own choice")
    for log2 in (14, 16, 18, 20, 22, 24, 26):
        rows = 2**log2 // 1024
        x, r, b = (torch.randn(rows, 1024, device="cuda"), torch.randn(rows, 1024, device="cuda"),
                   torch.randn(1024, device="cuda"))
        results["pointwise"][f"2^{log2}"] = sweep(f"gelu(x + b) + r, 2^{log2} elements",
                                                  lambda x, b, r: F.gelu(x + b) + r, (x, b, r), POINTWISE, "pointwise")
    for rows, cols in ((1024, 1024), (4096, 1024), (8192, 768), (16384, 256), (4096, 2048), (8192, 8192)):
        x, r = torch.randn(rows, cols, device="cuda"), torch.randn(rows, cols, device="cuda")
        b, w, bias = (torch.randn(cols, device="cuda") for _ in range(3))
        candidates = [(xb, nw) for xb, nw in REDUCTION if 32 <= xb * triton_codegen._next_pow2(cols) // nw <= 1024] \
            + [(1, 32)] * (cols >= 8192)
        results["reduction"][f"layer_norm {rows}x{cols}"] = sweep(
            f"layer_norm, {rows} x {cols}", lambda x, w, bias: F.layer_norm(x, (cols,), w, bias), (x, w, bias),
            candidates, "reduction")
        results["reduction"][f"gelu+residual+layer_norm {rows}x{cols}"] = sweep(
            f"gelu + residual + layer_norm, {rows} x {cols}",
            lambda x, b, r, w, bias: F.layer_norm(F.gelu(x + b) + r, (cols,), w, bias), (x, b, r, w, bias),
            candidates, "reduction")
    name = "sweep_configs_" + torch.cuda.get_device_name().split()[1].lower()
    path = bench.save_results(name, {"method": __doc__, "unit": "GPU microseconds per call", **results},
                              directory=args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
