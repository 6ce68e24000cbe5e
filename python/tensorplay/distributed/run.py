"""tensorplay.distributed.run: start a job's worker processes on this machine.

    python3 -m tensorplay.distributed.run --nproc-per-node 2 train.py [ARGS...]
    python3 -m tensorplay.distributed.run --nproc-per-node 2 -m pkg.train [ARGS...]
    python3 -m tensorplay.distributed.run --nproc-per-node 2 --no-python ./a.out [ARGS...]

The flags and the environment follow torchrun (torch.distributed.run); the
supervision follows tprun (real/tprun.c), the C launcher. Each process gets
RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,
ROLE_RANK, ROLE_NAME, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (a free port
of MASTER_ADDR unless --master-port is given), TORCHELASTIC_RUN_ID,
TORCHELASTIC_RESTART_COUNT and TORCHELASTIC_MAX_RESTARTS, and the job secret
in TP_SECRET (spec/tcp.md TCP-17): 32 bytes from the kernel's generator as 64
hex digits, fresh for each run unless TP_SECRET is set already; it never
appears on a command line.

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

Single machine only for now: --nnodes 1, --node-rank 0, --max-restarts 0.
--rdzv-backend, --rdzv-endpoint, --rdzv-id, --rdzv-conf and --standalone are
accepted so torchrun command lines work, and change nothing here; the
rendezvous of the workers themselves is init_method env:// on MASTER_ADDR
and MASTER_PORT. Like torchrun, each flag may also be spelt with
underscores (--nproc_per_node) and defaults to the environment variable
PET_<FLAG> (PET_NPROC_PER_NODE).
"""
import argparse
import errno
import os
import secrets
import selectors
import signal
import socket
import subprocess
import sys
import time

NPROC_MAX = 1024  # processes on one machine: tprun's bound
LINE_MAX_BYTES = 16384  # a longer line is split, as tprun does
GRACE_DEFAULT_S = 5.0
DRAIN_S = 1.0  # output the processes' own children may still write after they exit
PR_SET_PDEATHSIG = 1

_PROG = "tensorplay.distributed.run"


class UsageError(Exception):
    """A command line this launcher cannot run (exit status 2)."""


def _env_default(name, default):
    return os.environ.get("PET_" + name.upper().replace("-", "_"), default)


def _add(parser, name, **kw):
    """An option spelt --a-b and --a_b, defaulting to PET_A_B."""
    flags = ["--" + name]
    if "-" in name:
        flags.append("--" + name.replace("-", "_"))
    if "default" in kw and kw.get("action") is None:
        kw["default"] = _env_default(name, kw["default"])
    parser.add_argument(*flags, **kw)


