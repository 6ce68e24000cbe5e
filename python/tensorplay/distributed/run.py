"""tensorplay.distributed.run: start this machine's worker processes of a job.

    python3 -m tensorplay.distributed.run --nproc-per-node 2 train.py [ARGS...]
    python3 -m tensorplay.distributed.run --nproc-per-node 2 -m pkg.train [ARGS...]
    python3 -m tensorplay.distributed.run --nproc-per-node 2 --no-python ./a.out [ARGS...]
    python3 -m tensorplay.distributed.run --nnodes 2 --node-rank 1 --nproc-per-node 4 \
        --master-addr 10.0.0.1 --master-port 29500 --secret-file ~/job.secret train.py

The flags and the environment follow torchrun (torch.distributed.run); the
supervision follows tprun (real/tprun.c), the C launcher, and both follow
spec/launch.md (LAUNCH-1..9). Each process gets RANK (node rank x
nproc-per-node + local rank), LOCAL_RANK, WORLD_SIZE (nnodes x
nproc-per-node), LOCAL_WORLD_SIZE, GROUP_RANK (the node rank),
GROUP_WORLD_SIZE, ROLE_RANK, ROLE_NAME, ROLE_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT (one machine: a free port of MASTER_ADDR unless a port is given),
TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT and
TORCHELASTIC_MAX_RESTARTS, and the job secret in TP_SECRET (spec/tcp.md
TCP-17): from --secret-file (a file of the user's own, mode 0600 or
stricter), else TP_SECRET already set, else, on one machine only, 32 fresh
bytes from the kernel's generator as 64 hex digits. It never appears on a
command line or in output.

--max-restarts R restarts a process that failed (non-zero exit or a signal)
in place, with the same rank and TP_REJOIN=1, so it rejoins the running job
as a new incarnation (spec/lifecycle.md REJOIN-1); each rank at most R times,
counted in its TORCHELASTIC_RESTART_COUNT. Rank 0 is not restarted unless
--restart-rank0 says the job's store lives outside it (with env:// rank 0
serves the store, which dies with it).

Every line a process writes comes out on the launcher's stdout or stderr
prefixed with "[rank] " (unless --no-prefix). When a process fails (non-zero
exit or a signal), the others get SIGTERM, then SIGKILL after the grace
period (--grace, 5 s), and the launcher exits with the first failure's
status (128 + signal for a signal). SIGINT and SIGTERM sent to the launcher
are forwarded the same way; a second one kills at once. Each process leads
its own process group, so signals reach what it started too, and whatever is
left in a group when the job ends is killed. A terminal's Ctrl-C reaches only
the launcher, which forwards it once. Killed outright (SIGKILL), the launcher
takes its processes with it (PR_SET_PDEATHSIG), not what they started.

Each node runs its own launcher with the same --nnodes, --nproc-per-node,
master address and port, and secret; launchers do not talk to each other.
--rdzv-endpoint HOST:PORT is --master-addr HOST --master-port PORT;
--rdzv-backend, --rdzv-id, --rdzv-conf and --standalone are accepted so
torchrun command lines work; the rendezvous of the workers themselves is
init_method env:// on MASTER_ADDR and MASTER_PORT. Like torchrun, each flag
may also be spelt with underscores (--nproc_per_node) and defaults to the
environment variable PET_<FLAG> (PET_NPROC_PER_NODE).
"""
import argparse
import errno
import os
import secrets
import selectors
import signal
import socket
import stat
import subprocess
import sys
import time

NPROC_MAX = 1024  # processes on one machine: tprun's bound
WORLD_SIZE_MAX = 65536  # nnodes * nproc-per-node: the library's TP_WORLD_SIZE_MAX
RESTARTS_MAX = 10000  # --max-restarts: tprun's bound; a crash loop ends in bounded time
SECRET_HEX_MIN, SECRET_HEX_MAX = 32, 256  # TCP-17: 16..128 bytes written as hex
SECRET_FILE_MAX = 4096  # a secret file is read up to this many bytes
LINE_MAX_BYTES = 16384  # a longer line is split, as tprun does
GRACE_DEFAULT_S = 5.0
DRAIN_S = 1.0  # output the processes' own children may still write after they exit
PR_SET_PDEATHSIG = 1

