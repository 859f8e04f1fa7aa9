"""Debugging aid: the fusion log and kernel count of a book model, minicompile beside Inductor.
    python benchmarks/fusion_log.py [mlp|cnn|gpt_block] [scale]"""
import os
import sys

import torch
from torch._inductor import metrics as inductor_metrics

sys.path.insert(0, os.path.dirname(__file__))
import minicompile  # noqa: E402
import models  # noqa: E402

name = sys.argv[1] if len(sys.argv) > 1 else "gpt_block"
scale = float(sys.argv[2]) if len(sys.argv) > 2 else 1 / 64
device = "cuda" if torch.cuda.is_available() else "cpu"
model, x = models.model_and_input(name, device, scale=scale)
if name == "gpt_block":
    x = x[:, :32]
with torch.no_grad():
    inductor_metrics.reset()
    torch.compile(model)(x)
    minicompile.set_logs(fusion=True)
    minicompile.compile(model)(x)
    minicompile.set_logs(fusion=False)
print(f"{name} on {device}: minicompile {minicompile.metrics.kernels} kernels, "
      f"Inductor {inductor_metrics.generated_kernel_count}")
