"""Capture cost: minicompile's bytecode capture against TorchDynamo's, on a 12-layer transformer.

Both trace the same plain-PyTorch model (nn.Module blocks: LayerNorm, attention through
F.scaled_dot_product_attention, MLP) into one FX graph, without compiling kernels:
  - minicompile: `minicompile.capture.capture(model.forward, (x,), {})` (graph + guard);
  - Dynamo: the first call of `torch.compile(model, backend="eager")` after
    `torch._dynamo.reset()` (trace + guards + the eager backend, which just runs the graph;
    so Dynamo's number includes one eager forward, measured separately and reported).
Several repeats of each, interleaved, medians. Writes benchmarks/results/capture_transformer_<tag>.json.

    python benchmarks/capture_transformer.py [--repeats 5] [--tag cpu]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from minicompile.bench import save_results
from minicompile.capture import capture


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=-1)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class MLP(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    def __init__(self, layers=12, dim=256, heads=4):
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)


def time_minicompile(model, x):
    t0 = time.perf_counter()
    cap = capture(model.forward, (x,), {})
    dt = time.perf_counter() - t0
    return dt, sum(1 for n in cap.gm.graph.nodes if n.op not in ("placeholder", "output", "get_attr"))


def time_dynamo(model, x):
    torch._dynamo.reset()
    nodes = []

    def counting_eager(gm, example_inputs):
        nodes.append(sum(1 for n in gm.graph.nodes if n.op not in ("placeholder", "output", "get_attr")))
        return gm.forward
    compiled = torch.compile(model, backend=counting_eager)
    t0 = time.perf_counter()
    compiled(x)
    dt = time.perf_counter() - t0
    return dt, sum(nodes), len(nodes)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--tag", default="cpu")
    a = p.parse_args()
    torch.manual_seed(0)
    model = Transformer(a.layers).eval()
    x = torch.randn(2, 64, 256)
    with torch.no_grad():
        # warm both paths once (imports, lazy initialization), then measure interleaved
        time_minicompile(model, x)
        time_dynamo(model, x)
        mc, dy, eager = [], [], []
        for _ in range(a.repeats):
            t, mc_nodes = time_minicompile(model, x)
            mc.append(t)
            t, dy_nodes, dy_graphs = time_dynamo(model, x)
            dy.append(t)
            t0 = time.perf_counter()
            model(x)
            eager.append(time.perf_counter() - t0)
        ref = model(x)
        cap = capture(model.forward, (x,), {})
        out = cap.build_output(cap.gm(*cap.get_inputs((x,), {})))
        torch.testing.assert_close(out, ref)
    med = {k: statistics.median(v) for k, v in (("minicompile_capture_s", mc),
                                                 ("dynamo_first_call_s", dy),
                                                 ("eager_forward_s", eager))}
    payload = {
        "model": f"{a.layers}-layer transformer, dim 256, 4 heads, input (2, 64, 256), no_grad",
        "repeats": a.repeats,
        "median": med,
        "all": {"minicompile_capture_s": mc, "dynamo_first_call_s": dy, "eager_forward_s": eager},
        "graph_nodes": {"minicompile": mc_nodes, "dynamo": dy_nodes},
        "dynamo_graphs": dy_graphs,
        "ratio_dynamo_over_minicompile": med["dynamo_first_call_s"] / med["minicompile_capture_s"],
    }
    path = save_results(f"capture_transformer_{a.tag}", payload)
    for k, v in med.items():
        print(f"{k:24s} {v * 1e3:9.1f} ms")
    print(f"graph nodes: minicompile {mc_nodes}, dynamo {dy_nodes} ({dy_graphs} graph(s))")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