_PROG = "tensorplay.distributed.run"


class UsageError(Exception):
    """A command line this launcher cannot run (exit status 2)."""


class SecretError(Exception):
    """No usable job secret (exit status 2, LAUNCH-5)."""


def _env_name(name):
    return "PET_" + name.upper().replace("-", "_")


def _env_default(name, default):
    return os.environ.get(_env_name(name), default)


def _env_flag(name):
    """An on/off flag's default, as torchrun's check_env reads it: on when
    PET_<FLAG> holds an integer other than 0, off when it is unset."""
    value = os.environ.get(_env_name(name))
    if value is None:
        return False
    try:
        return int(value) != 0
    except ValueError:
        raise UsageError("%s=%r: expected an integer (0: off, any other: on), as torchrun "
                         "reads it" % (_env_name(name), value)) from None


def _add(parser, name, **kw):
    """An option spelt --a-b and --a_b, defaulting to PET_A_B."""
    flags = ["--" + name]
    if "-" in name:
        flags.append("--" + name.replace("-", "_"))
    if kw.get("action") is None:  # a valued option: each has a default
        kw["default"] = _env_default(name, kw["default"])
    else:  # an on/off flag
        kw["default"] = _env_flag(name)
    parser.add_argument(*flags, **kw)


def make_parser():
    p = argparse.ArgumentParser(
        prog="python3 -m " + _PROG, allow_abbrev=False,
        description="Starts this machine's worker processes of a tensorplay.distributed.rpc "
                    "job, one launcher per machine (torchrun's flags and environment; "
                    "spec/launch.md).")
    p.add_argument("--nproc-per-node", "--nproc_per_node", "--nproc", metavar="N",
                   dest="nproc_per_node", default=_env_default("nproc-per-node", "1"),
                   help="processes on this machine: a number (1..%d), or cpu/auto for one per "
                        "CPU; the same on every node" % NPROC_MAX)
    _add(p, "nnodes", default="1",
         help="machines in the job: N (or N:N; elastic MIN:MAX is not supported)")
    _add(p, "node-rank", type=int, default=0, help="this machine's rank, 0..N-1 (default 0)")
    _add(p, "master-addr", default=None,
         help="address rank 0 serves the rendezvous on (default 127.0.0.1; required with "
              "--nnodes > 1)")
    _add(p, "master-port", type=int, default=None,
         help="port rank 0 serves the rendezvous on (default: a free port; required with "
              "--nnodes > 1)")
    _add(p, "secret-file", default=None, metavar="PATH",
         help="the job secret as hex, in a file of yours with mode 0600 (required with "
              "--nnodes > 1 unless TP_SECRET is set)")
    _add(p, "max-restarts", type=int, default=0,
         help="restarts of each failed process, rejoining as a new incarnation (default 0)")
    _add(p, "restart-rank0", action="store_true",
         help="rank 0 may be restarted too: the job's store does not live in it (not env://)")
    _add(p, "rdzv-backend", default="static", help="accepted for torchrun command lines; unused")
    _add(p, "rdzv-endpoint", default="", metavar="HOST:PORT",
         help="the same as --master-addr HOST --master-port PORT")
    _add(p, "rdzv-id", default="none", help="the job's id (TORCHELASTIC_RUN_ID)")
    _add(p, "rdzv-conf", default="", help="accepted for torchrun command lines; unused")
    _add(p, "standalone", action="store_true", help="one machine (excludes --nnodes > 1)")
    _add(p, "role", default="default", help="ROLE_NAME of the processes")
    _add(p, "monitor-interval", type=float, default=0.1,
         help="seconds between checks on the processes (default 0.1)")
    _add(p, "start-method", default="spawn", choices=["spawn", "fork", "forkserver"],
         help="accepted for torchrun command lines; processes are always fresh")
    _add(p, "grace", type=float, default=GRACE_DEFAULT_S,
         help="seconds between SIGTERM and SIGKILL when stopping (default %g)" % GRACE_DEFAULT_S)
    _add(p, "no-prefix", action="store_true", help='do not prefix output lines with "[rank] "')
    p.add_argument("-m", "--module", action="store_true", default=_env_flag("module"),
                   help="run SCRIPT as a module (python -m SCRIPT)")
    _add(p, "no-python", action="store_true",
         help="run SCRIPT as a program itself, not with the Python interpreter")
    p.add_argument("training_script", metavar="SCRIPT",
                   help="the program each process runs (a .py file, a module with -m, "
                        "or any executable with --no-python)")
    p.add_argument("training_script_args", metavar="ARGS", nargs=argparse.REMAINDER)
    return p


