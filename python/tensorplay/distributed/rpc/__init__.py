"""tensorplay.distributed.rpc: call functions on other workers (PyTorch 1.13's
torch.distributed.rpc API, over the C library tensorplay-rpc).

    import tensorplay.distributed.rpc as rpc
    rpc.init_rpc("worker0", rank=0, world_size=2)
    rpc.rpc_sync("worker1", add, args=(3, 4))
    rpc.shutdown()

Functions travel as their qualified name (module and qualname); the callee
finds the same function among the modules its program has already imported
(``__main__`` included) and never imports a module because a peer named it.
Values are None, bool, int (64-bit), float, str, bytes, list, tuple, dict
with str keys, RRef and C-contiguous numpy arrays (as
tensors: dtype and shape kept); nothing is pickled. remote(to, SomeClass)
keeps the object on its owner, reached through rref.rpc_sync().method().

An array of 64 KiB or more is sent from its own buffer (do not write it until
the call completes) and received as an array viewing the received message.
new_method(cls, name, fn) adds a method that rref proxies can call.

With TensorPipeRpcBackendOptions(allow_pickle=True), for trusted peers only,
other objects travel pickled and are unpickled where that option is on.
"""
import builtins
import os
import sys

from ... import _rpc

__all__ = [
    "BackendType", "RRef", "RemoteError", "TensorPipeRpcBackendOptions", "WorkerInfo", "Future",
    "functions",
    "construct_rpc_backend_options", "get_worker_info", "init_backend", "init_rpc",
    "is_available", "method_factory", "new_method", "register_backend", "remote", "rpc_async",
    "rpc_sync",
    "shutdown", "wait_all",
]

RemoteError = _rpc.RemoteError
_DEFAULT = -1.0  # the worker's default timeout (TP_TIMEOUT_DEFAULT)


class BackendType:
    """The built-in backends: TENSORPIPE (TCP between processes) and SIM."""
    TENSORPIPE = "TENSORPIPE"
    SIM = "SIM"


class TensorPipeRpcBackendOptions:
    """Backend options, with PyTorch's names and defaults."""

    def __init__(self, num_worker_threads=16, rpc_timeout=60.0, init_method="env://",
                 init_timeout=None, allow_pickle=False):
        self.num_worker_threads = num_worker_threads
        self.rpc_timeout = rpc_timeout
        self.init_method = init_method
        self.init_timeout = init_timeout
        # For trusted peers only: objects no value kind holds travel pickled,
        # and what arrives pickled is unpickled (a peer's bytes become code).
        self.allow_pickle = allow_pickle


class WorkerInfo:
    """A worker's name and id (its rank); equal when both are."""
    __slots__ = ("name", "id")

    def __init__(self, name, id):
        self.name = name
        self.id = id

    def __eq__(self, other):
        return isinstance(other, WorkerInfo) and (self.name, self.id) == (other.name, other.id)

    def __hash__(self):
        return hash((self.name, self.id))

    def __repr__(self):
        return "WorkerInfo(id=%d, name=%s)" % (self.id, self.name)


def is_available():
    return _rpc.is_available()


def _env_int(name):
    v = os.environ.get(name)
    if v is None:
        raise ValueError("%s is not set: pass it to init_rpc or set the environment" % name)
    return int(v)


def init_rpc(name, backend=None, rank=-1, world_size=None, rpc_backend_options=None):
    """Joins the job as `name`; blocks until every worker joined."""
    if rank is None or rank < 0:
        rank = _env_int("RANK")
    if world_size is None:
        world_size = _env_int("WORLD_SIZE")
    opts = rpc_backend_options or TensorPipeRpcBackendOptions()
    init_method = opts.init_method
    if init_method == "env://":
        init_method = None  # the backend's own default reads the same variables
    init_timeout = -1.0 if opts.init_timeout is None else float(opts.init_timeout)
    _rpc.set_dispatcher(_dispatch, _dispatch_method)
    _rpc.set_allow_pickle(bool(getattr(opts, "allow_pickle", False)))
    _rpc.init_rpc(name, backend or BackendType.TENSORPIPE, rank, world_size,
                  float(opts.rpc_timeout), init_timeout, int(opts.num_worker_threads),
                  init_method)


