"""A two-stage pipeline with rpc_async and then: rank 0 sends each batch to
stage 1 (rank 1), and, without waiting, chains stage 2 (rank 2) onto the
answer with then; 16 batches are in flight at once.

    tprun --nproc 3 python3 examples/python/pipeline.py
"""
import os

import tensorplay.distributed.rpc as rpc


def stage1(batch):
    return [x * 2 for x in batch]


def stage2(batch):
    return sum(batch)


def main():
    rank = int(os.environ["RANK"])
    rpc.init_rpc("w%d" % rank, rank=rank, world_size=3)
    if rank == 0:
        batches = [list(range(i, i + 4)) for i in range(16)]
        futures = [rpc.rpc_async("w1", stage1, args=(b,))
                   .then(lambda f: rpc.rpc_sync("w2", stage2, args=(f.wait(),)))
                   for b in batches]
        results = rpc.wait_all(futures)
        expected = [sum(2 * x for x in b) for b in batches]
        print("pipeline:", results == expected, sum(results))
    rpc.shutdown()


if __name__ == "__main__":
    main()
