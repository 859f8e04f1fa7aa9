"""The compiler's decisions as pictures (matplotlib):

- `draw(fn_or_gm, example_inputs, passes)` (also reachable as `minicompile.fusion.draw`): the
  fusion decisions. One column per plan (a list of passes run by `schedule`), left to right; in
  each column one box per step, in execution order. A coloured box is a generated kernel: its
  name and kind, the operations it computes from top to bottom (a bold one is a buffer the
  kernel writes to memory; the others stay in registers or are recomputed), and the bytes it
  reads and writes. A grey, hatched box is an extern call: PyTorch's own kernel (a matrix
  product, a fallback).
- `draw_partition(joint, part)`: the AOT autograd partition (autograd/partition.py). Every node
  of the joint forward+backward graph, in the graph's order from left to right, in one of
  three lanes: the forward's work on top, the forward work the backward does (again) in the
  middle, the backward's work below; the saved values ringed in red.

matplotlib is imported only when drawing (it comes with the book's dependencies).
"""
from __future__ import annotations

import textwrap

import torch

from .fusion import PASSES, ExternCall, Kernel, _fused_origins, schedule

WIDTH, GAP, LINE, PAD = 2.6, 0.5, 0.42, 0.3      # data units: column width, gap, text line, box gap
EXTERN_COLOR = "#bbbbbb"
KERNEL_COLORS = [0, 1, 2, 3, 4, 5, 6, 8, 9]       # tab10 without its grey (7): grey is for externs


def draw(fn_or_gm, example_inputs, passes=None, ax=None, title: str | None = None):
    """Draw the kernels fusion makes for one graph; return the matplotlib Figure.

    fn_or_gm:        a torch.fx.GraphModule (e.g. `minicompile.explain(fn)(*args).graphs[0]`),
                     lowered with `example_inputs`; or a function or nn.Module, called once on
                     `example_inputs` to capture its graph (it must be one graph: no breaks).
    passes:          None (the default `PASSES`: what `minicompile.compile` runs); one list of
                     passes; or several plans, as {column title: list of passes} or as a list of
                     lists, drawn side by side (e.g. `PASSES[:k]` for growing k: before and after
                     each pass). Each plan is scheduled on a fresh lowering of the graph.
    ax:              a matplotlib Axes to draw into (all columns in it); None: a new figure sized
                     to the picture.
    title:           the Axes' title.

    Each kernel is one box (a FancyBboxPatch whose gid is the kernel's name; an extern call's
    gid is "extern:" and its buffer's name), listing the operations fused into it and
    "reads X, writes Y": the minimal bytes it moves (`Kernel.bytes_read`, `bytes_written`).
    """
    try:
        import matplotlib.pyplot as plt
        from matplotlib.patches import FancyBboxPatch
    except ImportError as e:                                   # pragma: no cover
        raise ImportError("fusion.draw needs matplotlib (pip install matplotlib, or the "
                          "package's [book] extra)") from e
    from .lower import lower

    gm, inputs = _graph(fn_or_gm, example_inputs)
    plans = _plans(passes)
    columns = [(label, schedule(lower(gm, inputs), passes=p)) for label, p in plans.items()]
    boxes = [[_box(step) for step in steps] for _, steps in columns]
    depth = max((sum(LINE * len(lines) + 0.3 + PAD for _, lines, _ in col) for col in boxes),
                default=0.0)

    if ax is None:          # about 0.75 inch per unit across and 0.4 inch down: 8pt text fits
        width, height = len(columns) * (WIDTH + GAP) - GAP + 0.4, depth + 1.4
        fig, ax = plt.subplots(figsize=(0.75 * width, 0.4 * height + (0.3 if title else 0.0)),
                               layout="constrained")
    else:
        fig = ax.figure
    for j, ((label, steps), col) in enumerate(zip(columns, boxes)):
        x0, y = j * (WIDTH + GAP), 0.0
        n_kernels = sum(isinstance(s, Kernel) for s in steps)
        n_externs = len(steps) - n_kernels
        moved = sum(s.bytes_read + s.bytes_written for s in steps if isinstance(s, Kernel))
        counts = f"{n_kernels} kernel{'s' * (n_kernels != 1)}"
        if n_externs:
            counts += f" + {n_externs} extern{'s' * (n_externs != 1)}"
        ax.text(x0 + WIDTH / 2, 0.25, f"{label}\n{counts}, {format_bytes(moved)} moved",
                ha="center", va="bottom", fontsize=8)
        for gid, lines, color in col:
            h = LINE * len(lines) + 0.3
            extern = gid.startswith("extern:")
            patch = FancyBboxPatch((x0, -y - h), WIDTH, h, boxstyle="round,pad=0.02",
                                   fc=color, alpha=0.35 if not extern else 0.6, ec="k",
                                   hatch="//" if extern else None, ls="--" if extern else "-")
            patch.set_gid(gid)
            ax.add_patch(patch)
            for k, (text, style) in enumerate(lines):
                ax.text(x0 + WIDTH / 2, -y - 0.15 - LINE * (k + 0.5), text, ha="center",
                        va="center", fontsize=7 if style == "small" else 8,
                        weight="bold" if style == "bold" else "normal",
                        style="italic" if style == "small" else "normal")
            y += h + PAD
    ax.set_xlim(-0.2, len(columns) * (WIDTH + GAP) - GAP + 0.2)
    ax.set_ylim(-depth - 0.1, 1.3)
    ax.axis("off")
    if title:
        ax.set_title(title)
    return fig


