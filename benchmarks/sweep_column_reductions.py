"""Column reductions on a GPU: minicompile's kernel under each tile setting, beside eager.

    python benchmarks/sweep_column_reductions.py [--split] [--out DIR]

A column reduction sums over rows that lie far apart in memory (a bias gradient: the sum over
a batch of rows of its output gradient). For the pair `(x * g).sum(0), g.sum(0)` (one fused
kernel, two inputs read) at four shapes, each (XBLOCK columns per program, RBLOCK rows per
step, warps) setting is compiled and timed as a CUDA graph replay (so the host's Python is not
timed, only the kernel), medians of 50 after warm-up, with eager's two reduce kernels timed the
same way. The setting `codegen/triton.py:_column_config` picks is marked. Writes
sweep_column_reductions_<device>.json to --out, else $OUT, else benchmarks/results/.

With --split, the same pair at the shapes of a ResNet-50's batch norms at batch 32 (its
backward sums: rows N * H * W of a channels-last tensor, a column per channel) and the four
above, each cut into 1 (no split), 8, 32, 128 or 512 pieces (`lowerings._split_factor`) and
reduced under three tile settings, beside the pieces and setting minicompile picks, eager, and
torch.compile (its kernels graphed the same way). Writes sweep_split_columns_<device>.json.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import minicompile  # noqa: E402
import minicompile.codegen.triton as triton_codegen  # noqa: E402
import minicompile.lower.lowerings as lowerings  # noqa: E402
from minicompile import bench  # noqa: E402

SHAPES = [(8192, 768), (8192, 3072), (16384, 1024), (2048, 256)]
SETTINGS = [(xblock, tile // xblock, warps) for xblock in (8, 16, 32, 64, 128)
            for tile in (2048, 4096, 8192) for warps in (4, 8)]
SPLIT_SHAPES = [(32 * 112 * 112, 64), (32 * 56 * 56, 256), (32 * 28 * 28, 512), (32 * 14 * 14, 1024)] + SHAPES[:3]
SPLIT_SETTINGS = [(8, 256, 8), (32, 64, 8), (32, 8, 8)]


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
    parser.add_argument("--split", action="store_true", help="sweep the pieces of split column reductions")
    parser.add_argument("--out", default=os.environ.get("OUT"))
    args = parser.parse_args()
    minicompile.config.graph_cache = False          # every setting compiled afresh
    name, results = ("sweep_split_columns", sweep_split()) if args.split else ("sweep_column_reductions", sweep_tiles())
    device = torch.cuda.get_device_name().split()[1].lower()
    path = bench.save_results(f"{name}_{device}",
                              {"environment": bench.environment(), "method": _method(args.split), "results": results},
                              args.out)
    print("wrote", path)


def _method(split: bool) -> str:
    paragraphs = __doc__.split("\n\n")
    return paragraphs[3 if split else 2].strip()


def _timed(fn, x, g, repeat=50) -> float:
    for a, b in zip(fn(x, g), bias_gradients(x, g)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-2)
    return 1e3 * bench.median_ms(graphed(fn, x, g), repeat=repeat, device="cuda")


def sweep_tiles() -> list:
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
            us = _timed(minicompile.compile(bias_gradients), x, g)
            timed.append({"xblock": setting[0], "rblock": setting[1], "num_warps": setting[2], "us": us})
        triton_codegen._column_config = chosen_rule
        best = min(timed, key=lambda r: r["us"])
        mine = next(r for r in timed if (r["xblock"], r["rblock"], r["num_warps"]) == chosen)
        results.append({"shape": list(shape), "eager_us": eager_us, "chosen": mine, "best": best,
                        "settings": timed})
        print(f"{shape}: eager {eager_us:.1f} us, chosen {chosen} {mine['us']:.1f} us, best "
              f"{(best['xblock'], best['rblock'], best['num_warps'])} {best['us']:.1f} us", flush=True)
    return results


def sweep_split() -> list:
    split_rule, tile_rule = lowerings._split_factor, triton_codegen._column_config
    results = []
    for rows, cols in SPLIT_SHAPES:
        x, g = torch.randn(rows, cols, device="cuda"), torch.randn(rows, cols, device="cuda")
        eager_us = 1e3 * bench.median_ms(graphed(bias_gradients, x, g), repeat=50, device="cuda")
        torch._dynamo.reset()
        inductor_us = _timed(torch.compile(bias_gradients), x, g)
        minicompile.reset()
        chosen_us = _timed(minicompile.compile(bias_gradients), x, g)
        pieces = split_rule(cols, rows, True)
        timed = []
        for p in (0, 8, 32, 128, 512):
            if rows % max(p, 1) or rows // max(p, 1) < 64:
                continue
            for setting in SPLIT_SETTINGS:
                lowerings._split_factor = lambda r, n, columns=False, p=p: p if columns else split_rule(r, n, columns)
                triton_codegen._column_config = lambda xnumel, rnumel, setting=setting: setting
                minicompile.reset()
                us = _timed(minicompile.compile(bias_gradients), x, g, repeat=30)
                timed.append({"pieces": p, "xblock": setting[0], "rblock": setting[1], "num_warps": setting[2],
                              "us": us})
            lowerings._split_factor, triton_codegen._column_config = split_rule, tile_rule
        best = min(timed, key=lambda r: r["us"])
        results.append({"shape": [rows, cols], "eager_us": eager_us, "torch_compile_us": inductor_us,
                        "chosen": {"pieces": pieces, "us": chosen_us}, "best": best, "settings": timed})
        print(f"{rows} x {cols}: eager {eager_us:.1f} us, torch.compile {inductor_us:.1f}, chosen {pieces} pieces "
              f"{chosen_us:.1f}, best {best}", flush=True)
    return results


if __name__ == "__main__":
    main()
