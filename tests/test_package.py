"""minicompile.export / save / load: one whole graph compiled ahead, saved, and run by another
process without capture, lowering or code generation, giving eager's results."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import minicompile
from conftest import DEVICE, kernel_backends


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.norm = torch.nn.Linear(24, 24), torch.nn.LayerNorm(24)

    def forward(self, x, y):
        h = torch.nn.functional.gelu(self.norm(self.lin(x)))
        return {"out": h.softmax(-1) + y, "total": (h * y).sum()}


LOAD = textwrap.dedent("""
    import sys, torch, minicompile
    import minicompile.capture.trace as trace, minicompile.graph_compiler as gc, minicompile.codegen.wrapper as wr
    minicompile.config.cpu_backend = sys.argv[2]
    def forbidden(*a, **k):
        raise AssertionError("captured, lowered or generated again")
    trace.capture = trace.trace_segment = gc.lower = wr.build = forbidden
    run = minicompile.load(sys.argv[1])
    x, y = torch.load(sys.argv[3])
    torch.save(run(x, y), sys.argv[4])
    print(minicompile.metrics.graphs, minicompile.metrics.kernels)
""")


@pytest.mark.parametrize("backend", kernel_backends())
def test_a_saved_package_runs_in_another_process_as_eager(tmp_path, backend):
    minicompile.config.cpu_backend = backend
    torch.manual_seed(0)
    net = Net().to(DEVICE).eval()
    x, y = torch.randn(37, 24, device=DEVICE), torch.randn(37, 24, device=DEVICE)
    exported = minicompile.export(net, x, y)
    with torch.no_grad():
        for a, b in ((x, y), (torch.randn_like(x), torch.randn_like(y))):
            torch.testing.assert_close(exported(a, b), net(a, b), rtol=1e-4, atol=1e-5)
    minicompile.save(exported, tmp_path / "net.mcpkg")
    x2, y2 = torch.randn_like(x), torch.randn_like(y)
    torch.save((x2, y2), tmp_path / "inputs.pt")
    out = subprocess.run([sys.executable, "-c", LOAD, str(tmp_path / "net.mcpkg"), backend,
                          str(tmp_path / "inputs.pt"), str(tmp_path / "out.pt")],
                         capture_output=True, text=True, env={**os.environ, "MINICOMPILE_GRAPH_CACHE": "0"})
    assert out.returncode == 0, out.stderr[-3000:]
    graphs, kernels = map(int, out.stdout.split())
    assert graphs == 0 and kernels > 0                   # nothing captured; kernels loaded
    with torch.no_grad():
        torch.testing.assert_close(torch.load(tmp_path / "out.pt"), net(x2, y2), rtol=1e-4, atol=1e-5)


def test_a_package_checks_its_arguments_and_its_file(tmp_path):
    exported = minicompile.export(lambda a: (a.relu() * 2,), torch.randn(5, 3))
    with pytest.raises(ValueError, match=r"sizes \(4, 3\).*exported for sizes \(5, 3\)"):
        exported(torch.randn(4, 3))
    with pytest.raises(TypeError, match="takes 1 tensors, got 2"):
        exported(torch.randn(5, 3), torch.randn(5, 3))
    path = tmp_path / "p.mcpkg"
    minicompile.save(exported, path)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ValueError, match="not a whole minicompile package"):
        minicompile.load(path)


def test_export_names_the_break_and_refuses_what_it_cannot_package():
    def breaks(x):
        y = x * 2
        print("a graph break")
        return y + 1
    with pytest.raises(minicompile.Unsupported, match="print"):
        minicompile.export(breaks, torch.randn(3))

    def writes(x):
        x.add_(1)
        return x * 2
    with pytest.raises(NotImplementedError, match="compute values only"):
        minicompile.export(writes, torch.randn(3))
