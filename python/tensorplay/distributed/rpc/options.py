"""Backend options with PyTorch's names (RpcBackendOptions,
TensorPipeRpcBackendOptions) plus ours: init_timeout, shutdown_timeout,
allow_pickle, secret, auth, tensor_type and any backend key by name."""
from . import constants

# Our keys beyond PyTorch's; each maps to a backend option of the C library.
_BACKEND_KEYS = ("secret", "auth", "listen_addr", "listen_port", "advertise_addr", "encrypt",
                 "hello_timeout", "frame_timeout", "idle_timeout", "rx_budget",
                 "max_handshakes", "max_message_size", "max_inflight_bytes", "max_queued_bytes",
                 "max_remote_values", "max_unsent_bytes", "shm", "shm_min_bytes", "shm_pool_bytes",
                 "shm_ring_bytes", "spin_us")
TENSOR_TYPES = ("auto", "torch", "numpy")


class RpcBackendOptions:
    """What every backend takes: the default call timeout in seconds and the
    rendezvous URL (env://, tcp://host:port, file:///path, sqlite:///path,
    etcd://host:port[,host:port...]/prefix)."""

    def __init__(self, rpc_timeout=constants.DEFAULT_RPC_TIMEOUT_SEC,
                 init_method=constants.DEFAULT_INIT_METHOD):
        self.rpc_timeout = rpc_timeout
        self.init_method = init_method

    @property
    def rpc_timeout(self):
        return self._rpc_timeout

    @rpc_timeout.setter
    def rpc_timeout(self, seconds):
        self._rpc_timeout = _seconds("rpc_timeout", seconds)

    @property
    def init_method(self):
        return self._init_method

    @init_method.setter
    def init_method(self, url):
        if not isinstance(url, str):
            raise TypeError("init_method must be a str URL, not %s" % type(url).__name__)
        self._init_method = url

    def __repr__(self):
        return "%s(rpc_timeout=%g, init_method=%r)" % (type(self).__name__, self.rpc_timeout,
                                                       self.init_method)


def _seconds(what, v, allow_none=False):
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError("%s must be a number of seconds, not %s (incompatible constructor "
                        "arguments; a timedelta? pass .total_seconds())" % (what, type(v).__name__))
    if v != v or v < 0:
        raise ValueError("%s must be >= 0 seconds (0 means no deadline), got %r" % (what, v))
    return float(v)


class TensorPipeRpcBackendOptions(RpcBackendOptions):
    """The TCP backend's options. PyTorch's arguments (keyword-only there, as
    here): num_worker_threads, rpc_timeout, init_method; device_maps and
    devices only for CPU (no CUDA here); _transports and _channels are
    accepted and ignored (one TCP transport). Ours:
      init_timeout      seconds init_rpc waits for every worker (default 60)
      shutdown_timeout  seconds a graceful shutdown may take (default: the backend's)
      allow_pickle      objects no value kind holds travel pickled; trusted peers only
      secret            the job secret (hex, >= 16 bytes); default TP_SECRET, else a
                        per-user secret for workers on this host (see README)
      auth              "on" (default) or "off" (no authentication: trusted networks only)
      tensor_type       what received tensors become: "auto" (torch when torch is
                        imported, else numpy), "torch" or "numpy"
      expose            what this worker serves to peers: None (default) serves
                        every function of modules the program imported except the
                        exposure policy's deny list (eval, exec, os.system,
                        subprocess, ctypes, pickle, ...); a list of functions,
                        classes, modules or 'module.qualname' strings serves only
                        those (spec/api.md PY-1)
      backend_options   any other backend key (tensorplay's TCP-12 keys) as a dict
    """

    def __init__(self, *, num_worker_threads=constants.DEFAULT_NUM_WORKER_THREADS,
                 rpc_timeout=constants.DEFAULT_RPC_TIMEOUT_SEC,
                 init_method=constants.DEFAULT_INIT_METHOD, device_maps=None, devices=None,
                 _transports=None, _channels=None, init_timeout=None, shutdown_timeout=None,
                 allow_pickle=False, secret=None, auth=None, tensor_type="auto",
                 expose=None, backend_options=None):
        super().__init__(rpc_timeout, init_method)
        if isinstance(num_worker_threads, bool) or not isinstance(num_worker_threads, int) \
                or num_worker_threads < 1:
            raise ValueError("num_worker_threads must be a positive int, got %r"
                             % (num_worker_threads,))
        self.num_worker_threads = num_worker_threads
        self.device_maps = {}
        self.devices = []
        for to, m in (device_maps or {}).items():
            self.set_device_map(to, m)
        if devices:
            self.set_devices(devices)
        self._transports, self._channels = _transports, _channels
        self.init_timeout = _seconds("init_timeout", init_timeout, allow_none=True)
        self.shutdown_timeout = _seconds("shutdown_timeout", shutdown_timeout, allow_none=True)
        self.allow_pickle = bool(allow_pickle)
        if secret is not None and not isinstance(secret, (str, bytes)):
            raise TypeError("secret must be a hex str or bytes, not %s" % type(secret).__name__)
        self.secret = secret.hex() if isinstance(secret, bytes) else secret
        if auth not in (None, "on", "off", True, False):
            raise ValueError("auth must be 'on' or 'off', got %r" % (auth,))
        self.auth = {True: "on", False: "off"}.get(auth, auth)
        if tensor_type not in TENSOR_TYPES:
            raise ValueError("tensor_type must be one of %s, got %r" % (TENSOR_TYPES, tensor_type))
        self.tensor_type = tensor_type
        if expose is not None and (isinstance(expose, str) or not hasattr(expose, "__iter__")):
            raise TypeError("expose must be a list of functions, classes, modules or "
                            "'module.qualname' strings")
        self.expose = None if expose is None else list(expose)
        self.backend_options = dict(backend_options or {})
        for k in self.backend_options:
            if k not in _BACKEND_KEYS:
                raise ValueError("unknown backend option %r (known: %s)"
                                 % (k, ", ".join(_BACKEND_KEYS)))

    def set_device_map(self, to, device_map):
        """CPU only: a map from CPU to CPU is accepted (and means nothing);
        any CUDA device is refused, since this build has no CUDA transport."""
        for a, b in dict(device_map).items():
            for d in (a, b):
                if str(d) != "cpu":
                    raise ValueError("device map to %r names device %r: tensorplay-rpc carries "
                                     "CPU tensors only (move them with .cpu())" % (to, d))
        self.device_maps.setdefault(to, {}).update(device_map)

    def set_devices(self, devices):
        for d in devices:
            if str(d) != "cpu":
                raise ValueError("device %r: tensorplay-rpc carries CPU tensors only" % (d,))
        self.devices = list(devices)

    def _backend_strings(self):
        """The C library's backend keys, as strings."""
        out = {k: str(v) for k, v in self.backend_options.items()}
        if self.secret is not None:
            out["secret"] = self.secret
        if self.auth is not None:
            out["auth"] = self.auth
        return out
