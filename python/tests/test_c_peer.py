"""A C worker and a Python worker in one job: what a C program sees of a
Python worker's objects. The C worker is this same script on rank 1,
calling the shared library libtensorplay-rpc through ctypes (it never
imports the Python package), so no compiler is needed. It reaches a Python
object through an rref (remote() of a class) and calls its methods with
the one method every Python object has, "py:method" ([name, args, kwargs])."""
import ctypes.util
import os
import shutil
import subprocess

import pytest

from test_rpc import PYTHON, TPRUN


def shared_library():
    """libtensorplay-rpc.so of the build (or install) whose tprun runs the
    tests: beside tprun's directory in a build tree, in lib/ when installed."""
    tprun = shutil.which(TPRUN) or TPRUN
    here = os.path.dirname(os.path.abspath(tprun))
    for d in (os.path.join(here, ".."), os.path.join(here, "..", "lib"), here):
        p = os.path.join(d, "libtensorplay-rpc.so")
        if os.path.exists(p):
            return os.path.abspath(p)
    return ctypes.util.find_library("tensorplay-rpc")


def run_mixed(tmp_path, script):
    """Runs script on two ranks (rank 0 the Python worker, rank 1 the C
    worker over the shared library): the C worker's output lines, and all
    output (for a failing assert)."""
    lib = shared_library()
    if lib is None:
        pytest.skip("libtensorplay-rpc.so not found beside %s" % TPRUN)
    (tmp_path / "mixed.py").write_text(script)
    proc = subprocess.run([TPRUN, "--nproc", "2", PYTHON, str(tmp_path / "mixed.py"), lib],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    return [l[4:] for l in proc.stdout.splitlines() if l.startswith("[1] ")], out


MIXED = r"""
import ctypes, os, sys

rank = int(os.environ["RANK"])

if rank == 0:  # the Python worker: owns the object
    import tensorplay.distributed.rpc as rpc

    class Box:
        def __init__(self, v):
            self.v = v

        def get(self):
            return self.v

        def bad(self):
            raise ValueError("bad box %d" % self.v)

    rpc.init_rpc("worker0")
    rpc.shutdown()  # graceful: waits for the C worker to be done
    sys.exit(0)

# The C worker.
lib = ctypes.CDLL(sys.argv[1])
P = ctypes.c_void_p


class Dest(ctypes.Structure):  # tp_dest
    _fields_ = [("kind", ctypes.c_int), ("name", ctypes.c_char_p), ("rank", ctypes.c_int32)]


for name, res, args in [
        ("tp_init_rpc", ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int,
                                       ctypes.c_int, P]),
        ("tp_shutdown", ctypes.c_int, [ctypes.c_int]),
        ("tp_errmsg", ctypes.c_char_p, []),
        ("tp_status_name", ctypes.c_char_p, [ctypes.c_int]),
        ("tp_value_list", P, []),
        ("tp_value_map", P, []),
        ("tp_value_str", P, [ctypes.c_char_p]),
        ("tp_value_int", P, [ctypes.c_int64]),
        ("tp_value_bool", P, [ctypes.c_int]),
        ("tp_value_float", P, [ctypes.c_double]),
        ("tp_list_append", ctypes.c_int, [P, P]),
        ("tp_value_free", None, [P]),
        ("tp_value_get_int", ctypes.c_int, [P, ctypes.POINTER(ctypes.c_int64)]),
        ("tp_remote", ctypes.c_int, [Dest, ctypes.c_char_p, P, P, ctypes.c_double,
                                     ctypes.POINTER(P)]),
        ("tp_rref_rpc_sync", ctypes.c_int, [P, ctypes.c_char_p, P, P, ctypes.c_double,
                                            ctypes.POINTER(P)]),
        ("tp_rref_release", None, [P])]:
    f = getattr(lib, name)
    f.restype, f.argtypes = res, args


def status(st):
    return lib.tp_status_name(st).decode()


def lst(*items):
    v = lib.tp_value_list()
    for x in items:
        assert lib.tp_list_append(v, x) == 0
    return v


def check(st, what):
    if st != 0:
        print(what, "failed:", status(st), lib.tp_errmsg().decode(), flush=True)
        sys.exit(1)


check(lib.tp_init_rpc(b"worker1", b"TENSORPIPE", 1, 2, None), "init")
# remote() of __main__.Box(7) on worker0: [module, qualname, args, kwargs, keep, timeout],
# the timeout left out (a C peer may: the callee's default then bounds its name waits)
wire = lst(lib.tp_value_str(b"__main__"), lib.tp_value_str(b"Box"),
           lst(lib.tp_value_int(7)), lib.tp_value_map(), lib.tp_value_bool(1))
rref = P()
check(lib.tp_remote(Dest(0, b"worker0", -1), b"py:call", wire, None, 30.0, ctypes.byref(rref)),
      "remote")
lib.tp_value_free(wire)


def method(name):
    args = lst(lib.tp_value_str(name), lib.tp_value_list(), lib.tp_value_map())
    out = P()
    st = lib.tp_rref_rpc_sync(rref, b"py:method", args, None, 30.0, ctypes.byref(out))
    lib.tp_value_free(args)
    return st, out


st, out = method(b"get")
check(st, "get")
n = ctypes.c_int64()
check(lib.tp_value_get_int(out, ctypes.byref(n)), "get's value")
print("get:", n.value)
lib.tp_value_free(out)
st, out = method(b"bad")
msg = lib.tp_errmsg().decode() if st != 0 else ""
print("bad:", status(st), "ValueError: bad box 7" in msg, flush=True)
lib.tp_value_free(out)
lib.tp_rref_release(rref)
check(lib.tp_shutdown(1), "shutdown")
"""


def test_c_worker_calls_methods_of_a_python_object(tmp_path):
    """A C worker's method call on a Python worker's object (py_method)
    answers with the method's value, and a method that raises fails the
    call with TP_EREMOTE and the Python exception's class and message, not
    TP_OK with no value."""
    lines, out = run_mixed(tmp_path, MIXED)
    assert lines == ["get: 7", "bad: TP_EREMOTE True"], out
    # PyTorch prints a served call's exception on the callee's stderr: the
    # method's too.
    assert "ValueError('bad box 7')" in out and "On WorkerInfo(id=0, name=" in out, out


NOPE = """
out = P()
args = lst(lib.tp_value_str(b"get"), lib.tp_value_list(), lib.tp_value_map())
st = lib.tp_rref_rpc_sync(rref, b"nope", args, None, 30.0, ctypes.byref(out))
lib.tp_value_free(args)
print("nope:", status(st), lib.tp_errmsg().decode() if st != 0 else "", flush=True)
lib.tp_value_free(out)
"""


def test_python_class_name_as_a_c_worker_sees_it(tmp_path):
    """A Python object's class is named "py:<module>:<name>" for the C
    library, keeping letters of either case, digits, '_', ':' and '-' and
    making any other character '_' (names must match ^[A-Za-z0-9_:-]+$):
    a C worker calling a method the class does not have is told that
    name."""
    script = MIXED
    for old, new in [("    class Box:\n",
                      "    class Box:\n        __module__ = \"my.mod-Z9\"\n"),
                     ("lib.tp_rref_release(rref)\n", NOPE + "lib.tp_rref_release(rref)\n")]:
        assert script.count(old) == 1, old
        script = script.replace(old, new)
    lines, out = run_mixed(tmp_path, script)
    assert lines[:2] == ["get: 7", "bad: TP_EREMOTE True"], out
    assert len(lines) == 3 and lines[2].startswith("nope: TP_E"), out
    assert "class 'py:my_mod-Z9:Box' has no method 'nope'" in lines[2], lines[2]


MALFORMED = """
parts = [lambda: lib.tp_value_str(b"get"), lib.tp_value_list, lib.tp_value_map,
         lambda: lib.tp_value_bool(1), lambda: lib.tp_value_int(0)]
for n in (2, 3, 4, 5):
    args = lst(*[make() for make in parts[:n]])
    out = P()
    st = lib.tp_rref_rpc_sync(rref, b"py:method", args, None, 30.0, ctypes.byref(out))
    lib.tp_value_free(args)
    msg = lib.tp_errmsg().decode() if st != 0 else ""
    print("%d parts:" % n, status(st), "a method call is [name, args, kwargs, keep]" in msg,
          flush=True)
    lib.tp_value_free(out)
lib.tp_value_tuple.restype, lib.tp_value_tuple.argtypes = P, []
args = lib.tp_value_tuple()  # the right parts in a tuple, not a list
for make in parts[:3]:
    assert lib.tp_list_append(args, make()) == 0
out = P()
st = lib.tp_rref_rpc_sync(rref, b"py:method", args, None, 30.0, ctypes.byref(out))
lib.tp_value_free(args)
msg = lib.tp_errmsg().decode() if st != 0 else ""
print("tuple:", status(st), "a method call is [name, args, kwargs, keep]" in msg, flush=True)
lib.tp_value_free(out)
"""


def test_malformed_method_call_from_a_c_worker(tmp_path):
    """A method call whose wire list is not [name, args, kwargs(, keep)]
    (too short, too long, or a tuple) is refused with a TypeError that says
    the form, never read past its end, run with the extra part ignored or
    read as a list; both right forms, with and without keep, run."""
    old = "lib.tp_rref_release(rref)\n"
    assert MIXED.count(old) == 1
    lines, out = run_mixed(tmp_path, MIXED.replace(old, MALFORMED + old))
    assert lines[2:] == ["2 parts: TP_EREMOTE True", "3 parts: TP_OK False",
                         "4 parts: TP_OK False", "5 parts: TP_EREMOTE True",
                         "tuple: TP_EREMOTE True"], out


NO_DISPATCHER = """
out = P()
lib.tp_rpc_sync.restype = ctypes.c_int
lib.tp_rpc_sync.argtypes = [Dest, ctypes.c_char_p, P, P, ctypes.c_double, ctypes.POINTER(P)]
st = lib.tp_rpc_sync(Dest(0, b"worker0", -1), b"py:call", wire, None, 30.0, ctypes.byref(out))
msg = lib.tp_errmsg().decode() if st != 0 else ""
print("no dispatcher:", status(st), "no Python dispatcher is registered" in msg, flush=True)
lib.tp_value_free(out)
lib.tp_value_free(wire)
check(lib.tp_shutdown(1), "shutdown")
"""


def test_python_worker_without_its_dispatcher_refuses_calls(tmp_path):
    """A worker whose Python layer never registered its dispatcher (the
    private _rpc module driven without it) answers a "py:call" with
    an error saying so (TP_EREMOTE at the caller), not TP_OK with no value."""
    script = MIXED
    init = '    rpc.init_rpc("worker0")\n'
    tail = script[script.index("rref = P()\n"):]
    assert script.count(init) == 1
    script = script.replace(init, "    from tensorplay import _rpc\n"
                                  "    _rpc.set_dispatcher = lambda *a: None  # never registered\n"
                            + init)
    script = script.replace(tail, NO_DISPATCHER)
    lines, out = run_mixed(tmp_path, script)
    assert lines == ["no dispatcher: TP_EREMOTE True"], out
