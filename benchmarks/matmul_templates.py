"""Matrix-product templates on a GPU, per shape: the template against PyTorch's product and the
epilogue kernel, as max-autotune timed them, and each function's time per call.

    python benchmarks/matmul_templates.py [--out DIR]

Each case is a linear layer and the pointwise work after it (the layers of the book's MLP and of
a GPT-2 block, a small layer, in float32 with TF32 products and in bfloat16). For each, in one
run: minicompile's max-autotune (no CUDA graphs) compiled on an empty cache, recording what it
timed (`metrics.template_choices`: the template's best time and settings, PyTorch's product plus
the epilogue kernel, the choice); then eager, torch.compile and minicompile, default and
max-autotune-no-cudagraphs, first call and median time per call after warm-up (bench.compare,
CUDA events), each result checked against eager. Writes matmul_templates_<gpu>.json.
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


def gelu_residual(x, w, b):          # the book's MLP layer
    return F.gelu(F.linear(x, w, b)) + x


def gelu_tanh(x, w, b):              # a GPT-2 MLP's first layer
    return F.gelu(F.linear(x, w, b), approximate="tanh")


def residual(x, w, b, r):            # a GPT-2 MLP's second layer, into the residual stream
    return r + F.linear(x, w, b)


def relu(x, w, b):                   # a small layer
    return torch.relu(F.linear(x, w, b))


# name -> (function, rows, k, n, takes a residual input)
CASES = {
    "mlp layer 4096x1024 -> 1024, gelu + residual": (gelu_residual, 4096, 1024, 1024, False),
    "gpt2 fc 4096x768 -> 3072, gelu(tanh)": (gelu_tanh, 4096, 768, 3072, False),
    "gpt2 out 4096x3072 -> 768, + residual": (residual, 4096, 3072, 768, True),
    "small 64x256 -> 256, relu": (relu, 64, 256, 256, False),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
LABELS = ("default", "max-autotune-no-cudagraphs")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT"))
    p.add_argument("--dtypes", nargs="*", default=list(DTYPES))
    p.add_argument("--name", default="matmul_templates", help="results file name (before the GPU)")
    args = p.parse_args()
    assert torch.cuda.is_available(), "templates are timed on a GPU"
    torch.backends.cuda.matmul.allow_tf32 = True
    results = {}
    with torch.no_grad():
        for case, (fn, rows, k, n, with_residual) in CASES.items():
            for dtype_name in args.dtypes:
                dtype = DTYPES[dtype_name]
                torch.manual_seed(0)
                inputs = [torch.randn(rows, k, device="cuda", dtype=dtype),
                          torch.randn(n, k, device="cuda", dtype=dtype) / k ** 0.5,
                          torch.randn(n, device="cuda", dtype=dtype)]
                if with_residual:
                    inputs.append(torch.randn(rows, n, device="cuda", dtype=dtype))
                torch._dynamo.reset()
                minicompile.reset()
                minicompile.metrics.reset()
                fns = {"eager": fn}
                for mode in LABELS:
                    fns[f"torch.compile {mode}"] = torch.compile(fn, mode=None if mode == "default" else mode)
                for mode in LABELS:
                    fns[f"minicompile {mode}"] = minicompile.compile(fn, mode=None if mode == "default" else mode)
                # TF32 products; bfloat16 results one unit in the last place apart (eager's
                # addmm rounds the product and bias once, minicompile's default path twice)
                tol = 6.25e-2 if dtype == torch.bfloat16 else 1e-2
                timed = bench.compare(fns, inputs, repeat=100, warmup=10, rtol=tol, atol=tol)
                key = f"{case}, {dtype_name}"
                results[key] = {"records": timed, "template_choices": list(minicompile.metrics.template_choices)}
                for choice in results[key]["template_choices"]:
                    print(f"{key}: template {choice['template_ms'] * 1e3:.1f} us {choice['settings']}, "
                          f"PyTorch's product + epilogue {choice['pytorch_ms'] * 1e3:.1f} us -> {choice['chosen']}")
                for label, r in timed.items():
                    print(f"    {label:42s} first call {r['first_call_s']:6.2f} s {r['median_ms'] * 1e3:9.1f} us "
                          f"{r['speedup']:5.2f}x", flush=True)
    gpu = "h100" if "H100" in torch.cuda.get_device_name() else "h200" if "H200" in torch.cuda.get_device_name() else "gpu"
    print("wrote", bench.save_results(f"{args.name}_{gpu}", {"cases": results}, args.out))


if __name__ == "__main__":
    main()
