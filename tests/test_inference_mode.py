"""torch.inference_mode() inside compiled code: a `with` block, a decorated function or
forward. The tensors the block makes are inference tensors in eager (no version counter, no
autograd history; writing one in place outside the mode raises): the compiled code's are too,
in one graph, and the mode is guarded as grad mode is."""
import pytest
import torch

import minicompile
from minicompile import metrics

torch.manual_seed(0)
LINEAR = torch.nn.Linear(7, 7)


def block_to_the_end(x):
    with torch.inference_mode():
        y = x.sin() + 1
        return y * 2, y[1:], x


def block_in_the_middle(x):
    z = LINEAR(x)
    with torch.inference_mode():
        inside = torch.is_inference_mode_enabled()
        y = z.sin() + 1
    return (z * 2).sum(), y, y.t(), y + z, inside, torch.is_inference_mode_enabled()


@torch.inference_mode()
def decorated(x):
    return LINEAR(x).cos() * 3, x


class DecoratedForward(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(7, 5)

    @torch.inference_mode()
    def forward(self, x):
        return self.linear(x).relu()


def _same(got, expected):
    got = got if isinstance(got, tuple) else (got,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        if not isinstance(e, torch.Tensor):
            assert g == e
            continue
        torch.testing.assert_close(g, e)
        assert (g.is_inference(), g.requires_grad) == (e.is_inference(), e.requires_grad)
        if not e.is_inference():
            assert g._version == e._version or g is not e


@pytest.mark.parametrize("fn", [block_to_the_end, block_in_the_middle, decorated, DecoratedForward()],
                         ids=["block_to_the_end", "block_in_the_middle", "decorated", "decorated_forward"])
def test_inference_mode_block_compiles_to_one_graph_with_eagers_tensors(fn):
    metrics.reset()
    compiled = minicompile.compile(fn)
    x = torch.randn(13, 7)[::2].requires_grad_()       # (every other row: not contiguous)
    for _ in range(2):
        _same(compiled(x), fn(x))
    assert (metrics.graphs, metrics.graph_breaks) == (1, 0)
    assert metrics.kernels > 0
    got, expected = compiled(x), fn(x)
    first = lambda r: r[0] if isinstance(r, tuple) else r      # noqa: E731
    for t in (first(got), first(expected)):       # eager's error for both, or neither
        try:
            t.add_(1)
            raised = None
        except RuntimeError as e:
            raised = str(e)
        assert raised == (None if not first(expected).is_inference() else raised)
    assert not torch.is_inference_mode_enabled()


def test_outputs_of_the_block_share_memory_as_eagers_and_the_rest_gets_gradients():
    compiled = minicompile.compile(block_in_the_middle)
    x = torch.randn(4, 7, requires_grad=True)
    got, expected = compiled(x), block_in_the_middle(x)
    _same(got, expected)
    assert got[1].data_ptr() == got[2].data_ptr()             # y and y.t(): one tensor's memory
    got[0].backward()
    grad, x.grad = x.grad, None
    expected[0].backward()
    torch.testing.assert_close(grad, x.grad)


def test_a_tensor_of_the_block_saved_for_backward_raises_eagers_error():
    def saves_it(x, w):
        with torch.inference_mode():
            y = x * 2
        return y * w

    x, w = torch.randn(3), torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
        saves_it(x, w)
    with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
        minicompile.compile(saves_it)(x, w)
    assert not torch.is_inference_mode_enabled()


def test_a_break_inside_the_block_runs_the_frame_eagerly_and_leaves_the_mode_as_it_was():
    def breaks_inside(x):
        with torch.inference_mode():
            y = x * 2
            print("", end="")
            return y + 1

    x = torch.randn(3, requires_grad=True)
    got = minicompile.compile(breaks_inside)(x)
    _same(got, breaks_inside(x))
    assert not torch.is_inference_mode_enabled() and torch.is_grad_enabled()


def test_calls_under_no_grad_and_under_inference_mode_are_guarded_apart():
    def double(x):
        return x * 2

    metrics.reset()
    compiled = minicompile.compile(double)
    x = torch.randn(3)
    for mode in (torch.no_grad, torch.inference_mode, torch.no_grad):
        with mode():
            got, expected = compiled(x), double(x)
        _same(got, expected)
    assert metrics.graphs == 2


def test_inference_mode_false_and_as_a_decorator_made_in_the_frame_run_as_eager():
    def mode_off(x):
        with torch.inference_mode(False):
            return x * 2

    def decorates(x):
        return torch.inference_mode()(lambda t: t + 1)(x)

    x = torch.randn(3)
    for fn in (mode_off, decorates):
        with torch.inference_mode():
            _same(minicompile.compile(fn)(x), fn(x))
        _same(minicompile.compile(fn)(x), fn(x))


def _rows_where(h, mask):
    rows = torch.where(mask)[0]
    return (h[rows] * 2).sum(0), torch.argwhere(mask).shape[0]


def test_ops_made_of_others_are_watched_under_inference_mode():
    """Under inference mode an op made of others reaches the capture's watch whole
    (torch.where(mask), argwhere: of nonzero, whose size depends on the mask's values): the
    trace must see its parts, as it does elsewhere, or a graph would keep one mask's size."""
    compiled = minicompile.compile(_rows_where)
    for n in (14, 22):
        h = torch.randn(n, 8)
        for p in (0.3, 0.6):
            mask = torch.rand(n) < p
            with torch.inference_mode():
                got, expected = compiled(h, mask), _rows_where(h, mask)
            torch.testing.assert_close(got[0], expected[0])
            assert got[1] == expected[1]


def _relative_coordinates(x):
    coords = torch.flatten(torch.stack(torch.meshgrid(torch.arange(3), torch.arange(4), indexing="ij")), 1)
    relative = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0).contiguous()
    relative[:, :, 0] += 2                          # (BEiT's relative position index)
    relative[:, :, 1] *= 3
    return x + relative.sum(-1)[:, :1]


def test_a_slice_written_in_place_under_inference_mode_stays_in_the_graph():
    """An inference tensor's views are not tracked (no _base): the region `r[:, :, 0] += 2`
    writes is still the slice, not the whole of r (a break per call before)."""
    x = torch.randn(12, 1)
    metrics.reset()
    with torch.inference_mode():
        got, expected = minicompile.compile(_relative_coordinates)(x), _relative_coordinates(x)
    torch.testing.assert_close(got, expected)
    assert (metrics.graphs, metrics.graph_breaks) == (1, 0)
