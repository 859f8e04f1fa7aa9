"""The runtime modes and switches: minicompile.disable, compile(disable=True), mode="reduce-overhead"
(CUDA graphs on a GPU; on a CPU the default path, said in the `cudagraphs` log)."""
import contextlib
import copy
import io

import pytest
import torch

import minicompile
from conftest import DEVICE

needs_cuda = pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs need a GPU")
# replays even where the default path is faster (the tests are about what a replay does)
ALWAYS_REPLAY = {"cudagraph_keep_faster": False}


def logged(artifact, fn, *args):
    """fn(*args) with one log artifact on: (result, what was logged)."""
    out = io.StringIO()
    minicompile.set_logs(**{artifact: True})
    try:
        with contextlib.redirect_stdout(out):
            result = fn(*args)
    finally:
        minicompile.set_logs(**{artifact: False})
    return result, out.getvalue()


# --------------------------------------------------------------------------- disable

def test_disabled_function_breaks_the_graph_and_runs_as_python():
    seen = []

    @minicompile.disable
    def helper(x):
        seen.append(type(x))                # a real tensor: the call is not traced
        return float(x.numpy().sum())

    def f(x):
        y = x * 2
        return y + helper(y)

    x = torch.randn(5)
    explained = minicompile.explain(f)(x)
    assert explained.graph_count == 2 and explained.graph_break_count == 1
    assert "marked with minicompile.disable" in str(explained.break_reasons[0])
    compiled = minicompile.compile(f)
    for _ in range(2):
        torch.testing.assert_close(compiled(x), f(x))
    assert all(t is torch.Tensor for t in seen)


def test_disable_with_a_reason_and_torch_compiler_disable_are_honoured():
    @minicompile.disable(reason="calls a C library")
    def lib(x):
        return x + 1

    assert "(calls a C library)" in str(minicompile.explain(lambda x: lib(x) * 2)(torch.randn(3)).break_reasons[0])
    marked = torch.compiler.disable(lambda x: x.numpy().sum())
    f = lambda x: x * 2 + float(marked(x))          # noqa: E731
    x = torch.randn(4)
    assert "torch.compiler.disable" in str(minicompile.explain(f)(x).break_reasons[0])
    torch.testing.assert_close(minicompile.compile(f)(x), f(x))


def test_disabled_module_and_disabled_entry_point_run_eagerly():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = minicompile.disable(torch.nn.Linear(4, 4))

        def forward(self, x):
            return self.inner(x).relu() * 3

    net, x = Net(), torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(minicompile.compile(net)(x), net(x))
        assert minicompile.metrics.graph_breaks >= 1

    minicompile.metrics.reset()
    f = minicompile.disable(lambda x: x.sin())
    torch.testing.assert_close(minicompile.compile(f)(x), x.sin())
    g = minicompile.compile(lambda x: x.cos(), disable=True)
    torch.testing.assert_close(g(x), x.cos())
    assert minicompile.metrics.graphs == 0


def test_disable_rejects_what_is_not_callable():
    with pytest.raises(TypeError, match="function or an nn.Module"):
        minicompile.disable(3)


# --------------------------------------------------------------------------- modes

def test_modes_are_checked():
    with pytest.raises(ValueError, match="unknown mode"):
        minicompile.compile(lambda x: x, mode="fast")


@pytest.mark.parametrize("mode", ["max-autotune", "max-autotune-no-cudagraphs"])
def test_max_autotune_gives_eagers_results_and_says_what_it_did(kernel_backend, mode, tmp_path, monkeypatch):
    monkeypatch.setattr(minicompile.config, "cache_dir", str(tmp_path))      # nothing tuned before

    def f(x, w):
        return torch.softmax(x @ w, -1) * 2 + torch.relu(x).sum(-1, keepdim=True)

    compiled = minicompile.compile(f, mode=mode)
    x, w = torch.randn(37, 19, device=DEVICE), torch.randn(19, 19, device=DEVICE)
    out, text = logged("autotune", compiled, x, w)
    torch.testing.assert_close(out, f(x, w), rtol=1e-4, atol=1e-4)
    if DEVICE == "cuda":
        assert "settings timed, best" in text
        # a later compile of the same kernels times nothing: the choices are on disk
        minicompile.reset()
        _, again = logged("autotune", minicompile.compile(f, mode=mode), x, w)
        assert "settings timed" not in again
    else:
        assert "have no launch settings to time" in text


