"""The package's argument checks and its own Future, each case asserting the
error a user gets (type and words) and that nothing started: most run in
this process, before any init_rpc; the ones that need running workers run
in small jobs of one or two. Issue 21: a check no test reached was a check
a mutant could delete unseen."""
import pickle
import threading
import time

import pytest

import tensorplay.distributed.rpc as rpc
from tensorplay import _rpc
from tensorplay.distributed.rpc import api, backend_registry
from test_rpc import need_torch, run


def not_started():
    return not api._state.running and not _rpc.is_initialized()


# ---- WorkerInfo, is_available, before init ------------------------------------------------

def test_worker_info_checks_its_id_and_name():
    assert rpc.WorkerInfo("w-1:a_b", 0).id == 0
    for bad in (-1, True, 1.0, "1", None):
        with pytest.raises(TypeError, match="WorkerInfo id must be a non-negative int"):
            rpc.WorkerInfo("w", bad)
    for bad in ("", "a b", "x" * 128, 7):
        with pytest.raises(RuntimeError, match=r"Worker name must match"):
            rpc.WorkerInfo(bad, 0)
    assert rpc.WorkerInfo("x" * 127, 3).name == "x" * 127


def test_is_available_and_calls_before_init():
    assert rpc.is_available() is True
    assert not_started()
    for call in (lambda: rpc.get_worker_info(), lambda: rpc.rpc_sync("w", len, args=("a",)),
                 lambda: api._get_current_rpc_agent()):
        with pytest.raises(RuntimeError, match="RPC has not been initialized|agent is not set"):
            call()
    # PyTorch's words, which programs match on, not the C layer's.
    for call, what in ((lambda: rpc.RRef(1), "RRef(value)"),
                       (lambda: rpc._set_rpc_timeout(5), "_set_rpc_timeout")):
        with pytest.raises(RuntimeError) as e:
            call()
        assert str(e.value) == ("RPC has not been initialized. Call "
                                "tensorplay.distributed.rpc.init_rpc first (%s)" % what)
    assert api._is_current_rpc_agent_set() is False


def test_every_entry_point_before_init_says_so_in_pytorchs_words():
    """rpc_async, remote and the gather check init themselves, as rpc_sync
    does: the message names the entry point, not the C layer's state."""
    assert not_started()
    for call, what in ((lambda: rpc.rpc_async("w", len, args=("a",)), "rpc_async"),
                       (lambda: rpc.remote("w", len, args=("a",)), "remote"),
                       (lambda: api._all_gather(None, ["w"]), "_all_gather")):
        with pytest.raises(RuntimeError) as e:
            call()
        assert str(e.value) == ("RPC has not been initialized. Call "
                                "tensorplay.distributed.rpc.init_rpc first (%s)" % what)
    assert not_started()


