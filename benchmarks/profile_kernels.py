"""Where a model's GPU time goes: per-kernel device time of eager, torch.compile and minicompile,
side by side, and each one's host time per call.

    python benchmarks/profile_kernels.py --models bert_base,gpt2 [--train] [--out DIR]

Models are real_models.py's (inference) or training.py's (--train: a whole SGD step). For each
compiler: the calls' median device time (CUDA events), the host time to enqueue one call, and
torch.profiler's device time per kernel name, summed over a few calls and divided by their
number, grouped into matrix products (cuBLAS, CUTLASS, cuDNN), generated kernels (Triton) and
the rest. The tables go to stdout and, with minicompile's generated code, to DIR. A debugging
aid for a GPU machine: the numbers are not committed results.
"""
import argparse
import collections
import contextlib
import copy
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import minicompile  # noqa: E402
import real_models  # noqa: E402
import training  # noqa: E402


def category(name: str) -> str:
    lowered = name.lower()
    # first: Inductor's kernel names say what they fused ("convolution", "attention")
    if lowered.startswith(("triton", "kernel", "combo_kernel", "mc_")) or "triton" in lowered:
        return "generated (Triton)"
    if any(k in lowered for k in ("gemm", "nvjet", "cutlass", "sm90_", "sm80_", "cublas", "xmma", "cudnn",
                                  "conv", "implicit_convolve", "flash", "fmha", "attention", "efficient")):
        return "library (matmul, conv, attention)"
    return "other (PyTorch's own kernels, copies)"


def device_ms(fn, x, repeat=20):
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeat)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeat)]
    for s, e in zip(starts, ends):
        s.record()
        fn(x)
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def host_us(fn, x, repeat=20):
    """Time to enqueue one call, with the GPU kept ahead of it (a full queue would block)."""
    times = []
    for _ in range(repeat):
        torch.cuda.synchronize()
        torch.cuda._sleep(20_000_000)          # ~10 ms of GPU work ahead: enqueue is not throttled
        t0 = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def kernel_table(fn, x, calls=5):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(x)
        torch.cuda.synchronize()
    per_name = collections.defaultdict(lambda: [0.0, 0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            per_name[event.name][0] += event.device_time / 1000 / calls      # ms per call
            per_name[event.name][1] += 1 / calls
    return per_name


def report(name, fns, x, out_dir, top=25):
    lines = [f"==== {name} ===="]
    tables = {}
    for label, fn in fns.items():
        for _ in range(3):
            fn(x)
        torch.cuda.synchronize()
        dev, host = device_ms(fn, x), host_us(fn, x)
        tables[label] = table = kernel_table(fn, x)
        by_cat = collections.defaultdict(lambda: [0.0, 0.0])
        for k, (ms, n) in table.items():
            by_cat[category(k)][0] += ms
            by_cat[category(k)][1] += n
        total = sum(ms for ms, _ in table.values())
        lines.append(f"-- {label}: {dev:.3f} ms a call (events), host {host:.0f} us to enqueue, "
                     f"kernels {total:.3f} ms in {sum(n for _, n in table.values()):.0f} launches")
        for cat, (ms, n) in sorted(by_cat.items(), key=lambda kv: -kv[1][0]):
            lines.append(f"     {cat:<40} {ms:8.3f} ms {n:6.0f} launches")
        for k, (ms, n) in sorted(table.items(), key=lambda kv: -kv[1][0])[:top]:
            lines.append(f"     {ms:8.3f} ms {n:5.0f}x  {k[:150]}")
    text = "\n".join(lines)
    print(text, flush=True)
    if out_dir:
        with open(os.path.join(out_dir, f"profile_{name}.txt"), "w") as f:
            f.write(text + "\n")


def profile_one(name, args):
    torch.manual_seed(0)
    torch._dynamo.reset()
    minicompile.reset()
    code = contextlib.nullcontext()
    if args.code and args.out:
        code = contextlib.redirect_stdout(open(os.path.join(args.out, f"code_{name}.txt"), "w"))
    if args.train:
        model, x = training.GPU_MODELS[name]("cuda")
        model.train()
        if hasattr(model, "config"):
            model.config.use_cache = False
        copies = {k: copy.deepcopy(model) for k in ("eager", "torch.compile", "minicompile")}
        compiled = {"eager": copies["eager"], "torch.compile": torch.compile(copies["torch.compile"]),
                    "minicompile": minicompile.compile(copies["minicompile"])}
        fns = {k: training.training_step(copies[k], compiled[k]) for k in copies}
        with code:
            minicompile.set_logs(output_code=args.code)
            fns["minicompile"](x)
            minicompile.set_logs(output_code=False)
        report(name + "_train", fns, x, args.out, args.top)
    else:
        make_model, make_inputs = real_models.GPU_MODELS[name]
        model = make_model().cuda().eval()
        if hasattr(model, "config"):
            model.config.use_cache = False
        (x,) = make_inputs("cuda")
        theirs, ours = torch.compile(model), minicompile.compile(model)
        with torch.no_grad():
            with code:
                minicompile.set_logs(output_code=args.code)
                ours(x)
                minicompile.set_logs(output_code=False)
            report(name, {"eager": model, "torch.compile": theirs, "minicompile": ours}, x, args.out, args.top)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", required=True)
    parser.add_argument("--train", action="store_true")
    parser.add_argument("--out", default=os.environ.get("OUT"))
    parser.add_argument("--code", action="store_true", help="write minicompile's generated code to DIR")
    parser.add_argument("--top", type=int, default=25, help="how many kernels to list per compiler")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    for name in args.models.split(","):
        try:
            profile_one(name, args)
        except Exception:                        # one model's failure must not end the run
            import traceback
            traceback.print_exc()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
