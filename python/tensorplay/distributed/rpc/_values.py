"""Values between Python and the C layer: RRefs, tensors of any framework,
and callables named so a peer can find them (or pickled, where allowed)."""
import functools
import sys
import types

from ... import _rpc
from . import _policy

# The C layer's dtype names (tp_dtype_name) are numpy's, bfloat16 aside;
# torch 1.13 has no uint16/32/64: those arrive as numpy arrays even for torch users.
_TORCH_LACKS = {"uint16", "uint32", "uint64"}


class State:
    """What the values layer needs to know of the running worker."""
    allow_pickle = False
    policy = None  # the worker's exposure policy (_policy.Policy), set by init_rpc
    tensor_type = "auto"


state = State()


# ---- Tensors out: torch, DLPack and buffer-protocol objects -------------------------

def _torch_module():
    return sys.modules.get("torch")  # never imported on our account


def adapt(o, where):
    """Called by the C layer for an object no built-in kind holds: returns
    (buffer_object, dtype_name_or_None) for something that travels as a
    tensor, or None. Zero copy: the buffer views the tensor's own memory."""
    torch = _torch_module()
    if torch is not None and isinstance(o, torch.Tensor):
        return _torch_buffer(torch, o, where)
    if (torch is not None and isinstance(o, torch._C.Future)) or \
            type(o).__name__ == "Future" and type(o).__module__.startswith("tensorplay."):
        # PyTorch's words: a future is local state; send what it holds.
        raise RuntimeError("%s: Can not pickle torch.futures.Future: a future cannot be sent; "
                           "send its value (fut.wait()) instead" % where)
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(o, numpy.ndarray) and not o.flags.c_contiguous:
        return numpy.ascontiguousarray(o), None  # packed: one copy, as PyTorch sends views
    if hasattr(o, "__dlpack__") and hasattr(o, "__dlpack_device__"):
        import numpy
        try:
            return numpy.from_dlpack(o), None
        except (BufferError, TypeError, RuntimeError) as e:
            raise TypeError("%s: a '%s' cannot be sent as a tensor through DLPack: %s"
                            % (where, type(o).__name__, e)) from None
    return None


def _torch_buffer(torch, t, where):
    if t.is_sparse or t.layout != torch.strided:
        raise TypeError("%s: a %s tensor cannot be sent: dense (strided) and sparse COO "
                        "tensors travel (.to_dense())" % (where, t.layout))
    if t.device.type != "cpu":
        raise TypeError("%s: a tensor on %s cannot be sent: tensorplay-rpc carries CPU tensors "
                        "(.cpu())" % (where, t.device))
    if t.is_quantized:
        raise TypeError("%s: a quantized tensor cannot be sent (.dequantize())" % where)
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()  # a view travels packed (one copy), as PyTorch sends it
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: the same bits as int16
        return t.view(torch.int16).numpy(), "bfloat16"
    try:
        return t.numpy(), None
    except TypeError as e:
        raise TypeError("%s: a tensor of dtype %s cannot be sent: %s" % (where, t.dtype, e)) \
            from None


# ---- Tensors in -----------------------------------------------------------------------

def tensor_in(v):
    """A received tensor (the C layer's Tensor, owning the message bytes) as
    a numpy array or torch tensor viewing those bytes (no copy)."""
    kind = state.tensor_type
    torch = _torch_module()
    if kind == "auto":
        kind = "torch" if torch is not None else "numpy"
    if kind == "torch" and torch is None:
        import torch  # the program asked for torch tensors
    import numpy
    if v.dtype == "bfloat16":
        if kind != "torch" and torch is None:
            raise TypeError("a bfloat16 tensor arrived, and numpy has no bfloat16: import torch "
                            "(or set tensor_type='torch') to receive it")
        torch = torch or sys.modules["torch"]
        a = numpy.frombuffer(v, dtype=numpy.int16).reshape(v.shape)
        return torch.from_numpy(a).view(torch.bfloat16)
    a = numpy.frombuffer(v, dtype=v.dtype).reshape(v.shape)
    if kind == "torch" and v.dtype not in _TORCH_LACKS:
        return sys.modules["torch"].from_numpy(a)
    return a


# ---- Walking values ---------------------------------------------------------------------

# ---- Python kinds the wire has no tag for (spec/api.md PY-2) ------------------------------
#
# A map with the single key EXT = [kind, payload] carries a Python value that
# no wire kind holds: a sparse tensor, a dict with keys other than str, a set,
# a complex number, a torch.dtype, a WorkerInfo, a function or class by name.
# Any peer can read it as a map; a Python peer turns it back into the value.
EXT = "__tensorplay_ext__"


def _ext(kind, payload):
    return {EXT: [kind, payload]}


def _torch_needed():
    torch = _torch_module()
    if torch is None:
        import torch  # a torch kind needs torch to exist at all
    return torch


# Built-in kinds rebuilt from a list of their parts (PY-2).
_BUILTIN_EXT = {"set": set, "frozenset": frozenset, "complex": lambda p: complex(*p),
                "range": lambda p: range(*p), "slice": lambda p: slice(*p),
                "ellipsis": lambda p: Ellipsis}


