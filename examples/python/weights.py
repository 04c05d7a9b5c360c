#!/usr/bin/env python3
"""Weight sharing: one loader puts a model's weights into broker memory once and
publishes them as one state dict (read-only, persistent: publish_state_dict);
N worker processes look the dict up and use the same pages as torch tensors
with no copy, all of it or nothing; the loader exits and the workers go on.
Afterwards the weights are unpublished and the broker holds nothing.

    examples/python/weights.py --socket /run/membroker.sock [--workers 4] [--mib 64]
"""
import argparse
import os
import subprocess
import sys
import time

import torch

import membroker

LAYERS = 4
NAME = "model/weights"


def loader(socket: str, mib: int) -> None:
    c = membroker.connect(socket, "weights-loader")
    rows = mib * (1 << 20) // (LAYERS * 1024 * 4)
    t0 = time.perf_counter()
    # "Loading" the checkpoint: each layer's weights, then one request publishes all of them.
    state = {f"layer{layer}.weight": torch.full((rows, 1024), float(layer + 1)) for layer in range(LAYERS)}
    c.publish_state_dict(NAME, state, read_only=True, persist=True)
    print(f"loader: published {LAYERS} layers, {mib} MiB, in {(time.perf_counter() - t0) * 1e3:.1f} ms; exiting",
          flush=True)


def worker(socket: str, index: int) -> None:
    c = membroker.connect(socket, f"worker-{index}")
    t0 = time.perf_counter()
    weights = c.lookup_state_dict(NAME, timeout_ms=10000)  # the broker's pages, read-only as published
    mapped_ms = (time.perf_counter() - t0) * 1e3
    total = 0.0
    for i in range(LAYERS):
        w = weights[f"layer{i}.weight"]
        assert float(w[0, 0]) == i + 1
        total += float(w[:64].sum())
    print(f"worker {index} (pid {os.getpid()}): mapped {len(weights)} tensors in {mapped_ms:.2f} ms, "
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
    membroker.connect(args.socket, "weights-cleanup").unpublish(NAME)
    print("weights: ok" if not any(codes) else f"weights: workers failed {codes}", flush=True)
    return 1 if any(codes) else 0


if __name__ == "__main__":
    sys.exit(main())
