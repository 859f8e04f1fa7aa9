"""The whole-graph cache: a graph compiled before, in this process or another, is not lowered,
fused or generated again.

Takes a values-only FX graph and its example inputs (what `graph_compiler` compiles) and hands
back a key; stores and loads the bytes of an entry under it (`codegen.wrapper` makes the entry
and rebuilds the compiled graph from it). The key holds everything the generated code depends
on: the graph's code and what each of its calls is, the constants it holds, the inputs' sizes,
strides, dtypes, devices and which share memory, which dimensions are dynamic, minicompile's
settings, and the versions of minicompile (a hash of its source), PyTorch, Triton and Python,
and the device. The kernels' own caches (C++ libraries, Triton binaries) stay where they are:
an entry names their source, which finds them.

- `config.graph_cache` (environment: MINICOMPILE_GRAPH_CACHE=0) turns it off, and
  `config.cache_dir` (MINICOMPILE_CACHE_DIR) moves it, with the kernel caches.
- Entries are written to a temporary file and renamed into place, so processes sharing the
  cache never read half an entry. Each entry starts with a checksum of the rest: a truncated
  or corrupted entry is found, said in the `output_code` log and a warning (once), removed,
  and the graph compiled again.
- A graph whose calls or constants cannot be named or stored (a closure, a subgraph) is not
  stored; the `output_code` log says why.
- `minicompile.cache_info()`: hits, misses, stores, and entries found corrupted.
"""
from __future__ import annotations

import functools
import hashlib
import os
import pickle
import platform
import sys
import tempfile
import types

import torch

from .. import config, logs

_INFO = {"hits": 0, "misses": 0, "stores": 0, "corrupted": 0, "not_stored": 0,
         "frames_saved": 0, "frames_loaded": 0}     # (frame_store.py's)
_warned_corrupted = False


def info() -> dict:
    """Hits, misses, stores, entries found corrupted and graphs that could not be stored,
    since the process started; and where the cache is."""
    return {**_INFO, "directory": _directory()}


def _directory() -> str:
    return os.path.join(config.cache_dir, "graphs")


class NotCacheable(Exception):
    """The graph holds something the key cannot name (the reason is the message)."""


@functools.lru_cache(None)
def _versions() -> str:
    """minicompile's source (every .py file of the package), PyTorch's, Triton's and Python's
    versions, and the machine (C++ kernels are built for its processor)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    digest = hashlib.sha256()
    for root, _, files in sorted(os.walk(package)):
        for name in sorted(files):
            if name.endswith(".py"):
                with open(os.path.join(root, name), "rb") as f:
                    digest.update(name.encode() + f.read())
    try:
        from importlib.metadata import version
        triton = version("triton")
    except Exception:                  # noqa: BLE001 (not installed)
        triton = None
    return repr((digest.hexdigest(), torch.__version__, triton, sys.version_info[:3],
                 platform.machine(), platform.processor()))


def _target_name(target) -> str:
    """A call target as the key names it: a function of a module by its qualified name."""
    if isinstance(target, str):
        return target
    name = getattr(target, "__qualname__", None)
    module = getattr(target, "__module__", None)
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(target)
    if not isinstance(name, str) or "<locals>" in name or module is None:
        raise NotCacheable(f"the call target {target!r} has no name a later process can find")
    if isinstance(target, types.FunctionType) and module.split(".")[0] not in ("torch", "minicompile"):
        # a user's function in the graph: its code too, which may change between processes
        return f"{module}.{name}:{code_digest(target.__code__)}"
    return f"{module}.{name}"


@functools.lru_cache(maxsize=65536)       # (a code object never changes)
def code_digest(code: types.CodeType) -> str:
    """A digest of what a code object does, the same in every process that loads the same
    source: its bytecode, names, constants (nested code objects the same way), file and
    lines. (marshal's bytes are not: they mark objects shared within the code by reference
    counts, which differ between processes.)"""
    def parts(c):
        consts = tuple(parts(k) if isinstance(k, types.CodeType)
                       else ("frozenset", sorted(map(repr, k))) if isinstance(k, frozenset)
                       else (type(k).__name__, repr(k)) for k in c.co_consts)
        return (c.co_code, consts, c.co_names, c.co_varnames, c.co_freevars, c.co_cellvars,
                c.co_filename, c.co_name, c.co_qualname, c.co_firstlineno, c.co_flags,
                c.co_argcount, c.co_posonlyargcount, c.co_kwonlyargcount,
                getattr(c, "co_exceptiontable", b""), c.co_linetable)
    return hashlib.sha256(repr(parts(code)).encode()).hexdigest()[:32]


def _describe(value) -> tuple:
    if isinstance(value, torch.Tensor):
        device = value.device
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
        return ("tensor", tuple(value.shape), value.stride(), value.storage_offset(), str(value.dtype),
                name, value.requires_grad, isinstance(value, torch.nn.Parameter))
    if value is None or isinstance(value, (bool, int, float, str)):
        return (type(value).__name__, value)
    raise NotCacheable(f"an input of type {type(value).__name__}")


def graph_key(gm: torch.fx.GraphModule, example_inputs) -> str:
    """The key of a graph's compiled code; NotCacheable where something cannot be named."""
    # (and the global state lowering reads: the dtype of `torch.ones(3)`, of `2.5 * int_tensor`)
    parts = [gm.code, _versions(), torch.is_grad_enabled(), torch.backends.cuda.matmul.allow_tf32,
             torch.get_default_dtype()]
    for node in gm.graph.nodes:
        if node.op in ("call_function", "call_method"):
            parts.append((node.name, _target_name(node.target), bool(node.meta.get("draws_random"))))
        elif node.op == "call_module":
            raise NotCacheable("a call of a submodule")
        elif node.op == "get_attr":
            value = getattr(gm, node.target)
            if not isinstance(value, torch.Tensor):
                raise NotCacheable(f"a constant of type {type(value).__name__}")
            parts.append((node.target, _describe(value),
                          hashlib.sha256(value.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy()).hexdigest()))
        elif node.op == "placeholder":
            parts.append((node.name, sorted(node.meta.get("dynamic_dims", ()))))
    # (the storage's identity, which a backward graph's fake example inputs have too)
    storages = [t.untyped_storage()._cdata if isinstance(t, torch.Tensor) else None for t in example_inputs]
    parts.append([_describe(t) for t in example_inputs])
    parts.append([storages.index(s) if s is not None else None for s in storages])   # which share memory
    parts.append(settings())
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def settings() -> list:
    """minicompile's settings (config.py) that change what it compiles, as a key holds them."""
    # (where the caches are, and whether frames are saved, change nothing compiled)
    values = {k: v for k, v in vars(config).items() if not k.startswith("_") and k not in ("cache_dir", "frame_cache")
              and not callable(v) and not isinstance(v, type(os))}
    return sorted((k, repr(v)) for k, v in values.items())