def make_parser():
    p = argparse.ArgumentParser(
        prog="python3 -m " + _PROG, allow_abbrev=False,
        description="Starts N worker processes of a tensorplay.distributed.rpc job on this "
                    "machine (torchrun's flags and environment).")
    _add(p, "nproc-per-node", default="1", metavar="N",
         help="processes on this machine: a number (1..%d), or cpu/auto for one per CPU"
              % NPROC_MAX)
    _add(p, "nnodes", default="1", help="machines in the job: 1 only for now (also 1:1)")
    _add(p, "node-rank", type=int, default=0, help="this machine's rank: 0 only for now")
    _add(p, "master-addr", default="127.0.0.1",
         help="address rank 0 serves the rendezvous on (default 127.0.0.1)")
    _add(p, "master-port", type=int, default=None,
         help="port rank 0 serves the rendezvous on (default: a free port)")
    _add(p, "max-restarts", type=int, default=0, help="restarts of a failed job: 0 only for now")
    _add(p, "rdzv-backend", default="static", help="accepted for torchrun command lines; unused")
    _add(p, "rdzv-endpoint", default="", help="accepted for torchrun command lines; unused")
    _add(p, "rdzv-id", default="none", help="the job's id (TORCHELASTIC_RUN_ID)")
    _add(p, "rdzv-conf", default="", help="accepted for torchrun command lines; unused")
    _add(p, "standalone", action="store_true", help="one machine (always so here)")
    _add(p, "role", default="default", help="ROLE_NAME of the processes")
    _add(p, "monitor-interval", type=float, default=0.1,
         help="seconds between checks on the processes (default 0.1)")
    _add(p, "start-method", default="spawn", choices=["spawn", "fork", "forkserver"],
         help="accepted for torchrun command lines; processes are always fresh")
    _add(p, "grace", type=float, default=GRACE_DEFAULT_S,
         help="seconds between SIGTERM and SIGKILL when stopping (default %g)" % GRACE_DEFAULT_S)
    _add(p, "no-prefix", action="store_true", help='do not prefix output lines with "[rank] "')
    p.add_argument("-m", "--module", action="store_true",
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
    lo, _, hi = value.partition(":")
    try:
        lo, hi = int(lo), int(hi or lo)
    except ValueError:
        raise UsageError("--nnodes %r: expected N or MIN:MAX" % value) from None
    if (lo, hi) != (1, 1):
        raise UsageError("--nnodes %s: multi-machine jobs are not supported yet; "
                         "this launcher runs one machine's processes (--nnodes 1)" % value)
    return 1


class JobSpec:
    """What to start: the command and the ranks of this machine's processes."""

    def __init__(self, args):
        self.nproc = _nproc(args.nproc_per_node)
        self.nnodes = _nnodes(args.nnodes)
        if args.node_rank != 0:
            raise UsageError("--node-rank %d: one machine only for now (--node-rank 0)"
                             % args.node_rank)
        if args.max_restarts != 0:
            raise UsageError("--max-restarts %d: restarts are not supported yet "
                             "(--max-restarts 0)" % args.max_restarts)
        if args.master_port is not None and not 1 <= args.master_port <= 65535:
            raise UsageError("--master-port %d: expected 1..65535" % args.master_port)
        if not 0 <= args.grace <= 3600:
            raise UsageError("--grace %g: expected 0..3600 seconds" % args.grace)
        if args.module and args.no_python:
            raise UsageError("-m and --no-python exclude each other")
        self.node_rank = args.node_rank
        self.world_size = self.nnodes * self.nproc
        self.master_addr = args.master_addr
        self.master_port = args.master_port
        self.role = args.role
        self.run_id = args.rdzv_id
        self.max_restarts = args.max_restarts
        if args.no_python:
            self.cmd = [args.training_script]
        else:
            # -u as torchrun does: a worker's lines come out as it writes them.
            self.cmd = [os.environ.get("PYTHON_EXEC", sys.executable), "-u"]
            if args.module:
                self.cmd.append("-m")
            self.cmd.append(args.training_script)
        self.cmd += args.training_script_args

    def rank(self, local_rank):
        # Multi-machine later: machines take consecutive blocks of ranks, as in torchrun.
        return self.node_rank * self.nproc + local_rank

    def env(self, local_rank, base):
        e = dict(base)
        rank = self.rank(local_rank)
        e.update({
            "RANK": str(rank), "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(self.world_size), "LOCAL_WORLD_SIZE": str(self.nproc),
            "GROUP_RANK": str(self.node_rank), "GROUP_WORLD_SIZE": str(self.nnodes),
            "ROLE_RANK": str(rank), "ROLE_NAME": self.role,
            "ROLE_WORLD_SIZE": str(self.world_size),
            "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port),
            "TORCHELASTIC_RUN_ID": self.run_id, "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": str(self.max_restarts),
        })
        return e


def free_port(addr):
    """A port nobody uses now on addr (the kernel's choice for port 0)."""
    try:
        infos = socket.getaddrinfo(addr, 0, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise UsageError("cannot resolve --master-addr %r: %s" % (addr, e)) from None
    family, kind, proto, _, sockaddr = infos[0]
    with socket.socket(family, kind, proto) as s:
        try:
            s.bind(sockaddr)
        except OSError as e:
            raise UsageError("cannot find a free port on %s: %s" % (addr, e.strerror)) from None
        return s.getsockname()[1]


def job_secret(environ):
    """TCP-17: the job secret, fresh unless the environment has one."""
    return environ.get("TP_SECRET") or secrets.token_hex(32)


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
    """One pipe of one process: bytes in, prefixed lines out."""

    def __init__(self, rank, fd, out_fd, prefix):
        self.rank, self.fd, self.out_fd = rank, fd, out_fd
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


def exit_code(returncode):
    """The status the launcher reports for a process's Popen.returncode."""
    return 128 - returncode if returncode < 0 else returncode


class Job:
    """The running processes of this machine and how the job ends."""

    def __init__(self, spec, grace_s, prefix, poll_s):
        self.spec, self.grace_s, self.prefix, self.poll_s = spec, grace_s, prefix, poll_s
        self.procs = []  # Popen, index = local rank
        self.pgids = []  # each process's group, killed at the end too
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

    def _signal_groups(self, sig, only_running=True):
        for p, pgid in zip(self.procs, self.pgids):
            if only_running and p.returncode is not None:
                continue
            try:
                os.killpg(pgid, sig)
            except OSError as e:
                if e.errno not in (errno.ESRCH, errno.EPERM):
                    raise

    def begin_stop(self, sig, result):
        """Sends sig to every running process and schedules SIGKILL after the grace."""
        if self.stopping:
            return
        self.stopping = True
        self.result = result
        self._signal_groups(sig)
        self.kill_at = time.monotonic() + self.grace_s

    def start(self, environ):
        base = dict(environ)
        for local_rank in range(self.spec.nproc):
            rank = self.spec.rank(local_rank)
            try:
                p = subprocess.Popen(self.spec.cmd, env=self.spec.env(local_rank, base),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True,
                                     preexec_fn=_die_with_parent)
            except OSError as e:
                sys.stderr.write("%s: cannot run %r: %s\n" % (_PROG, self.spec.cmd[0],
                                                              e.strerror or e))
                self.begin_stop(signal.SIGTERM, 127 if isinstance(e, FileNotFoundError) else 1)
                return
            self.procs.append(p)
            self.pgids.append(p.pid)
            for pipe, out_fd in ((p.stdout, 1), (p.stderr, 2)):
                os.set_blocking(pipe.fileno(), False)
                self.sel.register(pipe.fileno(), selectors.EVENT_READ,
                                  _Stream(rank, pipe.fileno(), out_fd, self.prefix))

    def reap(self):
        """Collects exited processes; the first failure stops the others."""
        for local_rank, p in enumerate(self.procs):
            if p.returncode is not None or p.poll() is None:
                continue
            code = exit_code(p.returncode)
            if code == 0 or self.stopping:
                continue
            rank = self.spec.rank(local_rank)
            if p.returncode < 0:
                what = "was killed by signal %d" % -p.returncode
            else:
                what = "exited with status %d" % code
            sys.stderr.write("%s: rank %d %s; stopping the others\n" % (_PROG, rank, what))
            self.begin_stop(signal.SIGTERM, code)

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
                os.close(key.fd)
        return len(self.sel.get_map()) > 1

    def running(self):
        return sum(1 for p in self.procs if p.returncode is None)

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
                os.close(key.fd)
        # What a process left behind in its group goes with it: no orphans.
        self._signal_groups(signal.SIGKILL, only_running=False)
        return self.result


def main(argv=None):
    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        spec = JobSpec(args)
        if spec.master_port is None:
            spec.master_port = free_port(spec.master_addr)
    except UsageError as e:
        parser.print_usage(sys.stderr)
        sys.stderr.write("%s: %s\n" % (_PROG, e))
        return 2
    environ = dict(os.environ)
    environ["TP_SECRET"] = job_secret(environ)
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
