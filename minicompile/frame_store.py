"""Saved frames: a frame compiled by an earlier process runs without being captured again.

Takes, from api.py, a frame's first segment once it is compiled: its guard (the generated
sources and the namespace they run in), how its result is made from the graph's outputs, and
the whole-graph cache's key of its compiled code. Hands on, in a later process, the same
segment ready to run: a call of the same code whose guard holds is not traced, lowered or
generated (TorchDynamo's "precompile" caching does the same). The graph cache alone still
captures every frame, which on a CPU is most of a warm start.

Why it is safe: a saved guard checks what the capture's guard checked. What the guard's
namespace held by identity (a class, a function, a code object, a module) is saved as a name
another process finds it by: its module, looked up among those already imported (nothing is
imported to look), and its qualified name; for a function also a digest of its bytecode,
defaults and closure (runtime/cache.code_digest), for a class one of its bases and its methods'
code, so a function or class whose code changed is not taken for the one traced. The C++
tensor check is made again from the tensors' saved properties. Where anything cannot be named
so (a nested function, an object of the user's, a tensor subclass), the frame is not saved,
and the `guards` log says why.

Saved: the first segment of a frame that returns (no graph break), compiled
by minicompile's own backend into one generated graph (no writes to its inputs, no CUDA
graphs, not for training, no conditions between sizes). Files: cache_dir/frames/<key>, the
key made of the code's digest, the compile options, and the versions and settings the graph
cache keys on; each holds up to config.recompile_limit entries, newest first, checksummed as
graph cache entries are. Off with config.frame_cache (MINICOMPILE_FRAME_CACHE=0), and
wherever the graph cache is off.
"""
from __future__ import annotations

import enum
import hashlib
import os
import pickle
import sys
import types

import torch

from . import config, logs
from .capture.frame import Segment, SourceRead
from .capture.guards import default_namespace, generated
from .codegen import wrapper
from .runtime import cache

FORMAT = "minicompile-frames-1"
# who saved an entry: a process does not load its own (what it compiled and then forgot, by
# minicompile.reset(), it compiles again, as TorchDynamo's reset means)
PROCESS = f"{os.getpid()}-{os.urandom(8).hex()}"
_DEFAULT_NAMES = frozenset(default_namespace())       # bound in every guard's namespace
_MISSING = object()


class NotSaved(Exception):
    """The segment holds something another process could not find again (the reason)."""


def frame_key(func: types.FunctionType, backend_name: str, options: tuple, fullgraph: bool, dynamic):
    """The file name of a frame's saved entries, or None where frames are not saved."""
    if not (config.frame_cache and config.graph_cache) or backend_name != "minicompile" \
            or logs.enabled("fusion"):
        return None
    parts = (cache.code_digest(func.__code__), repr(options), fullgraph, repr(dynamic), cache._versions(),
             cache.settings())
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def _path(key: str) -> str:
    return os.path.join(config.cache_dir, "frames", key)


# ---------------------------------------------------------------------------------------
# Saving
# ---------------------------------------------------------------------------------------
def save(key: str, seg) -> None:
    """Add the compiled segment to the frame's saved entries (or log why it cannot be)."""
    try:
        record = _record(seg)
    except Exception as err:            # noqa: BLE001 (NotSaved, or an object that fails to be read)
        logs.log("guards", f"[{getattr(seg, 'compile_id', '?')}] not saved for a later process: {err}")
        return
    records = [r for r in saved(key) if r["guard"] != record["guard"]]
    try:
        cache.write_checked(_path(key), {"format": FORMAT,
                                         "records": [record] + records[:config.recompile_limit - 1]})
    except OSError as err:
        logs.log("guards", f"not saved for a later process: {err}")
        return
    cache.count("frames_saved")


