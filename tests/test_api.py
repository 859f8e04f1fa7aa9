"""The public names of minicompile, end to end: capture -> lowering -> fusion -> kernels.

Every compiled result is compared with eager PyTorch on fresh random inputs.
"""
import functools
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import minicompile
from conftest import DEVICE
from helpers import assert_same, randn


def relu_chain(x):
    return torch.relu(x + 1) * 2


def test_public_names_exist():
    for name in ["compile", "explain", "reset", "mark_dynamic", "set_logs", "backend", "config",
                 "Unsupported", "metrics"]:
        assert hasattr(minicompile, name), name
    assert minicompile.config.recompile_limit == 8
    for counter in ["graphs", "graph_breaks", "recompiles", "kernels", "kernel_bytes"]:
        assert hasattr(minicompile.metrics, counter)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
def test_relu_chain_one_kernel(kernel_backend, dtype, layout):
    shape = (1823, 781) if kernel_backend == "cpp" or DEVICE == "cuda" else (183, 78)
    x = randn(*shape, dtype=dtype, layout=layout)
    f = minicompile.compile(relu_chain)
    assert_same(f(x), relu_chain(x), dtype)
    assert minicompile.metrics.kernels == 1
    assert minicompile.metrics.graphs == 1
    (_, read, written), = minicompile.metrics.kernel_bytes
    assert read == written == x.numel() * x.element_size()


def test_call_and_decorator_forms():
    x = randn(33, 17)

    @minicompile.compile
    def a(x):
        return x.sin() * 2

    @minicompile.compile(fullgraph=True)
    def b(x):
        return x.cos() + 1

    c = minicompile.compile(lambda x: x.exp() - 1, fullgraph=False, dynamic=False)
    assert_same(a(x), x.sin() * 2)
    assert_same(b(x), x.cos() + 1)
    assert_same(c(x), x.exp() - 1)
    assert a.__name__ == "a"


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(24, 16)
        self.norm = nn.LayerNorm(16)
        self.scale = 0.5

    def forward(self, x):
        return self.norm(F.gelu(self.fc(x))) * self.scale + x[:, :16]


def test_module_behaves_like_the_original():
    torch.manual_seed(0)
    model = Block().to(DEVICE)
    compiled = minicompile.compile(model)
    x = randn(37, 24)
    assert_same(compiled(x), model(x))
    assert isinstance(compiled, nn.Module)
    assert list(compiled.state_dict()) == list(model.state_dict())
    assert [n for n, _ in compiled.named_parameters()] == [n for n, _ in model.named_parameters()]
    assert all(p is q for p, q in zip(compiled.parameters(), model.parameters()))
    assert compiled.scale == 0.5 and compiled.fc is model.fc
    # weights are read live, never copied into the compiled code
    with torch.no_grad():
        model.fc.weight.mul_(-1)
    assert_same(compiled(x), model(x))
    # a checkpoint of the compiled module loads into the original, and back
    fresh = Block().to(DEVICE)
    fresh.load_state_dict(compiled.state_dict())
    assert_same(fresh(x), model(x))
    compiled.eval()
    assert not model.training


def test_shape_change_recompiles_and_stays_correct():
    f = minicompile.compile(relu_chain)
    for shape in [(8, 5), (8, 5), (9, 5), (8, 5)]:
        x = randn(*shape)
        assert_same(f(x), relu_chain(x))
    assert minicompile.metrics.graphs == 2
    assert minicompile.metrics.recompiles == 1


def test_compiles_of_one_function_with_other_dynamic_settings_keep_their_own_entries():
    # the cache is per code object and options: dynamic=False asks for code of static sizes,
    # which an entry compiled with dynamic=True (any size) is not
    minicompile.metrics.reset()
    dynamic = minicompile.compile(relu_chain, dynamic=True)
    for n in (3, 5):
        x = randn(n)
        assert_same(dynamic(x), relu_chain(x))
    assert minicompile.metrics.graphs == 1
    static = minicompile.compile(relu_chain, dynamic=False)
    for n in (3, 5):
        x = randn(n)
        assert_same(static(x), relu_chain(x))
    assert minicompile.metrics.graphs == 3 and minicompile.metrics.recompiles == 1