def _path(key: str) -> str:
    return os.path.join(_directory(), f"{key}.entry")


def write_checked(path, value) -> None:
    """Pickle `value` into `path`, after a checksum of the pickle, written to a temporary file
    and renamed into place (a reader never sees half a file). Pickling errors propagate."""
    payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".tmp", dir=directory)
    with os.fdopen(fd, "wb") as f:
        f.write(hashlib.sha256(payload).digest() + payload)
    os.replace(tmp, path)


def read_checked(path):
    """What `write_checked` wrote at `path`; OSError where there is no file, ValueError where
    its checksum does not match (truncated or changed)."""
    with open(path, "rb") as f:
        data = f.read()
    checksum, payload = data[:32], data[32:]
    if hashlib.sha256(payload).digest() != checksum:
        raise ValueError("its checksum does not match (truncated or changed)")
    return pickle.loads(payload)


def load(key: str, count_miss: bool = True):
    """The entry stored under `key`, or None (a miss, counted where `count_miss`: a saved frame
    whose graph is missing is compiled, which counts it). A corrupted entry is removed and said."""
    path = _path(key)
    try:
        entry = read_checked(path)
    except OSError:
        _INFO["misses"] += count_miss
        return None
    except Exception as err:            # noqa: BLE001 (whatever is wrong with the file)
        _INFO["misses"] += count_miss
        corrupted(path, err, "graph cache entry", "the graph compiled again")
        return None
    _INFO["hits"] += 1
    return entry


def count(what: str) -> None:
    """One more of `what` in cache_info() (frames_saved, frames_loaded: frame_store.py's)."""
    _INFO[what] += 1


def corrupted(path: str, err: Exception, what: str, then: str) -> None:
    """A file of the cache that does not read back: counted, removed, said (a warning once)."""
    global _warned_corrupted
    _INFO["corrupted"] += 1
    reason = f"{what} {path} is corrupted ({err}): removed, and {then}"
    logs.log("output_code", reason)
    if not _warned_corrupted:
        _warned_corrupted = True
        logs.warn(f"minicompile: {reason}")
    try:
        os.unlink(path)
    except OSError:
        pass


def store(key: str, entry: dict) -> bool:
    """Write the entry under `key`, atomically; an entry that cannot be pickled is not stored.
    -> whether it was."""
    try:
        write_checked(_path(key), entry)
    except Exception as err:            # noqa: BLE001 (a constant pickle cannot write, a full disk)
        not_stored(f"{type(err).__name__}: {err}")
        return False
    _INFO["stores"] += 1
    return True


def not_stored(reason: str) -> None:
    _INFO["not_stored"] += 1
    logs.log("output_code", f"not stored in the graph cache: {reason}")
