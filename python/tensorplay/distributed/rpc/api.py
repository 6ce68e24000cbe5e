"""The RPC API (PyTorch's rpc.api): init_rpc, shutdown, rpc_sync, rpc_async,
remote, RRef, futures, worker infos and timeouts, over the C library."""
import atexit
import builtins
import collections
import os
import re
import sys
import threading
import time
import traceback

from ... import _rpc
from . import _policy, _values, backend_registry, constants
from ._values import callable_ref, unwrap
from .options import RpcBackendOptions, TensorPipeRpcBackendOptions

RemoteError = _rpc.RemoteError
UNSET_RPC_TIMEOUT = constants.UNSET_RPC_TIMEOUT

# PyTorch's switch, read at shutdown: False makes rrefs that the drain could
# not settle an error (RuntimeError "Leaking RRef ..."), True only a warning.
_ignore_rref_leak = True

NAME_WAIT_MAX_S = 60.0  # the longest a callee waits for a name (a call with no deadline, or a long one)
NAME_WAIT_POLL_S = 0.005
WAIT_SLICE_S = 0.1  # a blocking wait's longest sleep between looks at Ctrl-C (and at its end)
_WORKER_NAME = re.compile(r"^[A-Za-z0-9_:-]{1,127}$")


class RpcTimeoutError(RuntimeError, TimeoutError):
    """A call or wait that ran past its deadline: a RuntimeError as PyTorch
    raises, and a TimeoutError too."""


class FunctionNotFoundError(LookupError, RuntimeError):
    """A callee has no function of the name a call gave: a LookupError, and
    a RuntimeError as PyTorch raises it."""


class _State:
    def __init__(self):
        self.lock = threading.Lock()
        self.running = False
        self.me = None
        self.default_timeout = constants.DEFAULT_RPC_TIMEOUT_SEC
        self.policy = _policy.Policy()
        self.stopping = False  # shutdown() began: no more names will be defined
        # Calls that may wait at once for a name not yet defined: each holds a
        # pool thread, so at most half the pool (set by init_rpc).
        self.name_waits = threading.BoundedSemaphore(1)


_state = _State()


# ---- Worker infos -------------------------------------------------------------------------

class WorkerInfo:
    """A worker's name and id (its rank); equal when both are."""
    __slots__ = ("name", "id")

    def __init__(self, name, id):
        if not isinstance(name, str) or not _WORKER_NAME.match(name):
            raise RuntimeError("Worker name must match ^[A-Za-z0-9-_:]*$, and must be non-empty "
                               "and shorter than 128 chars, but got %s" % (name,))
        if isinstance(id, bool) or not isinstance(id, int) or id < 0:
            raise TypeError("WorkerInfo id must be a non-negative int, not %r" % (id,))
        self.name = name
        self.id = id

    def __eq__(self, other):
        return isinstance(other, WorkerInfo) and (self.name, self.id) == (other.name, other.id)

    def __hash__(self):
        return hash((self.name, self.id))

    def __repr__(self):
        return "WorkerInfo(id=%d, name=%s)" % (self.id, self.name)

    def __getstate__(self):
        return (self.name, self.id)

    def __setstate__(self, s):
        self.name, self.id = s


def _require_init(what):
    # The C library's word: a peer's call may be served here (and call out)
    # between the moment init committed and init_rpc's return.
    if not _state.running and not _rpc.is_initialized():
        raise RuntimeError("RPC has not been initialized. Call "
                           "tensorplay.distributed.rpc.init_rpc first (%s)" % what)


def is_available():
    return _rpc.is_available()


def get_worker_info(worker_name=None):
    """This worker's WorkerInfo, or the named worker's."""
    _require_init("get_worker_info")
    if worker_name is not None and not isinstance(worker_name, str):
        raise TypeError("worker_name must be a str, not %s" % type(worker_name).__name__)
    name, id = _rpc.get_worker_info(worker_name)
    return WorkerInfo(name, id)


def _dest(to):
    if isinstance(to, WorkerInfo):
        return to.id
    if isinstance(to, float):  # as PyTorch: a rank that is not whole is a bad value
        raise ValueError("to: rank %r is not an int" % (to,))
    if isinstance(to, bool) or not isinstance(to, (str, int)):
        raise TypeError("to must be a worker name, rank or WorkerInfo, not %s"
                        % type(to).__name__)
    return to


def get_rpc_timeout():
    """The default timeout of calls, in seconds (0: none)."""
    return _state.default_timeout


def _set_rpc_timeout(rpc_timeout):
    seconds = _timeout_arg(rpc_timeout, allow_unset=False)
    _require_init("_set_rpc_timeout")
    _rpc.set_rpc_timeout(seconds)
    _state.default_timeout = seconds


