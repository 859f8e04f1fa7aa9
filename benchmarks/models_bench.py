"""Whole models from the book (benchmarks/models.py): eager vs torch.compile vs minicompile.

    python benchmarks/models_bench.py [--device cpu|cuda] [--scale S] [--out DIR]

Inference (no_grad), fp32 (TF32 matmuls on a GPU, for all three). For each model, in one run:
first call (compile + run, with empty compile caches made for this run; minicompile's before
torch.compile's, so what a first call warms in the process helps torch.compile's), medians of the
steady state (CUDA events on a GPU), speedups over eager, and the kernels each compiler generated.
Writes models_<cpu|h100|...>.json.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import cold_caches  # noqa: E402,F401  (before torch: first calls in this run are cold)

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import minicompile  # noqa: E402
import models  # noqa: E402
from minicompile import bench  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--scale", type=float, default=None, help="batch scale (default 1 on GPU, 1/16 on CPU)")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    scale = args.scale or (1.0 if args.device == "cuda" else 1 / 16)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    from torch._inductor import metrics as inductor_metrics

    results = {}
    for name in ["mlp", "cnn", "gpt_block"]:
        model, x = models.model_and_input(name, args.device, scale=scale)
        torch._dynamo.reset()
        minicompile.reset()
        minicompile.metrics.reset()
        inductor_metrics.reset()
        with torch.no_grad():
            fns = {"eager": model, "minicompile": minicompile.compile(model), "torch.compile": torch.compile(model)}
            records = bench.compare(fns, [x], repeat=args.repeat, rtol=1e-3, atol=1e-3)
        results[name] = {"input_shape": list(x.shape), "records": records,
                         "kernels": {"torch.compile": inductor_metrics.generated_kernel_count,
                                     "minicompile": minicompile.metrics.kernels},
                         "minicompile_graphs": minicompile.metrics.graphs,
                         "minicompile_graph_breaks": minicompile.metrics.graph_breaks}
    out_name = "models_cpu" if args.device == "cpu" else "models_" + torch.cuda.get_device_name().split()[1].lower()
    path = bench.save_results(out_name, {"precision": "fp32 (TF32 matmuls on GPU)", "mode": "inference, no_grad",
                                         "models": results}, directory=args.out)
    print(f"wrote {path}")
    print(f"{'model':<10}{'eager ms':>10}{'t.c ms':>9}{'mini ms':>9}{'t.c x':>7}{'mini x':>7}"
          f"{'t.c first s':>12}{'mini first s':>13}{'kernels t.c/mini':>18}")
    for name, r in results.items():
        rec = r["records"]
        print(f"{name:<10}{rec['eager']['median_ms']:>10.3f}{rec['torch.compile']['median_ms']:>9.3f}"
              f"{rec['minicompile']['median_ms']:>9.3f}{rec['torch.compile']['speedup']:>7.2f}"
              f"{rec['minicompile']['speedup']:>7.2f}{rec['torch.compile']['first_call_s']:>12.2f}"
              f"{rec['minicompile']['first_call_s']:>13.2f}"
              f"{r['kernels']['torch.compile']:>9}/{r['kernels']['minicompile']}")


if __name__ == "__main__":
    main()