def test_compile_seconds_say_where_a_first_call_went():
    # as Dynamo's compile_times(): each stage's seconds, a stage inside another counted once
    import time
    minicompile.metrics.reset()
    lin = nn.Linear(24, 8).to(DEVICE)

    def loss(x):
        return torch.relu(lin(x)).sum()
    x = randn(5, 24)
    start = time.perf_counter()
    minicompile.compile(loss)(x).backward()
    wall = time.perf_counter() - start
    seconds = minicompile.metrics.compile_seconds
    assert {"capture", "joint trace", "partition", "lowering", "fusion", "code generation"} <= set(seconds)
    assert all(s >= 0 for s in seconds.values()) and sum(seconds.values()) <= wall
    minicompile.metrics.reset()
    assert minicompile.metrics.compile_seconds == {}


def test_recompile_limit_falls_back_to_eager_with_warning():
    minicompile.config.recompile_limit, limit = 2, minicompile.config.recompile_limit
    try:
        f = minicompile.compile(relu_chain, dynamic=False)   # each size a compile
        for n in (3, 4):
            f(randn(n))
        with pytest.warns(UserWarning, match="recompile limit"):
            x = randn(5)
            assert_same(f(x), relu_chain(x))
        assert minicompile.metrics.graphs == 2
    finally:
        minicompile.config.recompile_limit = limit


def _returning_a_tuple(func):
    """transformers' can_return_tuple: one wrapper function for every model class's forward."""
    @functools.wraps(func)
    def wrapper(self, *args, **kwargs):
        return func(self, *args, **kwargs)
    return wrapper


