"""Saved frames (frame_store.py): a frame compiled by one process runs in the next without
being captured again, only where its saved guard holds; anything a later process could not
find again is not saved. Each case runs in fresh processes sharing one cache directory, on a
model defined in a module file that the case may edit between processes."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import minicompile
from minicompile import frame_store

MODEL = textwrap.dedent("""
    import torch

    SCALE = {scale}

    def helper(x):
        return torch.nn.functional.gelu(x) * {factor}

    class Inner(torch.nn.Module):
        def forward(self, x):
            return x - {inner}

    class Block(torch.nn.Module):
        def __init__(self, width=24):
            super().__init__()
            self.lin, self.norm, self.width = torch.nn.Linear(width, width), torch.nn.LayerNorm(width), width
            self.log, self.inner = [], Inner()
        def forward(self, x):
            self.log.append(self.width)             # a side effect, made on the call's own module
            return {{"y": helper(self.norm(self.lin(x))).softmax(-1) * SCALE + self.inner(x), "total": x.sum(0)}}
""")

PROGRAM = textwrap.dedent("""
    import json, os, sys
    import torch, minicompile
    import minicompile.capture.trace as trace
    sys.path.insert(0, os.environ["MODELS"])
    import model_file
    traced = []
    real = trace.trace_segment
    trace.trace_segment = lambda *a, **k: traced.append(1) or real(*a, **k)
    torch.manual_seed(0)
    block = model_file.Block().eval()
    x = torch.randn(int(os.environ.get("ROWS", 37)), 24)
    with torch.no_grad():
        got, want = minicompile.compile(block)(x), block(x)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-5)
    assert block.log == [24, 24], block.log
    info = minicompile.cache_info()
    print(json.dumps({"traced": len(traced), "saved": info["frames_saved"], "loaded": info["frames_loaded"],
                      "corrupted": info["corrupted"], "graphs": minicompile.metrics.graphs}))