def _timeout_arg(timeout, allow_unset=True):
    """A timeout in seconds: a number >= 0 (0: no deadline), or
    UNSET_RPC_TIMEOUT for the worker's default."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError("timeout must be a number of seconds, not %s (a timedelta? pass "
                        ".total_seconds())" % type(timeout).__name__)
    timeout = float(timeout)
    if allow_unset and timeout == UNSET_RPC_TIMEOUT:
        return timeout
    if timeout != timeout or timeout < 0:
        raise ValueError("timeout must be >= 0 seconds (0 means no deadline), got %r" % timeout)
    return timeout


def _effective_timeout(timeout):
    return _state.default_timeout if timeout == UNSET_RPC_TIMEOUT else timeout


# ---- Errors back from the C layer ---------------------------------------------------------

# Exception, not BaseException: a peer's words never raise SystemExit or
# KeyboardInterrupt here.
_BUILTIN_EXCEPTIONS = {name: obj for name, obj in vars(builtins).items()
                       if isinstance(obj, type) and issubclass(obj, Exception)}


def _remote_exception_type(type_name):
    """The class a remote exception's qualified name names here, or None.
    Found among builtins and modules already imported, never by importing."""
    if type_name in _BUILTIN_EXCEPTIONS:
        return _BUILTIN_EXCEPTIONS[type_name]
    module, _, qualname = type_name.rpartition(".")
    while module:
        mod = sys.modules.get(module)
        if mod is not None:
            obj = _values._resolve(mod, qualname)
            if isinstance(obj, type) and issubclass(obj, Exception):
                return obj
            return None
        module, _, head = module.rpartition(".")
        qualname = head + "." + qualname
    return None


def _translate(e, what, api=None):
    """The exception to raise for the C layer's e, for a call described by
    what, made through api (rpc_sync: the C call behind it is rpc_async)."""
    msg = str(e)
    if api and msg.startswith("rpc_async "):
        msg = api + msg[len("rpc_async"):]
    if what:
        msg = msg.replace("'py:call'", "'%s'" % what).replace("'py:method'", "'%s'" % what)
    if isinstance(e, TimeoutError):
        return RpcTimeoutError(msg.replace("timed out after",
                                           "RPC ran for more than its timeout; timed out after"))
    if not isinstance(e, RemoteError):
        if what and msg != str(e):
            return type(e)(msg)
        return e
    # "<call> on worker 'w1' (id 1) failed: module.Type: text\nTraceback...",
    # or a future the program failed: "module.Type: text".
    head, sep, rest = msg.partition(" failed: ")
    if not sep:
        head, rest = "", msg
    type_name = rest.split(":", 1)[0].strip()
    where = head.split(" on ", 1)[1] if " on " in head else ""
    text = "On %s:\n%s" % (where, rest) if where else rest
    cls = _remote_exception_type(type_name) if re.match(r"^[\w.]+$", type_name) else None
    if cls is not None:
        try:
            return cls(text)
        except Exception:  # a class whose constructor takes other arguments
            pass
    return RemoteError("%s (raised remotely: %s)" % (text, type_name or "an error"))


def _call_c(fn, what, api=None):
    try:
        return fn()
    except (RemoteError, TimeoutError, RuntimeError, ValueError, TypeError, LookupError) as e:
        t = _translate(e, what, api)
        if t is e:
            raise
        raise t from None


# ---- init_rpc and shutdown ---------------------------------------------------------------

def _env_int(name, what):
    v = os.environ.get(name)
    if v is None:
        raise ValueError("%s parameter missing: pass it to init_rpc, or set the environment "
                         "variable %s (environment variable %s expected, but not set)"
                         % (what, name, name))
    try:
        return int(v)
    except ValueError:
        raise ValueError("environment variable %s is %r, not an int" % (name, v)) from None


_LOCAL_HOSTS = ("127.", "localhost", "::1", "[::1]")


def _host_of(init_method):
    if init_method in (None, "env://"):
        return os.environ.get("MASTER_ADDR", "")
    # tcp://[v6]:port or tcp://host:port (a bare v6 address has colons of its own)
    m = re.match(r"^tcp://(?:\[([^\]/]*)\]|([^\[\]/:]*)):\d+", init_method)
    return (m.group(1) if m.group(1) is not None else m.group(2)) if m else ""


def _user_secret():
    """A job secret shared by this user's workers on this host, for workers
    started by hand on one machine (no launcher, no TP_SECRET): kept in a
    0600 file in a 0700 folder of this user's own."""
    base = os.environ.get("XDG_RUNTIME_DIR") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = os.path.join(base, "tensorplay")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    st = os.stat(folder)
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError("%s must belong to you with mode 0700 to hold the job secret"
                              % folder)
    path = os.path.join(folder, "local-secret")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as f:
            f.write(_rpc.job_secret_new() + "\n")
    st = os.stat(path)
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError("%s must belong to you with mode 0600" % path)
    for _ in range(100):  # another worker may be writing it right now
        with open(path) as f:
            s = f.read().strip()
        if len(s) >= 32:
            return s
        time.sleep(0.01)
    raise RuntimeError("%s holds no job secret; delete it and start again" % path)


def _backend_strings(opts, init_method):
    out = opts._backend_strings() if hasattr(opts, "_backend_strings") else {}
    if "secret" not in out and out.get("auth") != "off" and not os.environ.get("TP_SECRET") \
            and _host_of(init_method).startswith(_LOCAL_HOSTS):
        out["secret"] = _user_secret()
    return out


def _init_method_for_c(init_method):
    if init_method == "env://":
        return None  # the backend's own default reads the same variables
    if init_method.startswith("file://"):
        # PyTorch's FileStore: the same rendezvous over a SQLite file at that path.
        return "sqlite://" + init_method[len("file://"):]
    return init_method