def test_the_recompile_limit_counts_the_entries_of_each_wrapped_function_and_module():
    """Entries of one code object made for other functions (a decorator's closure over each
    class's forward) or another module as self do not count against each other, as in
    Dynamo: twelve model classes behind one wrapper all compile (the ninth ran eagerly, and
    with it everything it calls)."""
    models = []
    for i in range(12):
        def forward(self, x, i=i):
            return x * (i + 1) + self.w
        model = type(f"Model{i}", (torch.nn.Module,), {"forward": _returning_a_tuple(forward)})()
        model.w = torch.nn.Parameter(randn(3))
        models.append(model)
    x = randn(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for model in models:
            assert_same(minicompile.compile(model)(x), model(x))
    assert minicompile.metrics.graphs == 12

def with_print(x):
    y = x * 2
    print("debug")
    return y + 1


def test_graph_break_resumes_after_print(capsys):
    # the graph so far, print run for real, the rest compiled from the resume point
    f = minicompile.compile(with_print)
    x = randn(4, 4)
    assert_same(f(x), x * 2 + 1)
    assert "debug" in capsys.readouterr().out
    assert minicompile.metrics.graph_breaks == 1 and minicompile.metrics.graphs == 2
    x = randn(4, 4)
    assert_same(f(x), x * 2 + 1)                      # cached: no new graph
    assert minicompile.metrics.graphs == 2 and "debug" in capsys.readouterr().out


def test_unsupported_runs_eagerly_with_a_warning(capsys):
    def breaks_in_a_handler(x, d):
        try:
            return d["missing"]
        except KeyError:
            print("handled")                 # a break inside an exception handler: no resume
            return x * 2
    f = minicompile.compile(breaks_in_a_handler)
    x = randn(4, 4)
    with pytest.warns(UserWarning, match="runs eagerly"):
        assert_same(f(x, {}), x * 2)
    assert "handled" in capsys.readouterr().out


def test_fullgraph_raises_unsupported_with_source_line():
    f = minicompile.compile(with_print, fullgraph=True)
    with pytest.raises(minicompile.Unsupported, match='print\\("debug"\\)'):
        f(randn(4, 4))


def test_explain():
    out = minicompile.explain(relu_chain)(randn(5, 5))
    assert out.graph_count == 1 and out.graph_break_count == 0
    assert len(out.ops_per_graph[0]) == 3
    broken = minicompile.explain(with_print)(randn(5, 5))
    assert broken.graph_break_count == 1
    assert "print" in str(broken)




def test_bad_arguments_name_the_cause():
    with pytest.raises(TypeError, match="function or an nn.Module"):
        minicompile.compile(42)
    with pytest.raises(ValueError, match="unknown mode"):
        minicompile.compile(relu_chain, mode="fastest")
    with pytest.raises(ValueError, match="backend must be"):
        minicompile.compile(relu_chain, backend="tvm")
    with pytest.raises(TypeError, match="fullgraph"):
        minicompile.compile(relu_chain, fullgraph="yes")
    with pytest.raises(ValueError, match="unknown log artifact"):
        minicompile.set_logs(kernels=True)


def test_kernel_compile_error_is_a_sentence(monkeypatch):
    from minicompile.codegen.cpp import KernelCompileError
    monkeypatch.setattr(minicompile.config, "cxx_flags", minicompile.config.cxx_flags + ["-fno-such-flag"])
    monkeypatch.setattr(minicompile.config, "cpu_backend", "cpp")
    f = minicompile.compile(lambda x: x * 3 + 0.25)
    with pytest.raises(KernelCompileError, match="C\\+\\+ kernel failed to compile"):
        f(torch.randn(8, 8))


def test_logs_from_environment_variable(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text("import torch, minicompile\n"
                      "f = minicompile.compile(lambda x: torch.relu(x + 1) * 2)\n"
                      "f(torch.randn(16, 16))\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         env=dict(os.environ, MINICOMPILE_LOGS="graph_code,output_code,fusion"))
    assert out.returncode == 0, out.stderr
    assert "[minicompile:graph_code]" in out.stdout and "torch.relu(x + 1) * 2" in out.stdout
    assert "def call(args)" in out.stdout and "[minicompile:fusion] kernel0" in out.stdout


def test_backend_eager_and_custom():
    seen = []

    def my_backend(gm, example_inputs):
        seen.append(gm)
        return gm
    x = randn(6, 7)
    assert_same(minicompile.compile(relu_chain, backend="eager")(x), relu_chain(x))
    assert_same(minicompile.compile(relu_chain, backend=my_backend)(x), relu_chain(x))
    assert len(seen) == 1


def test_unsupported_python_version_warns_and_runs_eagerly(monkeypatch):
    import minicompile.api as api
    monkeypatch.setattr(api, "SUPPORTED_PYTHONS", ())
    monkeypatch.setattr(api, "_warned_python", False)
    with pytest.warns(UserWarning, match="Python 3.11 to 3.13"):
        x = randn(3)
        assert_same(minicompile.compile(relu_chain)(x), relu_chain(x))
    assert minicompile.metrics.graphs == 0


def test_options_apply_to_that_function_only():
    import minicompile.api as api
    x = randn(16, 16)
    before = minicompile.config.cpu_backend
    other = "triton" if before == "cpp" else "cpp"
    f = minicompile.compile(relu_chain, options={"cpu_backend": other})
    assert_same(f(x), relu_chain(x))
    assert minicompile.config.cpu_backend == before
    if DEVICE == "cpu":
        (entry,), = [e for e in api._CACHES.values() if e]
        assert entry.compiled.backend == other
    with pytest.raises(ValueError, match="unknown option"):
        minicompile.compile(relu_chain, options={"no_such_setting": 1})


def test_torch_cond_compiles_end_to_end(kernel_backend):
    def f(x, y):
        z = x * 2
        out = torch.cond(z.sum() > 0, lambda a, b: (a + b).relu(), lambda a, b: a - b, (z, y))
        return out * 3
    compiled = minicompile.compile(f, fullgraph=True)
    for sign in (1, -1):
        x, y = randn(8, 8) * sign, randn(8, 8)
        assert_same(compiled(x, y), f(x, y))
    assert minicompile.metrics.graphs == 1 and minicompile.metrics.graph_breaks == 0


def _python_headers() -> bool:
    import os
    import sysconfig
    return os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))


@pytest.mark.skipif(DEVICE == "cpu" and not _python_headers(),
                    reason="Inductor's C++ kernels need the Python headers (python3-dev)")
def test_minicompile_capture_with_inductor_backend():
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).to(DEVICE)
    x = randn(4, 16)
    with torch.no_grad():
        assert_same(minicompile.compile(model, backend="inductor")(x), model(x))
    assert minicompile.metrics.graphs == 1


def test_first_call_does_not_import_torch_dynamo():
    """TorchDynamo and Inductor take seconds to import; minicompile's own path needs neither
    (the cold first call is a published figure of the book)."""
    code = ("import sys, torch, minicompile\n"
            "f = minicompile.compile(lambda x: torch.relu(x + 1) * 2)\n"
            "f(torch.randn(8, 8))\n"
            "assert 'torch._dynamo' not in sys.modules and 'torch._inductor' not in sys.modules\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_training_keeps_gradients():
    """A graph that needs gradients is compiled for training (autograd/): eager's gradients,
    from generated backward kernels, without a warning; inference is compiled too."""
    import copy
    torch.manual_seed(0)
    model = Block().to(DEVICE)
    twin = copy.deepcopy(model)
    x = randn(9, 24)
    model(x).square().sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = minicompile.compile(twin)(x)
    out.square().sum().backward()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad)
    assert minicompile.metrics.backward_kernels > 0
    with torch.no_grad():                 # inference is compiled
        minicompile.metrics.reset()
        assert_same(minicompile.compile(twin)(x), model(x))
        assert minicompile.metrics.kernels > 0


