"""The autograder of Part III's assignments: `python -m minicompile.grade [--solutions] [TASK...]`.

Takes a student's fusion pass (the class in `assignments/aN_*.py`, or the teacher's reference in
`assignments/solutions/`), puts it into the task's pass list (`Task.plan`) and hands back a
score table. Each example of a task is graded on

- correctness: compiled with the task's passes (`compile(..., options={"fusion_passes": ...})`,
  C++ kernels on a CPU, Triton on a GPU) and compared with eager PyTorch on fresh random inputs,
  at awkward sizes, in float32 and in bfloat16;
- kernels: the number of kernels generated (`minicompile.metrics.kernels`) against the target;
- bytes: the bytes those kernels move (`minicompile.metrics.bytes_moved()`) against the target;
- work (the cost-rule task): the operations the kernels compute, counted from the schedule.

A stub that raises NotImplementedError scores zero with its message; any other exception in a
student's pass scores zero for that example and is reported, never raised. `--speed` adds the
compiled code's time against eager's, measured in one run (shown, not scored).
"""
from __future__ import annotations

import argparse
import importlib
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from . import api, bench, config, ir, metrics
from .fusion import PASSES, FusionPass, Kernel, schedule
from .fusion.passes import ElideStores, FuseRows, InlinePointwise, MakeKernels
from .lower import lower
from .picture import format_bytes

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class StoreEverything(FusionPass):
    """Every computed value gets a buffer: one kernel per operation, as eager PyTorch runs."""
    name = "store-everything"

    def run(self, state):
        for box in state.boxes:
            if isinstance(box.data, (ir.Pointwise, ir.Reduction)):
                box.realize()


def _replace(passes, kind, new):
    return [new if isinstance(p, kind) else p for p in passes]


def _adjacent_rows() -> FuseRows:
    """The built-in fuse-rows without its look-back: it merges a kernel only into the one just
    before it. Task 3's starting point (the look-back is what the student writes)."""
    rows = FuseRows()
    rows.look_back = 0
    return rows


@dataclass
class Example:
    name: str
    fn: Callable
    shapes: list                      # input shapes (awkward on purpose)
    kernels: int                      # target: kernels generated (at most)
    bytes: int                        # target: bytes moved in float32 (at most)
    ops: int | None = None            # target: operations computed (at most), where graded

    def inputs(self, dtype=torch.float32, seed=None):
        g = torch.Generator().manual_seed(seed if seed is not None else int(time.time_ns() % 2**31))
        return [torch.randn(s, generator=g).to(DEVICE, dtype) for s in self.shapes]


@dataclass
class Task:
    number: int
    title: str
    module: str                       # assignments/<module>.py
    cls: str                          # the pass class the student completes
    plan: Callable                    # student's pass -> the list of passes compile runs
    examples: list = field(default_factory=list)
    notebook: str = ""

    def before(self) -> list:
        """The passes without the student's: what the task starts from."""
        return [p for p in self.plan(None) if p is not None]


# ------------------------------------------------------------------ the examples

def chain(x):
    return torch.sigmoid(x * 2 + 1) * x - 0.5


def transposed(x):
    y = x.exp()
    return y.t() * 2 + y


def around_a_sum(x):
    a = x.relu() + 1
    return a / a.sum(-1, keepdim=True)


def attention(q, k, v):
    return torch.softmax(q @ k.t(), -1) @ v


def mlp(x, w1, b1, w2):
    h = torch.relu(x @ w1 + b1)
    return torch.softmax(h, -1) @ w2


def softmax_out(x):
    return torch.softmax(x, -1) * 3


def siblings(x, w):
    return x.sum(-1), x @ w, x.amax(-1)


def dependent(x, w):
    s = x.sum(-1)
    h = x @ w
    return s, h.amax(-1)


def other_sizes(x, w):
    s = x.sum(-1)
    h = x @ w
    return s, h, x.sum(0)


def costly_shared(x):
    y = torch.sin(x) * torch.cos(x) + x.exp() + torch.tanh(x) * x.sigmoid()
    return y.relu(), y.sum(-1)


def cheap_shared(x):
    y = x * 2 + 1
    return y.sum(0), y.sum(-1)


def costly_three(x):
    y = (x.exp() + x.sin() * x.cos()).sigmoid() * torch.tanh(x) + x.erf()
    return y.sum(0), y.amax(-1), y * 2


def softmax(x):
    return torch.softmax(x, -1)


def layer_norm(x, w, b):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b)


def other_rows(x):
    return x - x.sum(-1)[None, :]