# torch's singletons sent by their name in torch (torch.float64 as "float64").
_TORCH_NAMED = ("torch.dtype", "torch.layout", "torch.memory_format")


def _from_ext(kind, payload, rref_type):
    if kind == "torch.sparse_coo":
        torch = _torch_needed()
        indices, values, size, coalesced = payload
        t = torch.sparse_coo_tensor(_as_torch(indices), _as_torch(values), size)
        return t._coalesced_(bool(coalesced))
    if kind in _BUILTIN_EXT:
        return _BUILTIN_EXT[kind](payload)
    if kind in _TORCH_NAMED:
        torch = _torch_needed()
        cls = getattr(torch, kind[len("torch."):])
        obj = getattr(torch, payload, None) if isinstance(payload, str) else None
        if not isinstance(obj, cls):  # the name reaches nothing else of torch
            raise TypeError("a %s named %r arrived, which this worker's torch does not have"
                            % (kind, payload))
        return obj
    if kind == "torch.device":
        return _torch_needed().device(payload)
    if kind == "torch.Size":
        return _torch_needed().Size(payload)
    if kind == "dict":
        return {k: v for k, v in payload}
    if kind == "namedtuple":
        (module, qualname), items = payload
        mod = sys.modules.get(module)
        # A peer's name is resolved through modules and classes only (PY-1):
        # through an instance, a property's getter would run for the peer.
        cls = (_resolve(mod, qualname)
               if mod is not None and _policy._path_refusal(module, qualname) is None else None)
        return cls(*items) if isinstance(cls, type) and issubclass(cls, tuple) else tuple(items)
    if kind == "WorkerInfo":
        from .api import WorkerInfo
        return WorkerInfo(payload[0], payload[1])
    if kind == "callable":
        module, qualname = payload
        mod = sys.modules.get(module)
        if mod is not None and state.policy is not None:
            _policy.check_name(module, qualname)  # before any attribute is read
        obj = _resolve(mod, qualname) if mod is not None else None
        if obj is None or not callable(obj):
            raise LookupError("a reference to %s.%s arrived, which is not a function or class "
                              "defined among this worker's imported modules" % (module, qualname))
        if state.policy is not None:  # a peer must not reach through values what it cannot call
            state.policy.check(module, qualname, obj)
        return obj
    raise TypeError("a Python value of unknown kind %r arrived" % (kind,))


def _as_torch(t):
    torch = sys.modules["torch"]
    return t if isinstance(t, torch.Tensor) else torch.from_numpy(t)


def wrap(v, rref_type):
    """Received values: the C layer's rrefs become RRef, its tensors arrays."""
    if isinstance(v, _rpc.RRef):
        return rref_type(v)
    if isinstance(v, _rpc.Tensor):
        return tensor_in(v)
    if isinstance(v, list):
        return [wrap(x, rref_type) for x in v]
    if isinstance(v, tuple):
        return tuple(wrap(x, rref_type) for x in v)
    if isinstance(v, dict):
        if len(v) == 1 and EXT in v:
            kind, payload = v[EXT]
            return _from_ext(kind, wrap(payload, rref_type), rref_type)
        return {k: wrap(x, rref_type) for k, x in v.items()}
    return v


def unwrap(v):
    """Values to send: an RRef becomes the C layer's rref, the Python kinds
    of PY-2 their EXT maps (other kinds are converted by the C layer, with
    adapt() for tensors)."""
    t = type(v)
    if t in (int, float, str, bytes, bool) or v is None:
        return v
    core = getattr(v, "_core", None)
    if isinstance(core, _rpc.RRef):
        return core
    if t is list:
        return [unwrap(x) for x in v]
    if t is tuple:
        return tuple(unwrap(x) for x in v)
    if isinstance(v, tuple) and hasattr(t, "_fields"):  # a namedtuple, rebuilt by class name
        return _ext("namedtuple", [[t.__module__, t.__qualname__], [unwrap(x) for x in v]])
    if isinstance(v, dict):  # a subclass (OrderedDict) arrives as a dict
        if all(type(k) is str for k in v):
            return {k: unwrap(x) for k, x in v.items()}
        return _ext("dict", [[unwrap(k), unwrap(x)] for k, x in v.items()])
    if t is set or t is frozenset:
        return _ext(t.__name__, [unwrap(x) for x in v])
    if t is complex:
        return _ext("complex", [v.real, v.imag])
    if t is range:
        return _ext("range", [v.start, v.stop, v.step])
    if t is slice:
        return _ext("slice", [unwrap(v.start), unwrap(v.stop), unwrap(v.step)])
    if v is Ellipsis:
        return _ext("ellipsis", None)
    torch = _torch_module()
    if torch is not None and isinstance(v, torch.Tensor) and v.layout == torch.sparse_coo:
        return _ext("torch.sparse_coo", [v._indices().contiguous(), v._values().contiguous(),
                                         list(v.shape), v.is_coalesced()])
    if torch is not None and t in (torch.dtype, torch.layout, torch.memory_format):
        return _ext("torch." + t.__name__, str(v)[len("torch."):])  # torch.float64: "float64"
    if torch is not None and t is torch.device:
        return _ext("torch.device", str(v))  # "cpu", "cuda:1"
    if torch is not None and t is torch.Size:
        return _ext("torch.Size", list(v))
    if t.__name__ == "WorkerInfo" and t.__module__.startswith("tensorplay."):
        return _ext("WorkerInfo", [v.name, v.id])
    if isinstance(v, (types.FunctionType, types.BuiltinFunctionType, type)):
        path = _public_path(v)
        if path is not None:
            return _ext("callable", list(path))
    return v


