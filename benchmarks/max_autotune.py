"""mode="max-autotune" beside the default mode, for torch.compile and minicompile, on a GPU.

    python benchmarks/max_autotune.py [--out DIR]

The book's MLP and GPT-style block (benchmarks/models.py), inference: eager, torch.compile
(default, max-autotune-no-cudagraphs, max-autotune) and minicompile (the same three), in one
run: first call (the compile) and median time per call after warm-up (bench.compare, CUDA
events), each result checked against eager. Writes max_autotune_<gpu>.json.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import cold_caches  # noqa: E402,F401  (before torch: first calls in this run are cold)

import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
import minicompile  # noqa: E402
from minicompile import bench  # noqa: E402
from models import model_and_input  # noqa: E402

MODES = ("default", "max-autotune-no-cudagraphs", "max-autotune")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT"))
    p.add_argument("--models", nargs="*", default=["mlp", "gpt_block"])
    args = p.parse_args()
    assert torch.cuda.is_available(), "max-autotune times kernels on a GPU"
    torch.backends.cuda.matmul.allow_tf32 = True
    results, choices = {}, {}
    with torch.no_grad():
        for name in args.models:
            model, x = model_and_input(name, "cuda")
            model = model.eval()
            torch._dynamo.reset()
            minicompile.reset()
            fns = {"eager": model}
            for mode in MODES:
                fns[f"torch.compile {mode}"] = torch.compile(model, mode=mode)
            for mode in MODES:
                fns[f"minicompile {mode}"] = minicompile.compile(model, mode=mode)
            # TF32 matrix products (and templates that sum in other orders): checked loosely
            minicompile.metrics.reset()
            results[name] = bench.compare(fns, [x], repeat=100, warmup=10, rtol=2e-2, atol=2e-2)
            # what max-autotune timed for its matrix-product templates (the first mode's compile)
            templates = list(minicompile.metrics.template_choices)
            for choice in templates:
                print(f"{name:10s} template {choice['sizes']} {choice['template_ms'] * 1e3:.1f} us against "
                      f"{choice['pytorch_ms'] * 1e3:.1f} us -> {choice['chosen']}")
            for label, r in results[name].items():
                print(f"{name:10s} {label:42s} first call {r['first_call_s']:7.2f} s  "
                      f"{r['median_ms'] * 1e3:9.1f} us  {r['speedup']:5.2f}x", flush=True)
            choices[name] = templates
    gpu = "h100" if "H100" in torch.cuda.get_device_name() else "gpu"
    print("wrote", bench.save_results(f"max_autotune_{gpu}", {"models": results,
                                                                 "minicompile_template_choices": choices}, args.out))


if __name__ == "__main__":
    main()