TASKS = {
    1: Task(1, "vertical fusion of a pointwise chain", "a1_vertical", "FusePointwise",
            lambda p: [StoreEverything(), MakeKernels(), p, ElideStores()],
            [Example("chain", chain, [(37, 101)], 1, 29896),
             Example("transposed read", transposed, [(53, 53)], 2, 44944),
             Example("around a sum", around_a_sum, [(29, 67)], 3, 39092)],
            "41_assignment_vertical"),
    2: Task(2, "keep values in registers (epilogues feeding matrix products)", "a2_registers",
            "KeepInRegisters", lambda p: PASSES[:-1] + [p],
            [Example("softmax", softmax_out, [(37, 101)], 1, 29896),
             Example("attention", attention, [(37, 24), (45, 24), (45, 19)], 1, 13320),
             Example("mlp epilogue", mlp, [(37, 24), (24, 33), (33,), (33, 7)], 1, 9900)],
            "42_assignment_registers"),
    3: Task(3, "horizontal fusion of siblings across an extern call", "a3_horizontal",
            "FuseSiblings", lambda p: _replace(PASSES[:-1], FuseRows, _adjacent_rows()) + [p, ElideStores()],
            [Example("siblings", siblings, [(37, 101), (101, 101)], 1, 15244),
             Example("depends on the matmul", dependent, [(37, 101), (101, 101)], 2, 30192),
             Example("a column sum", other_sizes, [(43, 61), (61, 61)], 2, 21400)],
            "43_assignment_horizontal"),
    4: Task(4, "a cost rule: store or recompute a shared value", "a4_cost", "StoreCostly",
            lambda p: _replace(PASSES, InlinePointwise, p),
            [Example("costly, read twice", costly_shared, [(37, 101)], 1, 30044, 37370),
             Example("cheap, read twice", cheap_shared, [(37, 101)], 2, 30448, 29896),
             Example("costly, read three times", costly_three, [(31, 47)], 3, 29452, 17484)],
            "44_assignment_cost"),
    5: Task(5, "a reduction with its producers and consumers in one kernel", "a5_rows",
            "FuseRowsAgain", lambda p: _replace(PASSES, FuseRows, p),
            [Example("softmax", softmax, [(37, 101)], 1, 29896),
             Example("layer norm", layer_norm, [(29, 67), (67,), (67,)], 1, 16080),
             Example("reads another row", other_rows, [(41, 41)], 2, 20500)],
            "45_assignment_rows"),
}


# ------------------------------------------------------------------ grading

@dataclass
class Row:
    task: int
    example: str
    correct: str = "-"
    kernels: str = "-"
    bytes: str = "-"
    ops: str = "-"
    speed: str = ""
    points: int = 0
    out_of: int = 0
    note: str = ""


def load_pass(task: Task, solutions: bool = False) -> FusionPass:
    """The student's pass (assignments/), or the reference (assignments/solutions/)."""
    package = "assignments.solutions" if solutions else "assignments"
    module = importlib.import_module(f"{package}.{task.module}")
    return getattr(module, task.cls)()


def plan_of(task: Task, student_pass) -> tuple:
    return tuple(p for p in task.plan(student_pass) if p is not None)


def schedule_of(example: Example, passes, inputs=None) -> list:
    """The steps `passes` make for the example (its graph captured and lowered afresh)."""
    gm, args = api.capture_graph(example.fn, *(inputs or example.inputs(seed=0)))
    return schedule(lower(gm, args), passes=list(passes))


def ops_computed(steps) -> int:
    """Operations the kernels compute: each member's operations per element (those of the
    values inlined into it included) times the elements it is computed for."""
    total = 0
    for step in steps:
        if isinstance(step, Kernel):
            for m in step.members:
                per_row = m.role == "x" and not isinstance(m.comp, ir.Reduction)
                n = math.prod(step.x_sizes) * (1 if per_row else math.prod(step.r_sizes or [1]))
                total += ir.reads_of(m.comp).op_count * n
    return total


def _close(got, want, dtype) -> bool:
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    got = got if isinstance(got, (tuple, list)) else [got]
    want = want if isinstance(want, (tuple, list)) else [want]
    return len(got) == len(want) and all(
        g.shape == w.shape and g.dtype == w.dtype and torch.allclose(g.float(), w.float(), rtol=tol, atol=tol)
        for g, w in zip(got, want))


def grade_example(task: Task, example: Example, student_pass, speed=False) -> Row:
    row = Row(task.number, example.name, out_of=4 if example.ops is not None else 3)
    passes = plan_of(task, student_pass)
    try:
        steps = schedule_of(example, passes)
    except NotImplementedError as err:
        row.note = f"NotImplementedError: {err}"
        return row
    except Exception as err:                     # a student's bug: zero here, never a crash
        row.note = f"the pass failed: {type(err).__name__}: {err}"
        return row
    compiled = api.compile(example.fn, fullgraph=True, options={"fusion_passes": passes})
    correct = True
    for dtype in (torch.float32, torch.bfloat16):
        args = example.inputs(dtype)
        try:
            metrics.reset()
            with torch.no_grad():
                got = compiled(*args)
        except Exception as err:
            row.correct, row.note = "crash", f"{dtype}: {type(err).__name__}: {str(err)[:200]}"
            return row
        if dtype == torch.float32:
            kernels, moved = metrics.kernels, metrics.bytes_moved()
        if not _close(got, example.fn(*args), dtype):
            correct = False
            row.note = f"differs from eager in {str(dtype).removeprefix('torch.')}"
    row.correct = "yes" if correct else "NO"
    row.kernels = f"{kernels} / {example.kernels}"
    row.bytes = f"{format_bytes(moved)} / {format_bytes(example.bytes)}"
    # kernels and bytes only count for a correct result: fusing wrongly is not a saving
    row.points = 1 + (kernels <= example.kernels) + (moved <= example.bytes) if correct else 0
    if example.ops is not None:
        ops = ops_computed(steps)
        row.ops = f"{ops} / {example.ops}"
        row.points += correct and ops <= example.ops
    if speed:                  # medians of eager and compiled calls, one after the other
        args = example.inputs()
        with torch.no_grad():
            row.speed = f"{bench.median_ms(example.fn, *args) / bench.median_ms(compiled, *args):.2f}x eager"
    return row


