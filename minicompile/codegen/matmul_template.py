"""The matrix-product template (mode="max-autotune"): a fusion `TemplateKernel` as one Triton
kernel, and the choice, by timing, between it and PyTorch's product followed by the epilogue.

Takes a `TemplateKernel` (fusion's matmul-templates: torch.mm and the pointwise kernel that
reads its result); hands `triton.generate` the kernel's source and launch settings, and the
wrapper a schedule where each template is kept only where it was the faster.

The kernel is Triton's matrix product (as lower/matmul_kernels.py's, and Inductor's mm
template): each program owns a BLOCK_M x BLOCK_N tile of the product, walks k in BLOCK_K steps
accumulating in float32, then, instead of storing the tile, computes the epilogue's members on
it. The epilogue is the code the pointwise kernel would have had (codegen/triton.py's writer),
with its element index `xindex` a 2-D block (rows by columns of the tile) rather than a flat
one; where it read the product from memory it reads the accumulator, rounded to the product's
dtype as the stored product would have been. A linear layer's bias and GELU, or a residual
add, then cost no pass over the product: the tile is written once, as the epilogue's result.

Whether that is faster than cuBLAS's product plus one pointwise pass depends on the shape
(cuBLAS's kernels are very good; the pass the template saves is small beside a long k), so
with max-autotune every template is compiled with a few block settings and timed against the
two kernels it replaces, on the GPU it runs on, and kept where it is clearly faster
(TEMPLATE_MARGIN); the choice is kept on disk.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re

import torch

from .. import config, metrics
from ..fusion.kernels import ExternCall, TemplateKernel
from ..fusion.passes import strided_operand
from ..ir import use_ops
from .common import LoopPlan
from . import triton as triton_codegen
from .triton import TritonWriter, _decompose, _function, _next_pow2, _store, write_whole

GROUP_M = 8      # rows of tiles whose programs run together, so the columns of b they read stay in L2

# A template is kept only where it takes at most this fraction of the time of PyTorch's product
# and the epilogue kernel, both timed alone: the times alone are not those in the graph. For the
# book's MLP layers on the H100: 45.3 us for the template against 46.4 alone, but in the whole
# model about 45.8 against 42 (profiled), and the model was slower with its three templates.
TEMPLATE_MARGIN = 0.9

# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps) tried by max-autotune: a few of
# Inductor's mm configurations, from small tiles (few rows, many programs) to large ones
CANDIDATES = [(64, 64, 32, 2, 4), (64, 128, 32, 3, 4), (128, 64, 32, 3, 4), (128, 128, 32, 3, 8),
              (128, 128, 64, 3, 8), (64, 256, 32, 4, 8), (128, 256, 64, 3, 8)]


class _EpilogueWriter(TritonWriter):
    """The epilogue's writer: a read of the product is the accumulator, rounded as stored."""

    def __init__(self, kernel: TemplateKernel, plan, buffers):
        super().__init__(kernel, plan, buffers, "xmask")
        self.product = kernel.product

    def load(self, name, index):
        if name == self.product.name:     # (matmul-templates checked: at the element computed)
            return self.rounded_as_stored("acc", self.product.dtype)
        return super().load(name, index)