# ---- init_rpc's arguments ------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, error, words", [
    ({"name": 7}, TypeError, "name must be a str, not int"),
    ({"name": "a b"}, RuntimeError, "Worker name must match"),
    ({"name": "w", "backend": "TENSORPIPE"}, TypeError,
     "backend must be a member of BackendType, not 'TENSORPIPE'"),
    ({"name": "w", "rpc_backend_options": {"rpc_timeout": 1}}, TypeError,
     "must be an instance of RpcBackendOptions"),
    ({"name": "w", "backend": rpc.BackendType.TENSORPIPE,
      "rpc_backend_options": rpc.RpcBackendOptions()}, TypeError,
     "must be a `TensorPipeRpcBackendOptions` for backend TENSORPIPE, not RpcBackendOptions"),
    ({"name": "w", "rank": 0, "world_size": "2"}, TypeError, "world_size must be an int, not str"),
    ({"name": "w", "rank": True, "world_size": 2}, TypeError, "rank must be an int, not bool"),
    ({"name": "w", "rank": 0, "world_size": 2.0}, TypeError, "world_size must be an int, not float"),
])
def test_init_rpc_refuses_bad_arguments_before_starting(kwargs, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(").replace("`", ".")):
        rpc.init_rpc(**kwargs)
    assert not_started()


def test_init_rpc_reads_rank_and_world_size_from_the_environment(monkeypatch):
    monkeypatch.setenv("RANK", "zero")
    with pytest.raises(ValueError, match="environment variable RANK is 'zero', not an int"):
        rpc.init_rpc("w")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2x")
    with pytest.raises(ValueError, match="environment variable WORLD_SIZE is '2x', not an int"):
        rpc.init_rpc("w")
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(ValueError, match="world_size parameter missing"):
        rpc.init_rpc("w", rank=0)
    assert not_started()


def test_init_rpc_sends_a_python_backend_to_init_backend():
    class PyOptions(rpc.RpcBackendOptions):
        pass
    b = rpc.register_backend("API_CHECKS_PY", lambda *a, **kw: PyOptions(*a),
                             lambda *a, **kw: "started")
    with pytest.raises(ValueError, match="backend API_CHECKS_PY is written in Python: start it "
                       "with init_backend"):
        rpc.init_rpc("w", backend=b, rank=0, world_size=1)
    assert not_started()
    for bad in ("", 7, None):
        with pytest.raises(TypeError, match="backend_name must be a non-empty str"):
            rpc.register_backend(bad, None, None)
    with pytest.raises(RuntimeError, match="RPC backend API_CHECKS_PY: already registered"):
        rpc.register_backend("API_CHECKS_PY", None, None)


def test_backend_inferred_from_options_or_refused():
    assert backend_registry.infer(rpc.TensorPipeRpcBackendOptions()) is \
        backend_registry.BackendType.TENSORPIPE

    class Other(rpc.RpcBackendOptions):
        pass
    with pytest.raises(TypeError, match="Could not infer backend for options .*pass backend= "
                       "explicitly"):
        backend_registry.infer(Other())
    with pytest.raises(TypeError, match="Could not infer backend"):
        rpc.init_rpc("w", rank=0, world_size=1, rpc_backend_options=Other())
    assert not_started()


# ---- Options -------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, error, words", [
    ({"init_method": 7}, TypeError, "init_method must be a str URL, not int"),
    ({"secret": 12}, TypeError, "secret must be a hex str or bytes, not int"),
    ({"auth": "maybe"}, ValueError, "auth must be 'on' or 'off', got 'maybe'"),
    ({"tensor_type": "jax"}, ValueError, "tensor_type must be one of"),
    ({"expose": "os.getcwd"}, TypeError, "expose must be a list of functions"),
    ({"expose": 7}, TypeError, "expose must be a list of functions"),
    ({"backend_options": {"no_such_key": 1}}, ValueError, "unknown backend option 'no_such_key'"),
    ({"devices": ["cuda:0"]}, ValueError, "device 'cuda:0': tensorplay-rpc carries CPU tensors"),
    ({"init_timeout": "5"}, TypeError, "init_timeout must be a number of seconds, not str"),
    ({"shutdown_timeout": -1}, ValueError, "shutdown_timeout must be >= 0 seconds"),
    ({"rpc_timeout": float("nan")}, ValueError, "rpc_timeout must be >= 0 seconds"),
    ({"rpc_timeout": None}, TypeError, "rpc_timeout must be a number of seconds, not NoneType"),
    ({"num_worker_threads": 0}, ValueError, "num_worker_threads must be a positive int"),
])
def test_options_refuse_bad_values(kwargs, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(")):
        rpc.TensorPipeRpcBackendOptions(**kwargs)


def test_options_keep_what_they_are_given():
    o = rpc.TensorPipeRpcBackendOptions(devices=["cpu"], secret=b"\x01\xab", auth=False,
                                        init_method="tcp://127.0.0.1:1234", rpc_timeout=2)
    assert o.devices == ["cpu"]
    assert o._backend_strings() == {"secret": "01ab", "auth": "off"}
    assert repr(o) == "TensorPipeRpcBackendOptions(rpc_timeout=2, init_method=" \
                      "'tcp://127.0.0.1:1234')"
    assert rpc.TensorPipeRpcBackendOptions(auth=True, secret="ff" * 16)._backend_strings() == \
        {"secret": "ff" * 16, "auth": "on"}
    assert rpc.TensorPipeRpcBackendOptions()._backend_strings() == {}
    plain = rpc.TensorPipeRpcBackendOptions()  # PyTorch's defaults
    assert plain.devices == [] and plain.device_maps == {} and plain.num_worker_threads == 16
    assert repr(rpc.BackendType.TENSORPIPE) == "BackendType.TENSORPIPE"
    assert rpc.TensorPipeRpcBackendOptions(
        backend_options={"idle_timeout": 5})._backend_strings() == {"idle_timeout": "5"}
    with pytest.raises(TypeError, match="expose takes functions, classes, modules and "
                       "'module.qualname' strings, not 7"):
        api._policy.Policy([7])


# ---- The package's own Future ----------------------------------------------------------------

def test_future_completes_once_and_checks_its_arguments():
    f = rpc.Future()
    assert not f.done()
    with pytest.raises(RuntimeError, match="the future is still pending"):
        f.value()
    with pytest.raises(rpc.RpcTimeoutError, match="Future.wait timed out after 0.05 s"):
        f.wait(0.05)
    for bad, error in ((-1, ValueError), ("1", TypeError), (True, TypeError)):
        with pytest.raises(error, match="timeout must be"):
            f.wait(bad)
    with pytest.raises(TypeError, match="set_exception takes an exception, not str"):
        f.set_exception("no")
    with pytest.raises(TypeError, match="add_done_callback needs a callable, not 3"):
        f.add_done_callback(3)
    with pytest.raises(TypeError, match="then needs a callable"):
        f.then(None)
    assert not f.done()
    f.set_result(5)
    assert f.done() and f.value() == 5 and f.wait(0) == 5 and f.wait(1) == 5
    with pytest.raises(RuntimeError, match="this Future is already completed"):
        f.set_result(6)
    with pytest.raises(RuntimeError, match="this Future is already completed"):
        f.set_exception(ValueError("late"))
    assert f.value() == 5


def test_future_callbacks_and_then(capsys):
    f = rpc.Future()
    seen = []
    f.add_done_callback(lambda g: seen.append(("first", g.value())))

    def bad(g):
        raise KeyError("callback broke")
    f.add_done_callback(bad)
    f.add_done_callback(lambda g: seen.append(("after", g.value())))
    doubled = f.then(lambda g: g.value() * 2)
    failed = f.then(lambda g: 1 / 0)
    assert seen == [] and not doubled.done() and not failed.done()
    f.set_result(21)  # runs the callbacks in order; the failing one does not stop the rest
    assert seen == [("first", 21), ("after", 21)]
    err = capsys.readouterr().err
    assert "a future's done-callback raised" in err and "callback broke" in err
    assert doubled.value() == 42
    with pytest.raises(ZeroDivisionError):
        failed.wait()
    f.add_done_callback(lambda g: seen.append(("late", g.value())))  # runs at once
    assert seen[-1] == ("late", 21)


def test_wait_all_and_collect_all():
    assert rpc.wait_all([]) == []
    a, b, c = rpc.Future(), rpc.Future(), rpc.Future()
    a.set_result(1)
    b.set_result(2)
    t = threading.Timer(0.2, c.set_result, (3,))
    t.start()
    try:
        assert rpc.wait_all([a, b, c]) == [1, 2, 3]
    finally:
        t.join()
    c, d = rpc.Future(), rpc.Future()
    c.set_exception(ValueError("c failed"))
    with pytest.raises(ValueError, match="c failed"):
        rpc.wait_all([d, c])  # d never completes: the first error ends the wait
    # A success before the error does not end the wait: the error, when it
    # comes, does, before a slower future completes.
    ok, bad, slow = rpc.Future(), rpc.Future(), rpc.Future()
    ok.set_result(1)
    t = threading.Timer(0.2, bad.set_exception, (ValueError("bad"),))
    t_slow = threading.Timer(4, slow.set_result, (0,))  # so a wrong wait still ends
    t.start()
    t_slow.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(ValueError, match="bad"):
            rpc.wait_all([slow, ok, bad])
        assert time.monotonic() - t0 < 3
    finally:
        t.join()
        t_slow.join()
    empty = rpc.collect_all([])
    assert empty.done() and empty.value() == []
    e, g = rpc.Future(), rpc.Future()
    both = rpc.collect_all([e, g])
    e.set_result("e")
    assert not both.done()
    g.set_exception(KeyError("g"))
    assert both.done() and both.value() == [e, g]


# ---- PyTorch's helpers' shapes ---------------------------------------------------------------

def test_async_execution_keeps_pytorchs_attribute():
    """PyTorch's decorator leaves the function on _wrapped_async_rpc_function,
    which code written for it reads; ours does too."""
    def f(x):
        return x

    wrapped = rpc.functions.async_execution(f)
    assert wrapped._wrapped_async_rpc_function is f
    assert wrapped.__name__ == "f" and wrapped(3) == 3


def test_wait_all_block_lets_the_exception_out():
    """PyTorch's api._wait_all: an exception in the block propagates (its
    __exit__ does not swallow it), and the block's list is gone after it."""
    with pytest.raises(ValueError, match="inside"):
        with api._wait_all():
            raise ValueError("inside")
    assert not hasattr(api._thread_local_var, "future_list")
    with api._wait_all():
        pass
    assert not hasattr(api._thread_local_var, "future_list")


def test_remote_errors_become_their_class():
    """A remote error's text names its class: "<call> on worker 'w1' (id 1)
    failed: module.Type: text", or "module.Type: text" alone for a C future
    the program failed; either way the caller gets that class with the text,
    and a class it cannot rebuild stays a RemoteError that names it."""
    e = api._translate(_rpc.RemoteError("builtins.ValueError: bad"), None)
    assert type(e) is ValueError and str(e) == "builtins.ValueError: bad"
    e = api._translate(_rpc.RemoteError("rpc_sync to worker 'w1' (id 1), function 'f' on "
                                        "worker 'w1' (id 1) failed: builtins.KeyError: k"), None)
    assert type(e) is KeyError and "On worker 'w1' (id 1)" in str(e) and "KeyError: k" in str(e)
    e = api._translate(_rpc.RemoteError("nowhere.Gone: x"), None)
    assert type(e) is _rpc.RemoteError and "raised remotely: nowhere.Gone" in str(e)


def test_remote_errors_of_classes_this_worker_lacks():
    """A class whose module is loaded here but which this worker does not
    have (one defined only on the callee), or a name that is no class:
    a RemoteError naming it, not a TypeError from the lookup."""
    for name in ("__main__.OnlyOnTheCallee", "__main__.__name__", "builtins.len"):
        e = api._translate(_rpc.RemoteError("%s: boom" % name), None)
        assert type(e) is _rpc.RemoteError and "raised remotely: " + name in str(e), name


def test_errors_the_binding_did_not_reword_are_raised_as_they_are():
    for e in (UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"),
              KeyError("k")):
        assert api._translate(e, "m.f", "rpc_sync") is e
        assert api._translate(e, None) is e


def test_wait_all_and_collect_all_take_any_iterable():
    a, b = rpc.Future(), rpc.Future()
    a.set_result(1)
    b.set_result(2)
    assert rpc.wait_all(f for f in (a, b)) == [1, 2]
    assert rpc.collect_all(iter([a, b])).value() == [a, b]


def test_pytorchs_constants():
    assert api.GATHER_ROUND_STALE_S == 2 * api.NAME_WAIT_MAX_S == 120.0
    assert api._Agent.is_static_group is True


def test_new_method_checks_its_arguments():
    class Store:
        pass
    for args in ((Store, "m", 5), ("Store", "m", len), (Store, 5, len)):
        with pytest.raises(TypeError, match="a class, a str and a callable"):
            rpc.new_method(*args)
    assert not any(k[0] is Store for k in api._methods)


def test_a_function_its_module_rebound_is_not_sent_by_name():
    """A function object whose module now names another function under that
    name would run the other one on the callee: refused, saying why."""
    import sys
    import types
    from tensorplay.distributed.rpc._values import callable_ref
    mod = types.ModuleType("tp_shadow")
    sys.modules["tp_shadow"] = mod
    try:
        exec("def f():\n    return 1\n", mod.__dict__)
        old = mod.f
        assert callable_ref(old) == ("tp_shadow", "f")
        exec("def f():\n    return 2\n", mod.__dict__)
        with pytest.raises(TypeError, match="cannot be called remotely"):
            callable_ref(old)
    finally:
        del sys.modules["tp_shadow"]


def test_a_nested_function_is_not_sent_by_name():
    """A function defined inside another is refused, even when its module
    keeps it as a global under its own name: its qualified name
    ('make.<locals>.handler') names nothing a callee could find."""
    import sys
    import types
    from tensorplay.distributed.rpc._values import callable_ref
    mod = types.ModuleType("tp_nested")
    sys.modules["tp_nested"] = mod
    try:
        exec("def make():\n    def handler():\n        return 1\n    return handler\n"
             "handler = make()\n", mod.__dict__)
        with pytest.raises(TypeError, match="nested functions"):
            callable_ref(mod.handler)
    finally:
        del sys.modules["tp_nested"]


def test_callables_name_themselves_or_say_why_they_cannot():
    """What a caller's function becomes on the wire (_values.callable_ref):
    a C class's method or classmethod taken from the class (torch.Tensor.add,
    str.upper, int.__add__, dict.fromkeys) by its class's path, from an
    instance of the class too ({}.fromkeys); a bound method, Python or C, is
    refused with the advice for bound methods; a partial and an anonymous
    callable with theirs."""
    import functools
    from tensorplay.distributed.rpc import _values

    class Obj:
        def m(self):
            pass

        def __call__(self):
            pass

    assert _values.callable_ref(str.upper) == ("builtins", "str.upper")
    assert _values.callable_ref(int.__add__) == ("builtins", "int.__add__")
    assert _values.callable_ref(len) == ("builtins", "len")
    assert _values.callable_ref(dict.fromkeys) == ("builtins", "dict.fromkeys")
    assert _values.callable_ref({}.fromkeys) == ("builtins", "dict.fromkeys")
    import datetime
    assert _values.callable_ref(datetime.date.fromordinal) == ("datetime", "date.fromordinal")
    # A Python classmethod is made anew at each access: found again by its
    # class's path all the same (PyTorch's test_py_class_method).
    import fractions
    assert _values.callable_ref(fractions.Fraction.from_float) == ("fractions",
                                                                   "Fraction.from_float")
    refused = [(Obj().m, "a bound method carries its object"),
               ("abc".upper, "a bound method carries its object"),
               ((1).__add__, "a bound method carries its object"),
               (datetime.date(2026, 1, 1).replace, "a bound method carries its object"),
               (functools.partial(len, "a"), "a functools.partial cannot be called remotely"),
               (lambda: 1, "cannot be called remotely: only functions and classes"),
               (Obj(), "cannot be called remotely: only functions and classes")]
    for f, words in refused:
        with pytest.raises(TypeError, match=words):
            _values.callable_ref(f)


def test_methods_of_c_classes_are_called_by_name(tmp_path):
    """PyTorch programs pass torch.Tensor's methods as functions
    (rpc_sync(to, torch.Tensor.add, args=(a, b))), C classmethods
    (int.from_bytes) and their own classmethods: they travel by their
    class's path and run on the callee."""
    need_torch()
    out = run(tmp_path, """
        import torch

        class Maker:
            @classmethod
            def twice(cls, n):
                return [cls.__name__, 2 * n]

        rpc.init_rpc("worker%d" % rank)
        if rank == 0:
            print(rpc.rpc_sync("worker1", Maker.twice, args=(21,)))
            a, b = torch.tensor([1.0, 2.0]), torch.tensor([10.0, 20.0])
            print(rpc.rpc_sync("worker1", torch.Tensor.add, args=(a, b)).tolist())
            print(rpc.rpc_sync("worker1", torch.Tensor.__mul__, args=(a, 3)).tolist())
            print(rpc.remote("worker1", torch.Tensor.sum, args=(b,)).to_here().item())
            print(rpc.rpc_sync("worker1", str.upper, args=("abc",)),
                  rpc.rpc_sync("worker1", int.__add__, args=(2, 3)))
            print(rpc.rpc_sync("worker1", int.from_bytes, args=(b"\\x01\\x02", "big")),
                  rpc.rpc_sync("worker1", dict.fromkeys, args=(["a", "b"], 0)),
                  rpc.rpc_sync("worker1", bytes.fromhex, args=("ff00",)))
        rpc.shutdown()
    """)
    assert out == ["['Maker', 42]", "[11.0, 22.0]", "[3.0, 6.0]", "30.0", "ABC 5",
                   "258 {'a': 0, 'b': 0} b'\\xff\\x00'"]


# ---- With a running worker ---------------------------------------------------------------

def test_checks_that_need_a_running_worker(tmp_path):
    out = run(tmp_path, """
        import pickle
        def attempt(label, fn):
            try:
                fn()
                print(label, "no error")
            except Exception as e:
                print(label, type(e).__name__, str(e).splitlines()[0])
        rpc.init_rpc("worker0", rank=0, world_size=1)
        attempt("info", lambda: rpc.get_worker_info(5))
        attempt("float", lambda: rpc.rpc_sync(1.5, add, args=(1, 2)))
        attempt("bool", lambda: rpc.rpc_sync(True, add, args=(1, 2)))
        attempt("none", lambda: rpc.rpc_sync(None, add, args=(1, 2)))
        attempt("args", lambda: rpc.rpc_sync("worker0", add, args={"a": 1}))
        attempt("kwargs", lambda: rpc.rpc_async("worker0", add, args=(1,), kwargs=[2]))
        attempt("callable", lambda: rpc.rpc_sync("worker0", 42))
        attempt("unset default", lambda: rpc._set_rpc_timeout(rpc.constants.UNSET_RPC_TIMEOUT))
        attempt("sync -5", lambda: rpc.rpc_sync("worker0", add, args=(1, 2), timeout=-5))
        attempt("async True", lambda: rpc.rpc_async("worker0", add, args=(1, 2), timeout=True))
        attempt("remote -5", lambda: rpc.remote("worker0", add, args=(1, 2), timeout=-5))
        r0 = rpc.remote("worker0", add, args=(1, 2))
        attempt("to_here True", lambda: r0.to_here(timeout=True))
        attempt("to_here -5", lambda: r0.to_here(timeout=-5))
        print("repr", repr(r0))
        print("default", rpc.get_rpc_timeout())
        print("ok", rpc.rpc_sync(0, add, args=(1, 2)), rpc.rpc_sync(rpc.get_worker_info(), add,
                                                                     args=(3, 4)))
        r = rpc.remote("worker0", echo, args=([1, 2],))
        print("rref", r.confirmed_by_owner(), r.is_owner(), r._get_type().__name__,
              r._get_type(blocking=False).wait().__name__, r._get_future().wait())
        attempt("pickle", lambda: pickle.dumps(r))
        agent = rpc._get_current_rpc_agent()
        info = agent.get_debug_info()
        print("debug", rpc._is_current_rpc_agent_set(), sorted(info) == sorted(rpc._get_debug_info()),
              all(isinstance(v, str) for v in info.values()), len(info) > 0)
        rpc.shutdown()
        attempt("after", lambda: rpc.rpc_sync("worker0", add, args=(1, 2)))
    """, nproc=1)
    assert out == [
        "info TypeError worker_name must be a str, not int",
        "float ValueError to: rank 1.5 is not an int",
        "bool TypeError to must be a worker name, rank or WorkerInfo, not bool",
        "none TypeError to must be a worker name, rank or WorkerInfo, not NoneType",
        "args TypeError args must be a tuple or list, not dict",
        "kwargs TypeError kwargs must be a dict, not list",
        "callable TypeError 42 is not callable",
        "unset default ValueError timeout must be >= 0 seconds (0 means no deadline), got -1.0",
        "sync -5 ValueError timeout must be >= 0 seconds (0 means no deadline), got -5.0",
        "async True TypeError timeout must be a number of seconds, not bool (a timedelta? pass "
        ".total_seconds())",
        "remote -5 ValueError timeout must be >= 0 seconds (0 means no deadline), got -5.0",
        "to_here True TypeError timeout must be a number of seconds, not bool (a timedelta? pass "
        ".total_seconds())",
        "to_here -5 ValueError timeout must be >= 0 seconds (0 means no deadline), got -5.0",
        "repr RRef(owner=worker0)",
        "default 60.0",
        "ok 3 7",
        "rref True True list list None",
        "pickle RuntimeError Can not pickle rref in python pickler: an RRef travels as an "
        "argument or result of a call, never pickled",
        "debug True True True True",
        "after RuntimeError RPC has not been initialized. Call "
        "tensorplay.distributed.rpc.init_rpc first (rpc_sync)",
    ]


def test_file_init_method_is_a_sqlite_store(tmp_path):
    store = tmp_path / "rendezvous.db"
    out = run(tmp_path, """
        opts = rpc.TensorPipeRpcBackendOptions(init_method="file://%s")
        rpc.init_rpc("worker%%d" %% rank, rpc_backend_options=opts)
        if rank == 0:
            print(rpc.rpc_sync("worker1", add, args=(2, 3)), os.path.getsize("%s") > 0)
            with open("%s", "rb") as f:
                print(f.read(16))
        rpc.shutdown()
    """ % (store, store, store))
    assert out == ["5 True", "b'SQLite format 3\\x00'"]


def test_worker_infos_equal_by_name_and_id():
    a = rpc.WorkerInfo("w", 1)
    assert a == rpc.WorkerInfo("w", 1) and hash(a) == hash(rpc.WorkerInfo("w", 1))
    assert a != rpc.WorkerInfo("w", 2) and a != rpc.WorkerInfo("v", 1)
    assert a != ("w", 1) and a != "w"
    assert repr(a) == "WorkerInfo(id=1, name=w)"
    b = pickle.loads(pickle.dumps(a))
    assert b == a and (b.name, b.id) == ("w", 1)


def test_future_wait_returns_when_completed_in_time():
    f = rpc.Future()
    t = threading.Timer(0.3, f.set_result, ("late but in time",))
    t.start()
    try:
        assert f.wait(30) == "late but in time"  # waits in slices past the first
    finally:
        t.join()
    g = rpc.Future()
    t = threading.Timer(0.3, g.set_exception, (KeyError("in time"),))
    t.start()
    try:
        with pytest.raises(KeyError, match="in time"):
            g.wait(30)
    finally:
        t.join()



def test_future_wait_is_woken_by_its_completion(monkeypatch):
    """wait() returns when the future completes, woken by it, not at its
    next look: with the looks 30 s apart, a result set after 50 ms is
    returned within seconds (the same for an error)."""
    monkeypatch.setattr(api, "WAIT_SLICE_S", 30.0)
    for complete in ("set_result", "set_exception"):
        f = rpc.Future()
        t = threading.Timer(0.05, getattr(f, complete),
                            (KeyError("woken") if complete == "set_exception" else "woken",))
        t0 = time.monotonic()
        t.start()
        try:
            if complete == "set_result":
                assert f.wait() == "woken"
            else:
                with pytest.raises(KeyError, match="woken"):
                    f.wait(60)
        finally:
            t.join()
        assert time.monotonic() - t0 < 10, complete

# ---- The per-user secret of workers started by hand (no launcher, no TP_SECRET) ---------

def test_host_of_init_methods(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "10.1.2.3")
    assert api._host_of(None) == "10.1.2.3" and api._host_of("env://") == "10.1.2.3"
    assert api._host_of("tcp://127.0.0.1:29500") == "127.0.0.1"
    assert api._host_of("tcp://[::1]:29500") == "::1"
    assert api._host_of("tcp://node7:1") == "node7"
    assert api._host_of("file:///tmp/x") == ""


@pytest.fixture
def runtime_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("TP_SECRET", raising=False)
    return tmp_path / "tensorplay"


def test_user_secret_is_made_once_and_kept_private(runtime_dir):
    s = api._user_secret()
    assert len(s) >= 32 and all(c in "0123456789abcdef" for c in s)
    assert (runtime_dir / "local-secret").read_text().strip() == s
    assert runtime_dir.stat().st_mode & 0o777 == 0o700
    assert (runtime_dir / "local-secret").stat().st_mode & 0o777 == 0o600
    assert api._user_secret() == s  # the same for every worker of this user


def test_user_secret_refuses_a_folder_or_file_others_may_read(runtime_dir):
    runtime_dir.mkdir(mode=0o700)
    runtime_dir.chmod(0o755)
    with pytest.raises(PermissionError, match="tensorplay must belong to you with mode 0700"):
        api._user_secret()
    runtime_dir.chmod(0o700)
    path = runtime_dir / "local-secret"
    path.write_text("ab" * 32 + "\n")
    path.chmod(0o644)
    with pytest.raises(PermissionError, match="local-secret must belong to you with mode 0600"):
        api._user_secret()
    path.chmod(0o600)
    assert api._user_secret() == "ab" * 32


def test_user_secret_waits_for_a_whole_one(runtime_dir):
    runtime_dir.mkdir(mode=0o700)
    path = runtime_dir / "local-secret"
    path.write_text("c" * 31)  # another worker still writing, or a broken file
    path.chmod(0o600)
    with pytest.raises(RuntimeError, match="local-secret holds no job secret; delete it"):
        api._user_secret()
    t = threading.Timer(0.3, path.write_text, ("d" * 32 + "\n",))
    t.start()
    try:
        assert api._user_secret() == "d" * 32
    finally:
        t.join()


def test_backend_strings_take_the_user_secret_only_for_a_local_job(runtime_dir, monkeypatch):
    opts = rpc.TensorPipeRpcBackendOptions
    local = "tcp://127.0.0.1:29500"
    made = api._backend_strings(opts(), local)
    assert set(made) == {"secret"} and len(made["secret"]) >= 32
    assert api._backend_strings(opts(), "tcp://[::1]:29500") == made
    assert api._backend_strings(opts(secret="ee" * 16), local) == {"secret": "ee" * 16}
    assert api._backend_strings(opts(auth="off"), local) == {"auth": "off"}
    assert api._backend_strings(opts(auth="on"), local) == dict(made, auth="on")
    assert api._backend_strings(opts(), "tcp://10.0.0.9:29500") == {}
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    assert api._backend_strings(opts(), "env://") == made
    monkeypatch.setenv("TP_SECRET", "ff" * 16)
    assert api._backend_strings(opts(), local) == {}


def test_tensors_that_cannot_travel_say_why(tmp_path):
    need_torch()
    out = run(tmp_path, """
        import warnings
        import torch
        warnings.simplefilter("ignore")  # torch's beta warnings for CSR and complex32
        rpc.init_rpc("worker0", rank=0, world_size=1)
        cases = [("csr", torch.eye(3).to_sparse_csr()), ("meta", torch.empty(2, device="meta")),
                 ("quantized", torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8)),
                 ("complex32", torch.ones(2, dtype=torch.complex32))]
        for label, t in cases:
            try:
                rpc.rpc_sync("worker0", echo, args=(t,))
                print(label, "sent")
            except TypeError as e:
                print(label, str(e).split(": ", 1)[1])
        print("dense", rpc.rpc_sync("worker0", echo, args=(torch.arange(3),)).tolist())
        rpc.shutdown()
    """, nproc=1)
    assert out[0] == "csr a torch.sparse_csr tensor cannot be sent: dense (strided) and sparse " \
                     "COO tensors travel (.to_dense())"
    assert out[1] == "meta a tensor on meta cannot be sent: tensorplay-rpc carries CPU tensors " \
                     "(.cpu())"
    assert out[2] == "quantized a quantized tensor cannot be sent (.dequantize())"
    assert out[3].startswith("complex32 a tensor of dtype torch.complex32 cannot be sent: ")
    assert out[4:] == ["dense [0, 1, 2]"]


def test_arrays_in_another_byte_order_are_refused(tmp_path):
    """A big-endian array is refused with how to convert it, not sent as
    native numbers it does not hold; an explicitly little-endian one (a
    ctypes array's format '<f'), an explicitly native one ('@f'), and a
    byte array of either order, travel."""
    out = run(tmp_path, """
        import ctypes
        import numpy as np
        rpc.init_rpc("worker0", rank=0, world_size=1)
        try:
            rpc.rpc_sync("worker0", echo, args=(np.array([1.5, 2.5], dtype=">f4"),))
            print("big-endian sent")
        except TypeError as e:
            print(str(e).split(": ", 1)[1])
        print(rpc.rpc_sync("worker0", echo, args=(np.array([1.5, 2.5], dtype="<f4"),)).tolist())
        print(list(rpc.rpc_sync("worker0", echo, args=((ctypes.c_float * 3)(1, 2, 3),))))
        print(rpc.rpc_sync("worker0", echo, args=(np.array([7], dtype=">u1"),)).tolist())
        native = memoryview(bytearray(np.array([4.5], dtype="f4").tobytes())).cast("@f")
        print(native.format, rpc.rpc_sync("worker0", echo, args=(native,)).tolist())
        rpc.shutdown()
    """, nproc=1)
    assert out[0] == "a 'numpy.ndarray' of element format '>f' is not in this machine's byte " \
                     "order, which tensors carry (numpy: a.astype(a.dtype.newbyteorder('=')))"
    assert out[1:] == ["[1.5, 2.5]", "[1.0, 2.0, 3.0]", "[7]", "@f [4.5]"]


def test_answers_and_types_the_caller_cannot_take(tmp_path):
    """An async_execution function whose future completes with a value no
    value kind holds: the caller gets the callee's words, not a hang. An
    rref to an object whose class only its owner has: _get_type says so,
    at once or in its future, and a method call still runs on the owner."""
    out = run(tmp_path, """
        @rpc.functions.async_execution
        def later_set():
            f = rpc.Future()
            f.set_result(object())
            return f

        if rank == 1:
            class OnlyHere:
                def hello(self):
                    return "hello from " + rpc.get_worker_info().name

        def make():
            return OnlyHere()

        rpc.init_rpc("worker%d" % rank)
        if rank == 0:
            try:
                rpc.rpc_sync("worker1", later_set)
            except Exception as e:
                print("set", type(e).__name__, str(e).splitlines()[1][:62])
            r = rpc.remote("worker1", make)
            try:
                r._get_type()
            except LookupError as e:
                print("type", e)
            try:
                r._get_type(blocking=False).wait()
            except LookupError as e:
                print("type later", e)
            print(r.rpc_sync().hello())
        rpc.shutdown()
    """)
    assert out == ["set TypeError TypeError: set_result: a value of type 'object' cannot be "
                   "sent",
                   "type the rref's value is a __main__.OnlyHere, a class not found here",
                   "type later the rref's value is a __main__.OnlyHere, a class not found here",
                   "hello from worker1"]


def test_rref_strings_count_local_ids_within_an_incarnation():
    """PyTorch's GloballyUniqueId strings: the creator's rank and the local id
    from 0. Our ids count from 1 and carry a restarted worker's incarnation
    from bit 40 (common/core.h TPI_INC_SHIFT), which the string leaves out."""
    class Core:
        def _ids(self):
            return (2, (1 << 40) | 3), (0, (5 << 40) | 1)
    r = object.__new__(api.RRef)
    r._core = Core()
    assert r._gids() == ("GloballyUniqueId(created_on=2, local_id=2)",
                         "GloballyUniqueId(created_on=0, local_id=0)")


def test_backend_keys_reach_the_library(tmp_path):
    """OPT-6: TensorPipeRpcBackendOptions(backend_options={...}) keys are the
    library's: a value it refuses fails init_rpc, naming the key."""
    out = run(tmp_path, """
        for value in ("lots", "4096", "65536"):
            opts = rpc.TensorPipeRpcBackendOptions(backend_options={"max_unsent_bytes": value})
            if value == "lots":  # with a file:// init method too: the key is not forgotten
                opts.init_method = "file://" + os.path.join(os.getcwd(), "lots.db")
            try:
                rpc.init_rpc("worker0", rank=0, world_size=1, rpc_backend_options=opts)
                print(value, "initialized")
                rpc.shutdown()
            except Exception as e:
                print(value, type(e).__name__, str(e).splitlines()[0])
    """, nproc=1)
    assert out == ["lots ValueError option 'max_unsent_bytes': 'lots' is not a decimal count",
                   "4096 ValueError max_unsent_bytes 4096 outside [65536, 1099511627776]",
                   "65536 initialized"]


def test_binding_takes_backend_keys_as_strings_only(tmp_path):
    """The binding's init takes backend keys and values as str only (the
    options object makes them so): anything else is a TypeError before
    anything starts, and a later init works."""
    out = run(tmp_path, """
        from tensorplay.distributed.rpc import api
        for keys in ({"shm": 1}, {1: "on"}, {b"shm": b"on"}):
            try:
                api._rpc.init_rpc("worker0", "TENSORPIPE", 0, 1, 60.0, 60.0, 2, None, 5.0, keys)
                print("initialized")
            except TypeError as e:
                print("TypeError", e)
        rpc.init_rpc("worker0", rank=0, world_size=1)
        print(rpc.rpc_sync("worker0", add, args=(1, 2)))
        rpc.shutdown()
    """, nproc=1)
    assert out == ["TypeError backend options are str keys and str values"] * 3 + ["3"]


def test_refused_options_are_freed(tmp_path):
    """An init that a backend key's value fails before anything starts frees
    the options it built: 100,000 such inits leave the resident size where it
    was (each options block is over 500 bytes: kept, they would be 50 MiB)."""
    out = run(tmp_path, """
        from tensorplay.distributed.rpc import api
        def rss_mib():
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)
        def refused(n):
            for _ in range(n):
                try:
                    api._rpc.init_rpc("worker0", "TENSORPIPE", 0, 1, 60.0, 60.0, 2, None, 5.0,
                                      {"max_unsent_bytes": "lots"})
                except ValueError as e:
                    last = str(e)
            return last
        refused(1000)
        base = rss_mib()
        msg = refused(100000)
        grew = rss_mib() - base
        sys.stderr.write("100,000 refused inits grew the rss by %.1f MiB\\n" % grew)
        print(msg.splitlines()[0], grew < 16)
        rpc.init_rpc("worker0", rank=0, world_size=1)
        print(rpc.rpc_sync("worker0", add, args=(1, 2)))
        rpc.shutdown()
    """, nproc=1)
    assert out == ["option 'max_unsent_bytes': 'lots' is not a decimal count True", "3"]


def test_worker_infos_are_freed(tmp_path):
    """get_worker_infos copies the C list into Python objects and frees the
    list: 200,000 calls leave the resident size where it was."""
    out = run(tmp_path, """
        import gc
        def rss_mib():
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)
        rpc.init_rpc("worker%d" % rank)
        if rank == 0:
            agent = rpc.api._Agent()
            for _ in range(1000):
                agent.get_worker_infos()
            gc.collect()
            base = rss_mib()
            for _ in range(200000):
                infos = agent.get_worker_infos()
            gc.collect()
            grew = rss_mib() - base
            sys.stderr.write("200,000 get_worker_infos grew the rss by %.1f MiB\\n" % grew)
            print(sorted(w.name for w in infos), grew < 16)
        rpc.shutdown()
    """)
    assert out == ["['worker0', 'worker1'] True"]
