"""minicompile.bench: how runs are compared (the benchmarks' method)."""
import torch

from minicompile import bench


def test_compare_records_each_versions_median_and_its_range():
    x = torch.randn(64, 64)
    records = bench.compare({"eager": lambda x: x * 2, "twice": lambda x: (x * 2) + 0},
                            [x], warmup=2, repeat=25)
    for rec in records.values():
        lo, hi = rec["median_ms_range"]
        assert 0 < lo <= hi and lo * 0.999 <= rec["median_ms"] <= hi * 1.001
    assert records["eager"]["speedup"] == 1.0


def test_verdict_is_a_tie_when_the_ranges_overlap():
    def rec(median, lo, hi):
        return {"median_ms": median, "median_ms_range": [lo, hi]}
    reference = rec(1.00, 0.99, 1.01)
    assert bench.verdict(rec(0.95, 0.94, 0.96), reference) == "faster"
    assert bench.verdict(rec(1.05, 1.04, 1.06), reference) == "slower"
    assert bench.verdict(rec(1.005, 1.0, 1.01), reference) == "tie"      # slower, but not resolved
    assert bench.verdict({"median_ms": 0.9}, {"median_ms": 1.0}) == "faster"   # older results
