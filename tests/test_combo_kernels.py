"""Combo kernels (fusion's combo-kernels pass): consecutive pointwise kernels that do not read
each other's results run as one launch, each part over its own sizes, with eager's results."""
import torch

import minicompile
from helpers import assert_same, randn


def test_independent_pointwise_kernels_are_one_launch(kernel_backend):
    def f(x, y, z):
        return x.sin() * 2, y.cos() + 1, torch.relu(z) - 3

    args = randn(7, 5), randn(13, layout="strided"), randn(3, 4, 2, layout="transposed")
    for a, e in zip(minicompile.compile(f)(*args), f(*args)):
        assert_same(a, e)
    assert minicompile.metrics.kernels == 1


def test_a_part_reading_what_another_writes_is_a_launch_of_its_own(kernel_backend):
    def f(x, y):
        a = x.exp()
        b = a[:3].sum(0)          # a reduction between: reads a, so a must be written first
        return a, (b + 1).sin(), y * 2

    args = randn(6, 4), randn(9)
    for a, e in zip(minicompile.compile(f)(*args), f(*args)):
        assert_same(a, e)


def test_no_part_writes_over_what_another_part_reads(kernel_backend):
    # u is an intermediate (a matrix product's result) read by two parts of different sizes:
    # the first may not write its result over u while the second still reads it
    def f(x, w):
        u = x @ w
        return u.sin(), u[:, :2].cos() * 3

    args = randn(8, 6), randn(6, 5)
    for _ in range(2):
        for a, e in zip(minicompile.compile(f)(*args), f(*args)):
            assert_same(a, e)


def test_the_fusion_log_says_what_was_launched_together(capsys, kernel_backend):
    minicompile.logs.set_logs(fusion=True)
    try:
        minicompile.compile(lambda x, y: (x + 1, y * 2))(randn(5), randn(3, 3))
    finally:
        minicompile.logs.set_logs(fusion=False)
    out = capsys.readouterr()
    assert "combo-kernels: kernel0, kernel1 launched as combo_kernel0" in out.out + out.err
