"""Column reductions on a GPU: minicompile's kernel under each tile setting, beside eager.

    python benchmarks/sweep_column_reductions.py [--out DIR]

A column reduction sums over rows that lie far apart in memory (a bias gradient: the sum over
a batch of rows of its output gradient). For the pair `(x * g).sum(0), g.sum(0)` (one fused
kernel, two inputs read) at four shapes, each (XBLOCK columns per program, RBLOCK rows per
step, warps) setting is compiled and timed as a CUDA graph replay (so the host's Python is not
timed, only the kernel), medians of 50 after warm-up, with eager's two reduce kernels timed the
same way. The setting `codegen/triton.py:_column_config` picks is marked. Writes
sweep_column_reductions_<device>.json to --out, else $OUT, else benchmarks/results/.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import minicompile  # noqa: E402
import minicompile.codegen.triton as triton_codegen  # noqa: E402
from minicompile import bench  # noqa: E402

SHAPES = [(8192, 768), (8192, 3072), (16384, 1024), (2048, 256)]
SETTINGS = [(xblock, tile // xblock, warps) for xblock in (8, 16, 32, 64, 128)
            for tile in (2048, 4096, 8192) for warps in (4, 8)]


def bias_gradients(x, g):
    return (x * g).sum(0), g.sum(0)


def graphed(fn, *args):
    """fn(*args) recorded once as a CUDA graph: a replay runs its kernels alone."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn(*args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(*args)
    return graph.replay


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT"))
    args = parser.parse_args()
    minicompile.config.graph_cache = False          # every setting compiled afresh
    chosen_rule = triton_codegen._column_config
    results = []
    for shape in SHAPES:
        x, g = torch.randn(*shape, device="cuda"), torch.randn(*shape, device="cuda")
        eager_us = 1e3 * bench.median_ms(graphed(bias_gradients, x, g), repeat=50, device="cuda")
        chosen = tuple(chosen_rule(shape[1], shape[0]))
        timed = []
        for setting in SETTINGS + ([chosen] if chosen not in SETTINGS else []):
            triton_codegen._column_config = lambda xnumel, rnumel, setting=setting: setting
            minicompile.reset()
            compiled = minicompile.compile(bias_gradients)
            for a, b in zip(compiled(x, g), bias_gradients(x, g)):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-2)
            us = 1e3 * bench.median_ms(graphed(compiled, x, g), repeat=50, device="cuda")
            timed.append({"xblock": setting[0], "rblock": setting[1], "num_warps": setting[2], "us": us})
        triton_codegen._column_config = chosen_rule
        best = min(timed, key=lambda r: r["us"])
        mine = next(r for r in timed if (r["xblock"], r["rblock"], r["num_warps"]) == chosen)
        results.append({"shape": list(shape), "eager_us": eager_us, "chosen": mine, "best": best,
                        "settings": timed})
        print(f"{shape}: eager {eager_us:.1f} us, chosen {chosen} {mine['us']:.1f} us, best "
              f"{(best['xblock'], best['rblock'], best['num_warps'])} {best['us']:.1f} us", flush=True)
    device = torch.cuda.get_device_name().split()[1].lower()
    path = bench.save_results(f"sweep_column_reductions_{device}",
                              {"environment": bench.environment(), "method": __doc__.split("\n\n", 2)[2].strip(),
                               "results": results}, args.out)
    print("wrote", path)


if __name__ == "__main__":
    main()