def template_source(kernel: TemplateKernel, buffers) -> tuple[str, list[str], dict]:
    """The @triton.jit kernel of a template, the buffers it takes and its launch settings
    (`kernel.settings`, else `default_settings`)."""
    a, b = kernel.operands
    (m, k), n = a.shape, b.shape[1]
    # the epilogue's loops in row-major order (xindex = row * n + column): no merging, and
    # dims of size 1 always 0
    groups = [([f"x{d}"], f"x{d}", s) for d, s in enumerate(kernel.x_sizes) if s != 1]
    plan = LoopPlan([size for *_, size in groups], [], groups,
                    [f"x{d}" for d, s in enumerate(kernel.x_sizes) if s == 1])
    writer = _EpilogueWriter(kernel, plan, buffers)
    (a_name, (sam, sak), a_offset), (b_name, (sbk, sbn), b_offset) = strided_operand(a), strided_operand(b)
    a_ptr, b_ptr = writer.arg_name(a_name), writer.arg_name(b_name)     # (in_ptr0, and in_ptr1 unless a is b)
    with use_ops(writer):
        for member in kernel.members:
            value = member.run(*writer.canonical)
            if member.box.name in kernel.stored:
                writer.lines.append(_store(writer, member, value, "[BLOCK_M, BLOCK_N]", "xmask"))
    code = "\n".join(writer.lines)
    dims = [line for line in _decompose("xindex", plan.x_vars, plan.x_sizes)
            if re.search(rf"\b{line.split(' = ')[0]}\b", code)]
    precision = "" if a.dtype != torch.float32 else \
        ', input_precision="tf32"' if _tf32(a.device) else ', input_precision="ieee"'
    operands = "a, b"
    if not writer.device_asserts and a.dtype != torch.float32:
        # Triton's interpreter multiplies with NumPy, which has no bfloat16 (it would multiply
        # the bits): half-precision blocks are widened first, products exact in float32
        operands, precision = "a.to(tl.float32), b.to(tl.float32)", ', input_precision="ieee"'
    body = [
        "pid = tl.program_id(0)",
        # tiles in groups of GROUP_M rows, column by column (lower/matmul_kernels.py's _tile)
        f"blocks_n = tl.cdiv({n}, BLOCK_N)",
        "group = pid // (GROUP_M * blocks_n)",
        f"group_m = min(tl.cdiv({m}, BLOCK_M) - group * GROUP_M, GROUP_M)",
        "pid_m = group * GROUP_M + (pid % (GROUP_M * blocks_n)) % group_m",
        "pid_n = (pid % (GROUP_M * blocks_n)) // group_m",
        "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
        "rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
        # rows and columns past the edge read row (column) 0 again, unmasked; never stored
        f"am = tl.max_contiguous(tl.multiple_of(rm % {m}, BLOCK_M), BLOCK_M)",
        f"bn = tl.max_contiguous(tl.multiple_of(rn % {n}, BLOCK_N), BLOCK_N)",
        "rk = tl.arange(0, BLOCK_K)",
        f"a_ptrs = {a_ptr} + ({a_offset} + am[:, None] * {sam} + rk[None, :] * {sak})",
        f"b_ptrs = {b_ptr} + ({b_offset} + rk[:, None] * {sbk} + bn[None, :] * {sbn})",
        "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
        f"for kk in range(0, tl.cdiv({k}, BLOCK_K)):",
        "    if EVEN_K:",
        "        a = tl.load(a_ptrs)",
        "        b = tl.load(b_ptrs)",
        "    else:",
        f"        a = tl.load(a_ptrs, mask=rk[None, :] < {k} - kk * BLOCK_K, other=0.0)",
        f"        b = tl.load(b_ptrs, mask=rk[:, None] < {k} - kk * BLOCK_K, other=0.0)",
        f"    acc = tl.dot({operands}, acc{precision})",
        f"    a_ptrs += BLOCK_K * {sak}",
        f"    b_ptrs += BLOCK_K * {sbk}",
        # the epilogue, on the tile: its elements' flat index, rows by columns
        f"xindex = rm[:, None] * {n} + rn[None, :]",
        f"xmask = (rm[:, None] < {m}) & (rn[None, :] < {n})",
        *dims, *writer.lines]
    settings = kernel.settings or default_settings(m, n, k, a.dtype, a.device)
    block_m, block_n, block_k, stages, warps = settings
    launch = {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "GROUP_M": GROUP_M,
              "EVEN_K": k % block_k == 0, "num_stages": stages, "num_warps": warps,
              "grid": -(-m // block_m) * -(-n // block_n)}
    params = [f"{p}: tl.constexpr" for p in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "EVEN_K")]
    kernel.in_place = {}            # (its inputs are read across whole rows of tiles)
    return _function(kernel, writer, body, params, launch)


def _tf32(device: torch.device) -> bool:
    """Whether eager's float32 products are TF32 ones here (tl.dot's input_precision)."""
    return device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32


def default_settings(m: int, n: int, k: int, dtype: torch.dtype, device: torch.device) -> tuple:
    """The template's settings untimed: 128 x 128 tiles (k in steps of 64 bytes' worth of
    half-precision values, 32 of float32), no larger than the product needs."""
    return _fitted((128, 128, 64 if dtype.itemsize == 2 else 32, 3, 8), m, n, k)


def _fitted(settings: tuple, m: int, n: int, k: int) -> tuple:
    """Block sizes no larger than the product's sizes need (tl.dot takes blocks of 16 up)."""
    block_m, block_n, block_k, stages, warps = settings
    return (min(block_m, max(16, _next_pow2(m))), min(block_n, max(16, _next_pow2(n))),
            min(block_k, max(16, _next_pow2(k))), stages, warps)


def candidates(m: int, n: int, k: int, dtype: torch.dtype, device: torch.device) -> list[tuple]:
    """The settings max-autotune times: CANDIDATES fitted to the sizes, those whose pipeline
    (stages of an a block and a b block) fits the GPU's shared memory, each once."""
    limit = torch.cuda.get_device_properties(device).shared_memory_per_block_optin \
        if device.type == "cuda" else math.inf
    out = []
    for c in [default_settings(m, n, k, dtype, device)] + [_fitted(c, m, n, k) for c in CANDIDATES]:
        block_m, block_n, block_k, stages, _ = c
        if c not in out and (block_m + block_n) * block_k * dtype.itemsize * stages <= limit:
            out.append(c)
    return out


# ---------------------------------------------------------------------------------------
# The choice: the template, or PyTorch's product and the epilogue kernel, by timing
# ---------------------------------------------------------------------------------------
def choose_templates(steps: list, buffers: dict, device: torch.device, log) -> list:
    """The schedule with each TemplateKernel kept (with its fastest settings) where it beats
    PyTorch's product followed by the epilogue kernel by TEMPLATE_MARGIN, else replaced by those
    two. Timed on a GPU under max-autotune; templates of the same code (the layers of a model)
    are timed once, every candidate of every template compiled at once first, and each choice
    kept on disk by the template's code, sizes and GPU. Untimed (the defaults kept) where
    templates are asked for outright (config.matmul_templates) or off a GPU."""
    if device.type != "cuda" or config.matmul_templates:
        return steps
    trials: dict[str, _Trial] = {}
    for step in steps:
        if isinstance(step, TemplateKernel):
            trial = _Trial(step, buffers, device)
            trials.setdefault(trial.key, trial).kernels.append(step)
    untimed = [t for t in trials.values() if not t.decided]
    triton_codegen.compile_all([job for t in untimed for job in t.jobs()], wait=True)
    for trial in untimed:
        trial.time(log)
    chosen = {id(k): t.chosen for t in trials.values() for k in t.kernels}
    out = []
    for step in steps:
        if not isinstance(step, TemplateKernel):
            out.append(step)
        elif chosen[id(step)] is None:
            out += [ExternCall(step.product), step.epilogue]
        else:
            step.settings = chosen[id(step)]
            out.append(step)
    return out


class _Trial:
    """One template's code, timed: its candidate settings, and PyTorch's product followed by the
    epilogue kernel, on stand-ins of their buffers (floats random). `chosen`: the settings kept,
    or None for PyTorch's product; read from disk where this code was timed before."""

    def __init__(self, kernel: TemplateKernel, buffers: dict, device: torch.device):
        self.kernel, self.buffers, self.device, self.kernels = kernel, buffers, device, []
        a, b = kernel.operands
        self.sizes = (a.shape[0], a.shape[1], b.shape[1])
        self.dtype = a.dtype
        # under a name of its own, so that templates of the same code are one module, compiled once
        self.source, (self.args, self.launch) = _renamed(kernel, "template", buffers)
        gpu = torch.cuda.get_device_name(device)
        dtypes = [str(buffers[x].dtype) for x in self.args]
        self.key = hashlib.sha256(repr((self.source, sorted(self.launch.items()), dtypes, gpu)).encode()).hexdigest()[:24]
        directory = os.path.join(config.cache_dir, "autotune")
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, f"t{self.key}.json")
        self.decided = os.path.exists(self.path)
        if self.decided:
            with open(self.path) as f:
                kept = json.load(f)["template"]
            self.chosen = None if kept is None else tuple(kept)

    def jobs(self) -> list:
        """What to compile: the template with each candidate setting, and the epilogue kernel."""
        m, k, n = self.sizes
        self.tried = []
        for c in candidates(m, n, k, self.dtype, self.device):
            block_m, block_n, block_k, stages, warps = c
            settings = {**self.launch, "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k,
                        "EVEN_K": k % block_k == 0, "num_stages": stages, "num_warps": warps,
                        "grid": -(-m // block_m) * -(-n // block_n)}
            launcher = triton_codegen.load(self.source, {"template": (self.args, settings, "template")})["template"]
            self.tried.append((c, settings, launcher))
        e_source, (self.e_args, self.e_launch) = _renamed(self.kernel.epilogue, "epilogue", self.buffers)
        self.epilogue = triton_codegen.load(e_source, {"epilogue": (self.e_args, self.e_launch, "epilogue")})["epilogue"]
        dtypes, e_dtypes = [self.buffers[x].dtype for x in self.args], [self.buffers[x].dtype for x in self.e_args]
        return [(launcher, dtypes, s) for _, s, launcher in self.tried] + [(self.epilogue, e_dtypes, self.e_launch)]

    def time(self, log) -> None:
        kernel, (m, k, n) = self.kernel, self.sizes
        stand_ins = {x: triton_codegen.stand_in(self.buffers[x], self.device)
                     for x in {*self.args, *self.e_args, kernel.product.name}}
        timed = []
        for c, settings, launcher in self.tried:
            try:
                timed.append((triton_codegen.time_launch(launcher, [stand_ins[x] for x in self.args], settings), c))
            except Exception as err:             # noqa: BLE001 (a setting this GPU cannot run)
                log(f"{kernel.name}: template settings {c} not timed ({type(err).__name__}: {err})")
        operands, product = [_view(stand_ins, x) for x in kernel.operands], stand_ins[kernel.product.name]
        run_epilogue = self.epilogue[(self.e_launch["grid"],)]
        e_tensors = [stand_ins[x] for x in self.e_args]
        e_settings = {key: v for key, v in self.e_launch.items() if key != "grid"}

        def apart():
            torch.mm(*operands, out=product)
            run_epilogue(*e_tensors, **e_settings)
        apart_ms = triton_codegen.time_calls(apart)
        best_ms, best = min(timed) if timed else (math.inf, None)
        self.chosen = best if best_ms < TEMPLATE_MARGIN * apart_ms else None
        metrics.template_choices.append({
            "kernel": kernel.name, "sizes": self.sizes, "dtype": str(self.dtype).replace("torch.", ""),
            "template_ms": best_ms, "settings": best, "pytorch_ms": apart_ms,
            "chosen": "template" if self.chosen else "pytorch", "same_code": len(self.kernels)})
        log(f"{kernel.name}: template ({m} x {k} @ {k} x {n}, {self.dtype}) {best_ms * 1e3:.1f} us at {best} "
            f"against PyTorch's product and {kernel.epilogue.name} {apart_ms * 1e3:.1f} us: "
            + ("the template" if self.chosen else "PyTorch's product")
            + (f" (for {len(self.kernels)} kernels of this code)" if len(self.kernels) > 1 else ""))
        write_whole(self.path, json.dumps({"template": self.chosen}))


def _renamed(kernel, name: str, buffers: dict) -> tuple[str, tuple]:
    """(the module of this one kernel, its function called `name`; (argument buffers, launch))."""
    source, meta = triton_codegen.generate([kernel], buffers)
    args, launch, _ = meta[kernel.name]
    return source.replace(f"def {kernel.name}(", f"def {name}(", 1), (args, launch)


def _view(stand_ins: dict, operand) -> torch.Tensor:
    """An operand as the strided view of its buffer's stand-in that the product reads."""
    name, strides, offset = strided_operand(operand)
    base = stand_ins[name]
    return base.as_strided(operand.shape, strides, base.storage_offset() + offset)

