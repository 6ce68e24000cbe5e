"""The documented example: worker0 calls add(3, 4) on worker1 and prints 7.

    tprun --nproc 2 python3 examples/python/seed.py

(from a build tree: PYTHONPATH=build/python build/real/tprun --nproc 2 ...)
"""
import os

import tensorplay.distributed.rpc as rpc


def add(a, b):
    return a + b


rank = int(os.environ["RANK"])  # tprun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
rpc.init_rpc("worker0" if rank == 0 else "worker1", rank=rank, world_size=2)
if rank == 0:
    print(rpc.rpc_sync("worker1", add, args=(3, 4)))
rpc.shutdown()