def shutdown(graceful=True, timeout=0):
    """Leaves the job; graceful waits for every worker's outstanding work."""
    del timeout  # the backend options' shutdown timeout bounds it
    _rpc.shutdown(bool(graceful))


def get_worker_info(worker_name=None):
    name, id = _rpc.get_worker_info(worker_name)
    return WorkerInfo(name, id)


def _dest(to):
    if isinstance(to, WorkerInfo):
        return to.id
    return to


def _qualified(func):
    """(module, qualname) of a function a peer can find by name."""
    module = getattr(func, "__module__", None)
    qualname = getattr(func, "__qualname__", None)
    if not module or not qualname or not callable(func):
        raise TypeError("%r cannot be called remotely: only module-level functions and "
                        "classes travel (by their qualified name)" % (func,))
    if "<lambda>" in qualname or "<locals>" in qualname:
        raise TypeError("%s.%s cannot be called remotely: a lambda or a function defined "
                        "inside another has no name a peer can find" % (module, qualname))
    return module, qualname


def _wrap(v):
    """Received values: the C layer's rrefs become RRef, its tensors numpy arrays
    (viewing the received copy, which the array keeps alive)."""
    if isinstance(v, _rpc.RRef):
        return RRef(v)
    if isinstance(v, _rpc.Tensor):
        import numpy  # only a program that receives arrays needs numpy
        return numpy.frombuffer(v, dtype=v.dtype).reshape(v.shape)
    if isinstance(v, list):
        return [_wrap(x) for x in v]
    if isinstance(v, tuple):
        return tuple(_wrap(x) for x in v)
    if isinstance(v, dict):
        return {k: _wrap(x) for k, x in v.items()}
    return v


def _unwrap(v):
    """Values to send: RRef becomes the C layer's rref."""
    if isinstance(v, RRef):
        return v._core
    if isinstance(v, list):
        return [_unwrap(x) for x in v]
    if isinstance(v, tuple):
        return tuple(_unwrap(x) for x in v)
    if isinstance(v, dict):
        return {k: _unwrap(x) for k, x in v.items()}
    return v


def _dispatch(wire_args, wire_kwargs):
    """The callee's side: runs module.qualname(*args, **kwargs) (from C, GIL held)."""
    module, qualname, args, kwargs = _wrap(wire_args[:4])
    mod = sys.modules.get(module)
    if mod is None:
        raise LookupError("function %s.%s: module '%s' is not imported on this worker (it is "
                          "never imported because a peer named it)" % (module, qualname, module))
    obj = mod
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise LookupError("function %s.%s is not defined on this worker" % (module, qualname))
    return _answer(obj, obj(*args, **kwargs), "%s.%s" % (module, qualname))


def _answer(fn, result, what):
    """A served function's (or method's) result as the C layer takes it."""
    if getattr(fn, "_tp_async_execution", False):
        if not isinstance(result, Future):
            raise TypeError("%s is marked async_execution but returned %s, not a Future"
                            % (what, type(result).__name__))
        _rpc.answer_later(result._core)  # the reply goes when the future completes
        return None
    return _unwrap(result)


_methods = {}  # (class, name) -> fn(obj, *args, **kwargs), from new_method


