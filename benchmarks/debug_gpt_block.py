"""Debugging aid for a GPU machine: where the host time of a compiled model's call goes.
    python benchmarks/debug_gpt_block.py [mlp|cnn|gpt_block]"""
import cProfile
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
import minicompile  # noqa: E402
import models  # noqa: E402

name = sys.argv[1] if len(sys.argv) > 1 else "mlp"
torch.backends.cuda.matmul.allow_tf32 = True
model, x = models.model_and_input(name, "cuda")
with torch.no_grad():
    for label, fn in [("eager", model), ("torch.compile", torch.compile(model)), ("minicompile", minicompile.compile(model))]:
        for _ in range(5):
            fn(x)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(100):
            fn(x)
        host = (time.perf_counter() - t0) / 100
        torch.cuda.synchronize()
        total = (time.perf_counter() - t0) / 100
        print(f"{label:14s} host {host * 1e6:7.1f} us/call, with device {total * 1e6:7.1f} us/call")
        if label == "minicompile":
            cProfile.run("for _ in range(100): fn(x)", "/tmp/prof")
            pstats.Stats("/tmp/prof").sort_stats("tottime").print_stats(12)
