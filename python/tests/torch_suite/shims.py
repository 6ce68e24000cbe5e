"""Loads PyTorch 1.13's rpc_test.py so that it, and dist_utils.py which it
imports, see a chosen rpc module where they say torch.distributed.rpc, while
the rest of torch keeps its real rpc (the "only the module swapped" rule).

Fresh copies of the two modules are executed from their source while
sys.modules['torch.distributed.rpc...'] and the attribute torch.distributed.rpc
point at the chosen module; then everything is put back. The copies stay in
sys.modules under their own names, because a function travels by name and the
callee looks it up there. Each rank loads them once; its per-test children
inherit them.

For our package the chosen module is a forwarding module (_Forward): every
name comes from tensorplay.distributed.rpc (or from its submodule of the same
name, once it has one), except the few PRIVATE torch names that rpc_test.py
and dist_utils.py import or use at module level. Those get stand-ins that
exist only so the import succeeds; using one raises, so a test that really
needs a torch internal fails and says which one.
"""
import contextlib
import importlib
import importlib.util
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))

TEST_MODULE = "torch.testing._internal.distributed.rpc.rpc_test"
DIST_UTILS = "torch.testing._internal.dist_utils"
RPC = "torch.distributed.rpc"
# The rpc submodules the two files import by name (rpc_test.py line 21-27) or
# reach as attributes (rpc.api.*, rpc.constants.*, rpc.backend_registry.*).
RPC_SUBMODULES = ("api", "internal", "backend_registry", "constants")


def install_expecttest_stub():
    """common_utils imports expecttest (a PyPI-only package, not in Debian)
    for TestCase.assertExpectedInline, which no rpc test calls. A real
    expecttest wins when one is installed: the stub dir goes last on the path."""
    try:
        import expecttest  # noqa: F401
    except ImportError:
        sys.path.append(os.path.join(HERE, "_stubs"))


class _StandIn:
    """A torch-private name: present so `from ... import name` succeeds,
    raising with the name when a test really uses it."""

    def __init__(self, qualname):
        self._qualname = qualname

    def _refuse(self, *args, **kwargs):
        raise NotImplementedError(
            "%s is a torch-private name; the torch_suite adapter has only a stand-in "
            "for it (tensorplay has no such name)" % self._qualname)

    __call__ = __enter__ = _refuse

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        self._refuse()


class _RpcBackendOptionsStandIn:
    """rpc_test.py subclasses rpc.RpcBackendOptions at module level
    (FooBackendOptions); without a class there the module does not load."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError("torch.distributed.rpc.RpcBackendOptions: tensorplay has "
                                  "no such class (the adapter's stand-in)")


# Names imported from our module at module level, stood in only where our
# package lacks them (a name the package gains is used as it is).
_TOP_STANDINS = ("_get_debug_info", "_rref_context_get_debug_info")
_SUB_STANDINS = {
    "api": ("_use_rpc_pickler", "_thread_local_var", "_wait_all"),
    "internal": ("PythonUDF", "_internal_rpc_pickler", "_build_rpc_profiling_key"),
}


def _torch_rpc_exec_mode():
    """RPCExecMode is torch's enum of sync/async/remote that the test file's
    helpers branch on (_run_func_in_mode, _test_async_function default
    arguments): a selector on the test's side that carries no rpc behaviour,
    so ours gets torch's own enum."""
    from torch.distributed.rpc.internal import RPCExecMode
    return RPCExecMode


class _Forward(types.ModuleType):
    """A module whose names are the target's, plus stand-ins for missing ones."""

    def __init__(self, name, target, standins=(), extra=None):
        super().__init__(name)
        self.__dict__["_tp_target"] = target
        for n in standins:
            if not hasattr(target, n):
                self.__dict__[n] = _StandIn("%s.%s" % (name, n))
        for n, v in (extra or {}).items():
            if not hasattr(target, n):
                self.__dict__[n] = v

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return getattr(self.__dict__["_tp_target"], name)
        except AttributeError:
            raise AttributeError("module '%s' (tensorplay.distributed.rpc through the "
                                 "torch_suite adapter) has no attribute '%s'"
                                 % (self.__name__, name)) from None


def ours_modules():
    """{torch module name: forwarding module} for tensorplay.distributed.rpc."""
    import tensorplay.distributed.rpc as ours
    mods = {}
    for sub in RPC_SUBMODULES:
        try:
            target = importlib.import_module("%s.%s" % (ours.__name__, sub))
        except ModuleNotFoundError:
            target = ours  # the package keeps everything at the top level
        extra = {"RPCExecMode": _torch_rpc_exec_mode()} if sub == "internal" else {}
        mods[sub] = _Forward("%s.%s" % (RPC, sub), target, _SUB_STANDINS.get(sub, ()), extra)
    top = _Forward(RPC, ours, _TOP_STANDINS, {"RpcBackendOptions": _RpcBackendOptionsStandIn})
    top.__dict__.update(mods)  # rpc.api is the same forwarding module as sys.modules has
    out = {RPC: top}
    out.update({"%s.%s" % (RPC, sub): m for sub, m in mods.items()})
    return out


@contextlib.contextmanager
def rpc_swapped(mods):
    """sys.modules and torch.distributed.rpc point at mods (name -> module)
    inside the block. `import torch.distributed.rpc as rpc` reads the
    attribute, `from torch.distributed.rpc.api import x` reads sys.modules."""
    import torch.distributed
    saved = {n: sys.modules.get(n) for n in mods}
    saved_attr = torch.distributed.__dict__.get("rpc")
    sys.modules.update(mods)
    torch.distributed.rpc = mods[RPC]
    try:
        yield
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m
        torch.distributed.rpc = saved_attr


def _exec_fresh(name):
    """A new copy of module `name` from its source, registered under name."""
    spec = importlib.util.find_spec(name)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    parent, _, child = name.rpartition(".")
    setattr(sys.modules[parent], child, mod)
    return mod


_real_loaded = False


def load_test_module(mode):
    """A fresh rpc_test module: its rpc is torch's (mode 'control') or ours.
    Returns (rpc_test module, the rpc module it sees)."""
    global _real_loaded
    if not _real_loaded:
        # Everything rpc_test.py imports, loaded once with the real rpc, so
        # that no other torch module first meets the swapped one.
        importlib.import_module(TEST_MODULE)
        _real_loaded = True
    if mode == "control":
        import torch.distributed.rpc as rpc
        _exec_fresh(DIST_UTILS)
        return _exec_fresh(TEST_MODULE), rpc
    mods = ours_modules()
    with rpc_swapped(mods):
        _exec_fresh(DIST_UTILS)
        mod = _exec_fresh(TEST_MODULE)
    return mod, mods[RPC]
