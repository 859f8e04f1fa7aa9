"""Logs, switched on per artifact as in torch.compile's TORCH_LOGS:

    minicompile.set_logs(graph_code=True, output_code=True)
    MINICOMPILE_LOGS="graph_code,fusion" python train.py

Artifacts: graph_code (each captured graph, with the user's source lines), graph_breaks,
guards, recompiles, dynamic (which dimensions are dynamic, and why some became static), bytecode, output_code (generated kernels and wrapper), fusion (decisions), aot_graphs (training: the forward and
backward graphs, what the forward saves for the backward and its bytes), cudagraphs
(mode="reduce-overhead": what is recorded, and why a graph is not), autotune (mode="max-autotune": the
launch settings timed for each kernel, and the one chosen).

`warn` raises minicompile's warnings at the user's line, not at minicompile's.
"""
from __future__ import annotations

import os
import sys
import warnings

ARTIFACTS = ("graph_code", "graph_breaks", "guards", "recompiles", "dynamic", "bytecode", "output_code",
             "fusion", "aot_graphs", "cudagraphs", "autotune")
_enabled: set[str] = set()


def set_logs(**artifacts: bool) -> None:
    """Enable (True) or disable (False) log artifacts by name; unknown names are an error."""
    unknown = set(artifacts) - set(ARTIFACTS)
    if unknown:
        raise ValueError(f"unknown log artifact(s) {sorted(unknown)}; known: {', '.join(ARTIFACTS)}")
    for name, on in artifacts.items():
        (_enabled.add if on else _enabled.discard)(name)


def enabled(artifact: str) -> bool:
    return artifact in _enabled


def log(artifact: str, message: str) -> None:
    if artifact in _enabled:
        print(f"[minicompile:{artifact}] {message}", file=sys.stdout)


def short_path(filename: str) -> str:
    """A file of an installed package from the package on (torch/nn/modules/linear.py): where
    the package is installed differs from machine to machine and says nothing to the reader."""
    _, installed, rest = filename.rpartition(os.sep + "site-packages" + os.sep)
    return rest if installed else filename


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """warnings.warn, located at the first frame outside minicompile and torch (torch calls
    minicompile as a backend): the user's line, which is what a warning should show."""
    internal = [os.path.dirname(__file__) + os.sep]
    if "torch" in sys.modules:
        internal.append(os.path.dirname(sys.modules["torch"].__file__) + os.sep)
    frame, level = sys._getframe(1), 2          # level 2: the frame that called warn
    while frame is not None and frame.f_code.co_filename.startswith(tuple(internal)):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def _from_environment() -> None:
    value = os.environ.get("MINICOMPILE_LOGS", "")
    names = [n.strip().lstrip("+") for n in value.split(",") if n.strip()]
    if names:
        set_logs(**{n: True for n in names})


_from_environment()
