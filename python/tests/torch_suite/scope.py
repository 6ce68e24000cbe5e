"""Which of PyTorch 1.13's rpc tests are in scope, and what we expect of them.

The one place that decides scope: EXCLUDED, a pattern (re.search on the test
name) with the reason, checked in order. Decided by name and by reading each
test body and the helpers it calls (rpc_test.py in Debian's python3-torch
1.13.1). A test not excluded is in scope.

EXPECTED_FAIL (expected_fail.py) lists, per mode of our package, the in-scope
tests known to fail today, with the cause. Every other in-scope test is
expected to pass, and a regression fails CI; a listed test that passes is
reported, to be taken off the list.
"""
import re

# The two classes of rpc_test.py that run on CPU with the TensorPipe agent.
SUITE_CLASSES = ("RpcTest", "TensorPipeAgentRpcTest")

EXCLUDED = [
    # Areas outside this package (the list).
    (r"profil|record_function", "profiler (RPC profiling, record_function)"),
    (r"^test_rref_type_(blocking|non_blocking)$", "profiler (_profile() counts the RPCs)"),
    (r"cuda", "CUDA"),
    (r"script|torchscript", "JIT/TorchScript"),
    (r"^test_rref_get_future$", "JIT/TorchScript (my_script_func) and torch._C.Future"),
    (r"backward", "dist_autograd (backward through RRefs)"),
    (r"^test_debug_info$", "dist_autograd (dist_autograd._get_debug_info)"),
    (r"^test_register_rpc_backend_and_set_and_start_rpc_backend$",
     "dist_autograd (mocks torch.distributed.autograd._init)"),
    (r"^test_pg_init_no_rpc_init$", "DDP (torch.nn.parallel.DistributedDataParallel)"),
    # Tests whose subject is a torch-private API, one with no public
    # counterpart that the package could mimic. (The private names the
    # package does offer, as PyTorch programs use them: _all_gather, _barrier,
    # _wait_all_workers, _wait_all, _get_current_rpc_agent, RRef._get_type,
    # keep their tests in scope.)
    (r"^test_infer_backend_from_options$",
     "torch-private: the agent object and its class rpc.TensorPipeAgent"),
    (r"^test_set_and_get_num_worker_threads$",
     "torch-private: the agent's get_debug_info()"),
    (r"^test_duplicate_name$", "torch-private: rpc._init_rpc_backend on a c10d store"),
    (r"^test_use_rpc_pickler$", "torch-private: _use_rpc_pickler, _internal_rpc_pickler"),
    (r"^test_rref_context_debug_info$", "torch-private: _rref_context_get_debug_info"),
    (r"^test_(ignore_)?rref_leak$",
     "torch-private: api._ignore_rref_leak and a mock of "
     "rpc.api._delete_all_user_and_unforked_owner_rrefs"),
    (r"^test_shutdown_errors$", "torch-private: mocks rpc.api._broadcast_to_followers"),
    (r"^test_use_rref_after_shutdown$", "torch-private: rpc.internal.serialize"),
    (r"^test_py_nested_pickle$",
     "torch-private: MyPickleClass pickles itself with _internal_rpc_pickler and PythonUDF"),
    (r"^test_rref_timeout$",
     "torch-private: RRef._get_future and _rref_context_get_debug_info (fork counts)"),
    # Tests that fail in the control on this machine.
    (r"^test_reinit$", "fails in the control: under TCP init torch 1.13.1 raises 'RPC is "
     "already initialized' on rank 0, where the test expects 'Address already in use'"),
    (r"^test_set_and_get_default_rpc_timeout$", "flaky in the control: rpc_timeout=0.5 s is "
     "also torch's init (gloo group) timeout, which 4 ranks on 2 shared cores miss now and "
     "then ('Socket Timeout')"),
    (r"^test_dynamic_rpc_init_rpc$", "hangs in the control: four ranks joining a dynamic "
     "group (no world_size) at once under TCP init; init_rpc's rpc_sync to the members "
     "(_set_devices_and_reverse_device_map) never returns"),
]

# Seconds a test may take before the coordinator kills the world. Most take
# under 2 s in the control; these sleep or time out on purpose.
DEADLINE_S = 30.0
SLOW_DEADLINE_S = {
    "test_stress_heavy_rpc": 90.0,
    "test_stress_heavy_rpc_sparse": 90.0,
    "test_nested_rref_stress": 60.0,
    "test_nested_rref_stress_sparse": 60.0,
}

# test name -> cause, per mode of our package (the control expects all to
# pass): the baseline, rewritten by `runner.py --write-expected MODE RESULTS`.
from expected_fail import EXPECTED_FAIL  # noqa: E402,F401


def exclusion(name):
    """The reason name is out of scope, or None when it is in scope."""
    for pattern, reason in EXCLUDED:
        if re.search(pattern, name):
            return reason
    return None


def deadline(name):
    return SLOW_DEADLINE_S.get(name, DEADLINE_S)