def _record(seg) -> dict:
    compiled, code = seg.compiled, seg.guard_code
    if seg.offset != 0 or seg.eager or seg.end != "return":
        raise NotSaved("only a frame that returns, with no graph break, is saved")
    if seg.subclass_outputs:
        raise NotSaved("an output of a tensor subclass (its class is not saved)")
    if type(compiled) is not wrapper.CompiledGraph or compiled.cache_key is None or compiled.shape_guards:
        raise NotSaved("only one generated graph that writes no input, with no conditions between "
                       "sizes, is saved (not a graph for training, with CUDA graphs, or not in the "
                       "graph cache)")
    namespace, holders = {}, _holders(code.namespace)
    for name, value in code.namespace.items():
        if name in code.sources or name == "__builtins__":
            continue
        namespace[name] = ("default",) if name in _DEFAULT_NAMES else \
            _tensor_checks(code.tensors) if name == "TENSORS" else _recipe(value, name, code.namespace, holders)
    try:
        gm = pickle.dumps(seg.gm)
    except Exception as err:          # noqa: BLE001 (whatever the graph holds)
        raise NotSaved(f"the graph cannot be pickled ({type(err).__name__}: {err})") from None
    saving, memo = (_recipe, lambda read: read.expr), {}
    return {"process": PROCESS, "guard": code.sources["guard"], "sources": code.sources, "namespace": namespace,
            "where": code.where, "template": _template(seg.template, *saving, memo),
            "effects": [_effect(e, *saving, memo) for e in seg.effects],
            "cache_key": compiled.cache_key, "input_sources": seg.input_sources,
            "n_calls": seg.n_calls, "gm": gm, "inference": (seg.inference_whole, seg.inference_outputs)}


def _plain(value) -> bool:
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes, torch.dtype, torch.device)):
        return type(value) in (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device)
    if type(value) in (tuple, list, frozenset, torch.Size):
        return all(_plain(v) for v in value)
    if type(value) is dict:
        return all(_plain(k) and _plain(v) for k, v in value.items())
    return False


def _holders(namespace: dict) -> dict:
    """id -> (how, holder, key) for what the guard's namespace holds inside another of its
    values: a function's code, defaults, closure cells and the functions in them; a class's
    methods and properties (its VARS_ entry)."""
    held = {}
    for key, v in namespace.items():
        if key.startswith("VARS_"):
            for attr, member in v.items():
                if isinstance(member, _CODE_HOLDERS):
                    held.setdefault(id(member), ("classattr", namespace[key[len("VARS_"):]], attr))
    for f in _functions(namespace):
        for i, cell in enumerate(f.__closure__ or ()):
            held[id(cell)] = ("cell", f, i)
            if isinstance(_contents(cell), types.FunctionType):
                held[id(_contents(cell))] = ("contents", f, i)
        for attr in ("__code__", "__defaults__", "__kwdefaults__"):
            if getattr(f, attr) is not None:
                held[id(getattr(f, attr))] = ("attr", f, attr)
    return held


def _recipe(value, name: str = "", namespace=None, holders=None, depth: int = 0):
    """How a later process finds `value` again; NotSaved where it cannot. `holders`: the
    namespace's _holders, through which what it holds inside its values is found."""
    if depth > 24:
        raise NotSaved(f"{name or 'a value'} ({type(value).__name__}): names nested too deep")
    if isinstance(value, types.ModuleType):
        return ("module", value.__name__)
    if isinstance(value, enum.Enum):
        return ("member", _recipe(type(value), depth=depth + 1), value.name)
    if isinstance(value, types.MappingProxyType) and name.startswith("VARS_"):
        return ("vars", _recipe(namespace[name[len("VARS_"):]], depth=depth + 1))
    if _plain(value) and not name.startswith("OBJ_") or value is None or type(value) is bool:
        return ("value", value)            # (an OBJ_ is checked by identity: `is` an equal copy fails)
    how, holder, key = (holders or {}).get(id(value), (None, None, None))
    if how in ("attr", "contents"):
        # a function's code, defaults or a function in its cell, guarded by identity: found
        # again through the function
        return (how, _recipe(holder, depth=depth + 1), key)
    if isinstance(value, types.CellType):       # an inlined function's cell (CELL_<name>)
        if how != "cell":
            raise NotSaved(f"{name}: a closure cell of no function the guard holds")
        return ("cell", _recipe(holder, depth=depth + 1), key)
    if how == "classattr":
        # a class's method or property the trace ran: found on its class, and its code the same
        return ("classattr", _recipe(holder, depth=depth + 1), key, _member_digest(value, depth + 1))
    if type(value) is dict and isinstance(value.get("__name__"), str) \
            and getattr(sys.modules.get(value["__name__"]), "__dict__", None) is value:
        return ("globals", value["__name__"])            # a module's globals (G_<module> in guards)
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if module == "builtins" and isinstance(value, type) and _find(module, qualname) is not value:
        # a type of the interpreter's without a builtin name (code, function): types' name for it
        module, qualname = "types", next((k for k, v in vars(types).items() if v is value), "<none>")
    found, unwrap = _MISSING, ()
    if isinstance(module, str) and isinstance(qualname, str) and "<" not in qualname:
        found = _find(module, qualname)
        # what the name finds may hold the function: a decorator's wrapper (functools.wraps
        # gives it the same name), a property (its getter's name), a class method
        paths = [((), found)]
        while paths and paths[0][1] is not value:
            path, obj = paths.pop(0)
            if len(path) < 4:
                paths += [(path + (a,), getattr(obj, a)) for a in _HOLDERS if hasattr(obj, a)]
        found, unwrap = (value, paths[0][0]) if paths else (_MISSING, ())
    if found is not value:
        raise NotSaved(f"{name or 'a value'} ({type(value).__name__} {qualname or value!r:.60}) has no "
                       "name another process finds it by")
    digest = _digest(value, depth) if isinstance(value, types.FunctionType) else \
        _type_digest(value) if isinstance(value, type) else None
    return ("named", module, qualname, unwrap, digest)


