"""bench_common.py: helpers the Python benchmarks share (pytorch_rpc_bench.py,
python_rpc_bench.py): a free port, a microsecond clock, a percentile, and the
"BENCH <name> <value> <unit>" line every benchmark prints."""
import socket
import time


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def now_us():
    return time.monotonic_ns() / 1e3


def percentile(sorted_v, p):
    i = int(round((len(sorted_v) - 1) * p / 100.0))
    return sorted_v[min(i, len(sorted_v) - 1)]


def bench_print(name, value, unit):
    fmt = "BENCH {} {:.0f} {}" if value >= 1000 else "BENCH {} {:.3f} {}"
    print(fmt.format(name, value, unit), flush=True)
