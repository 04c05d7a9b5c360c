#!/usr/bin/env python3
"""torch.multiprocessing through the broker: the program torch's docs show (a
producer, a Queue, consumer Processes), plus one line. Tensors travel as broker
memory, not /dev/shm files: a SIGKILLed process leaves nothing behind.

    examples/python/torch_queue.py --socket /run/membroker.sock [--consumers 2] [--batches 8]
"""
import argparse
import os

import torch
import torch.multiprocessing as mp

import membroker.torch


def consumer(index, queue, results):
    while True:
        batch = queue.get()
        if batch is None:
            return
        results.put((index, batch.shape[0], float(batch.sum())))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True)
    parser.add_argument("--consumers", type=int, default=2)
    parser.add_argument("--batches", type=int, default=8)
    args = parser.parse_args()

    membroker.torch.enable(args.socket)  # the one line: CPU tensors go through the broker

    queue, results = mp.Queue(), mp.Queue()
    workers = [mp.Process(target=consumer, args=(i, queue, results)) for i in range(args.consumers)]
    for w in workers:
        w.start()
    expected = 0.0
    for b in range(args.batches):
        batch = torch.full((256, 1024), float(b + 1))  # 1 MiB of float32
        expected += float(batch.sum())
        queue.put(batch)
    got = sum(results.get(timeout=60)[2] for _ in range(args.batches))
    for _ in workers:
        queue.put(None)
    for w in workers:
        w.join(60)
    files = [f for f in os.listdir("/dev/shm") if f.startswith("torch_")]
    print(f"torch_queue: {args.batches} batches of 1 MiB to {args.consumers} consumers, sums "
          f"{'match' if got == expected else 'DIFFER'}, torch files in /dev/shm: {len(files)}")
    if got != expected or files or any(w.exitcode != 0 for w in workers):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