def format_bytes(n: int) -> str:
    """512 -> '512 B', 524288 -> '524.3 kB', 2.5e6 -> '2.50 MB' (powers of ten, as bandwidths)."""
    if n < 1e3:
        return f"{n} B"
    if n < 1e6:
        return f"{n / 1e3:.1f} kB"
    return f"{n / 1e6:.2f} MB"


def _graph(fn_or_gm, example_inputs):
    """(gm, inputs) to lower: a GraphModule as given, anything else captured."""
    inputs = list(example_inputs)
    if isinstance(fn_or_gm, torch.fx.GraphModule):
        return fn_or_gm, inputs
    from .api import capture_graph
    return capture_graph(fn_or_gm, *inputs)


def _plans(passes) -> dict:
    """{column title: list of passes}."""
    if passes is None:
        return {"PASSES": list(PASSES)}
    if isinstance(passes, dict):
        return {str(k): list(v) for k, v in passes.items()}
    passes = list(passes)
    if passes and all(isinstance(p, (list, tuple)) for p in passes):
        return {_label(list(p)): list(p) for p in passes}
    return {_label(passes): passes}


def _label(passes: list) -> str:
    """A column title for a list of passes: 'PASSES' or 'PASSES[:k]\\n+ last-pass' when it is
    (a prefix of) the default list, else the passes' names."""
    k = len(passes)
    if k and passes == list(PASSES[:k]):
        return "PASSES" if k == len(PASSES) else f"PASSES[:{k}]\n+ {passes[-1].name}"
    return "\n".join(textwrap.wrap(" + ".join(getattr(p, "name", type(p).__name__) for p in passes),
                                   30)) or "no passes"


def _box(step) -> tuple[str, list, object]:
    """(gid, [(text, style)], colour) of one step; style: 'bold' (a stored buffer), 'normal',
    or 'small' (the header and the bytes)."""
    if isinstance(step, ExternCall):
        op = step.box.data.op
        name = getattr(op, "__name__", str(op))
        return (f"extern:{step.box.name}",
                [("extern (PyTorch)", "small"), (name, "bold"),
                 (f"{step.box.name} {list(step.box.shape)}", "small")],
                EXTERN_COLOR)
    import matplotlib
    lines = [(f"{step.name} ({step.kind})", "small")]
    for m in step.members:
        # the ops computed for this member, the last being its own result (stored or not)
        mine = _fused_origins(m.box)
        lines += [(op, "bold" if k == len(mine) - 1 and m.box.name in step.stored else "normal")
                  for k, op in enumerate(mine)]
    lines.append((f"reads {format_bytes(step.bytes_read)}, writes {format_bytes(step.bytes_written)}",
                  "small"))
    index = int(step.name.removeprefix("kernel")) if step.name.removeprefix("kernel").isdigit() else 0
    return step.name, lines, matplotlib.colormaps["tab10"](KERNEL_COLORS[index % len(KERNEL_COLORS)])


# the lanes of draw_partition, top to bottom: (role, y, colour, legend label)
PARTITION_LANES = [("forward", 2.0, "tab:blue", "forward"),
                   ("recomputed", 1.0, "tab:purple", "recomputed in the backward"),
                   ("backward", 0.0, "tab:orange", "backward (reads a gradient)")]


