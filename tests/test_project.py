"""The project's own conventions, and what a reader and a new user see: one repository URL,
Colab install cells that say what to do when the install fails, the README's example, warnings
that point at the user's line, generated C++ without unused helpers."""
import importlib.util
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
import yaml

import minicompile
from minicompile.codegen import cpp
from minicompile.graph_compiler import generated_source

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _sync_tool():
    spec = importlib.util.spec_from_file_location("sync_repo_url", ROOT / "tools" / "sync_repo_url.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def install_cell(path):
    cells = json.loads(path.read_text())["cells"]
    return "".join(next(c for c in cells if c["cell_type"] == "code")["source"])


def repository_url():
    return yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"].rstrip("/")


def test_pyproject_and_readme_name_the_configured_repository():
    assert f'Repository = "{repository_url()}"' in (ROOT / "pyproject.toml").read_text()
    assert f'"minicompile @ git+{repository_url()}"' in (ROOT / "README.md").read_text()


def test_every_notebook_installs_on_colab_only_and_keeps_torch():
    url = repository_url()
    assert NOTEBOOKS
    for path in NOTEBOOKS:
        first = install_cell(path)
        assert first == _sync_tool().install_cell(url), f"{path.name}: run `make sync-url`"
        assert '"google.colab" in sys.modules' in first, path.name
        assert f"minicompile @ git+{url}" in first, f"{path.name}: run `make sync-url`"
        for line in first.splitlines():
            if "pip install" in line:
                packages = line.split("#")[0].split("pip install", 1)[1].split()
                assert not any(re.match(r"['\"]?(torch|triton)\b", p) for p in packages), \
                    f"{path.name} must not reinstall torch or triton"


def test_notebooks_in_the_table_of_contents_exist():
    toc = (ROOT / "_toc.yml").read_text()
    for entry in re.findall(r"file:\s*(\S+)", toc):
        assert list(ROOT.glob(entry + ".*")), entry


def test_install_cell_says_what_to_do_when_the_install_fails(monkeypatch, tmp_path):
    """The Colab cell, run as on Colab with the repository unreachable (a path that does not
    exist, so pip fails offline): it stops with pip's error and what to do instead."""
    source = install_cell(NOTEBOOKS[0]).replace(repository_url(), (tmp_path / "no-such-repo").as_uri())
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    with pytest.raises(RuntimeError) as failed:
        exec(compile(source, "install_cell", "exec"), {})
    message = str(failed.value)
    assert "pip could not install minicompile @ git+file://" in message
    assert "clone the repository, run `pip install -e .`" in message and "wheel" in message


def test_install_cell_does_nothing_off_colab(monkeypatch):
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    ran = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: ran.append(a))
    exec(compile(install_cell(NOTEBOOKS[0]), "install_cell", "exec"), {})
    assert ran == []


def readme_python_blocks():
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


@pytest.mark.slow
def test_readme_example_runs_and_logs_a_fused_kernel():
    """The README's example, run as written in a fresh process: both ways of compiling log one
    fused kernel (and no fallback to PyTorch's kernels), and it prints what it says it prints."""
    (example,) = readme_python_blocks()
    run = subprocess.run([sys.executable, "-c", example], capture_output=True, text=True, cwd=ROOT,
                         timeout=600)
    assert run.returncode == 0, run.stderr
    logs = run.stdout.split("[minicompile:output_code]")[1:]
    assert len(logs) == 2, run.stdout               # minicompile.compile, then TorchDynamo's graph
    for log in logs:                                # its tensors are on the CPU: a C++ kernel
        assert log.count('extern "C" void kernel0(') == 1 and "kernel1" not in log, log
        assert "no lowering" not in log and "empty_strided_cpu" in log, log
    assert "\n1\n" in run.stdout                  # minicompile.metrics.kernels
    assert "Warning" not in run.stderr, run.stderr


def test_warnings_point_at_the_users_line():
    """A warning minicompile raises shows the user's file and line, not minicompile's."""
    compiled = minicompile.compile(torch.relu)          # a builtin: no bytecode, so it runs eagerly
    with pytest.warns(UserWarning, match="runs eagerly") as caught:
        compiled(torch.randn(3, 5)); line = sys._getframe().f_lineno  # noqa: E702
    assert (caught[0].filename, caught[0].lineno) == (__file__, line)

    def write(a, b):                    # a written, and b shares its memory: PyTorch's kernels run
        a.add_(1)
        return b * 2
    base = torch.randn(4)
    compiled = minicompile.compile(write)
    with pytest.warns(UserWarning, match="runs on PyTorch's kernels") as caught:
        compiled(base, base[:2]); line = sys._getframe().f_lineno  # noqa: E702
    assert (caught[0].filename, caught[0].lineno) == (__file__, line)


def test_generated_cpp_has_only_the_helpers_its_kernels_use():
    def prelude_of(fn, *args):
        gm = minicompile.explain(fn)(*args).graphs[0]
        source = generated_source(gm, list(args), "cpp")
        return source[:source.index(cpp.KERNEL_MARK)]

    x = torch.randn(37, 129)
    relu = prelude_of(lambda x: torch.relu(x + 1) * 2, x)
    assert "mc_relu" in relu and "mc_add" in relu and "mc_wide" in relu       # mc_add uses mc_wide
    assert not any(name in relu for name in ("mc_exp", "mc_philox", "mc_bf16", "mc_sigmoid", "_Float16"))
    sigmoid = prelude_of(lambda x: torch.sigmoid(x), x)
    assert "mc_sigmoid" in sigmoid and "mc_exp" in sigmoid                     # sigmoid uses exp
    assert sigmoid.index("mc_exp(T a)") < sigmoid.index("mc_sigmoid(T a)")
    assert "mc_add" not in sigmoid


def test_logs_name_installed_files_from_their_package():
    from minicompile import logs
    installed = os.path.join(os.sep, "home", "me", "venv", "lib", "python3.12", "site-packages",
                             "torch", "nn", "modules", "linear.py")
    assert logs.short_path(installed) == os.path.join("torch", "nn", "modules", "linear.py")
    assert logs.short_path(__file__) == __file__                # the user's own files keep their path
