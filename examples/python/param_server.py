"""A parameter server whose model lives in an RRef-owned object on rank 0;
every other rank is a trainer that fits y = 3x + 1 on its shard of data.

    tprun --nproc 3 python3 examples/python/param_server.py

Each trainer reads the weights through the RRef (rref.rpc_sync().weights()),
computes its gradient and sends it (rref.rpc_sync().update(...)); the server
object applies each step under a lock. Exits 1 unless the fit converges.
"""
import os
import threading

import tensorplay.distributed.rpc as rpc

STEPS = 300
LR = 0.1
SHARD = 8


class ParameterServer:
    def __init__(self):
        self.w, self.b = 0.0, 0.0
        self.lock = threading.Lock()

    def weights(self):
        with self.lock:
            return [self.w, self.b]

    def update(self, dw, db):
        with self.lock:
            self.w -= LR * dw
            self.b -= LR * db
            return [self.w, self.b]


def make_server():
    return ParameterServer()


def gradient(rank, trainers, w, b):
    dw = db = 0.0
    for i in range(SHARD):
        x = 2.0 * ((rank - 1) * SHARD + i) / (trainers * SHARD) - 1
        err = w * x + b - (3 * x + 1)
        dw += 2 * err * x / SHARD
        db += 2 * err / SHARD
    return dw, db


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rpc.init_rpc("ps" if rank == 0 else "trainer%d" % rank, rank=rank, world_size=world)
    ok = True
    if rank == 0:
        global _server
        _server = rpc.remote("ps", make_server)  # an RRef rank 0 owns
        _server_ready.set()
    else:
        server = rpc.rpc_sync("ps", get_server)
        for _ in range(STEPS):
            w, b = server.rpc_sync().weights()
            server.rpc_sync().update(*gradient(rank, world - 1, w, b))
        w, b = server.rpc_sync().weights()
        ok = abs(w - 3) < 0.01 and abs(b - 1) < 0.01
        print("trainer%d: w = %.4f, b = %.4f (%s)" % (rank, w, b,
                                                      "converged" if ok else "NOT converged"))
    rpc.shutdown()
    raise SystemExit(0 if ok else 1)


_server = None
_server_ready = threading.Event()


def get_server():
    """Served on ps: the RRef to the model (trainers may ask before main made it)."""
    _server_ready.wait(30)
    return _server


if __name__ == "__main__":
    main()