""")


def run(tmp_path, scale=2.0, factor=3, inner=1, **env):
    models = tmp_path / "models"
    models.mkdir(exist_ok=True)
    (models / "model_file.py").write_text(MODEL.format(scale=scale, factor=factor, inner=inner))
    full = {**os.environ, "MINICOMPILE_CACHE_DIR": str(tmp_path / "cache"), "MINICOMPILE_GRAPH_CACHE": "1",
            "MINICOMPILE_CPU_BACKEND": "cpp", "MODELS": str(models), "PYTHONDONTWRITEBYTECODE": "1", **env}
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=full)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_later_process_runs_the_saved_frame_without_capture(tmp_path):
    assert run(tmp_path) == {"traced": 1, "saved": 1, "loaded": 0, "corrupted": 0, "graphs": 1}
    assert run(tmp_path) == {"traced": 0, "saved": 0, "loaded": 1, "corrupted": 0, "graphs": 1}
    # another size: the saved guard fails, the frame is captured (and saved beside the first)
    assert run(tmp_path, ROWS="5") == {"traced": 1, "saved": 1, "loaded": 0, "corrupted": 0, "graphs": 1}
    assert run(tmp_path, ROWS="5")["loaded"] == 1 and run(tmp_path)["loaded"] == 1


def test_what_the_trace_relied_on_changed_so_the_frame_is_captured_again(tmp_path):
    run(tmp_path)
    # a global the graph baked in, the code of a function it inlined, then that of a method of
    # another module class: each result is eager's (the program checks), from a new capture
    assert run(tmp_path, scale=5.0)["traced"] == 1
    assert run(tmp_path, factor=7)["traced"] == 1
    assert run(tmp_path, factor=7)["traced"] == 0
    assert run(tmp_path, factor=7, inner=2)["traced"] == 1


def test_the_frame_store_can_be_turned_off(tmp_path):
    run(tmp_path)
    assert run(tmp_path, MINICOMPILE_FRAME_CACHE="0")["traced"] == 1


def test_a_corrupted_file_is_said_and_the_frame_captured_again(tmp_path):
    run(tmp_path)
    (saved,) = (tmp_path / "cache" / "frames").iterdir()
    saved.write_bytes(saved.read_bytes()[:100])
    assert run(tmp_path) == {"traced": 1, "saved": 1, "loaded": 0, "corrupted": 1, "graphs": 1}
    assert run(tmp_path)["loaded"] == 1


def test_objects_without_a_name_elsewhere_are_not_saved(tmp_path, monkeypatch):
    monkeypatch.setattr(minicompile.config, "graph_cache", True)
    monkeypatch.setattr(minicompile.config, "cache_dir", str(tmp_path))
    def inner(x):
        return x.relu()

    def closure(x):              # its cell holds a function, guarded by identity: no name elsewhere
        return inner(x) * 2

    x = torch.randn(5, 3)
    logs = []
    monkeypatch.setattr(minicompile.logs, "log", lambda kind, text: logs.append((kind, text)))
    torch.testing.assert_close(minicompile.compile(closure)(x), closure(x))
    assert minicompile.cache_info()["frames_saved"] == 0
    assert any(kind == "guards" and "not saved for a later process" in text for kind, text in logs)
    with pytest.raises(frame_store.NotSaved):
        frame_store._recipe(lambda: 0, "OBJ_0")


def test_a_saved_name_must_find_the_same_function():
    def here(x):
        return x
    with pytest.raises(frame_store.NotSaved):             # a nested function: <locals> in its name
        frame_store._recipe(here)
    recipe = frame_store._recipe(frame_store.saved)
    assert frame_store._found(recipe) is frame_store.saved
    assert frame_store._found(frame_store._recipe(torch.nn.Linear)) is torch.nn.Linear
    changed = recipe[:4] + ("another digest",)
    with pytest.raises(LookupError):
        frame_store._found(changed)


def test_a_process_does_not_load_what_it_saved(tmp_path, monkeypatch):
    """minicompile.reset() forgets what the process compiled, as torch._dynamo.reset() does:
    the next call is captured again, not loaded from the frame this process saved."""
    monkeypatch.setattr(minicompile.config, "graph_cache", True)
    monkeypatch.setattr(minicompile.config, "cache_dir", str(tmp_path))
    x = torch.randn(4, 3)
    before = minicompile.cache_info()
    torch.testing.assert_close(minicompile.compile(_double_relu)(x), _double_relu(x))
    minicompile.reset()
    torch.testing.assert_close(minicompile.compile(_double_relu)(x), _double_relu(x))
    after = minicompile.cache_info()
    assert after["frames_saved"] - before["frames_saved"] == 2
    assert after["frames_loaded"] == before["frames_loaded"]
    assert minicompile.metrics.graphs == 2


def _double_relu(x):
    return (x * 2).relu()


def test_a_saved_template_keeps_shared_and_cyclic_parts():
    items = ["list", [["out", 0]]]
    items[1].append(items)
    saved = frame_store._template(["tuple", [items, items]], lambda c: c, lambda s: s)
    assert saved[1][0] is saved[1][1] and saved[1][0][1][1] is saved[1][0]


INFERENCE_PROGRAM = textwrap.dedent("""
    import json, os, sys
    import torch, minicompile
    sys.path.insert(0, os.environ["MODELS"])
    import inference_file
    torch.manual_seed(0)
    x = torch.randn(6, 4)
    got, want = minicompile.compile(inference_file.halved_sine)(x), inference_file.halved_sine(x)
    torch.testing.assert_close(got, want)
    assert got.is_inference() and want.is_inference()
    info = minicompile.cache_info()
    print(json.dumps({"saved": info["frames_saved"], "loaded": info["frames_loaded"]}))
""")


def test_a_saved_frame_keeps_the_inference_tensors_of_its_inference_mode_block(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    (models / "inference_file.py").write_text(textwrap.dedent("""
        import torch

        def halved_sine(x):
            with torch.inference_mode():
                return x.sin() / 2
    """))
    env = {**os.environ, "MINICOMPILE_CACHE_DIR": str(tmp_path / "cache"), "MINICOMPILE_GRAPH_CACHE": "1",
           "MINICOMPILE_CPU_BACKEND": "cpp", "MODELS": str(models), "PYTHONDONTWRITEBYTECODE": "1"}
    results = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", INFERENCE_PROGRAM], capture_output=True, text=True, env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert results == [{"saved": 1, "loaded": 0}, {"saved": 0, "loaded": 1}]
