"""Try block sizes and warps for the flat pointwise kernel on a GPU (relu(x + 1) * 2, N x N
float32) and print each one's median time and bandwidth against a device-to-device copy.
Used to choose the defaults in minicompile/codegen/triton.py (_pointwise_config)."""
import sys

import torch

import minicompile
from minicompile import bench
from minicompile.codegen import triton as triton_codegen

n = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
x = torch.randn(n, n, device="cuda")
copy = bench.copy_bandwidth(x.numel() * 4, "cuda")
print(f"copy bandwidth {copy / 1e12:.2f} TB/s (read + write)")
for xblock, warps in [(1024, 4), (2048, 4), (2048, 8), (4096, 8), (4096, 16), (8192, 16)]:
    triton_codegen._pointwise_config = lambda numel, c=(xblock, warps): c
    minicompile.reset()
    f = minicompile.compile(lambda x: torch.relu(x + 1) * 2)
    f(x)
    ms = bench.median_ms(f, x, repeat=100)
    print(f"XBLOCK={xblock:5d} num_warps={warps:2d}: {ms:.4f} ms, {2 * x.numel() * 4 / (ms * 1e-3) / copy:.1%} of copy")