def init_rpc(name, backend=None, rank=-1, world_size=None, rpc_backend_options=None):
    """Joins the job as worker `name`; blocks until every worker joined
    (bounded by the init timeout, 60 s unless the options say otherwise)."""
    if not isinstance(name, str):
        raise TypeError("name must be a str, not %s" % type(name).__name__)
    WorkerInfo(name, 0)  # the same name rule as PyTorch, before anything starts
    if backend is not None and not isinstance(backend, backend_registry.enum.Enum):
        raise TypeError("Argument backend must be a member of BackendType, not %r (for example "
                        "rpc.BackendType.TENSORPIPE)" % (backend,))
    if rpc_backend_options is not None and not isinstance(rpc_backend_options,
                                                          RpcBackendOptions):
        raise TypeError("Argument rpc_backend_options must be an instance of RpcBackendOptions")
    if backend is None and rpc_backend_options is not None:
        backend = backend_registry.infer(rpc_backend_options)
    b = backend_registry.resolve(backend)
    if b.value.init_backend_handler is None and rpc_backend_options is not None and \
            not isinstance(rpc_backend_options, TensorPipeRpcBackendOptions):
        raise TypeError("`rpc_backend_options` must be a `TensorPipeRpcBackendOptions` for "
                        "backend %s, not %s" % (b.name, type(rpc_backend_options).__name__))
    if b.value.init_backend_handler is not None:
        raise ValueError("backend %s is written in Python: start it with init_backend" % b.name)
    if rank is None or rank < 0:
        rank = _env_int("RANK", "rank")
    if world_size is None:
        world_size = _env_int("WORLD_SIZE", "world_size")
    for what, v in (("rank", rank), ("world_size", world_size)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError("%s must be an int, not %s" % (what, type(v).__name__))
    opts = rpc_backend_options or backend_registry.construct_rpc_backend_options(b)
    init_method = _init_method_for_c(opts.init_method)
    init_timeout = getattr(opts, "init_timeout", None)
    with _state.lock:
        if _state.running:
            raise RuntimeError("RPC is already initialized on this process as worker %r"
                               % _state.me.name)
        _values.state.allow_pickle = bool(getattr(opts, "allow_pickle", False))
        _values.state.tensor_type = getattr(opts, "tensor_type", "auto")
        _state.policy = _policy.Policy(getattr(opts, "expose", None))
        _state.stopping = False
        _state.name_waits = threading.BoundedSemaphore(
            max(1, getattr(opts, "num_worker_threads", constants.DEFAULT_NUM_WORKER_THREADS) // 2))
        _values.state.policy = _state.policy  # callables that arrive as values (PY-2)
        _rpc.set_dispatcher(_dispatch, _dispatch_method)
        _rpc.set_adapter(_values.adapt)
        _rpc.set_allow_pickle(_values.state.allow_pickle)
        # Set before the C init: peers may call in as soon as it commits.
        _state.me = WorkerInfo(name, rank)
        _state.default_timeout = float(opts.rpc_timeout)
        try:
            _rpc.init_rpc(name, b.name, rank, world_size, float(opts.rpc_timeout),
                          -1.0 if init_timeout is None else float(init_timeout),
                          int(getattr(opts, "num_worker_threads", 0)), init_method,
                          -1.0 if getattr(opts, "shutdown_timeout", None) is None
                          else float(opts.shutdown_timeout),
                          _backend_strings(opts, opts.init_method) if b.name == "TENSORPIPE"
                          else getattr(opts, "_backend_strings", dict)())
        except BaseException:
            _state.me = None
            raise
        _state.running = True


@atexit.register
def _at_exit():
    """A program that ends without shutdown() (an exception, sys.exit) leaves
    at once, as a killed worker would: its peers see it gone. Without this the
    pool threads would run Python code in a finalizing interpreter."""
    if _state.running:
        _state.running = False
        _rpc.shutdown(False, 0.0)


def shutdown(graceful=True, timeout=constants.DEFAULT_SHUTDOWN_TIMEOUT):
    """Leaves the job. graceful waits until every worker's outstanding work
    is done (bounded by timeout seconds when > 0, else by the backend's
    shutdown timeout) and then releases this worker's rrefs; a graceful
    shutdown that runs out of time finishes locally and raises."""
    _require_init("shutdown")
    timeout = _timeout_arg(timeout, allow_unset=False)
    _state.stopping = True  # name waits end now: the program defines nothing more
    with _state.lock:
        try:
            _rpc.shutdown(bool(graceful), timeout)
        finally:
            _state.running = False
            _state.me = None
    leaks = _rpc.shutdown_leaks()
    if leaks:
        text = "Leaking RRef: %d rref(s) were not settled by shutdown: %s" % (
            len(leaks), "; ".join(leaks[:8]))
        if not _ignore_rref_leak:
            raise RuntimeError(text)
        print("tensorplay.distributed.rpc: " + text, file=sys.stderr)


# ---- The callee's side -----------------------------------------------------------------------

def _may_appear(mod, module):
    """Whether a name missing from module may still be defined: __main__
    runs on after init_rpc (until shutdown, or its thread's end), and a
    module being imported is half made."""
    if _state.stopping:
        return False
    if module == "__main__":
        return threading.main_thread().is_alive()
    spec = getattr(mod, "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def _find(module, qualname, timeout):
    """The function module.qualname among modules already imported, waiting
    for one whose module is still running: bounded by the call's deadline
    and NAME_WAIT_MAX_S, by shutdown, and to half the pool's threads at once
    (a peer naming functions that never come cannot hold the whole pool)."""
    deadline = None
    waiting = False
    try:
        while True:
            mod = sys.modules.get(module)
            if mod is None:
                raise FunctionNotFoundError(
                    "function %s.%s: module '%s' is not imported on this worker (it is never "
                    "imported because a peer named it)" % (module, qualname, module))
            _policy.check_name(module, qualname)
            obj = _values._resolve(mod, qualname)
            if obj is not None:
                return obj
            if not _may_appear(mod, module) or not _state.policy.may_allow(module, qualname):
                break
            now = time.monotonic()
            if deadline is None:
                if not _state.name_waits.acquire(blocking=False):
                    break  # half the pool waits for names already
                waiting = True
                # Give up a little before the caller does, so it gets this error.
                budget = timeout - min(1.0, timeout / 10) if timeout > 0 else NAME_WAIT_MAX_S
                deadline = now + max(0.0, min(budget, NAME_WAIT_MAX_S))
            if now >= deadline:
                break
            time.sleep(NAME_WAIT_POLL_S)
    finally:
        if waiting:
            _state.name_waits.release()
    raise FunctionNotFoundError(
        "function %s.%s is not defined on this worker: functions travel by name (as with "
        "PyTorch, the RPC pickler does not serialize function code), so define it in the "
        "callee's %s too" % (module, qualname, module))


def _report_remote(e):
    """PyTorch prints a served function's exception on the callee's stderr."""
    me = _state.me
    print("On %r:\n%r\n%s" % (me, e, traceback.format_exc()), file=sys.stderr, flush=True)


def _dispatch(wire_args, wire_kwargs):
    """Runs a peer's call (from C, GIL held, on a pool thread): wire_args is
    [module, qualname, args, kwargs, keep, timeout]; a pickled callable
    arrives as module None and the callable in qualname's place."""
    module, qualname, args, kwargs = wire_args[:4]
    timeout = wire_args[5] if len(wire_args) > 5 else _state.default_timeout
    try:
        if module is None:  # a pickled callable: only from peers trusted with pickle
            if not _values.state.allow_pickle or not callable(qualname):
                raise PermissionError("a call without a function name needs allow_pickle on "
                                      "this worker and a pickled callable")
            fn = qualname
        else:
            fn = _find(module, qualname, timeout)
            _state.policy.check(module, qualname, fn)
        what = _values.describe(fn) if module is None else "%s.%s" % (module, qualname)
        args, kwargs = _values.wrap(args, RRef), _values.wrap(kwargs, RRef)
        return _answer(fn, fn(*args, **kwargs), what)
    except Exception as e:
        _report_remote(e)
        raise


def _answer(fn, result, what):
    """A served function's (or method's) result as the C layer takes it."""
    if getattr(fn, "_tp_async_execution", False) or getattr(fn, "_wrapped_async_rpc_function",
                                                            None) is not None:
        core = _future_core(result)
        if core is None:  # PyTorch's words, which programs match
            raise RuntimeError("Functions decorated with @rpc.async_function must return a "
                               "torch.futures.Future object, but %s (marked async_execution) "
                               "returned %s" % (what, type(result).__name__))
        _rpc.answer_later(core)  # the reply goes when the future completes
        return None
    return unwrap(result)


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
    """The owner's side of a method call on an rref's object (from C, GIL
    held: a C caller's tp_rref_rpc_sync on a Python object)."""
    try:
        return _run_method(obj, name, _values.wrap(args, RRef), _values.wrap(kwargs, RRef))
    except Exception as e:
        _report_remote(e)
        raise


def _run_method(obj, name, args, kwargs):
    """Method name of obj (new_method's first, then the class's own)."""
    what = "%s.%s" % (type(obj).__qualname__, name)
    for klass in type(obj).__mro__:
        fn = _methods.get((klass, name))
        if fn is not None:
            return _answer(fn, fn(obj, *args, **kwargs), what)
    if name.startswith("_"):  # before getattr: a private attribute is not even looked up
        _state.policy.check_method(obj, name, None)
    bound = getattr(obj, name)  # AttributeError names the method and the class
    _state.policy.check_method(obj, name, bound)
    return _answer(bound, bound(*args, **kwargs), what)


# ---- Futures -------------------------------------------------------------------------------

class Future:
    """PyTorch's Future (torch.futures.Future when torch is not imported; with
    torch, calls return torch futures): wait(), value(), done(), then(),
    add_done_callback(), set_result(), set_exception(). It holds any Python
    object. Future() makes one the program completes; an @async_execution
    function may return it."""

    def __init__(self):
        self._cond = threading.Condition()
        self._done = False
        self._value = None
        self._exc = None
        self._callbacks = []

    def _complete(self, value=None, exc=None):
        with self._cond:
            if self._done:
                raise RuntimeError("this Future is already completed")
            self._value, self._exc, self._done = value, exc, True
            callbacks, self._callbacks = self._callbacks, []
            self._cond.notify_all()
        for cb in callbacks:
            _run_callback(cb, self)

    def set_result(self, result):
        self._complete(value=result)

    def set_exception(self, exception):
        if not isinstance(exception, BaseException):
            raise TypeError("set_exception takes an exception, not %s"
                            % type(exception).__name__)
        self._complete(exc=exception)

    def wait(self, timeout=None):
        """The value, or raises the error; waits in slices, so Ctrl-C interrupts it."""
        if timeout is not None:
            timeout = _timeout_arg(timeout, allow_unset=False)
        deadline = None if not timeout else time.monotonic() + timeout
        _drive(self, deadline)
        with self._cond:
            while not self._done:
                left = (WAIT_SLICE_S if deadline is None
                        else min(WAIT_SLICE_S, deadline - time.monotonic()))
                if left <= 0:
                    raise RpcTimeoutError("Future.wait timed out after %g s; the call goes on"
                                          % timeout)
                self._cond.wait(left)
        if self._exc is not None:
            raise self._exc
        return self._value

    def value(self):
        if not self._done:
            raise RuntimeError("the future is still pending")
        return self.wait()

    def done(self):
        return self._done

    def add_done_callback(self, callback):
        """callback(self) runs once the future completes: at once on this
        thread if it already is, else on the thread that completes it."""
        if not callable(callback):
            raise TypeError("add_done_callback needs a callable, not %r" % (callback,))
        with self._cond:
            if not self._done:
                self._callbacks.append(callback)
                return
        _run_callback(callback, self)

    def then(self, callback):
        """A Future of callback(self)'s return value (or its exception)."""
        if not callable(callback):
            raise TypeError("then needs a callable, not %r" % (callback,))
        chained = Future()

        def run(f):
            try:
                chained.set_result(callback(f))
            except Exception as e:
                chained.set_exception(e)
        self.add_done_callback(run)
        if getattr(self, "_tp_drive", None) is not None:  # completing self runs callback here
            chained._tp_drive = lambda deadline: _drive(self, deadline)
        return chained


def _run_callback(cb, f):
    try:
        cb(f)
    except Exception:  # as PyTorch: a failing done-callback is reported, not raised
        print("tensorplay.distributed.rpc: a future's done-callback raised:\n"
              + traceback.format_exc(), file=sys.stderr)


def _type_name(e):
    t = type(e)
    return t.__qualname__ if t.__module__ == "builtins" else "%s.%s" % (t.__module__, t.__qualname__)


_torch_future_class = None
_torchs_wait_all = None  # torch.futures.wait_all as torch defined it
_torch_future_lock = threading.Lock()  # one class, one replacement, whatever threads race


def _torch_future_type():
    """torch.futures.Future subclass for calls, made once torch is imported:
    torch.futures.wait_all, collect_all and then take it. Its errors are set
    with set_exception, so wait() raises the remote exception's own class;
    torch's collect_all, which looks only at errors set in C++, does not see
    them early (a limit of set_exception in torch 1.13). So that
    torch.futures.wait_all still returns at the first error, as it does for
    PyTorch's own rpc futures, it is replaced once by _torch_wait_all."""
    global _torch_future_class, _torchs_wait_all
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    if _torch_future_class is not None:
        return _torch_future_class
    with _torch_future_lock:
        if _torch_future_class is None:
            class TorchFuture(torch.futures.Future):
                def wait(self):
                    _drive(self)  # slices of the C future's wait: Ctrl-C interrupts between them
                    return super().wait()
            _torch_future_class = TorchFuture  # first: _torch_wait_all tests for it
            if torch.futures.wait_all is not _torch_wait_all:  # never our own, or it recurses
                _torchs_wait_all = torch.futures.wait_all
                torch.futures.wait_all = _torch_wait_all
    return _torch_future_class


def _torch_wait_all(futures):
    """torch.futures.wait_all, once this package made a torch future: a list
    holding one of ours is waited for by wait_all below (the first error
    raised as soon as it is set, as torch does for errors set in C++); any
    other list goes to torch's own, unchanged. A program that bound torch's
    function to a name of its own before its first rpc_async keeps torch's
    (it stops at such an error only when every earlier future is done)."""
    futures = list(futures)
    if any(isinstance(f, _torch_future_class) for f in futures):
        return wait_all(futures)
    return _torchs_wait_all(futures)


def _make_future(core, what):
    """The future rpc_async returns (a torch future when torch is imported),
    completed from the C future core once, with the value converted once: by
    its done-callback (on a pool thread) or by a thread waiting on it (its
    _tp_drive, spec/api.md PY-3), whichever comes first."""
    f = (_torch_future_type() or Future)()
    f._tp_core = core  # the C future behind it
    claimed = []
    lock = threading.Lock()

    def complete():
        with lock:  # once: by the done-callback or by a waiter, whichever comes first
            if claimed:
                return
            claimed.append(True)
        try:
            v = _values.wrap(_call_c(lambda: core.wait(), what), RRef)
        except Exception as e:
            f.set_exception(e)
        else:
            f.set_result(v)

    def drive(deadline):
        # A waiter takes the outcome from the C future itself, on its own
        # thread, rather than waiting for a pool thread to hand it over: that
        # pool thread may be the waiter (a served function waiting on its own
        # rpc_async with every pool thread busy), which would never come.
        # _drive reads f.done() after it: nothing to return.
        while not core._wait_done(_slice_until(deadline)):
            if deadline is not None and time.monotonic() >= deadline:
                return
        complete()
    f._tp_drive = drive
    core._add_done_callback(complete)
    return f


def _slice_until(deadline):
    """The next slice of a wait that ends at deadline (None: never)."""
    if deadline is None:
        return WAIT_SLICE_S
    return max(0.001, min(WAIT_SLICE_S, deadline - time.monotonic()))


def _drive(f, deadline=None):
    """Completes f from this thread where it can (a call's future, or one
    that follows such futures: then(), collect_all()), waiting until
    deadline (monotonic, None: no end); whether f is done."""
    d = getattr(f, "_tp_drive", None)
    if d is not None and not f.done():
        d(deadline)
    return f.done()


def _failed_future(e):
    """A future that failed at once with e (a send that could not start)."""
    f = (_torch_future_type() or Future)()
    f.set_exception(e)
    return f


def _future_core(fut):
    """The C future that answers for a Future of ours or a torch one
    (answer_later): made and completed from its done-callback."""
    torch = sys.modules.get("torch")
    if not isinstance(fut, Future) and (torch is None
                                        or not isinstance(fut, torch._C.Future)):
        return None  # torch.futures.Future derives from torch._C.Future; then() makes the latter
    core = _rpc.future_new()

    def relay(f):
        try:
            v = f.value()
        except Exception as e:
            core._set_exception("%s: %s" % (_type_name(e), e))
        else:
            try:
                core._set_result(unwrap(v))
            except Exception as e:
                core._set_exception("%s: %s" % (_type_name(e), e))
    fut.add_done_callback(relay)
    return core


def wait_all(futures):
    """Waits for every future and returns their values; raises the first
    error as soon as any future fails (PyTorch's wait_all)."""
    futures = list(futures)
    done = threading.Event()
    failed = []
    left = [len(futures)]
    lock = threading.Lock()

    def on_done(f):
        with lock:
            left[0] -= 1
            if _failed(f):
                failed.append(f)
            if left[0] == 0 or failed:
                done.set()
    if not futures:
        return []
    for f in futures:
        f.add_done_callback(on_done)
    while not done.is_set():  # slices, so Ctrl-C interrupts it
        pending = next((f for f in futures if not f.done()), None)
        if pending is None or getattr(pending, "_tp_drive", None) is None:
            done.wait(WAIT_SLICE_S)
        else:  # completed here if no pool thread can (its callback then runs here)
            _drive(pending, time.monotonic() + WAIT_SLICE_S)
    if failed:
        failed[0].wait()  # raises its error
    return [f.wait() for f in futures]


def _failed(f):
    try:
        f.value()
        return False
    except Exception:
        return True


def collect_all(futures):
    """A Future completed with the list of futures once all are complete."""
    futures = list(futures)
    out = Future()
    left = [len(futures)]
    lock = threading.Lock()

    def on_done(_):
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            out.set_result(futures)
    if not futures:
        out.set_result([])
    for f in futures:
        f.add_done_callback(on_done)

    def drive(deadline):  # in order, until one is not done by deadline
        for g in futures:
            if not _drive(g, deadline):
                return
    if any(getattr(f, "_tp_drive", None) is not None for f in futures):
        out._tp_drive = drive
    return out


# ---- Calls ---------------------------------------------------------------------------------

def _call_wire(func, args, kwargs, timeout):
    module, name = callable_ref(func)
    if args is not None and not isinstance(args, (tuple, list)):
        raise TypeError("args must be a tuple or list, not %s" % type(args).__name__)
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError("kwargs must be a dict, not %s" % type(kwargs).__name__)
    timeout = _timeout_arg(timeout)
    what = _values.describe(func) if module is None else "%s.%s" % (module, name)
    wire = (module, name, tuple(unwrap(list(args or ()))), unwrap(dict(kwargs or {})),
            _effective_timeout(timeout))
    return wire, timeout, what


def rpc_async(to, func, args=None, kwargs=None, timeout=UNSET_RPC_TIMEOUT):
    """Calls func(*args, **kwargs) on worker `to`; returns a Future of its result."""
    _require_init("rpc_async")
    wire, timeout, what = _call_wire(func, args, kwargs, timeout)
    dest = _dest(to)
    try:
        core = _rpc.call(dest, *wire, timeout, False)
    except (_rpc.PeerDownError, RemoteError) as e:
        # A send that failed (the peer is gone, an rref argument's creation
        # failed) is the future's error, as in PyTorch.
        return _failed_future(_translate(e, what))
    except (TimeoutError, RuntimeError, ValueError, TypeError, LookupError) as e:
        t = _translate(e, what)
        if t is e:
            raise
        raise t from None
    fut = _make_future(core, what)
    if hasattr(_thread_local_var, "future_list"):  # inside _wait_all()
        _thread_local_var.future_list.append(fut)
    return fut


def rpc_sync(to, func, args=None, kwargs=None, timeout=UNSET_RPC_TIMEOUT):
    """Calls func(*args, **kwargs) on worker `to` and returns its result."""
    _require_init("rpc_sync")
    wire, timeout, what = _call_wire(func, args, kwargs, timeout)
    core = _call_c(lambda: _rpc.call(_dest(to), *wire, timeout, False), what, "rpc_sync")
    # Ctrl-C in the wait gives the call up: shutdown() does not wait for it.
    return _values.wrap(_call_c(lambda: core.wait(True), what, "rpc_sync"), RRef)


def remote(to, func, args=None, kwargs=None, timeout=UNSET_RPC_TIMEOUT):
    """Runs func on worker `to` and keeps the result there; returns an RRef to it."""
    _require_init("remote")
    wire, timeout, what = _call_wire(func, args, kwargs, timeout)
    return RRef(_call_c(lambda: _rpc.call(_dest(to), *wire, timeout, True), what))


# ---- RRefs ---------------------------------------------------------------------------------

def _local_value_of(rref):
    """On the owner: the value an rref holds (to_here's way for objects that
    travel pickled)."""
    return rref.local_value()


_local_value_of._tp_internal = True  # served whatever the exposure policy


def _confirmed(rref):
    """On the owner, run once the rref argument is confirmed (RREF-13): None."""
    del rref


_confirmed._tp_internal = True  # served whatever the exposure policy


def _type_path_of(rref):
    t = type(rref.local_value())
    # A class may hide either name (its metaclass raises): None, and the
    # caller, finding no class, leaves the method's check to this owner.
    module, qualname = getattr(t, "__module__", None), getattr(t, "__qualname__", None)
    return (module if isinstance(module, str) else None,
            qualname if isinstance(qualname, str) else None)


_type_path_of._tp_internal = True  # served whatever the exposure policy


class RRef:
    """A reference to a value on its owner: to_here(), owner(), is_owner() and the rest.
    RRef(value) makes one this worker owns, holding value (PyTorch's RRef(value))."""

    def __init__(self, value, type_hint=None):
        del type_hint  # PyTorch's TorchScript hint: no meaning here
        if isinstance(value, _rpc.RRef):
            self._core = value
        else:
            _require_init("RRef(value)")
            self._core = _rpc.rref_from_value(unwrap(value))

    def to_here(self, timeout=UNSET_RPC_TIMEOUT):
        timeout = _timeout_arg(timeout)
        try:
            return _values.wrap(_call_c(lambda: self._core.to_here(timeout), "to_here"), RRef)
        except TypeError as e:
            # An object kept on its owner travels only pickled, which the owner
            # does when asked through a call (on its pool, with the GIL).
            if not _values.state.allow_pickle or "object" not in str(e):
                raise
            return rpc_sync(self.owner(), _local_value_of, args=(self,), timeout=timeout)

    def local_value(self):
        if not self.is_owner():  # PyTorch's words, which programs match
            rref_id, fork_id = self._gids()
            raise RuntimeError(
                "For UserRRef(rref_id=%s, fork_id=%s), can't call localValue() on user %r. Call "
                "it on owner %r" % (rref_id, fork_id, get_worker_info(), self.owner()))
        return _values.wrap(_call_c(self._core.local_value, "local_value"), RRef)

    def _gids(self):
        """PyTorch's GloballyUniqueId strings of the value's id and this fork's
        (local ids from 0, as PyTorch counts them; ours count from 1)."""
        def gid(g):
            return "GloballyUniqueId(created_on=%d, local_id=%d)" % (
                g[0], (g[1] & ((1 << 40) - 1)) - 1)
        rref_id, fork_id = self._core._ids()
        return gid(rref_id), gid(fork_id)

    def __str__(self):
        rref_id, fork_id = self._gids()
        if self.is_owner():
            return "OwnerRRef(%s)" % rref_id
        return "UserRRef(RRefId = %s, ForkId = %s)" % (rref_id, fork_id)

    def owner(self):
        name, id = self._core._owner()
        return WorkerInfo(name, id)

    def owner_name(self):
        return self.owner().name

    def is_owner(self):
        return self._core.is_owner()

    def confirmed_by_owner(self):
        return self._core.confirmed_by_owner()

    def _get_type(self, timeout=UNSET_RPC_TIMEOUT, blocking=True):
        """The type of the value on its owner (a class found here by name)."""
        def resolve(path):
            module, qualname = path
            mod = sys.modules.get(module)
            t = _values._resolve(mod, qualname) if mod else None
            if not isinstance(t, type):
                raise LookupError("the rref's value is a %s.%s, a class not found here"
                                  % (module, qualname))
            return t
        if self.is_owner():
            t = type(self.local_value())
            if blocking:
                return t
            f = Future()
            f.set_result(t)
            return f
        fut = rpc_async(self.owner(), _type_path_of, args=(self,), timeout=timeout)
        if blocking:
            return resolve(fut.wait())
        out = (_torch_future_type() or Future)()  # not then(): torch's then retypes errors

        def done(f):
            try:
                out.set_result(resolve(f.wait()))
            except Exception as e:
                out.set_exception(e)
        fut.add_done_callback(done)
        return out

    def _check_method(self, name, timeout):
        """AttributeError now, as PyTorch, when the value's class (found here
        by name, fetched once) has no attribute name."""
        t = getattr(self, "_tp_type", None)
        if t is None:
            try:
                t = self._tp_type = self._get_type(timeout)
            except LookupError:
                return  # the class is not imported here: the owner will say
        if not hasattr(t, name) and not any((k, name) in _methods for k in t.__mro__):
            raise AttributeError("'%s' object has no attribute '%s'" % (t.__name__, name))

    def _get_future(self, timeout=UNSET_RPC_TIMEOUT):
        """A future that completes once the owner holds the value (its
        creation's outcome: the creation's error if it failed)."""
        if self.is_owner():
            f = (_torch_future_type() or Future)()
            f.set_result(None)
            return f
        return rpc_async(self.owner(), _confirmed, args=(self,), timeout=timeout)

    def rpc_sync(self, timeout=UNSET_RPC_TIMEOUT):
        """rref.rpc_sync().m(*args): m of the object this rref holds, run on its owner."""
        return _Proxy(self, timeout, "sync")

    def rpc_async(self, timeout=UNSET_RPC_TIMEOUT):
        return _Proxy(self, timeout, "async")

    def remote(self, timeout=UNSET_RPC_TIMEOUT):
        return _Proxy(self, timeout, "remote")

    def __reduce__(self):
        raise RuntimeError("Can not pickle rref in python pickler: an RRef travels as an "
                           "argument or result of a call, never pickled")

    def __repr__(self):
        return "RRef(owner=%s)" % self.owner_name()


class _Proxy:
    """The methods of an rref's value, called on its owner (PyTorch's RRef
    proxies): rref.rpc_sync().m(*args) runs m of the value there, whatever its
    kind (an object kept by remote(), a tensor, ...), as PyTorch does, through
    a call of _proxy_call to the owner."""

    def __init__(self, rref, timeout, mode):
        self._rref, self._timeout, self._mode = rref, _timeout_arg(timeout), mode

    def __getattr__(self, name):
        call = {"sync": rpc_sync, "async": rpc_async, "remote": remote}[self._mode]
        self._rref._check_method(name, self._timeout)

        def method(*args, **kwargs):
            return call(self._rref.owner(), _proxy_call, args=(self._rref, name, args, kwargs),
                        timeout=self._timeout)
        method.__name__ = name
        return method


def _proxy_call(rref, name, args, kwargs):
    """On the owner: method name of the rref's value, whatever its kind."""
    return _run_method(rref.local_value(), name, args, kwargs)


_proxy_call._tp_internal = True  # served whatever the exposure policy


def method_factory(method_name, docstring=None):
    """A callable m(rref, *args, **kwargs) that runs method_name of the object
    rref holds on its owner (the C API's method_factory)."""
    def method(rref, *args, **kwargs):
        return getattr(rref.rpc_sync(), method_name)(*args, **kwargs)
    method.__name__ = method_name
    method.__doc__ = docstring
    return method


# ---- The current agent ----------------------------------------------------------------------

class _Agent:
    """What PyTorch's _get_current_rpc_agent() offers programs that inspect it."""

    def get_worker_info(self, worker_name=None):
        return get_worker_info(worker_name)

    def get_worker_infos(self):
        return [WorkerInfo(n, i) for n, i in _rpc.get_worker_infos()]

    def get_debug_info(self):
        return {k: str(v) for k, v in _rpc.get_debug_info().items()}

    is_static_group = True


def _is_current_rpc_agent_set():
    return _state.running


def _get_current_rpc_agent():
    if not _state.running:
        raise RuntimeError("Current RPC agent is not set! Did you initialize the RPC framework "
                           "(e.g. by calling `rpc.init_rpc`)?")
    return _Agent()


def _get_debug_info():
    return _get_current_rpc_agent().get_debug_info()


# ---- Gathers over rpc (PyTorch's private _all_gather, _barrier, _wait_all) -------------------

class _Gather:
    def __init__(self):
        self.objects = {}
        self.ready = threading.Event()
        self.made = time.monotonic()
        self.waited = False    # a local _all_gather waits for it
        self.answered_by = None  # a follower's round: who broadcast the result


_gather_lock = threading.Lock()
_gather_seq = {}     # the sorted names joined -> the next round's number
_gathers = {}        # round id -> _Gather
_gathers_closed = collections.OrderedDict()  # rounds ended here (ids), newest last
# Rounds held at once. A peer's _gather_to_leader or _broadcast_to_followers
# (served whatever the exposure policy) makes one, and one that no local
# _all_gather ever waits for would stay: past this many, they are refused.
GATHER_ROUNDS_MAX = 1024
# A round a peer made that no local _all_gather has waited for in this long
# is dropped when room is needed (its local side is not coming).
GATHER_ROUND_STALE_S = 2 * NAME_WAIT_MAX_S


def _gather_state(round_id, local=False):
    """The round's state, made when new: a round that ended here (a late
    contribution or broadcast after its timeout) is never made again."""
    with _gather_lock:
        g = _gathers.get(round_id)
        if g is None:
            if round_id in _gathers_closed:
                raise RuntimeError("_all_gather: round %r already ended on this worker"
                                   % (round_id,))
            if len(_gathers) >= GATHER_ROUNDS_MAX:
                now = time.monotonic()
                for rid in [r for r, x in _gathers.items()
                            if not x.waited and now - x.made > GATHER_ROUND_STALE_S]:
                    _gather_close_locked(rid)
            if len(_gathers) >= GATHER_ROUNDS_MAX:
                raise RuntimeError("_all_gather: %d rounds are pending on this worker "
                                   "(GATHER_ROUNDS_MAX); round %r refused"
                                   % (len(_gathers), round_id))
            g = _gathers[round_id] = _Gather()
        g.waited = g.waited or local
        return g


def _gather_close_locked(round_id):
    """The round ends here (_gather_lock held); its id is remembered, a
    bounded number of them, so nothing a peer sends late makes it again."""
    _gathers.pop(round_id, None)
    _gathers_closed[round_id] = None
    while len(_gathers_closed) > GATHER_ROUNDS_MAX:
        _gathers_closed.popitem(last=False)


def _gather_put(round_id, name, obj, names):
    """On the leader: one worker's contribution to a round."""
    if name not in names:
        raise ValueError("_all_gather: %r is not among the round's workers" % (name,))
    g = _gather_state(round_id)
    with _gather_lock:
        if name in g.objects:
            raise RuntimeError("%s sent round %s of _all_gather twice" % (name, round_id))
        g.objects[name] = obj
        if set(g.objects) == set(names):
            g.ready.set()


def _gather_to_leader(round_id, name, obj, names):
    """Served on the leader: a follower's contribution, under its own name only."""
    sender = _rpc.serving_caller()
    if sender != name:
        raise PermissionError("_all_gather: worker %r sent a contribution as %r" % (sender, name))
    _gather_put(round_id, name, obj, names)


_gather_to_leader._tp_internal = True  # served whatever the exposure policy


def _broadcast_to_followers(round_id, objects):
    """On a follower: the leader's gathered result for a round (the leader
    checks it is the one that sent it)."""
    g = _gather_state(round_id)
    g.answered_by = _rpc.serving_caller()
    g.objects = objects
    g.ready.set()


_broadcast_to_followers._tp_internal = True  # served whatever the exposure policy


def _all_gather(obj, worker_names=None, timeout=UNSET_RPC_TIMEOUT):
    """Every named worker's obj, as {name: obj}, on every one of them. The
    worker with the smallest name gathers and answers the others (PyTorch's
    algorithm); every wait is bounded by timeout (the default timeout when
    unset, 60 s when that is 0)."""
    _require_init("_all_gather")
    names = set(worker_names or (w.name for w in _Agent().get_worker_infos()))
    timeout = _effective_timeout(_timeout_arg(timeout))
    wait_s = timeout if timeout > 0 else NAME_WAIT_MAX_S
    leader, me = min(names), _state.me.name
    key = "".join(sorted(names))
    with _gather_lock:
        n = _gather_seq.get(key, 0)
        _gather_seq[key] = n + 1
    round_id = "%s/%d" % (key, n)
    if leader == me:
        _gather_put(round_id, me, obj, sorted(names))
    else:
        rpc_sync(leader, _gather_to_leader, args=(round_id, me, obj, sorted(names)),
                 timeout=timeout)
    g = _gather_state(round_id, local=True)
    if not g.ready.wait(wait_s):
        with _gather_lock:
            _gather_close_locked(round_id)
            missing = sorted(names - set(g.objects))
        raise RuntimeError("_all_gather timed out in _all_gather after %.2f seconds waiting for %s"
                           % (wait_s, ", ".join(missing) or "the leader %s" % leader))
    if leader != me and g.answered_by != leader:
        with _gather_lock:
            _gather_close_locked(round_id)
        raise RuntimeError("_all_gather: round %s was answered by %r, not its leader %r"
                           % (round_id, g.answered_by, leader))
    if leader == me:
        futs = {f: rpc_async(f, _broadcast_to_followers, args=(round_id, g.objects),
                             timeout=timeout) for f in sorted(names - {leader})}
        errors = []
        for f, fut in futs.items():
            try:
                fut.wait()
            except RuntimeError as e:
                errors.append((f, e))
        if errors:
            raise RuntimeError("Followers %s timed out in _all_gather after %.2f seconds. The "
                               "first exception is %s" % ([f for f, _ in errors], wait_s,
                                                          errors[0][1]))
    with _gather_lock:
        _gather_close_locked(round_id)
    return g.objects


def _barrier(worker_names):
    """Returns once every named worker reached it (PyTorch's _barrier)."""
    _all_gather(None, set(worker_names))


def _wait_all_workers(timeout=constants.DEFAULT_SHUTDOWN_TIMEOUT):
    """Returns once every worker reached it; our graceful shutdown does this
    itself, with a deadline, so programs need not."""
    _all_gather(None, timeout=timeout if timeout else UNSET_RPC_TIMEOUT)


_thread_local_var = threading.local()


class _wait_all:
    """with rpc.api._wait_all(): futures that rpc_async returns in the block
    are waited for at its end (PyTorch's private helper)."""

    def __enter__(self):
        _thread_local_var.future_list = []

    def __exit__(self, *exc):
        try:
            wait_all(_thread_local_var.future_list)
        finally:
            del _thread_local_var.future_list
        return False
