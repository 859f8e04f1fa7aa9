"""Inputs and comparisons for tests: fresh random values, awkward layouts, eager as reference."""
import torch

from conftest import DEVICE


def randn(*shape, dtype=torch.float32, device=DEVICE, layout="contiguous"):
    """Fresh random values (never zeros). layout: 'contiguous', 'transposed' (a non-contiguous
    view of a tensor of the transposed shape), 'strided' (every other column)."""
    if layout == "transposed":
        return torch.randn(*shape[::-1], dtype=dtype, device=device).transpose(0, -1)
    if layout == "strided":
        full = torch.randn(*shape[:-1], shape[-1] * 2, dtype=dtype, device=device)
        return full[..., ::2]
    return torch.randn(*shape, dtype=dtype, device=device)


def tolerances(dtype):
    """float32: 1e-4, loose enough for a sum of ten thousand terms taken in another order than
    eager's, tight enough that any indexing or fusion error (errors of order 1) fails."""
    return {torch.float16: dict(rtol=2e-3, atol=2e-3), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}.get(
        dtype, dict(rtol=1e-4, atol=1e-4))


def assert_same(actual, expected, dtype=torch.float32):
    torch.testing.assert_close(actual, expected, **tolerances(dtype))


def graph_counter():
    """(backend, graphs): a torch.compile backend that records each graph it is given and runs
    it as is, for counting torch.compile's compiles."""
    graphs = []

    def counter(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    return counter, graphs
