#!/usr/bin/env python3
"""pytorch_rpc_bench.py: rpc_bench's workloads on PyTorch RPC (torch.distributed.rpc).

The same figures as bench/rpc_bench.c, named "BENCH pytorch_<name> <value> <unit>",
for the TensorPipe agent of Debian's python3-torch (1.13) forced onto plain TCP:
TensorPipeRpcBackendOptions(_transports=["uv"], _channels=["basic"]) (no shared
memory, no CMA or multiplexed channels), so both libraries move every byte over
loopback TCP. Workers are forked processes (after `import torch`, before any rpc),
placed like rpc_bench's (--placement, default spread: rank r on CPU r).

As in rpc_bench, the raw TCP reference is measured between the same two processes,
interleaved block by block with the rpc workloads, over a raw socket with
TCP_NODELAY: 64-byte ping-pongs and 64 MiB transfers. It runs in Python, which adds
little to it (a plain Python ping-pong measures within ~3 us of rpc_bench's C one).

syscalls_per_rpc_sync is counted as rpc_bench counts it: `strace -f -c` over a
two-worker job (this script with --syscall-job) making 1 + n calls, minus the same
job making 1, over n. --no-syscalls skips it (no strace); --quick skips init_32_s.

Exits non-zero when a workload fails to run, never for a slow figure.
"""
import argparse
import collections
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
import traceback

import torch
import torch.distributed.rpc as rpc

from bench_common import bench_print, free_port, now_us, percentile

MSG_LEN = 64
BULK_BYTES = 64 << 20


# ---- Functions the callee serves (module level: pickled by name) -----------------

def echo(x):
    return x


def numel(t):
    return t.numel()


# ---- Helpers ------------------------------------------------------------------------

def place(placement, rank):
    """Pins this process (and threads it starts later) like rpc_bench --placement."""
    if placement == "free":
        return
    ncpu = os.cpu_count() or 1
    os.sched_setaffinity(0, {0 if placement == "one" else rank % ncpu})


def options(port, threads=16):
    return rpc.TensorPipeRpcBackendOptions(
        init_method=f"tcp://127.0.0.1:{port}",
        num_worker_threads=threads,
        rpc_timeout=120,
        _transports=["uv"],
        _channels=["basic"],
    )




# ---- The raw TCP reference, between the same two processes -------------------------------
# As in rpc_bench: 64-byte messages whose first byte says what to do: b"P" ping (echoed),
# b"B" bulk (a little-endian u64 length at offset 8; that many bytes follow, then a
# 64-byte answer), b"Q" quit. rank 1's main thread serves them while PyTorch's own
# threads serve the rpc calls; blocked in recv it does not hold the GIL.

def recv_exact(sock, view):
    got = 0
    while got < len(view):
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("raw connection closed")
        got += k


def raw_serve(sock):
    msg = bytearray(MSG_LEN)
    buf = bytearray(BULK_BYTES)
    mv, bv = memoryview(msg), memoryview(buf)
    while True:
        recv_exact(sock, mv)
        if msg[0:1] == b"Q":
            return
        if msg[0:1] == b"B":
            n = int.from_bytes(msg[8:16], "little")
            recv_exact(sock, bv[:n])
        sock.sendall(msg)


def raw_ping(sock, msg, mv):
    sock.sendall(msg)
    recv_exact(sock, mv)


def raw_bulk(sock, data):
    cmd = bytearray(MSG_LEN)
    cmd[0:1] = b"B"
    cmd[8:16] = len(data).to_bytes(8, "little")
    sock.sendall(cmd)
    sock.sendall(data)
    recv_exact(sock, memoryview(cmd))


# ---- The two-process workloads ----------------------------------------------------------