_CODE_HOLDERS = (types.FunctionType, property, staticmethod, classmethod)


def _functions_of(member) -> list:
    """The functions a class member runs: itself (a method), a property's getter, setter and
    deleter, a static or class method's function."""
    return [f for f in (member, *(getattr(member, a, None) for a in ("fget", "fset", "fdel", "__func__")))
            if isinstance(f, types.FunctionType)]


def _contents(cell):
    try:
        return cell.cell_contents
    except ValueError:                  # an empty cell
        return _MISSING


def _member_digest(value, depth: int = 0) -> str:
    """A class member that holds code (a method, a property, a static or class method): the
    code it runs."""
    return repr([_digest(f, depth) for f in _functions_of(value)])


def _type_digest(cls: type) -> str:
    """A class by its bases and the code of its own methods and those it inherits from classes
    outside torch (which the guard's checks, written for the class as traced, rely on: which
    class of the MRO defines what, how attributes are read)."""
    parts = []
    for k in cls.__mro__:
        parts.append((k.__module__, k.__qualname__))
        if k.__module__.split(".")[0] not in ("torch", "builtins", "typing", "abc", "collections"):
            parts.append(sorted((name, repr([cache.code_digest(f.__code__) for f in _functions_of(v)]))
                                for name, v in vars(k).items() if isinstance(v, _CODE_HOLDERS)))
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def _functions(namespace):
    return [f for f in (namespace or {}).values() if isinstance(f, types.FunctionType)]


def _digest(fn: types.FunctionType, depth: int = 0, seen: dict | None = None) -> str:
    """What calling a function runs, beyond its globals (guarded apart): its code, and its
    defaults and what its closure cells hold (a method's __class__, a decorator's function)."""
    seen = {} if seen is None else seen
    seen[id(fn)] = len(seen)
    cells = [_contents(c) for c in fn.__closure__ or ()]
    if any(c is _MISSING for c in cells):
        raise NotSaved(f"function {fn.__qualname__} has an empty closure cell")
    return cache.code_digest(fn.__code__) + repr(_content((fn.__defaults__, fn.__kwdefaults__, cells),
                                                         depth + 1, seen))


def _content(value, depth: int, seen: dict):
    """What a value is, the same in any process where it is the same: plain values as they
    are, functions by what they run, modules and classes by name, other objects by their type
    and state; one met again on the way (a wrapper whose cell holds itself) by when it was
    first met. NotSaved where that goes on too deep or meets a tensor."""
    if depth > 24:
        raise NotSaved(f"a {type(value).__name__} among a function's defaults and cells: nested too deep")
    if id(value) in seen:
        return ("seen", seen[id(value)])
    if isinstance(value, frozenset):                     # (its order depends on the hash seed)
        return ("frozenset", sorted(repr(_content(v, depth + 1, seen)) for v in value))
    if isinstance(value, (tuple, list)) and type(value) in (tuple, list):
        return (type(value).__name__, [_content(v, depth + 1, seen) for v in value])
    if type(value) is dict:
        return ("dict", [(_content(k, depth + 1, seen), _content(v, depth + 1, seen)) for k, v in value.items()])
    if _plain(value):
        return value
    if isinstance(value, types.FunctionType):
        return ("function", _digest(value, depth + 1, seen))
    if isinstance(value, types.MethodType):
        return ("method", _content(value.__self__, depth + 1, seen), _content(value.__func__, depth + 1, seen))
    try:
        return _recipe(value, depth=depth + 1)
    except NotSaved:
        state = getattr(value, "__dict__", None)
        if type(state) is not dict or isinstance(value, torch.Tensor):
            raise
        seen[id(value)] = len(seen)
        return ("object", _recipe(type(value), depth=depth + 1), _content(state, depth + 1, seen))