def new_method(cls, method_name, fn):
    """Registers fn(obj, *args, **kwargs) as method method_name of cls's
    objects on this worker (the C API's new_method): rref.rpc_sync().name()
    on an rref to such an object, or to one of a subclass, runs it. It comes
    before a method the class defines itself; registering one twice is an
    error. Register before init_rpc, as functions are defined before it: a
    peer may call as soon as init_rpc returns on every worker."""
    if not isinstance(cls, type) or not callable(fn) or not isinstance(method_name, str):
        raise TypeError("new_method(cls, method_name, fn): a class, a str and a callable")
    if (cls, method_name) in _methods:
        raise RuntimeError("method %s.%s is already registered on this worker"
                           % (cls.__qualname__, method_name))
    _methods[(cls, method_name)] = fn


def _dispatch_method(obj, name, args, kwargs):
    """The owner's side of a method call on an rref's object (from C, GIL held)."""
    args, kwargs = _wrap(args), _wrap(kwargs)
    for klass in type(obj).__mro__:
        fn = _methods.get((klass, name))
        if fn is not None:
            return _answer(fn, fn(obj, *args, **kwargs), "%s.%s" % (klass.__qualname__, name))
    bound = getattr(obj, name)  # AttributeError names the method and the class
    return _answer(bound, bound(*args, **kwargs), "%s.%s" % (type(obj).__qualname__, name))


class functions:
    """rpc.functions.async_execution, as in PyTorch."""

    @staticmethod
    def async_execution(fn):
        """Marks fn as answering with the Future it returns: the reply goes when
        that future completes, and no pool thread waits for it."""
        fn._tp_async_execution = True
        return fn


class Future:
    """The result of rpc_async: wait(), value(), done(), then(), add_done_callback().
    Future() makes one the program completes with set_result / set_exception
    (torch.futures.Future), on the worker of the calling process (after init_rpc)."""

    def __init__(self, core=None):
        self._core = core if core is not None else _rpc.future_new()

    def set_result(self, result):
        self._core._set_result(_unwrap(result))

    def set_exception(self, exception):
        self._core._set_exception("%s: %s" % (type(exception).__name__, exception))

    def wait(self, timeout=None):
        return _wrap(_raise_remote(
            lambda: self._core.wait(0.0 if timeout is None else float(timeout))))

    def value(self):
        if not self._core.done():
            raise RuntimeError("the future is still pending")
        return self.wait()

    def done(self):
        return self._core.done()

    def add_done_callback(self, callback):
        """callback(self) runs on a pool thread once the future completes."""
        self._core._add_done_callback(lambda: callback(self))

    def then(self, callback):
        """A Future of callback(self)'s return value, run once this completes."""
        return Future(self._core._then(lambda core: _unwrap(callback(self))))


def wait_all(futures):
    return [f.wait() for f in futures]


_BUILTIN_EXCEPTIONS = {name: obj for name, obj in vars(builtins).items()
                       if isinstance(obj, type) and issubclass(obj, BaseException)}


def _raise_remote(fn):
    """Re-raises a remote failure with its original built-in type when it has one."""
    try:
        return fn()
    except RemoteError as e:
        msg = str(e)
        # "function 'py:call' on worker 'w1' (id 1) failed: ValueError: boom\nTraceback...",
        # or a future the program failed: "ValueError: boom".
        head, sep, rest = msg.partition(" failed: ")
        if not sep:
            head, rest = "", msg
        type_name = rest.split(":", 1)[0]
        exc_type = _BUILTIN_EXCEPTIONS.get(type_name, RuntimeError)
        where = " on " + head.split(" on ", 1)[1] if " on " in head else ""
        raise exc_type("%s raised%s: %s" % (type_name or "the function", where, rest)) from None
    except _rpc.RemoteError:
        raise


def rpc_async(to, func, args=None, kwargs=None, timeout=_DEFAULT):
    module, qualname = _qualified(func)
    core = _rpc.call(_dest(to), module, qualname, tuple(_unwrap(list(args or ()))),
                     _unwrap(dict(kwargs or {})), float(timeout), False)
    return Future(core)


def rpc_sync(to, func, args=None, kwargs=None, timeout=_DEFAULT):
    return rpc_async(to, func, args, kwargs, timeout).wait()


