"""Buffer allocation for the generated wrapper code.

Takes a shape, strides, dtype and device; hands back an uninitialized tensor. And `on_device`,
which runs a GPU graph's wrapper with its device current.

On a CPU, a freshly allocated large tensor costs more than the kernel that fills it: the
operating system maps its memory lazily and takes a page fault (and zeroes a 4 KiB page) on the
first write to each page, 16,384 faults for a 64 MiB result. Asking for transparent huge pages
(`madvise(MADV_HUGEPAGE)`, where the kernel allows it) makes that 32 faults of 2 MiB. Eager
PyTorch and TorchInductor allocate the ordinary way; the "Why compile?" chapter measures the
difference. On a GPU, PyTorch's caching allocator already reuses memory.
"""
from __future__ import annotations

import ctypes
import sys

import torch

HUGE_PAGE = 2 << 20
MIN_BYTES = 4 * HUGE_PAGE          # below this, huge pages do not pay for the system call
MADV_HUGEPAGE = 14

_madvise = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(None, use_errno=True)
        _madvise = _libc.madvise
        _madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _madvise.restype = ctypes.c_int
    except (OSError, AttributeError):
        _madvise = None


def empty_strided(shape, stride, dtype, device) -> torch.Tensor:
    out = torch.empty_strided(shape, stride, dtype=dtype, device=device)
    if _madvise is not None and out.device.type == "cpu":
        nbytes = out.untyped_storage().nbytes()
        if nbytes >= MIN_BYTES:
            start = out.data_ptr()
            first = (start + HUGE_PAGE - 1) // HUGE_PAGE * HUGE_PAGE
            last = (start + nbytes) // HUGE_PAGE * HUGE_PAGE
            if last > first:
                _madvise(first, last - first, MADV_HUGEPAGE)   # advice only: failure is harmless
    return out


def on_device(index: int):
    """Decorates a GPU graph's `call`: run with GPU `index` the current device (the wrapper
    allocates its buffers on the current one), the caller's current device back after."""
    def decorate(call):
        def on_its_device(args):
            previous = torch._C._cuda_exchangeDevice(index)
            try:
                return call(args)
            finally:
                torch._C._cuda_maybeExchangeDevice(previous)
        return on_its_device
    return decorate


def as_layout(tensor: torch.Tensor, stride: tuple, returned: bool = False, dtype=None) -> torch.Tensor:
    """`tensor` with the given strides: itself when it already has them (dims of size 1 or 0
    aside, which no index reads), else a copy laid out so. Generated kernels index an extern
    op's result with the strides predicted at compile time; this makes the prediction a
    guarantee. `returned`: the graph hands the result out, where eager's strides show in those
    dims too (sdpa of an unsqueezed view): a view with them, no copy. An output the op left
    undefined (None: an LSTM's workspace on a CPU, an empty tensor to the trace) stays None.
    `dtype`: the predicted one, which kernels read the memory as; a result of another (where
    an op's fake kernel and its real one disagree: group norm's statistics of a bfloat16 input
    with float32 weights on a CPU) is converted to it, not read as bytes of the wrong type."""
    if tensor is None:
        return None
    if dtype is not None and tensor.dtype != dtype:
        tensor = tensor.to(dtype)
    actual = tensor.stride()
    if actual == stride:
        return tensor
    if all(a == b or n <= 1 for a, b, n in zip(actual, stride, tensor.shape)):
        return tensor.as_strided(tensor.shape, stride, tensor.storage_offset()) if returned else tensor
    repeated = [d for d, (s, n) in enumerate(zip(stride, tensor.shape)) if s == 0 and n > 1]
    if repeated:
        # a broadcast (eager's result repeats its values along these dims, a meshgrid's, say):
        # no memory can be copied into that layout; the values it repeats are, then expanded
        once = tensor
        for d in repeated:
            once = once.narrow(d, 0, 1)
        return as_layout(once, tuple(1 if d in repeated else s for d, s in enumerate(stride))).expand(tensor.shape)
    out = torch.empty_strided(tensor.shape, stride, dtype=tensor.dtype, device=tensor.device)
    return out.copy_(tensor)
