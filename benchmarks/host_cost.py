"""Host cost of a compiled call: what runs besides the compiled graph.

    python benchmarks/host_cost.py [--device cpu|cuda] [--out DIR]

1. A model with many parameters: a ResNet-50-sized `transformers.ResNetModel` (bottleneck,
   depths 3-4-6-3), input (1, 3, 32, 32), eval, no_grad. Its parameters and buffers are graph
   inputs (modules are guarded by type, never identity), so every call checks and fetches each.
   Timed: the entry's `check` (the guard that also hands on the graph's inputs, what a hit
   runs), with the tensors checked by one C++ TensorGuards call and by Python expressions
   (`config.cpp_tensor_guards`).
2. Regional compilation: one block of benchmarks/capture_transformer.py (dim 32), compiled on
   its own, with its compiled graph replaced by a stub that returns the graph's outputs: the
   time from the block's `__call__` to the graph and back (CompiledModule, the frame's cache,
   the guard, output handling), and the guard alone.
Medians of repeated rounds; results checked against eager. Writes host_cost_<device>.json.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import minicompile  # noqa: E402
from minicompile.bench import save_results  # noqa: E402


def per_call_us(fn, n, rounds=9):
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(times)


def entry_of(compiled_module):
    """(the newest entry of the compiled module's frame, the call as its guard takes it)."""
    cf = compiled_module._compiled_forward
    return next(iter(cf._frame.segments[(0, False)])), cf._func


def resnet(device):
    import transformers
    torch.manual_seed(0)
    model = transformers.ResNetModel(transformers.ResNetConfig(
        layer_type="bottleneck", depths=[3, 4, 6, 3], hidden_sizes=[256, 512, 1024, 2048]))
    model = model.to(device).eval()
    x = torch.randn(1, 3, 32, 32, device=device)
    out = {}
    for cpp in (True, False):
        minicompile.reset()
        with torch.no_grad(), minicompile.config.patch(cpp_tensor_guards=cpp):
            compiled = minicompile.compile(model)
            torch.testing.assert_close(compiled(x).last_hidden_state, model(x).last_hidden_state,
                                       rtol=1e-3, atol=1e-3)
            seg, func = entry_of(compiled)
            inputs = seg.check(func, (model, x), {})
            out["cpp TensorGuards" if cpp else "Python expressions"] = {
                "graph_inputs": len(inputs),
                "check_us": per_call_us(lambda: seg.check(func, (model, x), {}), 500),
            }
    return out


def regional_block(device):
    from capture_transformer import Block
    torch.manual_seed(0)
    block = Block(32, 4).to(device).eval()
    x = torch.randn(1, 4, 32, device=device)
    minicompile.reset()
    with torch.no_grad():
        compiled = minicompile.compile(block)
        torch.testing.assert_close(compiled(x), block(x))
        seg, func = entry_of(compiled)
        inputs = seg.check(func, (block, x), {})
        graph = seg.compiled
        outs = graph(*inputs)
        seg.compiled = lambda *args: outs             # the graph itself stubbed out
        try:
            host_us = per_call_us(lambda: compiled(x), 5000)
        finally:
            seg.compiled = graph
        check_us = per_call_us(lambda: seg.check(func, (block, x), {}), 5000)
    return {"block_call_host_us": host_us, "of_which_guard_us": check_us}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default=os.environ.get("OUT"))
    args = p.parse_args()
    results = {"resnet50": resnet(args.device), "regional_block": regional_block(args.device)}
    for name, r in results["resnet50"].items():
        print(f"ResNet-50, tensors checked by {name:19}: {r['graph_inputs']} graph inputs, "
              f"check {r['check_us']:7.1f} us")
    r = results["regional_block"]
    print(f"one transformer block: host path {r['block_call_host_us']:.2f} us (guard "
          f"{r['of_which_guard_us']:.2f} us)")
    tag = "h100" if args.device == "cuda" and "H100" in torch.cuda.get_device_name() else args.device
    print("wrote", save_results(f"host_cost_{tag}", {
        "what": "per-call host cost: a ResNet-50's guard and input fetching; one regional "
                "transformer block's path around its compiled graph (benchmarks/host_cost.py)",
        "results": results}, args.out))


if __name__ == "__main__":
    main()
