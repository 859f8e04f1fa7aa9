"""Try reduction-kernel settings on a GPU for softmax, layer norm and RMS norm (N x N float32)
and print each one's median time and bandwidth against a device-to-device copy. Used to choose
_reduction_config in minicompile/codegen/triton.py."""
import sys

import torch
import torch.nn.functional as F

import minicompile
from minicompile import bench
from minicompile.codegen import triton as triton_codegen

n = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
x, w, b = torch.randn(n, n, device="cuda"), torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
copy = bench.copy_bandwidth(x.numel() * 4, "cuda")
fns = {"softmax": lambda x, w, b: torch.softmax(x, -1),
       "layer_norm": lambda x, w, b: F.layer_norm(x, (n,), w, b),
       "rms_norm": lambda x, w, b: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w}
default = triton_codegen._reduction_config
configs = [("default", default)] + [
    (f"persistent XBLOCK={xb} warps={nw}", (lambda xb, nw: lambda X, R: (True, xb, triton_codegen._next_pow2(R), nw))(xb, nw))
    for xb, nw in [(1, 4), (1, 8), (1, 16), (1, 32), (2, 16), (2, 32)]] + [
    (f"looped RBLOCK={rb} warps={nw}", (lambda rb, nw: lambda X, R: (False, 1, rb, nw))(rb, nw))
    for rb, nw in [(2048, 8), (4096, 16)]]
for label, cfg in configs:
    triton_codegen._reduction_config = cfg
    row = []
    for name, fn in fns.items():
        minicompile.reset()
        f = minicompile.compile(fn)
        torch.testing.assert_close(f(x, w, b), fn(x, w, b), rtol=1e-4, atol=1e-4)
        ms = bench.median_ms(f, x, w, b, repeat=50)
        row.append(f"{name} {ms:.3f} ms {2 * x.numel() * 4 / (ms * 1e-3) / copy:5.1%}")
    print(f"{label:<32}", " | ".join(row))