def partition_roles(joint, part) -> dict:
    """{joint node name: role} for every node of the joint graph but its output. Roles: 'forward'
    (an input of the forward, or computed by the forward graph alone), 'recomputed' (computed by
    the backward graph without reading a gradient: forward work done again, or moved there),
    'backward' (a gradient input, or work that reads one)."""
    from .autograd.partition import _descendants
    graph = joint.graph.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    reads_tangent = _descendants(placeholders[joint.num_primals:])
    in_backward = {n.name for n in part.backward.graph.nodes if n.op == "call_function"}
    roles = {}
    for n in graph.nodes:
        if n.op == "output":
            continue
        if n in reads_tangent:
            roles[n.name] = "backward"
        elif n.name in in_backward:
            roles[n.name] = "recomputed"
        else:
            roles[n.name] = "forward"
    return roles


def draw_partition(joint, part=None, ax=None, title: str | None = None, labels: bool | None = None):
    """Draw the partition of a joint graph (autograd.trace_joint's) into forward and backward;
    return the matplotlib Figure.

    part:    its `Partition` (None: `autograd.partition(joint)`).
    labels:  write each node's op under it (None: when the graph has at most 40 nodes).

    Each node is one marker (a Line2D whose gid is 'role:name', role as `partition_roles`
    gives it), joined to the nodes it reads by grey lines; a saved value has a red ring and its
    gid ends in ':saved'. Every line from the top lane into the lower two leaves a saved value:
    what the backward reads of the forward is exactly what was saved.
    """
    try:
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
    except ImportError as e:                                   # pragma: no cover
        raise ImportError("draw_partition needs matplotlib (pip install matplotlib, or the "
                          "package's [book] extra)") from e
    from .autograd import partition

    part = part if part is not None else partition(joint)
    roles = partition_roles(joint, part)
    nodes = [n for n in joint.graph.graph.nodes if n.name in roles]
    saved = set(part.saved)
    labels = len(nodes) <= 40 if labels is None else labels
    lane = {role: (y, color) for role, y, color, _ in PARTITION_LANES}
    where = {n.name: (i, lane[roles[n.name]][0]) for i, n in enumerate(nodes)}
    if ax is None:
        width = min(16.0, max(6.0, 0.42 * len(nodes) if labels else 0.1 * len(nodes)))
        fig, ax = plt.subplots(figsize=(width, 3.2 + (0.3 if title else 0.0)), layout="constrained")
    else:
        fig = ax.figure
    for n in nodes:
        for m in n.all_input_nodes:
            (x0, y0), (x1, y1) = where[m.name], where[n.name]
            ax.plot([x0, x1], [y0, y1], color="0.75", lw=0.6, zorder=1)
    size = 9 if labels else 5
    for n in nodes:
        x, y = where[n.name]
        role = roles[n.name]
        gid = f"{role}:{n.name}" + (":saved" if n.name in saved else "")
        ax.plot([x], [y], marker="o", ms=size, color=lane[role][1], zorder=3,
                mec="red" if n.name in saved else "k", mew=2.2 if n.name in saved else 0.5, gid=gid)
        if labels:
            ax.text(x, y - 0.22, _op_name(n), rotation=60, ha="right", va="top", fontsize=7)
    counts = {role: sum(r == role for r in roles.values()) for role, *_ in PARTITION_LANES}
    handles = [Line2D([], [], marker="o", ls="", color=color, mec="k", mew=0.5,
                      label=f"{label}: {counts[role]}") for role, _, color, label in PARTITION_LANES]
    handles.append(Line2D([], [], marker="o", ls="", color="white", mec="red", mew=2.2,
                          label=f"saved: {len(saved)}, {format_bytes(part.saved_bytes)}"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    ax.set_yticks([y for _, y, _, _ in PARTITION_LANES], ["forward", "recomputed", "backward"])
    ax.set_ylim(-1.2 if labels else -0.4, 2.4)
    ax.set_xlim(-0.8, len(nodes) - 0.2)
    ax.set_xticks([])
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    if title:
        ax.set_title(title)
    return fig


def _op_name(node) -> str:
    """'mm', 'exp', 'permute', 'getitem'... or the placeholder's name."""
    if node.op == "placeholder":
        return node.name
    target = node.target
    name = getattr(target, "__name__", str(target))
    return name.split(".")[0]