def _nproc(value):
    if value in ("cpu", "auto"):
        return min(os.cpu_count() or 1, NPROC_MAX)
    if value == "gpu":
        raise UsageError("--nproc-per-node gpu: this launcher knows no GPUs; give a number")
    try:
        n = int(value)
    except ValueError:
        raise UsageError("--nproc-per-node %r: expected a number, cpu or auto" % value) from None
    if not 1 <= n <= NPROC_MAX:
        raise UsageError("--nproc-per-node %d: expected 1..%d" % (n, NPROC_MAX))
    return n


def _nnodes(value):
    lo, colon, hi = value.partition(":")
    try:
        lo, hi = int(lo), int(hi if colon else lo)
    except ValueError:
        raise UsageError("--nnodes %r: expected N or MIN:MAX" % value) from None
    if not (1 <= lo <= WORLD_SIZE_MAX and 1 <= hi <= WORLD_SIZE_MAX):
        raise UsageError("--nnodes %s: expected 1..%d" % (value, WORLD_SIZE_MAX))
    if lo != hi:
        raise UsageError("--nnodes %s: elastic membership (MIN < MAX) is not supported: give "
                         "one number of nodes, the same on every node (spec/launch.md "
                         "LAUNCH-2)" % value)
    return lo


def _endpoint(value):
    """--rdzv-endpoint HOST[:PORT], [V6]:PORT or a bare IPv6 address: (host, port or None)."""
    host, port = value, None
    if value.startswith("["):
        host, sep, rest = value[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise UsageError("--rdzv-endpoint %r: expected HOST:PORT" % value)
        port = rest[1:] if rest else None
    elif value.count(":") == 1:
        host, port = value.split(":")
    if not host:
        raise UsageError("--rdzv-endpoint %r: expected HOST:PORT" % value)
    if port is not None:
        if not port.isdigit() or int(port) > 65535:
            raise UsageError("--rdzv-endpoint %r: the port must be 0..65535" % value)
        port = int(port) or None  # 0: none given, as torchrun's localhost:0
    return host, port


class JobSpec:
    """What to start: the command and the ranks of this machine's processes."""

    def __init__(self, args):
        self.nproc = _nproc(args.nproc_per_node)
        self.nnodes = _nnodes(args.nnodes)
        if args.standalone and self.nnodes != 1:
            raise UsageError("--standalone is one machine: it excludes --nnodes %d" % self.nnodes)
        if not 0 <= args.node_rank < self.nnodes:
            raise UsageError("--node-rank %d is out of range for --nnodes %d (0..%d)"
                             % (args.node_rank, self.nnodes, self.nnodes - 1))
        if self.nnodes * self.nproc > WORLD_SIZE_MAX:
            raise UsageError("--nnodes %d x --nproc-per-node %d is over %d processes"
                             % (self.nnodes, self.nproc, WORLD_SIZE_MAX))
        if not 0 <= args.max_restarts <= RESTARTS_MAX:
            raise UsageError("--max-restarts %d: expected 0..%d" % (args.max_restarts,
                                                                    RESTARTS_MAX))
        if args.master_port is not None and not 1 <= args.master_port <= 65535:
            raise UsageError("--master-port %d: expected 1..65535" % args.master_port)
        if not 0 <= args.grace <= 3600:
            raise UsageError("--grace %g: expected 0..3600 seconds" % args.grace)
        if args.module and args.no_python:
            raise UsageError("-m and --no-python exclude each other")
        self.master_addr, self.master_port = self._rendezvous(args)
        self.node_rank = args.node_rank
        self.world_size = self.nnodes * self.nproc
        self.role = args.role
        self.run_id = args.rdzv_id
        self.max_restarts = args.max_restarts
        self.restart_rank0 = args.restart_rank0
        if args.no_python:
            self.cmd = [args.training_script]
        else:
            # -u as torchrun does: a worker's lines come out as it writes them.
            self.cmd = [os.environ.get("PYTHON_EXEC", sys.executable), "-u"]
            if args.module:
                self.cmd.append("-m")
            self.cmd.append(args.training_script)
        self.cmd += args.training_script_args

    def _rendezvous(self, args):
        """LAUNCH-3: (address, port or None) of the rendezvous rank 0 serves."""
        addr, port = args.master_addr, args.master_port
        if args.rdzv_endpoint:
            if addr is not None or port is not None:
                raise UsageError("give --rdzv-endpoint or --master-addr/--master-port, not both")
            addr, port = _endpoint(args.rdzv_endpoint)
        if self.nnodes > 1 and (addr is None or port is None):
            raise UsageError(
                "--nnodes %d needs %s (or --rdzv-endpoint HOST:PORT): every node must reach the "
                "rendezvous rank 0 serves there, and a free port picked here would be unknown to "
                "the other nodes (spec/launch.md LAUNCH-3)"
                % (self.nnodes, "--master-addr" if addr is None else "--master-port"))
        return addr or "127.0.0.1", port

    def rank(self, local_rank):
        # LAUNCH-2: nodes take consecutive blocks of ranks, as in torchrun.
        return self.node_rank * self.nproc + local_rank

    def env(self, local_rank, base, restarts=0):
        """LAUNCH-4: the environment of local_rank's process, restarted `restarts` times."""
        e = dict(base)
        rank = self.rank(local_rank)
        # REJOIN-1: a restarted process comes back as a new incarnation; a first
        # one joins the initial rendezvous whatever the launcher's environment says.
        e.pop("TP_REJOIN", None)
        if restarts:
            e["TP_REJOIN"] = "1"
        e.update({
            "RANK": str(rank), "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(self.world_size), "LOCAL_WORLD_SIZE": str(self.nproc),
            "GROUP_RANK": str(self.node_rank), "GROUP_WORLD_SIZE": str(self.nnodes),
            "ROLE_RANK": str(rank), "ROLE_NAME": self.role,
            "ROLE_WORLD_SIZE": str(self.world_size),
            "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port),
            "TORCHELASTIC_RUN_ID": self.run_id, "TORCHELASTIC_RESTART_COUNT": str(restarts),
            "TORCHELASTIC_MAX_RESTARTS": str(self.max_restarts),
        })
        return e


FREE_PORT_LOW = 10000  # the lowest port free_port draws
FREE_PORT_TRIES = 64


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(addr):
    """A port nobody uses now on addr, drawn at random below the kernel's
    ephemeral range when there is room (as tprun does): a port the kernel
    picks for port 0 comes from that range, where any process's outgoing
    connection may take it before rank 0 binds it for the store."""
    try:
        infos = socket.getaddrinfo(addr, 0, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise UsageError("cannot resolve --master-addr %r: %s" % (addr, e)) from None
    family, kind, proto, _, sockaddr = infos[0]
    low = _ephemeral_low()
    for _ in range(FREE_PORT_TRIES if low > FREE_PORT_LOW + 1000 else 0):
        port = FREE_PORT_LOW + secrets.randbelow(low - FREE_PORT_LOW)
        with socket.socket(family, kind, proto) as s:
            try:
                s.bind((sockaddr[0], port) + tuple(sockaddr[2:]))
            except OSError:
                continue
            return port
    # No room below the range, or none free there: the kernel's choice.
    with socket.socket(family, kind, proto) as s:
        try:
            s.bind(sockaddr)
        except OSError as e:
            raise UsageError("cannot find a free port on %s: %s" % (addr, e.strerror)) from None
        return s.getsockname()[1]


def _is_hex_secret(s):
    return (SECRET_HEX_MIN <= len(s) <= SECRET_HEX_MAX and len(s) % 2 == 0
            and all(c in "0123456789abcdefABCDEF" for c in s))


def secret_from_file(path):
    """LAUNCH-5: the hex secret in path, a regular file of ours that nobody
    else may read or write. One descriptor, checked with fstat: what is
    checked is what is read. Never puts the secret in a message."""
    try:
        # O_NONBLOCK: a FIFO planted there must not hang the open.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError as e:
        raise SecretError("--secret-file %s: %s" % (path, e.strerror)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SecretError("--secret-file %s: it is not a regular file; refusing to use it "
                              "as the job secret" % path)
        if st.st_uid != os.geteuid():
            raise SecretError("--secret-file %s: it is not owned by you; refusing to use it as "
                              "the job secret" % path)
        if st.st_mode & 0o077:
            raise SecretError("--secret-file %s has mode %04o: a job secret must be readable by "
                              "you alone (mode 0600 or stricter: chmod 600 %s); refusing to use it"
                              % (path, stat.S_IMODE(st.st_mode), path))
        data = b""
        while len(data) < SECRET_FILE_MAX:
            chunk = os.read(fd, SECRET_FILE_MAX - len(data))
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    text = data.decode("ascii", "replace").strip()
    if not _is_hex_secret(text):
        raise SecretError("--secret-file %s does not hold a job secret: it must be %d to %d hex "
                          "digits, an even number, on one line (%d characters found; TCP-17)"
                          % (path, SECRET_HEX_MIN, SECRET_HEX_MAX, len(text)))
    return text


def job_secret(environ, secret_file=None, nnodes=1):
    """LAUNCH-5 (TCP-17): --secret-file, else TP_SECRET, else (one node) a fresh one."""
    if secret_file:
        return secret_from_file(secret_file)
    if environ.get("TP_SECRET"):
        return environ["TP_SECRET"]
    if nnodes > 1:
        raise SecretError("--nnodes %d needs the job secret, the same on every node: give "
                          "--secret-file PATH (a file of yours, mode 0600, holding the secret as "
                          "hex) or set TP_SECRET; a secret made here would differ from the other "
                          "nodes' (spec/launch.md LAUNCH-5)" % nnodes)
    return secrets.token_hex(32)


def _die_with_parent():
    """In the child before exec: die when the launcher does, even by SIGKILL."""
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # best effort: the launcher still stops its children itself
    if os.getppid() != parent:  # the launcher died before the prctl
        os._exit(1)


class _Stream:
    """One pipe of one process: bytes in, prefixed lines out. It owns the
    pipe's file object: a restarted process's Popen goes, its pipes stay
    until their end of file."""

    def __init__(self, rank, pipe, out_fd, prefix):
        self.rank, self.pipe, self.fd, self.out_fd = rank, pipe, pipe.fileno(), out_fd
        self.prefix = ("[%d] " % rank).encode() if prefix else b""
        self.buf = b""

    def emit(self, line):
        data = self.prefix + line + b"\n"
        while data:  # one write per line, so the lines of ranks do not mix
            try:
                data = data[os.write(self.out_fd, data):]
            except InterruptedError:
                continue
            except OSError:
                return  # our own output is gone: nothing better to do

    def read(self):
        """Copies what is there; False at end of file (the rest emitted)."""
        try:
            chunk = os.read(self.fd, 65536)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            chunk = b""
        if not chunk:
            self.flush()
            return False
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        for line in lines:
            while len(line) > LINE_MAX_BYTES:
                self.emit(line[:LINE_MAX_BYTES])
                line = line[LINE_MAX_BYTES:]
            self.emit(line)
        while len(self.buf) >= LINE_MAX_BYTES:
            self.emit(self.buf[:LINE_MAX_BYTES])
            self.buf = self.buf[LINE_MAX_BYTES:]
        return True

    def flush(self):
        if self.buf:
            self.emit(self.buf)
            self.buf = b""

    def close(self):
        self.pipe.close()


def exit_code(returncode):
    """The status the launcher reports for a process's Popen.returncode."""
    return 128 - returncode if returncode < 0 else returncode


class Job:
    """The running processes of this machine and how the job ends."""

    def __init__(self, spec, grace_s, prefix, poll_s):
        self.spec, self.grace_s, self.prefix, self.poll_s = spec, grace_s, prefix, poll_s
        self.procs = [None] * spec.nproc  # Popen of each local rank's current process
        self.pgids = [None] * spec.nproc  # its process group, killed at the end too
        self.restarts = [0] * spec.nproc  # times each local rank was restarted
        self.base = {}  # the environment every process starts from
        self.sel = selectors.DefaultSelector()
        self.stopping = False
        self.result = 0
        self.kill_at = None
        self.got_signal = 0
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.sel.register(self.wake_r, selectors.EVENT_READ, None)

    def _on_signal(self, sig, frame):
        self.got_signal = sig
        try:
            os.write(self.wake_w, b"x")
        except OSError:
            pass

    @staticmethod
    def _killpg(pgid, sig):
        try:
            os.killpg(pgid, sig)
        except OSError as e:
            if e.errno not in (errno.ESRCH, errno.EPERM):
                raise

    def _signal_groups(self, sig, only_running=True):
        for p, pgid in zip(self.procs, self.pgids):
            if p is None or (only_running and p.returncode is not None):
                continue
            self._killpg(pgid, sig)

    def begin_stop(self, sig, result):
        """Sends sig to every running process and schedules SIGKILL after the grace."""
        if self.stopping:
            return
        self.stopping = True
        self.result = result
        self._signal_groups(sig)
        self.kill_at = time.monotonic() + self.grace_s

    def _spawn(self, local_rank, restarts):
        """Starts local_rank's process (its restarts-th restart). Raises OSError.
        A restarted process's earlier pipes stay registered until their end
        of file, so nothing the earlier one wrote is lost."""
        p = subprocess.Popen(self.spec.cmd, env=self.spec.env(local_rank, self.base, restarts),
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True,
                             preexec_fn=_die_with_parent)
        self.procs[local_rank] = p
        self.pgids[local_rank] = p.pid
        self.restarts[local_rank] = restarts
        rank = self.spec.rank(local_rank)
        for pipe, out_fd in ((p.stdout, 1), (p.stderr, 2)):
            os.set_blocking(pipe.fileno(), False)
            self.sel.register(pipe.fileno(), selectors.EVENT_READ,
                              _Stream(rank, pipe, out_fd, self.prefix))

    def start(self, environ):
        self.base = dict(environ)
        for local_rank in range(self.spec.nproc):
            try:
                self._spawn(local_rank, 0)
            except OSError as e:
                sys.stderr.write("%s: cannot run %r: %s\n" % (_PROG, self.spec.cmd[0],
                                                              e.strerror or e))
                # The shell's statuses: 127 not found, 126 found but not runnable.
                self.begin_stop(signal.SIGTERM, 127 if isinstance(
                    e, (FileNotFoundError, NotADirectoryError)) else 126)
                return

    def _on_failure(self, local_rank, returncode):
        """LAUNCH-6, LAUNCH-7: a process failed while the job runs: restart it
        in place, or stop the job with its status."""
        code = exit_code(returncode)
        rank, done, most = self.spec.rank(local_rank), self.restarts[local_rank], \
            self.spec.max_restarts
        if returncode < 0:
            cause = "was killed by signal %d" % -returncode
        else:
            cause = "exited with status %d" % code
        if most > 0 and rank == 0 and not self.spec.restart_rank0:
            tail = ("; not restarting it: with init_method env:// rank 0 serves the job's "
                    "rendezvous store, which ended with it, so a new rank 0 would have no job "
                    "to rejoin (--restart-rank0 if the store lives elsewhere; spec/launch.md "
                    "LAUNCH-7); stopping the others")
        elif done < most:
            sys.stderr.write("%s: rank %d %s; restarting it as a new incarnation (TP_REJOIN=1), "
                             "restart %d of %d\n" % (_PROG, rank, cause, done + 1, most))
            # What the failed process left in its group goes with it: no orphans.
            self._killpg(self.pgids[local_rank], signal.SIGKILL)
            try:
                self._spawn(local_rank, done + 1)
                return
            except OSError as e:
                # Not restarted: the job ends with the rank's failure (LAUNCH-6).
                tail = "; cannot restart it: %s; stopping the others" % (e.strerror or e)
        elif most > 0:
            tail = " after %d restart%s (--max-restarts %d); stopping the others" % (
                done, "" if done == 1 else "s", most)
        else:
            tail = "; stopping the others"
        sys.stderr.write("%s: rank %d %s%s\n" % (_PROG, rank, cause, tail))
        self.begin_stop(signal.SIGTERM, code)

    def reap(self):
        """Collects exited processes; a failure restarts its process or stops the others."""
        for local_rank, p in enumerate(self.procs):
            if p is None or p.returncode is not None or p.poll() is None:
                continue
            if exit_code(p.returncode) != 0 and not self.stopping:
                self._on_failure(local_rank, p.returncode)

    def pump(self, timeout):
        """Copies what the processes wrote; False when every pipe is closed."""
        for key, _ in self.sel.select(timeout):
            if key.data is None:
                try:
                    while os.read(self.wake_r, 64):
                        pass
                except (BlockingIOError, InterruptedError):
                    pass
                continue
            if not key.data.read():
                self.sel.unregister(key.fd)
                key.data.close()
        return len(self.sel.get_map()) > 1

    def running(self):
        return sum(1 for p in self.procs if p is not None and p.returncode is None)

    def run(self):
        drain_until = None
        while True:
            if self.got_signal:
                sig, self.got_signal = self.got_signal, 0
                if not self.stopping:
                    sys.stderr.write("%s: got signal %d; stopping every rank\n" % (_PROG, sig))
                    self.begin_stop(sig, 128 + sig)
                elif self.kill_at is not None:
                    self.kill_at = time.monotonic()  # asked again while stopping: no more grace
            self.reap()
            if self.kill_at is not None and time.monotonic() >= self.kill_at:
                self._signal_groups(signal.SIGKILL)
                self.kill_at = None
            open_pipes = self.pump(self.poll_s)
            if self.running() == 0:
                if drain_until is None:
                    drain_until = time.monotonic() + DRAIN_S
                if not open_pipes or time.monotonic() >= drain_until:
                    break
        for key in list(self.sel.get_map().values()):
            if key.data is not None:
                key.data.flush()
                self.sel.unregister(key.fd)
                key.data.close()
        # What a process left behind in its group goes with it: no orphans.
        self._signal_groups(signal.SIGKILL, only_running=False)
        return self.result


def main(argv=None):
    try:
        parser = make_parser()  # reads the flags' PET_* defaults
    except UsageError as e:
        sys.stderr.write("%s: %s\n" % (_PROG, e))
        return 2
    args = parser.parse_args(argv)
    environ = dict(os.environ)
    try:
        spec = JobSpec(args)
        environ["TP_SECRET"] = job_secret(environ, args.secret_file, spec.nnodes)
        if spec.master_port is None:
            spec.master_port = free_port(spec.master_addr)
    except UsageError as e:
        parser.print_usage(sys.stderr)
        sys.stderr.write("%s: %s\n" % (_PROG, e))
        return 2
    except SecretError as e:
        sys.stderr.write("%s: %s\n" % (_PROG, e))
        return 2
    job = Job(spec, args.grace, not args.no_prefix, max(0.01, min(args.monitor_interval, 1.0)))
    old = {s: signal.signal(s, job._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        job.start(environ)
        return job.run()
    finally:
        for s, h in old.items():
            signal.signal(s, h)


if __name__ == "__main__":
    sys.exit(main())
