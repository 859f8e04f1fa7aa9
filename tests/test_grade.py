"""The assignments' autograder (minicompile.grade): full marks on the reference solutions, zero
with each stub's "not implemented" message, and fewer marks for plausible wrong solutions
(one or more per task). C++ kernels on a CPU."""
import os
import sys

import pytest
import torch

from minicompile import grade, ir
from minicompile.fusion.passes import loads, stores

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)                  # assignments/ lives at the repository's root

from assignments.solutions import a1_vertical, a2_registers, a3_horizontal, a4_cost, a5_rows  # noqa: E402

TASKS = [pytest.param(n, marks=getattr(pytest.mark, f"task{n}")) for n in grade.TASKS]


@pytest.mark.parametrize("number", TASKS)
def test_the_solution_gets_full_marks(number):
    rows = grade.grade_task(number, solutions=True)
    got, out_of = grade.score(rows)
    assert got == out_of > 0, grade.table(rows)
    assert all(r.correct == "yes" for r in rows)


@pytest.mark.task3
def test_horizontal_fusion_starts_from_siblings_apart():
    """Task 3 starts from the package's passes with a fuse-rows that merges a kernel only into
    the one just before it (the package's own looks back past other steps, which is what the
    student writes): the siblings example is two kernels there, one after the solution."""
    task = grade.TASKS[3]
    siblings = task.examples[0]
    steps = grade.schedule_of(siblings, task.before())
    assert sum(isinstance(s, grade.Kernel) for s in steps) == 2
    steps = grade.schedule_of(siblings, task.plan(a3_horizontal.FuseSiblings()))
    assert sum(isinstance(s, grade.Kernel) for s in steps) == siblings.kernels == 1


@pytest.mark.parametrize("number", TASKS)
def test_the_stub_gets_zero_with_its_message(number):
    rows = grade.grade_task(number)
    assert grade.score(rows)[0] == 0
    module = grade.TASKS[number].module
    for r in rows:
        assert r.note.startswith(f"NotImplementedError: Task {number} is not implemented yet"), r.note
        assert f"assignments/{module}.py" in r.note
    assert "not implemented yet" in grade.table(rows)


class NoLocalityCheck(a1_vertical.FusePointwise):
    """Wrong: fuses whatever has the same sizes, even a read of another element or a reduction."""
    def why_not(self, group, new):
        return None if list(new.box.shape) == list(group.x_sizes) or new.kind == "reduction" else "sizes"


class OnlyOutputs(a2_registers.KeepInRegisters):
    """Wrong: forgets that extern calls (and other kernels) read memory."""
    def needed(self, state):
        return {b.name for b in state.outputs}


class IgnoresDependencies(a3_horizontal.FuseSiblings):
    """Wrong: moves a kernel past the matrix product it reads."""
    def why_not_move(self, between, new):
        return None


class IgnoresWrites(a3_horizontal.FuseSiblings):
    """Wrong: checks what the steps between read instead of what they write."""
    def why_not_move(self, between, new):
        return "it reads their input" if any(loads(s) & stores(new) for s in between) else None


class NeverStore(a4_cost.StoreCostly):
    """Wrong: always recomputes (fewest bytes, but the costly work is repeated)."""
    def should_store(self, box):
        return False


class AlwaysStore(a4_cost.StoreCostly):
    """Wrong: stores every shared value, even one cheaper to recompute than to move."""
    def should_store(self, box):
        return True


class DoubleCountsBytes(a4_cost.StoreCostly):
    """Wrong: counts the store's bytes once per reader and for the write twice, so it never
    finds a value worth storing."""
    def should_store(self, box):
        readers = len(box.readers)
        return (readers - 1) * ir.reads_of(box).op_count > 2 * box.dtype.itemsize * (1 + readers) * readers


class NoLocalReads(a5_rows.FuseRowsAgain):
    """Wrong: merges every same-rows kernel without asking whether its reads come from registers
    (a value of another row is read as this row's)."""
    def merge(self, group, new):
        members_check = a5_rows.reads_are_local
        try:
            a5_rows.reads_are_local = lambda *args: True
            return super().merge(group, new)
        finally:
            a5_rows.reads_are_local = members_check


