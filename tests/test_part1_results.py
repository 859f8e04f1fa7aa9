"""The committed Part I GPU results hold what the Part I notebooks read from them.

Fast (no compilation): checks benchmarks/results/part1_h100.json, written by
benchmarks/part1_gpu.py on an H100, for the sections and keys notebooks 02-08 load.
"""
import json
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "part1_h100.json"


@pytest.fixture(scope="module")
def results():
    return json.loads(RESULTS.read_text())


def test_measured_on_a_gpu(results):
    env = results["environment"]
    assert "H100" in env["device"] and env["torch"] and env["date"]
    assert results["precision"]


def test_relu_section(results):
    relu = results["sections"]["relu"]
    assert set(relu["large"]) == {"eager", "default", "reduce-overhead", "max-autotune"}
    assert set(relu["tiny"]) == {"eager", "default", "reduce-overhead"}
    assert relu["large"]["eager"]["speedup"] == pytest.approx(1.0)
    assert "@triton.jit" in relu["generated_code_1024"]


def test_dynamic_modes_section(results):
    dm = results["sections"]["dynamic_modes"]
    assert len(dm["sizes"]) == 16 and dm["buckets"]
    for name in ("eager", "reduce-overhead", "reduce-overhead, dynamic=False",
                 "reduce-overhead, padded to 3 buckets"):
        v = dm["variants"][name]
        assert {"first_pass_s", "steady_pass_ms", "speedup_steady", "counters"} <= set(v)


def test_optimizer_compile_time_and_models(results):
    s = results["sections"]
    assert {"eager_steps_per_s", "compiled_steps_per_s", "speedup", "model"} <= set(s["optimizer"])
    runs = s["compile_time"]["runs"]
    for name in ("eager", "whole, cold cache", "whole, warm cache", "regional, cold cache"):
        assert {"first_step_s", "steps_per_s"} <= set(runs[name])
    cases = s["models"]["cases"]
    for name in ("ResNet-50", "BERT-base", "GPT-2"):
        assert cases[name]["inference_speedup"] > 0 and cases[name]["training_speedup"] > 0
    assert s["models"]["note"]