_HOLDERS = ("__wrapped__", "fget", "fset", "fdel", "__func__")


def _find(module: str, qualname: str, unwrap: tuple = ()):
    obj = sys.modules.get(module, _MISSING)
    for part in qualname.split(".") + list(unwrap):
        if obj is _MISSING:
            break
        obj = getattr(obj, part, _MISSING)
    return obj


def _tensor_checks(tensors) -> tuple:
    """The C++ tensor check's tensors as (kind, dtype, device, requires_grad), sizes, strides:
    it is made again from tensors of one element with the same properties, which only holds
    where those have the same dispatch keys (not an inference tensor, a conjugate view...)."""
    kinds = []
    for t in tensors:
        kind = {torch.Tensor: "tensor", torch.nn.Parameter: "parameter"}.get(type(t))
        if kind is None:
            raise NotSaved(f"a tensor of type {type(t).__name__}")
        props = (kind, t.dtype, str(t.device), t.requires_grad)
        if torch._C._dispatch_keys(_like(*props)) != torch._C._dispatch_keys(t):
            raise NotSaved(f"a tensor with dispatch keys {torch._C._dispatch_keys(t)}")
        kinds.append(props)
    return ("tensors", kinds, [list(t.shape) for t in tensors], [list(t.stride()) for t in tensors])


def _like(kind, dtype, device, requires_grad) -> torch.Tensor:
    t = torch.empty(1, dtype=dtype, device=device)
    if kind == "parameter":
        return torch.nn.Parameter(t, requires_grad=requires_grad)
    return t.requires_grad_(requires_grad)


def _template(t, classes, sources, memo=None):
    """A template (frame.rebuild's: how a value is made from the graph's outputs and the call's
    state) with its classes and its reads of the call's state converted: to what is saved, or
    back. NotSaved for what holds objects of this process. `memo` (one per record) keeps a part
    met twice one part, as `rebuild` needs it to keep identity (and to follow a cycle)."""
    memo = {} if memo is None else memo
    if id(t) in memo:
        return memo[id(t)]
    r = memo[id(t)] = []                   # filled in place: a part may refer back to it
    r.extend(_converted(t, lambda x: _template(x, classes, sources, memo), classes, sources))
    return r


def _converted(t, part, classes, sources):
    kind = t[0]
    if kind in ("out", "deleted") or kind == "const" and _plain(t[1]):
        return t
    if kind == "src":
        return [kind, sources(t[1])]
    if kind in ("tuple", "list", "Size"):
        return [kind, [part(x) for x in t[1]]]
    if kind == "dict" and all(_plain(k) for k, _ in t[1]):
        return [kind, [(k, part(x)) for k, x in t[1]]]
    if kind == "namedtuple":
        return [kind, classes(t[1]), [part(x) for x in t[2]]]
    if kind in ("modeloutput", "obj") and all(type(k) is str for k, _ in t[2]):
        # a ModelOutput, or an object made in the frame (a new one per call, its attributes)
        return [kind, classes(t[1]), [(k, part(x)) for k, x in t[2]]]
    if kind == "new":                      # a module made in the frame, made again per call
        return [kind, classes(t[1]), [part(x) for x in t[2]], [(k, part(x)) for k, x in t[3]]]
    raise NotSaved(f"the result holds a {kind!r} value")


def _effect(effect, classes, sources, memo):
    """A side effect (frame.Segment.effects: what kind of write, the object written, what is
    written) converted as _template converts."""
    kind, obj, what = effect
    if kind == "advance":
        return (kind, sources(obj), what)
    if kind == "list":
        return (kind, sources(obj), _template(what, classes, sources, memo))
    if not all(_plain(name) for name, _ in what):
        raise NotSaved("a side effect on a dict with keys that are objects")
    return (kind, sources(obj), [(name, _template(t, classes, sources, memo)) for name, t in what])