def measure(cfg, sock):
    """rank 0's part: every figure of the pair, as a dict."""
    payload = b"\x07" * MSG_LEN
    ping = bytearray(b"P" + b"\x07" * (MSG_LEN - 1))
    ping_mv = memoryview(bytearray(MSG_LEN))
    res = {}
    for _ in range(cfg.warmup):
        raw_ping(sock, ping, ping_mv)
        rpc.rpc_sync("w1", echo, args=(payload,))
        rpc.remote("w1", echo, args=(7,)).to_here()

    # Round trips, interleaved: a block of raw pings, a block of rpc_syncs, a few
    # remote + to_here.
    raw_t, sync_t, remote_t = [], [], []
    rounds = max(1, cfg.samples // cfg.block)
    remote_per_round = max(1, cfg.remote_samples // rounds)
    for _ in range(rounds):
        for _ in range(cfg.block):
            t0 = now_us()
            raw_ping(sock, ping, ping_mv)
            raw_t.append(now_us() - t0)
        for _ in range(cfg.block):
            t0 = now_us()
            out = rpc.rpc_sync("w1", echo, args=(payload,))
            sync_t.append(now_us() - t0)
            assert len(out) == MSG_LEN
        for _ in range(remote_per_round):
            t0 = now_us()
            v = rpc.remote("w1", echo, args=(7,)).to_here()
            remote_t.append(now_us() - t0)
            assert v == 7
    sync_t.sort()
    res["raw_tcp_rtt_median_us"] = statistics.median(raw_t)
    res["rpc_sync_rtt_median_us"] = statistics.median(sync_t)
    res["rpc_sync_rtt_p99_us"] = percentile(sync_t, 99)
    res["remote_to_here_median_us"] = statistics.median(remote_t)

    # rpc_async with a window: call i is issued right after call i - window completed.
    def async_run(calls):
        ring = collections.deque()
        t0 = time.monotonic()
        for _ in range(calls):
            if len(ring) == cfg.window:
                ring.popleft().wait()
            ring.append(rpc.rpc_async("w1", echo, args=(payload,)))
        while ring:
            ring.popleft().wait()
        return calls / (time.monotonic() - t0)

    async_run(cfg.window * 5)  # warm-up
    rates = [async_run(cfg.async_calls) for _ in range(cfg.async_reps)]
    res["rpc_async_calls_per_s"] = statistics.median(rates)
    res["_async_reps"] = rates

    # Bulk, alternating: 64 MiB of raw bytes, then a 64 MiB float32 tensor argument
    # (the callee answers its element count).
    t = torch.arange(BULK_BYTES // 4, dtype=torch.float32)
    data = memoryview(t.numpy()).cast("B")
    raw_bulk(sock, data)  # warm-up
    rpc.rpc_sync("w1", numel, args=(t,))
    raw_gbps, gbps = [], []
    for _ in range(cfg.bulk_reps):
        t0 = time.monotonic_ns()
        raw_bulk(sock, data)
        t1 = time.monotonic_ns()
        n = rpc.rpc_sync("w1", numel, args=(t,))
        t2 = time.monotonic_ns()
        assert n == BULK_BYTES // 4
        raw_gbps.append(BULK_BYTES / (t1 - t0))
        gbps.append(BULK_BYTES / (t2 - t1))
    res["raw_tcp_gbps"] = statistics.median(raw_gbps)
    res["tensor_64mib_gbps"] = statistics.median(gbps)
    res["_bulk_reps"] = list(zip(raw_gbps, gbps))
    # The tensor's round trip: sent and echoed back (python_rpc_bench's torch_echo).
    for _ in range(3):  # the same warm-up as python_rpc_bench.py's
        assert torch.equal(rpc.rpc_sync("w1", echo, args=(t,)), t)
    ms = []
    for _ in range(cfg.bulk_reps):
        t0 = time.monotonic_ns()
        back = rpc.rpc_sync("w1", echo, args=(t,))
        ms.append((time.monotonic_ns() - t0) / 1e6)
        del back
    res["torch_echo_64MiB_ms"] = statistics.median(ms)
    return res


def pair_child(rank, port, lsock, cfg, job):
    try:
        place(cfg.placement, rank)
        rpc.init_rpc(f"w{rank}", rank=rank, world_size=2, rpc_backend_options=options(port))
        res = None
        if rank == 1:
            sock, _ = lsock.accept()
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            raw_serve(sock)
        else:
            sock = socket.create_connection(lsock.getsockname())
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            res = measure(cfg, sock)
            sock.sendall(b"Q" * MSG_LEN)
        sock.close()
        rpc.shutdown()
    except BaseException:  # report anything, then fail the process
        job.report("error", traceback.format_exc())
    job.report("ok", res)


class Job:
    """n forked processes, each running target(*args_of(i), job) and reporting once
    through job.report(); none exits before all reported, since rank 0 hosts the
    rendezvous store the others still use while they shut down."""

    def __init__(self, target, n, args_of):
        ctx = mp.get_context("fork")
        self.exit_ok = ctx.Event()
        self.pipes, self.procs, self._w = [], [], None
        for i in range(n):
            r, w = ctx.Pipe(duplex=False)
            self._w = w
            p = ctx.Process(target=target, args=(*args_of(i), self), daemon=True)
            p.start()
            w.close()
            self.pipes.append(r)
            self.procs.append(p)

    # In a child (the pipe's write end was inherited through fork as self._w).
    def report(self, status, value):
        self._w.send((status, value))
        self.exit_ok.wait(120)
        os._exit(0 if status == "ok" else 1)

    def collect(self, timeout_s, what):
        deadline = time.monotonic() + timeout_s
        replies = []
        try:
            for i, r in enumerate(self.pipes):
                if not r.poll(max(0.0, deadline - time.monotonic())):
                    raise RuntimeError(f"{what}: process {i} did not report within "
                                       f"{timeout_s:.0f} s")
                status, value = r.recv()
                if status != "ok":
                    raise RuntimeError(f"{what}: process {i} failed:\n{value}")
                replies.append(value)
        except BaseException:
            for p in self.procs:
                p.kill()
            raise
        self.exit_ok.set()
        for i, p in enumerate(self.procs):
            p.join(max(1.0, deadline - time.monotonic()))
            if p.exitcode != 0:
                raise RuntimeError(f"{what}: process {i} exited with {p.exitcode}")
        return replies


def run_pair(cfg):
    port = free_port()
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    job = Job(pair_child, 2, lambda i: (i, port, lsock, cfg))
    lsock.close()
    return job.collect(600, "pair")[0]


# ---- Init of n processes ----------------------------------------------------------

def init_child(rank, n, port, ready, go, job):
    try:
        opts = options(port)
        ready.release()
        go.wait()  # the start barrier: the parent sets it once all n are ready
        start = time.monotonic_ns()
        rpc.init_rpc(f"w{rank}", rank=rank, world_size=n, rpc_backend_options=opts)
        ret = time.monotonic_ns()
        rpc.shutdown()
    except BaseException:
        job.report("error", traceback.format_exc())
    job.report("ok", (start, ret))


def run_init(n, timeout_s):
    ctx = mp.get_context("fork")
    ready, go = ctx.Semaphore(0), ctx.Event()
    port = free_port()
    job = Job(init_child, n, lambda i: (i, n, port, ready, go))
    for _ in range(n):
        if not ready.acquire(timeout=timeout_s):
            raise RuntimeError(f"init of {n}: not every process got ready")
    go.set()
    times = job.collect(timeout_s, f"init of {n}")
    return (max(r for _, r in times) - max(s for s, _ in times)) / 1e9


# ---- System calls per rpc_sync ---------------------------------------------------------

def syscall_job(n, placement):
    """The traced program: one warm-up call then n more, between two forked workers."""
    port = free_port()
    done = mp.get_context("fork").Event()

    def child(rank, job):
        try:
            place(placement, rank)
            rpc.init_rpc(f"w{rank}", rank=rank, world_size=2, rpc_backend_options=options(port))
            if rank == 0:
                payload = b"\x07" * MSG_LEN
                for _ in range(n + 1):
                    rpc.rpc_sync("w1", echo, args=(payload,))
                done.set()
            else:
                # Out of shutdown (whose waits may cost calls over time) until rank 0 is
                # done, so both runs shut down the same way.
                done.wait(600)
            rpc.shutdown()
        except BaseException:
            job.report("error", traceback.format_exc())
        job.report("ok", None)

    Job(child, 2, lambda i: (i,)).collect(600, "syscall job")


def strace_total(n, placement):
    import subprocess
    import tempfile
    with tempfile.NamedTemporaryFile(prefix="pytorch_bench_strace_") as f:
        subprocess.run(["strace", "-f", "-c", "-o", f.name, sys.executable, __file__,
                        "--syscall-job", str(n), "--placement", placement],
                       check=True, stdout=subprocess.DEVNULL)
        for line in open(f.name):
            tok = line.split()
            if tok and tok[-1] == "total":
                return int(tok[3])
    raise RuntimeError("no total in strace's summary")


# ---- Main ----------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--placement", choices=["spread", "one", "free"], default="spread")
    ap.add_argument("--quick", action="store_true",
                    help="fewer samples and no 32-process init: a smoke run")
    ap.add_argument("--no-syscalls", action="store_true",
                    help="skip syscalls_per_rpc_sync (needs strace)")
    ap.add_argument("--syscall-job", type=int, help=argparse.SUPPRESS)
    ap.add_argument("-v", action="store_true", help="per-repetition details on stderr")
    cfg = ap.parse_args()
    os.environ.setdefault("TP_SOCKET_IFNAME", "lo")    # TensorPipe's uv transport
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # init's process group
    if cfg.syscall_job is not None:
        syscall_job(cfg.syscall_job, cfg.placement)
        return 0
    cfg.warmup, cfg.block, cfg.window = 500, 500, 1000
    cfg.samples, cfg.remote_samples = 10000, 1000
    cfg.async_calls, cfg.async_reps, cfg.bulk_reps = 50000, 4, 5
    if cfg.quick:
        cfg.warmup, cfg.samples, cfg.remote_samples = 100, 1000, 100
        cfg.async_calls, cfg.async_reps, cfg.bulk_reps = 10000, 2, 2

    t_start = time.monotonic()
    res = run_pair(cfg)
    if cfg.v:
        print(f"pytorch_rpc_bench: async repetitions {res['_async_reps']}", file=sys.stderr)
        print(f"pytorch_rpc_bench: bulk repetitions {res['_bulk_reps']}", file=sys.stderr)
    bench_print("pytorch_raw_tcp_rtt_median_us", res["raw_tcp_rtt_median_us"], "us")
    bench_print("pytorch_rpc_sync_rtt_median_us", res["rpc_sync_rtt_median_us"], "us")
    bench_print("pytorch_rpc_sync_rtt_p99_us", res["rpc_sync_rtt_p99_us"], "us")
    bench_print("pytorch_rpc_async_calls_per_s", res["rpc_async_calls_per_s"], "calls/s")
    bench_print("pytorch_raw_tcp_gbps", res["raw_tcp_gbps"], "GB/s")
    bench_print("pytorch_tensor_64mib_gbps", res["tensor_64mib_gbps"], "GB/s")
    bench_print("pytorch_remote_to_here_median_us", res["remote_to_here_median_us"], "us")
    bench_print("pytorch_torch_echo_64MiB_ms", res["torch_echo_64MiB_ms"], "ms")
    sizes = [2, 8] + ([] if cfg.quick else [32])
    for n in sizes:
        bench_print(f"pytorch_init_{n}_s", run_init(n, 120 if n < 32 else 300), "s")
    if not cfg.no_syscalls:
        n = 300 if cfg.quick else 1000
        base = strace_total(0, cfg.placement)
        with_n = strace_total(n, cfg.placement)
        bench_print("pytorch_syscalls_per_rpc_sync", (with_n - base) / n, "calls")
    raw_rtt = res["raw_tcp_rtt_median_us"]
    bench_print("pytorch_ratio_rpc_sync_rtt_median", res["rpc_sync_rtt_median_us"] / raw_rtt, "x")
    bench_print("pytorch_ratio_remote_to_here_median", res["remote_to_here_median_us"] / raw_rtt,
                "x")
    bench_print("pytorch_ratio_tensor_64mib_gbps", res["tensor_64mib_gbps"] / res["raw_tcp_gbps"],
                "x")
    if cfg.v:
        print(f"pytorch_rpc_bench: the run took {time.monotonic() - t_start:.1f} s",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # a workload failed to run
        print(f"pytorch_rpc_bench: {e}", file=sys.stderr)
        sys.exit(1)
