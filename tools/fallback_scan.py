"""Which calls of the Hugging Face zoo's compiled graphs are still PyTorch's: every `# no
lowering for X` line of the generated host code, counted per op, with the models it came from.

    PYTHONPATH=$PWD python tools/fallback_scan.py                  # every model, inference
    PYTHONPATH=$PWD python tools/fallback_scan.py --train bert t5  # a training step of these
    PYTHONPATH=$PWD python tools/fallback_scan.py --show gpt2      # and each such line

The models are tests/hf_zoo.py's (tiny configurations, random weights). Inference runs under
no_grad in eval mode; --train runs a forward in train mode and a backward of the sum of its
outputs, so the backward graphs' calls are listed too. Extern kernels (matrix products,
convolutions, attention) are not listed: they are PyTorch's by design. A tuple item of an extern
call's result (`getitem`) is plain Python, listed all the same. A model that fails is reported
and the scan goes on.
"""
from __future__ import annotations

import argparse
import collections
import logging
import os
import re
import sys
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

import torch  # noqa: E402

import minicompile  # noqa: E402
from minicompile.codegen import wrapper  # noqa: E402


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="*", help="names from tests/hf_zoo.py (default: all)")
    p.add_argument("--train", action="store_true", help="a training step instead of inference")
    p.add_argument("--show", action="store_true", help="print each fallback line")
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    from hf_zoo import ZOO

    counts: collections.Counter = collections.Counter()
    where = collections.defaultdict(set)
    current = [None]
    build = wrapper.build

    def listing_build(*a, **k):
        graph = build(*a, **k)
        for line in graph.wrapper_source.splitlines():
            found = re.search(r"# no lowering for (.*)", line)
            if found:
                counts[found.group(1)] += 1
                where[found.group(1)].add(current[0])
                if args.show:
                    print(f"{current[0]}: {line.strip()[:200]}")
        return graph
    wrapper.build = listing_build          # (graph_compiler calls it as wrapper.build)
    minicompile.config.graph_cache = False  # every graph is built here, none loaded
    for name in args.models or list(ZOO):
        current[0] = name
        make_model, make_inputs = ZOO[name]
        torch.manual_seed(0)
        try:
            model = make_model().train(args.train)
            inputs, kwargs = make_inputs()
            compiled = minicompile.compile(model)
            if args.train:
                out = compiled(*inputs, **kwargs)
                leaves = [t for t in torch.utils._pytree.tree_leaves(out)
                          if isinstance(t, torch.Tensor) and t.requires_grad]
                sum(t.float().sum() for t in leaves).backward()
            else:
                with torch.no_grad():
                    compiled(*inputs, **kwargs)
        except Exception as err:  # noqa: BLE001 (one model's failure is reported, the scan goes on)
            print(f"{name}: failed: {type(err).__name__}: {str(err)[:150]}")
    for op, n in counts.most_common():
        print(f"{n:5d}  {op:45s} {', '.join(sorted(where[op]))}")
    if not counts:
        print("no PyTorch calls left but the extern kernels")


if __name__ == "__main__":
    main()