# ---- Callables ----------------------------------------------------------------------------

# Methods of C classes taken from the class (torch.Tensor.add, str.upper,
# int.__add__): no __module__ of their own; the class names them. (A C
# classmethod is never found again as its descriptor: Class.name is a
# builtin bound to the class, which _public_path names by the class too.)
_C_METHODS = (types.MethodDescriptorType, types.WrapperDescriptorType)


def _public_path(func):
    """(module, attribute path) under which func is found again, or None."""
    if isinstance(func, _C_METHODS):
        owner = _public_path(getattr(func, "__objclass__", None))
        name = getattr(func, "__name__", None)
        if owner is None or not isinstance(name, str):
            return None
        path = "%s.%s" % (owner[1], name)
        mod = sys.modules.get(owner[0])
        return (owner[0], path) if mod is not None and _resolve(mod, path) is func else None
    owner_cls = getattr(func, "__self__", None)
    if isinstance(func, types.BuiltinMethodType) and isinstance(owner_cls, type):
        # A C classmethod taken from its class (int.from_bytes, dict.fromkeys,
        # datetime.datetime.now): made anew at each access, named by the class.
        owner = _public_path(owner_cls)
        name = getattr(func, "__name__", None)
        if owner is None or not isinstance(name, str):
            return None
        path = "%s.%s" % (owner[1], name)
        mod = sys.modules.get(owner[0])
        return (owner[0], path) if mod is not None and _same_function(_resolve(mod, path),
                                                                      func) else None
    module = getattr(func, "__module__", None)
    qualname = getattr(func, "__qualname__", None) or getattr(func, "__name__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        return None
    if "<lambda>" in qualname or "<locals>" in qualname:
        return None
    mod = sys.modules.get(module)
    if mod is None:
        return module, qualname  # the callee decides (it may have imported it)
    if _resolve(mod, qualname) is func or _same_function(_resolve(mod, qualname), func):
        return module, qualname
    # A C function whose __qualname__ names its defining class (torch.add is
    # torch._VariableFunctionsClass.add): its public name in its module.
    name = getattr(func, "__name__", None)
    if isinstance(name, str) and _same_function(getattr(mod, name, None), func):
        return module, name
    return None


def _resolve(obj, path):
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _same_function(a, b):
    if a is b:
        return a is not None
    if isinstance(a, types.MethodType) and isinstance(b, types.MethodType):
        return a == b  # made anew at each access: same function and same self
    # builtin methods are made anew at each attribute access
    return (isinstance(a, types.BuiltinFunctionType) and isinstance(b, types.BuiltinFunctionType)
            and a.__self__ is b.__self__ and a.__name__ == b.__name__)


def callable_ref(func):
    """What names func on the wire: (module, qualname), or (None, func) for a
    callable that travels pickled (allow_pickle: bound methods, partials,
    callable objects). Raises TypeError with what to do instead."""
    if not callable(func):
        raise TypeError("%r is not callable" % (func,))
    bound_self = getattr(func, "__self__", None)
    # Bound: a Python method of an object, or a C one ("abc".upper, (1).__add__).
    is_bound = isinstance(func, types.MethodType) or (
        bound_self is not None and not isinstance(bound_self, types.ModuleType))
    # A classmethod of a module-level class has a name (Class.method); a method
    # bound to an instance carries that instance, which has none.
    named = not isinstance(func, types.MethodType) or isinstance(bound_self, type)
    path = _public_path(func) if named else None
    if path is not None:
        return path
    if state.allow_pickle:
        return None, func
    if is_bound or isinstance(func, types.MethodType):
        raise TypeError("%r cannot be called remotely by name: a bound method carries its object; "
                        "call a module-level function that uses the object, hold the object in "
                        "an RRef (rref.rpc_sync().method()), or turn on allow_pickle so the "
                        "object travels with the call" % (func,))
    if isinstance(func, functools.partial):
        raise TypeError("a functools.partial cannot be called remotely by name: pass its "
                        "arguments in args/kwargs, or turn on allow_pickle")
    raise TypeError("%r cannot be called remotely: only functions and classes a peer can find "
                    "by their module and qualified name travel (not lambdas, nested functions "
                    "or callable objects), unless allow_pickle is on" % (func,))


def describe(func):
    """The name messages use for a callable."""
    module = getattr(func, "__module__", None)
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None)
    if isinstance(module, str) and isinstance(name, str):
        return "%s.%s" % (module, name)
    return repr(func)