def test_a_compiled_module_that_has_run_can_be_deep_copied():
    """(an EMA of the compiled model, a copy for evaluation): the copy is compiled as the
    original is, runs on its own parameters, and reuses the original's compiled entries."""
    import copy
    torch.manual_seed(0)
    compiled = minicompile.compile(Block().to(DEVICE))
    x = randn(9, 24)
    with torch.no_grad():
        compiled(x)
        twin = copy.deepcopy(compiled)
        for p in twin.parameters():
            p.mul_(0.5)
        minicompile.metrics.reset()
        assert_same(twin(x), twin._orig_mod(x))
        assert_same(compiled(x), compiled._orig_mod(x))
    assert isinstance(twin, minicompile.api.CompiledModule) and minicompile.metrics.graphs == 0


def test_attributes_written_on_the_compiled_module_reach_the_model():
    """(a new head to fine-tune, a flag, train()/eval()): written where the compiled forward
    reads them, as torch.compile's OptimizedModule forwards them."""
    torch.manual_seed(0)
    model = Block()
    compiled = minicompile.compile(model)
    x = torch.randn(2, 24)
    compiled(x)
    compiled.norm = nn.Identity()                  # a new tail, and a new scale
    compiled.scale = 3.0
    compiled.tag = "head"
    out = compiled(x)
    assert_same(out, F.gelu(model.fc(x)) * 3 + x[:, :16])
    assert model.tag == "head" and compiled.tag == "head" and isinstance(model.norm, nn.Identity)
    compiled.eval()
    assert not compiled.training and not model.training and not model.fc.training
    del compiled.tag
    assert not hasattr(model, "tag")


def test_a_compiled_model_pickles_whole():
    """torch.save(model) of a compiled model, or of one whose blocks compile_regions compiled:
    it loads compiled, with its weights."""
    import io
    torch.manual_seed(0)
    x = torch.randn(9, 24)
    for make in (lambda m: minicompile.compile(m), lambda m: minicompile.compile_regions(m, nn.Linear)):
        model = make(Block())
        expected = model(x)
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        assert_same(loaded(x), expected)


def test_the_cycle_collector_is_paused_only_while_compiling(monkeypatch):
    import gc
    from minicompile.capture import trace
    real, seen = trace.trace_segment, []

    def watched(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)
    monkeypatch.setattr(trace, "trace_segment", watched)
    assert gc.isenabled()
    minicompile.compile(lambda x: x + 1)(torch.randn(3))
    assert seen == [False] and gc.isenabled()

    def bad(x):
        return x.no_such_method()
    with pytest.raises(AttributeError):
        minicompile.compile(bad)(torch.randn(3))
    assert gc.isenabled()


WINDOW = torch.tensor(4)     # a 0-dim CPU tensor a GPU graph reads, as transformers' sliding-window masks do


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU beside the CPU")
@pytest.mark.parametrize("fn", [lambda x, t: x * t + 1,
                                lambda x, t: torch.where(torch.arange(x.shape[0], device=x.device) < WINDOW, x, t),
                                lambda x, t: x * torch.tensor(3).to(torch.float64) + (t - 1).exp()])
def test_a_zero_dim_cpu_tensor_in_a_gpu_graph_is_read_as_a_number(fn):
    """Eager takes a 0-dim CPU tensor beside CUDA ones as a number, so a graph given one (an
    input, a global, torch.tensor(3)) or computing one from those is still compiled: its
    kernels read the value copied to the GPU."""
    compiled = minicompile.compile(fn)
    minicompile.metrics.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (5, 7, 9):
            x, t = torch.randn(n, device="cuda"), torch.tensor(2.5)
            expected, got = fn(x, t), compiled(x, t)
            assert got.device == expected.device
            torch.testing.assert_close(got, expected)
    assert not [w for w in caught if "PyTorch's kernels" in str(w.message)]
    assert minicompile.metrics.kernels > 0


