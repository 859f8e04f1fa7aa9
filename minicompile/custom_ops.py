"""Operators of minicompile's own (torch.library, namespace `minicompile`): what the joint graph
records in place of an ATen op whose saved result would cost more memory than it needs.

Takes nothing; defines ops. autograd/joint.py's decompositions record them, lower/lowerings.py
lowers them to generated kernels; where lowering does not, they run these eager definitions.

- `max_pool2d_offsets(x, kernel_size, stride, padding, ceil_mode) -> (maxima, offsets)`: max
  pooling, with where each maximum is as its place in its window (`i * kw + j`, int8), not as
  an index into the input plane (int64): what the backward needs, in an eighth of the bytes
  (Inductor's low-memory max pooling does the same). ResNet-50's saved pooling indices at
  batch 32: 6.4 MB instead of 51 MB.
- `max_pool2d_offsets_to_indices(offsets, kernel_size, stride, padding, width)`: those
  offsets as the indices `max_pool2d_with_indices` gives (`h * width + w`), for its backward.
  Pointwise (tagged so): the partition recomputes it in the backward from the saved offsets.
- `check(cond, error, message)`: raises the exception named `error` (with `message`, if not
  None) unless every element of `cond` is true: what capture makes of `assert t` and
  `torch._check_tensor_all(t)` on a tensor's values, which would otherwise break the graph.
  It returns nothing and is kept though nothing reads it (FX's has_side_effect). With the error
  `RaisingPathTaken`, it stands for a branch whose other side runs straight into a `raise`
  (`if not ok.all(): raise ValueError(f"... {x}")`): the graph left that side out, so where the
  check fails the frame runs again from the graph's start as Python, and raises what eager does.
"""
from __future__ import annotations

import torch
import torch.fx

_LIBRARY = torch.library.Library("minicompile", "DEF")
_LIBRARY.define("max_pool2d_offsets(Tensor x, int[] kernel_size, int[] stride, int[] padding, bool ceil_mode)"
                " -> (Tensor, Tensor)")
_LIBRARY.define("max_pool2d_offsets_to_indices(Tensor offsets, int[] kernel_size, int[] stride, int[] padding, "
                "SymInt width) -> Tensor", tags=(torch.Tag.pointwise,))
_LIBRARY.define("check(Tensor cond, str error, str? message) -> ()")


# the largest window lowering unrolls into its kernels (a larger one stays PyTorch's pooling)
LARGEST_WINDOW = 25


def pair(v) -> list:
    """A 2-D op's size argument (kernel size, stride, padding...) for both dims: an int, or a
    sequence of one or two."""
    v = [v] if isinstance(v, int) else list(v)
    return v * 2 if len(v) == 1 else v


def pooling_sizes(kernel_size, stride, padding) -> tuple[list, list, list]:
    """A 2-D pooling's window, stride and padding as [rows, columns] each (`pair`); no stride
    (None or empty) is the window's."""
    kernel = pair(kernel_size)
    return kernel, pair(stride) if stride not in (None, (), []) else kernel, pair(padding)


def window_starts(out_height: int, out_width: int, stride, padding, device):
    """Each window's first row (as a column) and first column (as a row), padding counted:
    (out_height, 1) and (out_width,) int64 tensors."""
    rows = torch.arange(out_height, device=device) * stride[0] - padding[0]
    cols = torch.arange(out_width, device=device) * stride[1] - padding[1]
    return rows.view(out_height, 1), cols


@torch.library.impl(_LIBRARY, "max_pool2d_offsets", "CompositeExplicitAutograd")
def _max_pool2d_offsets(x, kernel_size, stride, padding, ceil_mode):
    maxima, indices = torch.ops.aten.max_pool2d_with_indices.default(x, kernel_size, stride, padding, [1, 1],
                                                                      ceil_mode)
    rows, cols = window_starts(*maxima.shape[-2:], stride, padding, x.device)
    width = x.shape[-1]
    offsets = (torch.div(indices, width, rounding_mode="floor") - rows) * kernel_size[1] \
        + (indices % width - cols)
    return maxima, offsets.to(torch.int8)


@torch.library.impl(_LIBRARY, "max_pool2d_offsets_to_indices", "CompositeExplicitAutograd")
def _max_pool2d_offsets_to_indices(offsets, kernel_size, stride, padding, width):
    rows, cols = window_starts(*offsets.shape[-2:], stride, padding, offsets.device)
    at = offsets.to(torch.int64)
    return (rows + torch.div(at, kernel_size[1], rounding_mode="floor")) * width + cols + at % kernel_size[1]


@torch.library.register_fake("minicompile::max_pool2d_offsets", lib=_LIBRARY)
def _max_pool2d_offsets_fake(x, kernel_size, stride, padding, ceil_mode):
    maxima, indices = torch.ops.aten.max_pool2d_with_indices.default(x, kernel_size, stride, padding, [1, 1],
                                                                      ceil_mode)
    return maxima, torch.empty_like(indices, dtype=torch.int8)


@torch.library.register_fake("minicompile::max_pool2d_offsets_to_indices", lib=_LIBRARY)
def _max_pool2d_offsets_to_indices_fake(offsets, kernel_size, stride, padding, width):
    return torch.empty_like(offsets, dtype=torch.int64)


max_pool2d_offsets = torch.ops.minicompile.max_pool2d_offsets.default
max_pool2d_offsets_to_indices = torch.ops.minicompile.max_pool2d_offsets_to_indices.default


class RaisingPathTaken(Exception):
    """A check of the side a branch takes failed: the frame takes the side that raises, which
    the graph does not hold (caught by capture's Segment.run, never seen by the user)."""


# the exceptions a check raises, by name (the op's schema takes strings)
CHECK_ERRORS = {e.__name__: e for e in (AssertionError, RuntimeError, ValueError, TypeError, IndexError,
                                       KeyError, NotImplementedError, RaisingPathTaken)}


@torch.library.impl(_LIBRARY, "check", "CompositeExplicitAutograd")
def _check(cond, error, message):
    if not bool(cond.all()):
        raise CHECK_ERRORS[error]() if message is None else CHECK_ERRORS[error](message)


@torch.library.register_fake("minicompile::check", lib=_LIBRARY)
def _check_fake(cond, error, message):
    return None


check = torch.ops.minicompile.check.default
torch.fx.node.has_side_effect(check)


def checks(graph: torch.fx.Graph) -> bool:
    """Whether a graph holds a check (which may raise where eager raises)."""
    return any(n.target is check for n in graph.nodes)


def checks_branches(graph: torch.fx.Graph) -> bool:
    """Whether a graph holds a check of a branch's side (RaisingPathTaken: run again on failure)."""
    return any(n.target is check and n.args[1] == RaisingPathTaken.__name__ for n in graph.nodes)
