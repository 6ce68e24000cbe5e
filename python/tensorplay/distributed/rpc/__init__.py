"""tensorplay.distributed.rpc: call functions on other workers (PyTorch 1.13's
torch.distributed.rpc API, over the C library tensorplay-rpc).

    import tensorplay.distributed.rpc as rpc
    rpc.init_rpc("worker0", rank=0, world_size=2)
    rpc.rpc_sync("worker1", torch.add, args=(torch.ones(2), 1))
    rpc.shutdown()

Functions travel as their qualified name (module and qualname; torch.add
and other C functions by their public path); the callee finds the same
function among the modules its program has already imported (``__main__``
included, waiting for a name __main__ has not defined yet) and never imports
a module because a peer named it. Values are None, bool, int (64-bit),
float, str, bytes, list, tuple, dict with str keys, RRef, and tensors:
torch tensors, numpy arrays and anything with DLPack or the buffer protocol
(CPU, contiguous; dtype and shape kept; no copy at either end). Received
tensors are torch tensors when torch is imported, else numpy arrays
(TensorPipeRpcBackendOptions(tensor_type=...) chooses). remote(to, SomeClass)
keeps the object on its owner, reached through rref.rpc_sync().method().

With TensorPipeRpcBackendOptions(allow_pickle=True), for trusted peers only,
other objects (bound methods and partials too) travel pickled and are
unpickled where that option is on.
"""
from . import api, backend_registry, constants, functions, options
from .api import (Future, FunctionNotFoundError, RRef, RemoteError, RpcTimeoutError,
                  WorkerInfo, _get_current_rpc_agent, _get_debug_info,
                  _is_current_rpc_agent_set, _set_rpc_timeout, collect_all, get_rpc_timeout,
                  get_worker_info, init_rpc, is_available, method_factory, new_method, remote,
                  rpc_async, rpc_sync, shutdown, wait_all)
from .backend_registry import (BackendType, backend_registered, construct_rpc_backend_options,
                               init_backend, register_backend)
from .options import RpcBackendOptions, TensorPipeRpcBackendOptions

__all__ = [
    "BackendType", "FunctionNotFoundError", "Future", "RRef", "RemoteError",
    "RpcBackendOptions", "RpcTimeoutError", "TensorPipeRpcBackendOptions", "WorkerInfo", "api",
    "backend_registered", "backend_registry", "collect_all", "constants",
    "construct_rpc_backend_options", "functions", "get_rpc_timeout", "get_worker_info",
    "init_backend", "init_rpc", "is_available", "method_factory", "new_method", "options",
    "register_backend", "remote", "rpc_async", "rpc_sync", "shutdown", "wait_all",
]