NUMBER_OPS = {"x * t": lambda x, t: x * t, "x / t": lambda x, t: x / t, "x.div(t)": lambda x, t: x.div(t),
              "x + t": lambda x, t: x + t, "t - x": lambda x, t: t - x, "maximum(x, t)": lambda x, t: torch.maximum(x, t),
              "x < t": lambda x, t: x < t, "where(x > 0, x, t)": lambda x, t: torch.where(x > 0, x, t),
              "x / 0.1": lambda x, t: x / 0.1, "x.div(255.0)": lambda x, t: x.div(255.0),
              "torch.div(t, x)": lambda x, t: torch.div(t, x), "0.1 / x": lambda x, t: 0.1 / x}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU beside the CPU")
@pytest.mark.parametrize("name", list(NUMBER_OPS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_gpu_op_on_a_cpu_number_is_eagers_to_the_bit(name, dtype):
    """Eager's CUDA kernels take a CPU number (or a Python one) as a kernel argument, each op
    in its own way (x / t is x times t's reciprocal): compiled, the same bits, for numbers of
    the op's dtype and of others."""
    fn = NUMBER_OPS[name]
    x = (torch.randn(257, device="cuda") * 100).to(dtype)
    for t in (torch.tensor(2.7), torch.tensor(0.1, dtype=dtype), torch.tensor(3),
              torch.tensor(0.3, dtype=torch.float64)):
        minicompile.reset()
        torch.testing.assert_close(minicompile.compile(fn)(x, t), fn(x, t), rtol=0, atol=0, msg=lambda m: f"{t}: {m}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU beside the CPU")
@pytest.mark.parametrize("fn", [lambda x: torch.tensor([x[0], x[1]]) + 1,
                                lambda x: (x.cpu() * 2 + 1, x * 3),
                                lambda x: torch.ones(3) * 2 + x.sum().cpu()])
def test_values_on_the_cpu_in_a_gpu_graph_stay_on_the_cpu(fn):
    """A graph with tensors on two devices runs on PyTorch's kernels: one program's kernels are
    made for one device (its CPU tensors came back on the GPU)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = minicompile.compile(fn)
        for n in (5, 6):
            x = torch.arange(float(n), device="cuda") - 1
            expected, got = fn(x), compiled(x)
            for e, g in zip(torch.utils._pytree.tree_leaves(expected), torch.utils._pytree.tree_leaves(got)):
                assert g.device == e.device
                torch.testing.assert_close(g, e)


@minicompile.compile
def _compiled_on_its_own(x):
    return x.sin() * 2


def _calls_a_compiled_function(x):
    return _compiled_on_its_own(x + 1).cos()


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x):
        return F.gelu(self.lin(x)) + x


class _Blocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([minicompile.compile(_Block()) for _ in range(3)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def test_a_compiled_function_or_module_called_in_another_trace_is_traced_there():
    # as TorchDynamo inlines the original of a torch.compile'd callable it meets: one graph,
    # no break in minicompile's own call machinery
    compiled = minicompile.compile(_calls_a_compiled_function)
    x = torch.randn(5)
    expected = _calls_a_compiled_function(x)     # (compiles the inner one on its own)
    minicompile.metrics.reset()
    assert_same(compiled(x), expected)
    assert minicompile.metrics.graphs == 1 and minicompile.metrics.graph_breaks == 0
    model = _Blocks().eval()
    compiled = minicompile.compile(model)
    with torch.no_grad():
        x = torch.randn(4, 6)
        expected = model(x)
        minicompile.metrics.reset()
        assert_same(compiled(x), expected)
    assert minicompile.metrics.graphs == 1 and minicompile.metrics.graph_breaks == 0


def test_global_module_hooks_run_once_per_module_call_through_a_compiled_module():
    # the wrapper compile() returns is no module of eager's: global hooks see the model's
    # modules only (torch.compile's OptimizedModule is seen too, with a warning)
    seen = []
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    handle = nn.modules.module.register_module_forward_hook(lambda m, args, out: seen.append(type(m).__name__))
    try:
        x = torch.randn(2, 3)
        model(x)
        expected, seen[:] = list(seen), []
        compiled = minicompile.compile(model)
        for _ in range(2):
            compiled(x)
            assert seen == expected == ["Linear", "ReLU", "Sequential"]
            seen.clear()
        compiled.register_forward_hook(lambda m, args, out: seen.append("own"))
        compiled(x)                     # a hook on the wrapper itself runs too
        assert seen.count("own") == 1
    finally:
        handle.remove()
