"""PyTorch's rpc.backend_registry: BackendType (an enum), register_backend,
construct_rpc_backend_options, init_backend. The built-in backends are
TENSORPIPE (TCP between processes, real/) and SIM (the simulator); a
backend registered here is written in Python and started by its handler."""
import collections
import enum

from . import constants
from .options import TensorPipeRpcBackendOptions

__all__ = ["BackendType", "BackendValue", "backend_registered", "construct_rpc_backend_options",
           "init_backend", "register_backend"]

BackendValue = collections.namedtuple(
    "BackendValue", ["construct_rpc_backend_options_handler", "init_backend_handler"])


def _builtin_options(rpc_timeout, init_method, **kwargs):
    return TensorPipeRpcBackendOptions(rpc_timeout=rpc_timeout, init_method=init_method, **kwargs)


# The C library starts the built-in ones: they have no Python init handler.
_BUILTIN = {"TENSORPIPE": BackendValue(_builtin_options, None),
            "SIM": BackendValue(_builtin_options, None)}


def _make_enum(members):
    t = enum.Enum(value="BackendType", names=members)
    t.__repr__ = lambda self: "BackendType." + self.name
    return t


BackendType = _make_enum(dict(_BUILTIN))


def backend_registered(backend_name):
    return backend_name in BackendType.__members__


def register_backend(backend_name, construct_rpc_backend_options_handler, init_backend_handler):
    """Adds a backend written in Python; returns its BackendType member.
    BackendType is made anew with it, as PyTorch does: read it from this
    module after registering."""
    global BackendType
    if not isinstance(backend_name, str) or not backend_name:
        raise TypeError("backend_name must be a non-empty str")
    if backend_registered(backend_name):
        raise RuntimeError("RPC backend %s: already registered" % backend_name)
    members = {m.name: m.value for m in BackendType}
    members[backend_name] = BackendValue(construct_rpc_backend_options_handler,
                                         init_backend_handler)
    BackendType = _make_enum(members)
    return BackendType[backend_name]


def resolve(backend):
    """A BackendType member for a member, its name, or None (TENSORPIPE)."""
    if backend is None:
        return BackendType.TENSORPIPE
    if isinstance(backend, str):
        if backend not in BackendType.__members__:
            raise ValueError("no RPC backend named %r is registered (known: %s)"
                             % (backend, ", ".join(BackendType.__members__)))
        return BackendType[backend]
    if isinstance(backend, enum.Enum) and type(backend).__name__ == "BackendType" \
            and backend.name in BackendType.__members__:
        return BackendType[backend.name]  # a member of an enum made before a later register
    raise TypeError("Argument backend must be a member of BackendType, not %r" % (backend,))


def infer(options):
    """The backend whose options options are (PyTorch's inference when
    init_rpc gets options and no backend)."""
    for member in BackendType:
        if isinstance(options, type(construct_rpc_backend_options(member))):
            return member
    raise TypeError("Could not infer backend for options %r: pass backend= explicitly"
                    % (options,))


def construct_rpc_backend_options(backend, rpc_timeout=constants.DEFAULT_RPC_TIMEOUT_SEC,
                                  init_method=constants.DEFAULT_INIT_METHOD, **kwargs):
    return resolve(backend).value.construct_rpc_backend_options_handler(
        rpc_timeout, init_method, **kwargs)


def init_backend(backend, *args, **kwargs):
    b = resolve(backend)
    if b.value.init_backend_handler is None:
        raise ValueError("backend %s is built in: init_rpc starts it" % b.name)
    return b.value.init_backend_handler(*args, **kwargs)