# ---------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------
def saved(key: str) -> list:
    """The frame's saved entries, newest first (api.py takes those of other processes)."""
    path = _path(key)
    try:
        data = cache.read_checked(path)
    except OSError:
        return []
    except Exception as err:            # noqa: BLE001 (whatever is wrong with the file)
        cache.corrupted(path, err, "saved frame", "the frame captured again")
        return []
    return data["records"] if isinstance(data, dict) and data.get("format") == FORMAT else []


def segment(record: dict, F, args, kwargs):
    """(the saved segment, its graph's inputs) where its guard holds for this call, else None
    (something it names is not found, or is not what was traced, or the guard fails)."""
    try:
        return _segment(record, F, args, kwargs)
    except LookupError:
        return None
    except Exception as err:            # noqa: BLE001 (a saved entry must never fail the call)
        logs.log("guards", f"a saved frame could not be loaded ({type(err).__name__}: {err}): captured instead")
        return None


def _segment(record: dict, F, args, kwargs):
    if "resolved" not in record:
        # what the entry names, found in this process once (its guard may fail on this call
        # and hold on a later one); not kept where a name is not found yet
        ns = {name: _found(recipe) for name, recipe in record["namespace"].items() if recipe[0] != "default"}
        ns.update(default_namespace())
        loading, memo = (_found, lambda expr: SourceRead(expr, ns)), {}
        record["resolved"] = (generated(dict(record["sources"]), ns, record["where"]),
                              _template(record["template"], *loading, memo),
                              [_effect(e, *loading, memo) for e in record["effects"]])
    code, template, effects = record["resolved"]
    inputs = code.check(F, args, kwargs)
    if inputs is None:
        return None
    entry = cache.load(record["cache_key"], count_miss=False)
    if entry is None:
        return None
    compiled = wrapper.rebuild(entry)
    compiled.shape_guards, compiled.cache_key = [], record["cache_key"]
    seg = Segment(code=F.__code__, offset=0, gm=pickle.loads(record["gm"]), example_inputs=[], end="return",
                  template=template, n_calls=record["n_calls"],
                  compiled=compiled, input_sources=list(record["input_sources"]), effects=effects)
    seg.inference_whole, seg.inference_outputs = record.get("inference", (False, None))
    seg.use(code)
    cache.count("frames_loaded")
    return seg, inputs


def _found(recipe):
    """The object a recipe names in this process; LookupError where it is not that object."""
    kind = recipe[0]
    if kind == "value":
        return recipe[1]
    if kind in ("module", "globals"):
        if recipe[1] not in sys.modules:
            raise LookupError(recipe[1])
        return sys.modules[recipe[1]] if kind == "module" else vars(sys.modules[recipe[1]])
    if kind in ("cell", "contents"):
        closure = _found(recipe[1]).__closure__ or ()
        if recipe[2] >= len(closure):
            raise LookupError("a closure cell")
        value = closure[recipe[2]] if kind == "cell" else _contents(closure[recipe[2]])
        if value is _MISSING:
            raise LookupError("an empty closure cell")
        return value
    if kind == "classattr":
        value = vars(_found(recipe[1])).get(recipe[2], _MISSING)
        if not isinstance(value, _CODE_HOLDERS) or _same(_member_digest, value) != recipe[3]:
            raise LookupError(f"{recipe[2]} is not the class member traced")
        return value
    if kind == "member":
        return getattr(_found(recipe[1]), recipe[2])
    if kind == "vars":
        return _found(recipe[1]).__dict__
    if kind == "attr":
        return getattr(_found(recipe[1]), recipe[2])
    if kind == "tensors":
        from .capture.guards import _TensorGuards
        if _TensorGuards is None:
            raise LookupError("TensorGuards")
        try:
            like = [_like(*props) for props in recipe[1]]
        except RuntimeError as err:        # a device this process has not
            raise LookupError(str(err)) from None
        return _TensorGuards(*like, dynamic_dims_sizes=recipe[2], dynamic_dims_strides=recipe[3])
    _, module, qualname, unwrap, digest = recipe
    value = _find(module, qualname, unwrap)
    if value is _MISSING:
        raise LookupError(f"{module}.{qualname}")
    if digest is not None:
        made = _digest if isinstance(value, types.FunctionType) else _type_digest if isinstance(value, type) else None
        if made is None or _same(made, value) != digest:
            raise LookupError(f"{module}.{qualname} is not the code traced")
    return value


def _same(digest, value):
    """The digest of `value` in this process (None where it cannot be made)."""
    try:
        return digest(value)
    except (NotSaved, RecursionError):
        return None