@pytest.mark.parametrize("launch", [
    {"xnumel": 4096 * 1024, "XBLOCK": 1024, "num_warps": 4},                       # pointwise
    {"xnumel": 100, "XBLOCK": 128, "num_warps": 4},                                # pointwise, small
    {"xnumel": 4096, "rnumel": 1024, "XBLOCK": 2, "RBLOCK": 1024, "num_warps": 8},  # persistent rows
    {"xnumel": 64, "rnumel": 50000, "XBLOCK": 1, "RBLOCK": 2048, "num_warps": 8},   # looped rows
])
def test_max_autotune_tries_a_few_settings_near_the_kernels_own(launch):
    """The candidates: the kernel's own settings first, then at most eight others, each a
    launch of the same code (a persistent reduction keeps its whole row) over every element."""
    from minicompile.codegen.triton import _candidates
    launch = {**launch, "grid": -(-launch["xnumel"] // launch["XBLOCK"])}
    found = _candidates(launch)
    assert found[0] == launch and 1 < len(found) <= 9
    assert len({tuple(sorted(c.items())) for c in found}) == len(found)
    for c in found:
        assert set(c) == set(launch) and c["grid"] * c["XBLOCK"] >= c["xnumel"]
        assert c["XBLOCK"] in (launch["XBLOCK"] // 2, launch["XBLOCK"], launch["XBLOCK"] * 2)
        if launch.get("RBLOCK", 0) >= launch.get("rnumel", 1):
            assert c.get("RBLOCK") == launch.get("RBLOCK")


@pytest.mark.skipif(DEVICE == "cuda", reason="the CPU path")
def test_reduce_overhead_on_a_cpu_runs_the_default_path_and_says_why():
    f = minicompile.compile(lambda x: (x + 1).relu(), mode="reduce-overhead")
    x = torch.randn(10)
    out, text = logged("cudagraphs", f, x)
    torch.testing.assert_close(out, (x + 1).relu())
    assert "not recorded: its inputs are not all on one CUDA device: cpu" in text


@needs_cuda
def test_reduce_overhead_replays_and_outputs_are_not_overwritten():
    def f(x, y):
        return torch.relu(x * y + 1), (x - y).sum(0)

    compiled = minicompile.compile(f, mode="reduce-overhead", options=ALWAYS_REPLAY)
    calls = [(torch.randn(37, 19, device="cuda"), torch.randn(19, device="cuda")) for _ in range(4)]
    results, text = logged("cudagraphs", lambda: [compiled(*c) for c in calls])
    assert text.count("recorded a CUDA graph") == 1
    for (x, y), got in zip(calls, results):          # earlier outputs survive later replays
        torch.testing.assert_close(got, f(x, y))
    # non-contiguous and broadcast inputs: a signature of their own
    x = torch.randn(19, 37, device="cuda").t()
    torch.testing.assert_close(compiled(x, calls[0][1]), f(x, calls[0][1]))


@needs_cuda
def test_reduce_overhead_writes_inputs_and_returns_views_as_eager():
    def step(x, w):
        x[:, 0].mul_(2)
        w += x.sum(0)
        return x.t(), w[:2]

    compiled = minicompile.compile(step, mode="reduce-overhead", options=ALWAYS_REPLAY)
    for _ in range(3):
        x0, w0 = torch.randn(4, 3, device="cuda"), torch.randn(3, device="cuda")
        xe, we, xc, wc = x0.clone(), w0.clone(), x0.clone(), w0.clone()
        with torch.no_grad():
            expected, got = step(xe, we), compiled(xc, wc)
        torch.testing.assert_close((xc, wc), (xe, we))
        torch.testing.assert_close(got, expected)
        assert got[0].data_ptr() == xc.data_ptr() and got[1].data_ptr() == wc.data_ptr()


@needs_cuda
def test_reduce_overhead_uses_parameters_in_place_and_limits_recordings():
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).cuda()
    compiled = minicompile.compile(model, mode="reduce-overhead", dynamic=False,
                                   options={"cudagraph_max_recordings": 2, **ALWAYS_REPLAY})
    with torch.no_grad():
        _, text = logged("cudagraphs", lambda: [compiled(torch.randn(n, 16, device="cuda")) for n in (3, 3)])
        assert "2 used in place" in text or "4 used in place" in text
        model[0].weight.mul_(0.5)                    # in place: the recording sees it
        x = torch.randn(3, 16, device="cuda")
        torch.testing.assert_close(compiled(x), model(x))
        for n in (5, 7, 9):                          # new sizes: recorded up to the limit
            x = torch.randn(n, 16, device="cuda")
            torch.testing.assert_close(compiled(x), model(x))


@needs_cuda
@pytest.mark.parametrize("keep_faster", [False, True])
def test_reduce_overhead_writes_a_static_input_in_place_once_per_call(keep_faster):
    """A tensor marked as at a fixed address (a static KV cache) is used in place, not copied
    in and out: the recording writes it, the warm-up and the timed calls that choose between
    replay and default path leave it as it was, and each call writes it once, as eager's."""
    def step(cache, count, pos, row):
        count.add_(1)
        cache.index_copy_(1, pos, row)
        return cache[:, :4].sum(1) * count

    cache, count = torch.randn(2, 64, 8, device="cuda"), torch.zeros(1, device="cuda")
    minicompile.mark_static_address(cache)
    torch._dynamo.mark_static_address(count)        # torch._dynamo's mark is read too
    compiled = minicompile.compile(step, mode="reduce-overhead",
                                   options={"cudagraph_keep_faster": keep_faster})
    ec, en = cache.clone(), count.clone()
    for i in range(5):
        pos, row = torch.tensor([i * 3], device="cuda"), torch.randn(2, 1, 8, device="cuda")
        with torch.no_grad():
            if i == 0:
                got, text = logged("cudagraphs", compiled, cache, count, pos, row)
                assert "2 used in place" in text, text
            else:
                got = compiled(cache, count, pos, row)
            expected = step(ec, en, pos, row)
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close((cache, count), (ec, en))


@needs_cuda
def test_a_recording_writes_a_static_inputs_new_value_into_it():
    """write_back: an output that is only a static input's new value, which the graph did not
    store into it, is copied into it inside the recording; the call hands back the input."""
    from minicompile.runtime import cudagraphs

    def step(count, x):                  # the new count is a new tensor, as a kernel's output
        return count + 1, x * count

    count, x = torch.zeros(3, device="cuda"), torch.randn(3, device="cuda")
    minicompile.mark_static_address(count)
    wrapped = cudagraphs.record_when_possible(step, [count, x], written={0}, dynamic=False, write_back={0: 0})
    with minicompile.config.patch(**ALWAYS_REPLAY):
        for n in range(1, 4):
            x = torch.randn(3, device="cuda")
            new, out = wrapped(count, x)
            assert new is count
            torch.testing.assert_close(count, torch.full((3,), float(n), device="cuda"))
            torch.testing.assert_close(out, x * (n - 1))


@needs_cuda
def test_a_graph_that_cannot_be_recorded_runs_the_default_path():
    from minicompile.runtime import cudagraphs

    calls = []

    def syncs(x):                  # a host synchronization is not allowed while recording
        calls.append(1)
        torch.cuda.synchronize()
        return (x * 2,)

    wrapped = cudagraphs.record_when_possible(syncs, [torch.randn(3, device="cuda")])
    x = torch.randn(3, device="cuda")
    out, text = logged("cudagraphs", wrapped, x)
    torch.testing.assert_close(out[0], x * 2)
    assert "not recorded, the default path runs instead" in text
    torch.testing.assert_close(wrapped(x)[0], x * 2)
    torch.randn(3, device="cuda")          # the generator works after the failed recording


@needs_cuda
def test_reduce_overhead_keeps_the_faster_of_replay_and_default_path():
    def f(x):
        return (x * torch.rand_like(x)).relu() + 1          # random numbers: none used up by timing

    compiled = minicompile.compile(f, mode="reduce-overhead")
    for size in (64, 4096 * 4096):
        x = torch.randn(size, device="cuda")
        torch.manual_seed(0)
        expected = f(x)
        torch.manual_seed(0)
        got, text = logged("cudagraphs", compiled, x)
        torch.testing.assert_close(got, expected)
        assert "per call: replay" in text and "serves inputs of sizes" in text
        torch.testing.assert_close(compiled(x + 1).ge(1).all(), torch.tensor(True, device="cuda"))


# --------------------------------------------------------------------------- regions

class Layer(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm, self.lin = torch.nn.LayerNorm(dim), torch.nn.Linear(dim, dim)

    def forward(self, x):
        return x + torch.nn.functional.gelu(self.lin(self.norm(x)))


class Stack(torch.nn.Module):
    def __init__(self, dim=16, depth=6):
        super().__init__()
        self.embed = torch.nn.Linear(dim, dim)
        self.layers = torch.nn.ModuleList(Layer(dim) for _ in range(depth))

    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return x


def test_regional_compilation_compiles_one_graph_for_every_layer(kernel_backend):
    torch.manual_seed(0)
    model = Stack().to(DEVICE).eval()
    x = torch.randn(3, 5, 16, device=DEVICE)
    with torch.no_grad():
        expected = model(x)
        assert minicompile.compile_regions(model) is model        # the block class found: Layer
        assert all(type(layer) is Layer and isinstance(layer.forward, minicompile.api.CompiledFunction)
                   for layer in model.layers)
        torch.testing.assert_close(model(x), expected, rtol=1e-4, atol=1e-5)
        assert minicompile.metrics.graphs == 1 and minicompile.metrics.recompiles == 0
        model.layers[2].lin.weight.mul_(2)                         # each layer's own parameters
        eager = copy.deepcopy(model)
        for layer in eager.layers:
            del layer.forward
        torch.testing.assert_close(model(x), eager(x), rtol=1e-4, atol=1e-5)
    assert minicompile.metrics.graphs == 1
    # compiled in place: the model's names, and so its checkpoints, are eager's
    assert list(model.state_dict()) == list(eager.state_dict())
    model.load_state_dict(eager.state_dict())
    assert model.get_submodule("layers.3.lin") is model.layers[3].lin


def test_regional_compilation_keeps_the_blocks_hooks():
    torch.manual_seed(0)
    results = []
    for regions in (False, True):
        torch.manual_seed(0)
        model, seen = Stack(depth=3), []
        model.layers[1].register_forward_hook(lambda m, args, out: out * 2)
        model.layers[2].register_full_backward_pre_hook(lambda m, grad_out: seen.append(1) or (grad_out[0] * 10,))
        if regions:
            minicompile.compile_regions(model)
        x = torch.randn(4, 16, requires_grad=True)
        model(x).sum().backward()
        results.append((seen, model.embed.weight.grad, x.grad))
    assert results[0][0] == results[1][0] == [1]
    torch.testing.assert_close(results[1][1], results[0][1], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(results[1][2], results[0][2], rtol=1e-4, atol=1e-4)


def test_compiling_each_layer_in_a_loop_shares_the_graph():
    model = Stack().eval()
    for i, layer in enumerate(model.layers):
        model.layers[i] = minicompile.compile(layer)
    with torch.no_grad():
        model(torch.randn(2, 16))
    assert minicompile.metrics.graphs == 1
    with pytest.raises(ValueError, match="no submodule of class"):
        minicompile.compile_regions(Stack(), torch.nn.Conv2d)