class RRef:
    """A reference to a value on its owner: to_here(), owner(), is_owner() and the rest.
    RRef(value) makes one this worker owns, holding value (PyTorch's RRef(value))."""

    def __init__(self, value):
        if isinstance(value, _rpc.RRef):
            self._core = value
        else:
            self._core = _rpc.rref_from_value(_unwrap(value))

    def to_here(self, timeout=_DEFAULT):
        return _wrap(_raise_remote(lambda: self._core.to_here(float(timeout))))

    def local_value(self):
        return _wrap(self._core.local_value())

    def owner(self):
        name, id = self._core._owner()
        return WorkerInfo(name, id)

    def owner_name(self):
        return self.owner().name

    def is_owner(self):
        return self._core.is_owner()

    def confirmed_by_owner(self):
        return self._core.confirmed_by_owner()

    def rpc_sync(self, timeout=_DEFAULT):
        """rref.rpc_sync().m(*args): m of the object this rref holds, run on its owner."""
        return _Proxy(self, timeout, lambda f: f.wait())

    def rpc_async(self, timeout=_DEFAULT):
        return _Proxy(self, timeout, lambda f: f)

    def remote(self, timeout=_DEFAULT):
        return _Proxy(self, timeout, None)

    def __repr__(self):
        return "RRef(owner=%s)" % self.owner_name()


class _Proxy:
    """The methods of an rref's object, called on its owner (PyTorch's RRef proxies)."""

    def __init__(self, rref, timeout, finish):
        self._rref, self._timeout, self._finish = rref, float(timeout), finish

    def __getattr__(self, name):
        def method(*args, **kwargs):
            wire = (self._rref._core, name, tuple(_unwrap(list(args))), _unwrap(dict(kwargs)),
                    self._timeout)
            if self._finish is None:
                return RRef(_rpc.rref_call(*wire, True))
            return self._finish(Future(_rpc.rref_call(*wire, False)))
        return method


def method_factory(method_name):
    """A callable m(rref, *args, **kwargs) that runs method_name of the object
    rref holds on its owner (the C API's method_factory)."""
    def method(rref, *args, **kwargs):
        return getattr(rref.rpc_sync(), method_name)(*args, **kwargs)
    method.__name__ = method_name
    return method


_backends = {}


def register_backend(backend_name, construct_rpc_backend_options_handler, init_backend_handler):
    """Registers a backend implemented in Python by its two handlers (PyTorch's
    signature). The built-in ones (TENSORPIPE, SIM) are always there."""
    if backend_name in _backends or backend_name in (BackendType.TENSORPIPE, BackendType.SIM):
        raise RuntimeError("RPC backend %s: already registered" % backend_name)
    _backends[backend_name] = (construct_rpc_backend_options_handler, init_backend_handler)
    return backend_name


def construct_rpc_backend_options(backend, rpc_timeout=60.0, init_method="env://", **kwargs):
    """Options for backend: TensorPipeRpcBackendOptions for the built-in ones."""
    if backend in _backends:
        return _backends[backend][0](rpc_timeout, init_method, **kwargs)
    if backend not in (BackendType.TENSORPIPE, BackendType.SIM):
        raise ValueError("no backend named %r is registered" % (backend,))
    return TensorPipeRpcBackendOptions(rpc_timeout=rpc_timeout, init_method=init_method, **kwargs)


def init_backend(backend, *args, **kwargs):
    """Starts a registered Python backend through its handler."""
    if backend not in _backends:
        raise ValueError("no Python backend named %r is registered; the built-in ones start "
                         "with init_rpc" % (backend,))
    return _backends[backend][1](*args, **kwargs)


def remote(to, func, args=None, kwargs=None, timeout=_DEFAULT):
    module, qualname = _qualified(func)
    return RRef(_rpc.call(_dest(to), module, qualname, tuple(_unwrap(list(args or ()))),
                          _unwrap(dict(kwargs or {})), float(timeout), True))
