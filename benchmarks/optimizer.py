"""The optimizer step: eager (foreach and for-loop), torch.compile and minicompile, in one run.

    python benchmarks/optimizer.py [--device cpu|cuda] [--repeat N] [--out DIR]

Each candidate steps its own copy of the same parameters and gradients, for the book's GPT
block and MLP (benchmarks/models.py): AdamW (lr 1e-3, weight decay 0.01) and SGD with momentum.
For each: the median time of a step after warm-up (CUDA events on a GPU; the steps are queued
back to back, so the host's launch work counts where it is the bottleneck), the first call
(compilation included), the kernels one step launches (counted by torch.profiler on a GPU)
and the parameters checked against eager's foreach step after the timed steps. Then the
published claim's setting: a whole training step (forward, backward, AdamW) of the GPT block,
its optimizer step eager or compiled. Writes optimizer_<device>.json to --out, else $OUT, else
benchmarks/results/.
"""
import argparse
import copy
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(__file__))
import cold_caches  # noqa: E402,F401  (before torch: first calls in this run are cold)

import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import minicompile  # noqa: E402
import models as book  # noqa: E402
from minicompile import bench  # noqa: E402

OPTIMIZERS = {
    "adamw": lambda params, **kw: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, **kw),
    "sgd_momentum": lambda params, **kw: torch.optim.SGD(params, lr=1e-3, momentum=0.9, **kw),
}
CANDIDATES = ["eager foreach", "eager for-loop", "torch.compile", "minicompile"]


def _candidate(name, params, make_opt):
    """(optimizer, step function) of one candidate."""
    opt = make_opt(params, foreach=(name != "eager for-loop"))
    if name.startswith("eager"):
        return opt, opt.step
    if name == "torch.compile":
        return opt, torch.compile(lambda: opt.step(), fullgraph=False)
    return opt, minicompile.compile(lambda: opt.step())


def _kernels_per_step(step, device) -> int | None:
    if device != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and "memcpy" not in e.name.lower() and "memset" not in e.name.lower())


def optimizer_steps(model_name, device, repeat) -> dict:
    model, _ = book.model_and_input(model_name, device, scale=1.0 if device == "cuda" else 0.05)
    torch.manual_seed(1)
    grads = [torch.randn_like(p) for p in model.parameters()]
    out = {"parameters": sum(p.numel() for p in model.parameters()),
           "tensors": len(grads), "optimizers": {}}
    for opt_name, make_opt in OPTIMIZERS.items():
        records, final = {}, {}
        for name in CANDIDATES:
            params = [torch.nn.Parameter(p.detach().clone()) for p in model.parameters()]
            for p, g in zip(params, grads):
                p.grad = g.clone()
            opt, step = _candidate(name, params, make_opt)
            first = bench.first_call_seconds(step)
            times = bench.time_calls(step, warmup=5, repeat=repeat, device=device)
            records[name] = {"first_call_s": first, "median_ms": statistics.median(times),
                             "kernels_per_step": _kernels_per_step(step, device)}
            final[name] = params
            print(f"{model_name} {opt_name} {name}: {records[name]['median_ms']:.3f} ms, "
                  f"{records[name]['kernels_per_step']} kernels, first {first:.2f} s", flush=True)
        # every candidate took the same number of steps from the same start
        for name in CANDIDATES[1:]:
            for a, b in zip(final["eager foreach"], final[name]):
                torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
        base = records["eager foreach"]["median_ms"]
        for r in records.values():
            r["speedup"] = base / r["median_ms"]
        out["optimizers"][opt_name] = records
    return out


def training_steps(device, repeat) -> dict:
    """Forward, backward and AdamW on the GPT block (compiled by torch.compile, as in the
    claim), the optimizer step eager or compiled by each compiler."""
    model, x = book.model_and_input("gpt_block", device, scale=0.25 if device == "cuda" else 0.02)
    model.train()
    out = {"input_shape": list(x.shape), "records": {}}
    for name in ("eager optimizer", "torch.compile optimizer", "minicompile optimizer"):
        m = copy.deepcopy(model)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
        compiled_model = torch.compile(m)
        step = {"eager optimizer": opt.step,
                "torch.compile optimizer": torch.compile(lambda: opt.step(), fullgraph=False),
                "minicompile optimizer": minicompile.compile(lambda: opt.step())}[name]

        def train_step():
            compiled_model(x).square().mean().backward()
            step()
            opt.zero_grad(set_to_none=True)
        train_step()
        ms = bench.median_ms(train_step, warmup=3, repeat=repeat, device=device)
        out["records"][name] = {"median_ms": ms, "steps_per_s": 1e3 / ms}
        print(f"training step, {name}: {ms:.3f} ms ({1e3 / ms:.1f} steps/s)", flush=True)
    base = out["records"]["eager optimizer"]["steps_per_s"]
    for r in out["records"].values():
        r["speedup"] = r["steps_per_s"] / base
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--out", default=os.environ.get("OUT"))
    args = parser.parse_args()
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    payload = {"environment": bench.environment(),
               "method": __doc__.split("\n\n", 2)[2].strip(),
               "models": {name: optimizer_steps(name, args.device, args.repeat) for name in ("gpt_block", "mlp")},
               "training_step": training_steps(args.device, max(10, args.repeat // 3))}
    device = "cpu" if args.device == "cpu" else torch.cuda.get_device_name().split()[1].lower()
    path = bench.save_results(f"optimizer_{device}", payload, args.out)
    print("wrote", path)


if __name__ == "__main__":
    main()