def grade_task(number: int, student_pass=None, *, solutions=False, speed=False) -> list[Row]:
    """Rows of one task: `student_pass` (a pass object), else the pass loaded from the
    assignments (or the solutions)."""
    task = TASKS[number]
    if student_pass is None:
        try:
            student_pass = load_pass(task, solutions)
        except Exception as err:
            return [Row(number, ex.name, out_of=4 if ex.ops is not None else 3,
                        note=f"cannot load {task.module}.{task.cls}: {type(err).__name__}: {err}")
                    for ex in task.examples]
    with config.patch(cpu_backend="cpp"):
        rows = [grade_example(task, ex, student_pass, speed) for ex in task.examples]
    stub = next((r.note for r in rows if r.note.startswith("NotImplementedError")), None)
    if stub:            # an unwritten pass scores zero, also where doing nothing happens to be right
        for r in rows:
            r.points, r.note = 0, stub
    return rows


def score(rows: list[Row]) -> tuple[int, int]:
    return sum(r.points for r in rows), sum(r.out_of for r in rows)


def table(rows: list[Row]) -> str:
    """The score table, one line per example, a total per task and overall."""
    speed = any(r.speed for r in rows)
    head = ["task", "example", "correct", "kernels", "bytes", "ops", "points"] + (["speed"] if speed else [])
    lines, notes = [], []
    for number in dict.fromkeys(r.task for r in rows):
        mine = [r for r in rows if r.task == number]
        for r in mine:
            cells = [str(r.task), r.example, r.correct, r.kernels, r.bytes, r.ops, f"{r.points}/{r.out_of}"]
            lines.append(cells + ([r.speed] if speed else []))
            if r.note:
                notes.append(f"task {r.task}, {r.example}: {r.note}")
        got, out_of = score(mine)
        lines.append(["", f"task {number} ({TASKS[number].module})", "", "", "", "", f"{got}/{out_of}"]
                     + ([""] if speed else []))
    got, out_of = score(rows)
    lines.append(["", "total", "", "", "", "", f"{got}/{out_of}"] + ([""] if speed else []))
    widths = [max(len(c[i]) for c in [head] + lines) for i in range(len(head))]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    out = [fmt(head), fmt(["-" * w for w in widths])] + [fmt(c) for c in lines]
    return "\n".join(out + [""] + notes)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minicompile.grade", description=__doc__.split("\n")[0])
    parser.add_argument("tasks", nargs="*", type=int, help="task numbers (default: all)")
    parser.add_argument("--solutions", action="store_true", help="grade assignments/solutions/")
    parser.add_argument("--speed", action="store_true", help="also time compiled code against eager")
    parser.add_argument("--require-full", action="store_true",
                        help="exit with status 1 unless every graded task has full marks")
    args = parser.parse_args(argv)
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")                   # assignments/ is found from the working directory
    rows = [r for n in (args.tasks or TASKS) for r in grade_task(n, solutions=args.solutions, speed=args.speed)]
    print(table(rows))
    got, out_of = score(rows)
    return 1 if args.require_full and got < out_of else 0


if __name__ == "__main__":
    sys.exit(main())


# ------------------------------------------------------------------ for the notebooks

def show(number: int, example: int = 0):
    """Draw one example of a task before and after the student's pass (the reference
    solution's when the stub is not written yet); return the matplotlib Figure."""
    from .picture import draw
    task = TASKS[number]
    ex = task.examples[example]
    plans = {"before": task.before()}
    try:
        mine = load_pass(task)
        schedule_of(ex, plan_of(task, mine))
        plans["after: your pass"] = list(plan_of(task, mine))
    except NotImplementedError as err:
        try:
            plans["after: the reference solution"] = list(plan_of(task, load_pass(task, solutions=True)))
            print(f"{err}\nshowing the reference solution's plan instead")
        except ImportError:                     # handed out without the solutions
            print(err)
    gm, args = api.capture_graph(ex.fn, *ex.inputs(seed=0))
    return draw(gm, args, plans, title=f"task {number}: {ex.name}")
