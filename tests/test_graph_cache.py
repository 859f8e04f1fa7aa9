"""The whole-graph cache (runtime/cache.py): a graph compiled by one process is loaded by the
next without lowering, fusion or code generation, gives eager's results, and survives a
corrupted entry. Each case runs in fresh processes that share one cache directory."""
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import DEVICE, kernel_backends

PROGRAM = textwrap.dedent("""
    import os, sys, warnings
    import torch, minicompile
    import minicompile.lower, minicompile.graph_compiler as gc
    minicompile.config.cpu_backend = os.environ["BACKEND"]
    if os.environ.get("FORBID_LOWERING"):          # a hit must not lower, fuse or generate
        def forbidden(*a, **k):
            raise AssertionError("lowered again")
        gc.lower = forbidden

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.norm = torch.nn.Linear(24, 24), torch.nn.LayerNorm(24)
        def forward(self, x):
            out = torch.nn.functional.gelu(self.norm(self.lin(x))).softmax(-1) + x, x.sum(0)
            if os.environ.get("ATEN_OP"):          # an op the code names as an OpOverload
                out = out[0] + torch.ops.aten.cumsum.default(x, 0), out[1]
            return out

    torch.manual_seed(0)
    block = Block().to(os.environ["DEVICE"]).eval()
    compiled = minicompile.compile(block)
    x = torch.randn(int(os.environ.get("ROWS", 37)), 24, device=os.environ["DEVICE"])
    with torch.no_grad(), warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for got, want in zip(compiled(x), block(x)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    info = minicompile.cache_info()
    print(info["hits"], info["misses"], info["stores"], info["corrupted"], minicompile.metrics.kernels,
          sum("corrupted" in str(w.message) for w in said))
""")


def run(tmp_path, backend, **env):
    full = {**os.environ, "MINICOMPILE_CACHE_DIR": str(tmp_path), "MINICOMPILE_GRAPH_CACHE": "1",
            "BACKEND": backend, "DEVICE": DEVICE, **env}
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=full)
    assert out.returncode == 0, out.stderr[-3000:]
    return [int(v) for v in out.stdout.split()]


@pytest.fixture(params=kernel_backends())
def backend(request):
    return request.param


def test_a_later_process_loads_the_graph_without_compiling_it(tmp_path, backend):
    hits, misses, stores, _, kernels, _ = run(tmp_path, backend)
    assert (hits, misses, stores) == (0, 1, 1) and kernels > 0
    # the same graph in a new process: loaded, not lowered (lowering would raise), same kernels
    assert run(tmp_path, backend, FORBID_LOWERING="1") == [1, 0, 0, 0, kernels, 0]
    # other sizes are another graph
    assert run(tmp_path, backend, ROWS="5")[:3] == [0, 1, 1]
    assert not [f for f in os.listdir(tmp_path / "graphs") if f.endswith(".tmp")]


def test_a_graph_calling_an_aten_op_is_stored(tmp_path, backend):
    """An extern call of an ATen op (torch.ops.aten.cumsum.default, as training graphs are
    made of) is named in the code: held as a constant, it could not be pickled."""
    hits, misses, stores, _, kernels, _ = run(tmp_path, backend, ATEN_OP="1")
    assert (hits, misses, stores) == (0, 1, 1)
    assert run(tmp_path, backend, ATEN_OP="1", FORBID_LOWERING="1") == [1, 0, 0, 0, kernels, 0]


def test_a_corrupted_entry_is_rebuilt_and_said_once(tmp_path, backend):
    run(tmp_path, backend)
    (entry,) = (tmp_path / "graphs").iterdir()
    entry.write_bytes(entry.read_bytes()[:200])                 # truncated
    hits, misses, stores, corrupted, _, warned = run(tmp_path, backend)
    assert (hits, misses, stores, corrupted, warned) == (0, 1, 1, 1, 1)
    assert run(tmp_path, backend, FORBID_LOWERING="1")[:4] == [1, 0, 0, 0]


def test_the_cache_can_be_turned_off(tmp_path, backend):
    run(tmp_path, backend)
    assert run(tmp_path, backend, MINICOMPILE_GRAPH_CACHE="0")[:3] == [0, 0, 0]


def test_the_key_names_what_the_code_depends_on():
    import torch
    import minicompile
    from minicompile.runtime import cache

    gm = torch.fx.symbolic_trace(lambda x: torch.relu(x) * 2)
    key = cache.graph_key(gm, [torch.randn(4, 5)])
    assert key == cache.graph_key(gm, [torch.randn(4, 5)])                  # values do not matter
    assert key != cache.graph_key(gm, [torch.randn(4, 6)])
    assert key != cache.graph_key(gm, [torch.randn(4, 5, dtype=torch.float64)])
    assert key != cache.graph_key(gm, [torch.randn(5, 4).t()])
    with minicompile.config.patch(cpu_backend="triton"):
        assert key != cache.graph_key(gm, [torch.randn(4, 5)])
    # the default dtype: `torch.ones(3)` and `2.5 * int_tensor` are made in it, the graph's
    # text the same (after torch.set_default_dtype(torch.float64), float32 code was loaded)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert key != cache.graph_key(gm, [torch.randn(4, 5, dtype=torch.float32)])
    finally:
        torch.set_default_dtype(default)

    def local(x):
        return x + 1
    gm = torch.fx.symbolic_trace(lambda x: local(x) if False else x)
    gm.graph.call_function(local, (next(iter(gm.graph.nodes)),))
    with pytest.raises(cache.NotCacheable, match="no name"):
        cache.graph_key(gm, [torch.randn(3)])


def test_a_graph_with_a_zero_dim_constant_has_a_key():
    """A graph's constants are hashed by their bytes; a 0-dim one (the scale DeBERTa's training
    graph holds as a tensor) too."""
    import torch
    import torch.fx
    from minicompile.runtime import cache

    root = torch.nn.Module()
    root.scale = torch.tensor(2.5)
    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(torch.mul, (x, g.get_attr("scale"))))
    gm = torch.fx.GraphModule(root, g)
    key = cache.graph_key(gm, [torch.randn(4, 3)])
    root.scale = torch.tensor(3.5)
    assert len(key) == 32 and cache.graph_key(torch.fx.GraphModule(root, g), [torch.randn(4, 3)]) != key
