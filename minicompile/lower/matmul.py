"""A matrix product of minicompile's own, as a Triton kernel, for the one case where PyTorch's
is slow and the way around it costs a copy: a result whose rows are not a multiple of 16 bytes
long (a language model's head over a vocabulary of 50,257 words).

cuBLAS's fast kernels need every row of every matrix to start on a 16-byte boundary. Where the
result's rows do not, it falls back to much slower kernels. Lowering can pad the weight with
zero rows to an aligned width instead (`_padded_rows` in lowerings.py), as Inductor does, but
then the product has the padded layout. A graph returns eager's contiguous layout, so the
padded result is copied once more, and the weight is padded on every call. This kernel reads
the operands as they are and writes each row of the result where eager's layout puts it:
Triton's stores need no alignment. benchmarks/results/unaligned_matmul_h100.json times it
beside cuBLAS on the operands as they are and on a padded weight with the copy, for GPT-2's
head and other sizes and dtypes.

Lowering names `mm` as the call target of an extern kernel, like torch.mm, so the wrapper calls
it; it launches the kernel or, where the kernel does not apply at run time, calls torch.mm.
The kernels themselves are in matmul_kernels.py.
"""
from __future__ import annotations

import contextlib
import functools

import torch

# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps), by the operands' bytes per element: the
# fastest on the H100 for GPT-2's head among those benchmarks/unaligned_matmul.py tries
SETTINGS = {4: (128, 256, 32, 4, 8), 2: (128, 256, 64, 3, 8)}
GROUP_M = 8      # rows of programs that run together, so their weight columns stay in L2


def chosen(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether lowering should call `mm` for an unaligned product of this dtype on this device
    (rather than cuBLAS on a padded weight): on a GPU, where the kernel applies."""
    return device.type == "cuda" and _tensor_cores(device) and _precision_allows(dtype)


def _tensor_cores(device: torch.device) -> bool:
    """A GPU whose tensor cores take TF32 and bfloat16 (compute capability 8, Ampere, and
    newer): on older ones (Colab's T4) eager's TF32 setting changes nothing, and the padded
    product stays."""
    return torch.cuda.get_device_capability(device)[0] >= 8


def _precision_allows(dtype: torch.dtype) -> bool:
    if dtype == torch.float32:
        return torch.backends.cuda.matmul.allow_tf32
    return dtype in (torch.float16, torch.bfloat16)


def applies(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the kernel computes a @ b as eager would: 2-D operands of one float dtype on a
    GPU, in float32 only where eager's products use TF32 (with full float32 products the
    kernel would differ, and cuBLAS's are no slower than Triton's)."""
    if a.dim() != 2 or b.dim() != 2 or a.dtype != b.dtype or not a.is_cuda or a.device != b.device:
        return False
    if max(a.shape[0] * b.shape[1], _extent(a), _extent(b)) >= 2 ** 31:
        return False            # the kernel's offsets are 32-bit
    return _tensor_cores(a.device) and _precision_allows(a.dtype)


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b as a new contiguous tensor: the Triton kernel where it applies, else torch.mm."""
    if not applies(a, b):
        return torch.mm(a, b)
    return launch(a, b, SETTINGS[a.element_size()])


def launch(a: torch.Tensor, b: torch.Tensor, settings: tuple, descriptors: bool | None = None) -> torch.Tensor:
    """The kernel's launch with the given (BLOCK_M, BLOCK_N, BLOCK_K, stages, warps).
    descriptors: whether the operands are read through tensor descriptors (the Hopper GPU's
    TMA unit copies whole blocks into shared memory); None: where they can be."""
    (m, k), n = a.shape, b.shape[1]
    out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if out.numel() == 0:
        return out
    if k == 0:
        return out.zero_()
    block_m, block_n = settings[:2]
    grid = (-(-m // block_m) * -(-n // block_n),)
    _start(lambda kernel: kernel[grid], a, b, out, (m, k, n), a.stride(), b.stride(), settings,
           _descriptors_apply(a, b) if descriptors is None else descriptors)
    return out


def _start(how, a, b, out, sizes, a_stride, b_stride, settings: tuple, descriptors: bool) -> None:
    """One of the kernels on these operands, started by `how(kernel)(*arguments)`: a launch
    (kernel[grid]) or a compilation without one (kernel.warmup)."""
    (m, k, n), (block_m, block_n, block_k, stages, warps) = sizes, settings
    options = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=GROUP_M,
                   TF32=a.dtype == torch.float32, num_stages=stages, num_warps=warps)
    from . import matmul_kernels      # (imports Triton)
    # Triton launches on the current GPU
    with torch.cuda.device(a.device) if a.is_cuda else contextlib.nullcontext():
        if descriptors:
            from triton.tools.tensor_descriptor import TensorDescriptor
            a_desc = TensorDescriptor(a, [m, k], list(a_stride), [block_m, block_k])
            # b's transpose, (n, k) with rows of k: the layout the tensor cores read
            b_desc = TensorDescriptor(b, [n, k], [b_stride[1], b_stride[0]], [block_n, block_k])
            how(matmul_kernels.mm_descriptor_kernel)(a_desc, b_desc, out, m, n, k, **options)
        else:
            how(matmul_kernels.mm_kernel)(a, b, out, m, n, k, *a_stride, *b_stride,
                                          EVEN_K=k % block_k == 0, **options)


def _descriptors_apply(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() % 16 == 0 and b.data_ptr() % 16 == 0 \
        and _descriptors_fit(a.device, a.element_size(), a.stride(), b.stride())


def _descriptors_fit(device: torch.device, size: int, a_stride, b_stride) -> bool:
    """Tensor descriptors need a GPU with TMA (compute capability 9 or more), rows of k
    contiguous elements, and 16-byte aligned row strides (and addresses)."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] < 9:
        return False
    return a_stride[1] == 1 and b_stride[0] == 1 and (a_stride[0] * size) % 16 == 0 \
        and (b_stride[1] * size) % 16 == 0


def compile_ahead(products) -> None:
    """Compile the kernel for each product (dtype, device, (m, k, n), a's strides, b's) before
    its first launch, so that the first call does not wait for it: codegen/triton.py's
    compile_all runs this while the graph's generated kernels compile in worker processes.
    Triton's launcher keeps what it compiled for the launch that asks for the same
    specialization (the sizes, strides and 16-byte aligned addresses given here)."""
    for dtype, device, sizes, a_stride, b_stride in products:
        if not chosen(device, dtype) or min(sizes) == 0:
            continue
        base = torch.empty(16, dtype=dtype, device=device)        # (only its dtype and address count)
        _start(lambda kernel: functools.partial(kernel.warmup, grid=(1,)), base, base, base, sizes,
               a_stride, b_stride, SETTINGS[dtype.itemsize],
               _descriptors_fit(device, dtype.itemsize, a_stride, b_stride))


def _extent(t: torch.Tensor) -> int:
    """One past the largest element offset a tensor's view reaches."""
    return 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