WRONG = [pytest.param(1, NoLocalityCheck, "transposed read", marks=pytest.mark.task1),
         pytest.param(1, NoLocalityCheck, "around a sum", marks=pytest.mark.task1),
         pytest.param(2, OnlyOutputs, "attention", marks=pytest.mark.task2),
         pytest.param(3, IgnoresDependencies, "depends on the matmul", marks=pytest.mark.task3),
         pytest.param(3, IgnoresWrites, "depends on the matmul", marks=pytest.mark.task3),
         pytest.param(4, NeverStore, "costly, read twice", marks=pytest.mark.task4),
         pytest.param(4, AlwaysStore, "cheap, read twice", marks=pytest.mark.task4),
         pytest.param(4, DoubleCountsBytes, "costly, read twice", marks=pytest.mark.task4),
         pytest.param(5, NoLocalReads, "reads another row", marks=pytest.mark.task5)]


@pytest.mark.parametrize("number, wrong, example", WRONG)
def test_a_wrong_solution_loses_marks(number, wrong, example):
    task = grade.TASKS[number]
    row = grade.grade_example(task, next(e for e in task.examples if e.name == example), wrong())
    assert row.points < row.out_of, grade.table([row])


def test_the_command_prints_the_table(capsys):
    assert grade.main(["--solutions", "--require-full", "1"]) == 0
    out = capsys.readouterr().out
    assert "chain" in out and "total" in out and "9/9" in out
    assert grade.main(["--require-full", "1"]) == 1


def test_compile_takes_the_pass_list_as_an_option():
    import minicompile
    x = torch.randn(37, 101)
    one_per_op = (grade.StoreEverything(), grade.MakeKernels())
    minicompile.metrics.reset()
    out = minicompile.compile(grade.chain, options={"fusion_passes": list(one_per_op)})(x)
    torch.testing.assert_close(out, grade.chain(x))
    assert minicompile.metrics.kernels == 5
    with pytest.raises(ValueError, match="unknown option"):
        minicompile.compile(grade.chain, options={"fusion_pass": []})
    # or as a setting, for every compile
    minicompile.reset()
    minicompile.metrics.reset()
    with minicompile.config.patch(fusion_passes=[grade.StoreEverything(), grade.MakeKernels()]):
        torch.testing.assert_close(minicompile.compile(grade.chain)(x), grade.chain(x))
    assert minicompile.metrics.kernels == 5


def test_the_fusion_log_says_why_not(capsys):
    import minicompile
    minicompile.set_logs(fusion=True)
    try:
        steps = grade.schedule_of(grade.TASKS[5].examples[2], grade.PASSES)
    finally:
        minicompile.set_logs(fusion=False)
    assert sum(isinstance(s, grade.Kernel) for s in steps) == 2
    out = capsys.readouterr().out
    assert "not fused with kernel0: it reads the kernel's results at other elements or rows" in out


@pytest.mark.parametrize("number", TASKS)
def test_a_stub_completed_at_its_task_mark_gets_full_marks(number, tmp_path, monkeypatch):
    """What a student does: edit only the lines between `# TASK n` and `# END TASK n`."""
    module = grade.TASKS[number].module
    stub = open(os.path.join(ROOT, "assignments", f"{module}.py")).read()
    solution = open(os.path.join(ROOT, "assignments", "solutions", f"{module}.py")).read()
    begin, end = f"        # TASK {number}\n", f"        # END TASK {number}\n"
    body = solution[solution.index(begin):solution.index(end)]
    completed = stub[:stub.index(begin)] + body + stub[stub.index(end):]
    (tmp_path / "assignments").mkdir()
    (tmp_path / "assignments" / "__init__.py").write_text("")
    (tmp_path / "assignments" / f"{module}.py").write_text(completed)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "assignments" or m.startswith("assignments.")]:
        monkeypatch.delitem(sys.modules, name)
    rows = grade.grade_task(number)
    got, out_of = grade.score(rows)
    assert got == out_of, grade.table(rows)
