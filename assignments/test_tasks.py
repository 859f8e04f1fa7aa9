"""Your assignments, graded: `pytest -m task1 assignments/test_tasks.py` (or task2 .. task5)
passes when the grader gives that task full marks; the score table is printed when it does not.
The same table for every task: `python -m minicompile.grade`."""
import os
import sys

import pytest

from minicompile import grade

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


@pytest.mark.parametrize("number", [pytest.param(n, marks=getattr(pytest.mark, f"task{n}"))
                                    for n in grade.TASKS])
def test_task(number):
    rows = grade.grade_task(number)
    got, out_of = grade.score(rows)
    assert got == out_of, "\n" + grade.table(rows)
