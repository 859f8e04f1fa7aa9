"""A product whose result rows are not 16-byte aligned (a language model's head): cuBLAS on
the operands as they are, cuBLAS on a zero-padded weight (then the copy into eager's layout),
torch.compile, and minicompile's Triton kernel (minicompile/lower/matmul.py) with each
candidate setting; in one run on a GPU, fp32 with TF32 products and bf16.

    python benchmarks/unaligned_matmul.py [--out DIR]

Writes unaligned_matmul_<device>.json: per shape, each version's median and speedup over
eager, every result checked against eager's, and the strides of torch.compile's result beside
eager's.
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from minicompile import bench  # noqa: E402
from minicompile.lower import matmul  # noqa: E402

# (rows, inner size, columns, dtype): GPT-2's head at 8 x 512 tokens and at 1 x 512, wider
# models' inner sizes, bf16
SHAPES = [(4096, 768, 50257, torch.float32), (512, 768, 50257, torch.float32),
          (4096, 4096, 50257, torch.float32), (4096, 768, 50257, torch.bfloat16),
          (4096, 4096, 50257, torch.bfloat16)]
# (BLOCK_M, BLOCK_N, BLOCK_K, stages, warps), by the operands' bytes per element; each with the
# operands read through pointers and through tensor descriptors
CANDIDATES = {4: [(128, 128, 32, 3, 8), (128, 128, 32, 4, 8), (128, 128, 32, 5, 8), (128, 256, 32, 3, 8),
                  (128, 256, 32, 4, 8), (256, 128, 32, 3, 8), (128, 128, 64, 3, 8), (128, 128, 32, 4, 4),
                  (64, 256, 32, 4, 4)],
              2: [(128, 128, 64, 3, 8), (128, 128, 64, 4, 8), (128, 256, 64, 3, 8), (256, 128, 64, 3, 8),
                  (128, 256, 32, 4, 8), (128, 128, 64, 4, 4)]}


def padded_then_copied(x, w):
    wide = -(-w.shape[0] // 8) * 8
    return torch.mm(x, F.pad(w, (0, 0, 0, wide - w.shape[0])).t())[:, :w.shape[0]].contiguous()


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = True
    results = {"environment": bench.environment(), "precision": "fp32 with TF32 products; bf16", "shapes": {}}
    for m, k, n, dtype in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        w = (torch.randn(n, k, device="cuda") / k ** 0.5).to(dtype)
        fns = {"eager (cuBLAS, unaligned)": lambda x, w: F.linear(x, w),
               "cuBLAS on padded weight + copy": padded_then_copied}
        if k == 768:
            fns["torch.compile"] = torch.compile(lambda x, w: F.linear(x, w))
            out = fns["torch.compile"](x, w)
            layout = {"torch.compile": list(out.stride()), "eager": list(F.linear(x, w).stride())}
            print("   result strides:", layout)
        for s in CANDIDATES[x.element_size()]:
            for descriptors in (False, True):
                try:                   # a setting whose blocks do not fit the GPU's shared memory
                    matmul.launch(x, w.t(), s, descriptors)
                    torch.cuda.synchronize()
                except Exception as err:  # noqa: BLE001
                    print("  ", s, descriptors, "does not run:", str(err).splitlines()[0][:100])
                    continue
                label = f"triton {s}{' descriptors' if descriptors else ''}"
                fns[label] = (lambda s, d: lambda x, w: matmul.launch(x, w.t(), s, d))(s, descriptors)
        tol = 3e-2 if dtype == torch.bfloat16 else 5e-3
        try:
            records = bench.compare(fns, (x, w), repeat=50, rtol=tol, atol=tol)
        except Exception as err:  # noqa: BLE001 (a setting that does not fit: said, the rest measured)
            print(m, k, n, dtype, "FAILED", str(err)[:300])
            continue
        key = f"{m}x{k} @ {k}x{n} {str(dtype).split('.')[-1]}"
        results["shapes"][key] = records
        if k == 768:             # torch.compile's layout beside eager's
            results.setdefault("result_strides", {})[key] = layout
        print(key)
        for label, rec in records.items():
            print(f"   {label:36s} {rec['median_ms']:.3f} ms  {rec['speedup']:.2f}x")
    bench.save_results(f"unaligned_matmul_{'h100' if 'H100' in torch.cuda.get_device_name() else 'gpu'}",
                       results, args.out)


if __name__ == "__main__":
    main()
