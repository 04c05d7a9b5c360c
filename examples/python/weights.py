#!/usr/bin/env python3
"""Weight sharing: one loader fills a model's weights into broker memory once and
publishes them (read-only, persistent); N worker processes map the same pages
as numpy arrays / torch tensors with no copy; the loader exits and the workers
go on. Afterwards the weights are unpublished and the broker holds nothing.

    examples/python/weights.py --socket /run/membroker.sock [--workers 4] [--mib 64]
"""
import argparse
import os
import subprocess
import sys
import time

import numpy as np

import membroker

LAYERS = 4


def loader(socket: str, mib: int) -> None:
    c = membroker.connect(socket, "weights-loader")
    rows = mib * (1 << 20) // (LAYERS * 1024 * 4)
    t0 = time.perf_counter()
    for layer in range(LAYERS):
        w = c.new_tensor((rows, 1024), "float32")
        a = w.numpy()
        a[:] = np.float32(layer + 1)  # "loading" the checkpoint: every page written once
        c.publish_tensor(f"model/layer{layer}", w, read_only=True, persist=True)
    print(f"loader: published {LAYERS} layers, {mib} MiB, in {(time.perf_counter() - t0) * 1e3:.1f} ms; exiting",
          flush=True)


def worker(socket: str, index: int) -> None:
    c = membroker.connect(socket, f"worker-{index}")
    t0 = time.perf_counter()
    layers = [c.lookup_tensor(f"model/layer{i}", timeout_ms=10000) for i in range(LAYERS)]
    mapped_ms = (time.perf_counter() - t0) * 1e3
    # Torch sees the same pages (read-only as published: numpy refuses writes).
    import torch
    total = 0.0
    for i, t in enumerate(layers):
        arr = t.numpy()
        assert not arr.flags.writeable and float(arr[0, 0]) == i + 1
        total += float(t.torch()[:64].sum())
    print(f"worker {index} (pid {os.getpid()}): mapped {LAYERS} layers in {mapped_ms:.2f} ms, "
          f"checksum {total:.0f}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--role", default="main")
    ap.add_argument("--index", type=int, default=0)
    args = ap.parse_args()
    if args.role == "loader":
        loader(args.socket, args.mib)
        return 0
    if args.role == "worker":
        worker(args.socket, args.index)
        return 0
    me = [sys.executable, os.path.abspath(__file__), "--socket", args.socket]
    subprocess.run(me + ["--role", "loader", "--mib", str(args.mib)], check=True)  # loader gone
    workers = [subprocess.Popen(me + ["--role", "worker", "--index", str(i)]) for i in range(args.workers)]
    codes = [w.wait(timeout=120) for w in workers]
    c = membroker.connect(args.socket, "weights-cleanup")
    for i in range(LAYERS):
        c.unpublish(f"model/layer{i}")
    print("weights: ok" if not any(codes) else f"weights: workers failed {codes}", flush=True)
    return 1 if any(codes) else 0


if __name__ == "__main__":
    sys.exit(main())
