#!/usr/bin/env python3
"""python_rpc_bench.py: rpc_bench's workloads from Python, on tensorplay.distributed.rpc.

Prints "BENCH python_<name> <value> <unit>" for the figures pytorch_rpc_bench.py
measures on PyTorch RPC, so one `make bench` run puts the three side by side
(C, Python over the same library, PyTorch): rpc_sync of a 64-byte bytes value
(median, p99), remote + to_here (median), rpc_async throughput with a window of
calls in flight, a 64 MiB float32 numpy array argument (GB/s), and where torch
imports, a 64 MiB torch tensor's round trip (sent, echoed back; ms). Two worker
processes on 127.0.0.1 over the TENSORPIPE (TCP) backend, forked from this one,
with a fresh job secret. Exits non-zero when a workload fails, never for a slow
figure. Needs the package on PYTHONPATH (build/python) and numpy.
"""
import argparse
import collections
import multiprocessing as mp
import os
import secrets
import statistics
import sys
import time

import numpy

import tensorplay.distributed.rpc as rpc

from bench_common import bench_print, free_port, now_us, percentile

MSG_LEN = 64
BULK_BYTES = 64 << 20


def echo(x):
    return x


def numel(a):
    return int(a.size)





def measure(cfg):
    payload = b"\x07" * MSG_LEN
    res = {}
    for _ in range(cfg.warmup):
        rpc.rpc_sync("w1", echo, args=(payload,))
        rpc.remote("w1", echo, args=(7,)).to_here()
    sync_t, remote_t = [], []
    for _ in range(cfg.samples):
        t0 = now_us()
        out = rpc.rpc_sync("w1", echo, args=(payload,))
        sync_t.append(now_us() - t0)
        assert out == payload
    for _ in range(cfg.remote_samples):
        t0 = now_us()
        assert rpc.remote("w1", echo, args=(7,)).to_here() == 7
        remote_t.append(now_us() - t0)
    sync_t.sort()
    res["rpc_sync_rtt_median_us"] = (statistics.median(sync_t), "us")
    res["rpc_sync_rtt_p99_us"] = (percentile(sync_t, 99), "us")
    res["remote_to_here_median_us"] = (statistics.median(remote_t), "us")

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

    async_run(cfg.window * 2)
    res["rpc_async_calls_per_s"] = (statistics.median(
        [async_run(cfg.async_calls) for _ in range(cfg.async_reps)]), "calls/s")

    a = numpy.arange(BULK_BYTES // 4, dtype=numpy.float32)
    assert rpc.rpc_sync("w1", numel, args=(a,)) == a.size  # warm-up
    gbps = []
    for _ in range(cfg.bulk_reps):
        t0 = time.monotonic_ns()
        rpc.rpc_sync("w1", numel, args=(a,))
        gbps.append(BULK_BYTES / (time.monotonic_ns() - t0))  # bytes/ns = GB/s
    res["bulk_64MiB_GBps"] = (statistics.median(gbps), "GB/s")

    try:
        import torch  # a torch tensor's round trip, where PyTorch is installed (issue 20)
    except ImportError:
        return res
    t = torch.arange(BULK_BYTES // 4, dtype=torch.float32)
    for _ in range(3):  # warm-up to the steady state (shared memory slabs made, TCP-22)
        assert torch.equal(rpc.rpc_sync("w1", echo, args=(t,)), t)  # and it is the same
    ms = []
    for _ in range(cfg.bulk_reps):
        t0 = time.monotonic_ns()
        back = rpc.rpc_sync("w1", echo, args=(t,))
        ms.append((time.monotonic_ns() - t0) / 1e6)
        assert back.shape == t.shape
        del back
    res["torch_echo_64MiB_ms"] = (statistics.median(ms), "ms")
    return res


def worker(rank, port, secret, cfg, queue):
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port), "TP_SECRET": secret})
    try:
        rpc.init_rpc("w%d" % rank, rpc_backend_options=rpc.TensorPipeRpcBackendOptions(
            num_worker_threads=16, rpc_timeout=120))
        res = measure(cfg) if rank == 0 else None
        rpc.shutdown()
        queue.put((rank, res, None))
    except Exception as e:  # reported by the parent
        queue.put((rank, None, "%s: %s" % (type(e).__name__, e)))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    cfg = p.parse_args()
    cfg.warmup = 200 if not cfg.quick else 20
    cfg.samples = 10000 if not cfg.quick else 500
    cfg.remote_samples = 2000 if not cfg.quick else 100
    cfg.window = 1000
    cfg.async_calls = 20000 if not cfg.quick else 2000
    cfg.async_reps = 3 if not cfg.quick else 1
    cfg.bulk_reps = 5 if not cfg.quick else 2
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    port, secret = free_port(), secrets.token_hex(32)
    procs = [ctx.Process(target=worker, args=(r, port, secret, cfg, queue)) for r in (0, 1)]
    for pr in procs:
        pr.start()
    results, failed = {}, False
    for _ in procs:
        rank, res, err = queue.get(timeout=600)
        if err:
            print("python_rpc_bench: rank %d failed: %s" % (rank, err), file=sys.stderr)
            failed = True
        if res:
            results = res
    for pr in procs:
        pr.join(60)
    for name, (value, unit) in results.items():
        bench_print("python_" + name, value, unit)
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main())
