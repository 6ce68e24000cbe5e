"""PyTorch's rpc.constants, with the same names and values."""
from datetime import timedelta

DEFAULT_RPC_TIMEOUT_SEC = 60.0
DEFAULT_INIT_METHOD = "env://"
# PyTorch's 0 means "no deadline" for the shutdown barrier; ours always has
# one (the backend's shutdown timeout) when 0 is given.
DEFAULT_SHUTDOWN_TIMEOUT = 0
DEFAULT_NUM_WORKER_THREADS = 16
DEFAULT_PROCESS_GROUP_TIMEOUT = timedelta(milliseconds=2 ** 31 - 1)
# A call's timeout argument when none was given: the worker's default applies.
UNSET_RPC_TIMEOUT = -1.0
