#!/usr/bin/env python3
"""Python hand-off: a producer process hands a float32 tensor of each size to a
consumer process that reads every element; the clock runs from the producer's
send to the consumer's last read (CLOCK_MONOTONIC, shared by both). Peers in the
same run: torch.multiprocessing (a shared-memory tensor through its Queue),
multiprocessing.shared_memory (create, attach by name), and pickling through a
pipe. Also: a Python Ping's cost over the C++ Ping it wraps, and the time to make
1 GiB of published weights visible as tensors in 8 worker processes.

    bench/python_handoff.py --socket S [--quick]     (JSON lines on stdout)
"""
import argparse
import json
import multiprocessing as mp
import os
import pickle
import statistics
import sys
import time

import numpy as np

SIZES = [4 << 10, 1 << 20, 64 << 20, 1 << 30]


def now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


# -- consumers: each runs in its own process, gets one message per run, reads every element, answers the time
def consumer_membroker(socket, inbox, outbox):
    import membroker
    c = membroker.connect(socket, "bench-consumer")
    while True:
        name = inbox.get()
        if name is None:
            return
        t = c.lookup_tensor(name, timeout_ms=10000)
        s = float(t.numpy().sum(dtype=np.float64))
        outbox.put((now(), s))
        del t


def consumer_torch(inbox, outbox):
    while True:
        x = inbox.get()
        if x is None:
            return
        s = float(x.numpy().sum(dtype=np.float64))
        outbox.put((now(), s))
        del x


def consumer_shm(inbox, outbox):
    from multiprocessing import shared_memory
    while True:
        msg = inbox.get()
        if msg is None:
            return
        name, n = msg
        shm = shared_memory.SharedMemory(name=name)
        a = np.ndarray((n,), dtype=np.float32, buffer=shm.buf)
        s = float(a.sum(dtype=np.float64))
        del a
        shm.close()
        outbox.put((now(), s))


def consumer_pickle(conn, outbox):
    while True:
        blob = conn.recv_bytes()
        if blob == b"stop":
            return
        a = pickle.loads(blob)
        outbox.put((now(), float(a.sum(dtype=np.float64))))


def run_case(method, size, runs, socket):
    n = size // 4
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    times = []
    if method == "membroker":
        import membroker
        c = membroker.connect(socket, "bench-producer")
        p = ctx.Process(target=consumer_membroker, args=(socket, inbox, outbox))
        p.start()
        for i in range(runs + 1):
            t0 = now()
            t = c.new_tensor((n,), "float32")
            t.numpy()[:] = 1.0
            name = f"bench/{os.getpid()}/{i}"
            c.publish_tensor(name, t)
            inbox.put(name)
            end, s = outbox.get()
            c.unpublish(name)
            del t
            if i:
                times.append(end - t0)
        inbox.put(None)
    elif method == "torch.multiprocessing":
        import torch
        import torch.multiprocessing as tmp
        tctx = tmp.get_context("spawn")
        inbox, outbox = tctx.Queue(), tctx.Queue()
        p = tctx.Process(target=consumer_torch, args=(inbox, outbox))
        p.start()
        for i in range(runs + 1):
            t0 = now()
            x = torch.empty(n, dtype=torch.float32).share_memory_()
            x.fill_(1.0)
            inbox.put(x)
            end, s = outbox.get()
            del x
            if i:
                times.append(end - t0)
        inbox.put(None)
    elif method == "shared_memory":
        from multiprocessing import shared_memory
        p = ctx.Process(target=consumer_shm, args=(inbox, outbox))
        p.start()
        for i in range(runs + 1):
            t0 = now()
            shm = shared_memory.SharedMemory(create=True, size=size)
            np.ndarray((n,), dtype=np.float32, buffer=shm.buf)[:] = 1.0
            inbox.put((shm.name, n))
            end, s = outbox.get()
            shm.close()
            shm.unlink()
            if i:
                times.append(end - t0)
        inbox.put(None)
    else:  # pickle through a pipe
        a_end, b_end = ctx.Pipe()
        p = ctx.Process(target=consumer_pickle, args=(b_end, outbox))
        p.start()
        for i in range(runs + 1):
            t0 = now()
            a = np.ones(n, dtype=np.float32)
            a_end.send_bytes(pickle.dumps(a, protocol=5))
            end, s = outbox.get()
            if i:
                times.append(end - t0)
        a_end.send_bytes(b"stop")
    p.join(timeout=60)
    return {"bench": "python_handoff", "method": method, "size": size, "runs": runs,
            "median_us": statistics.median(times) * 1e6, "min_us": min(times) * 1e6}


def ping_overhead(socket, n):
    import membroker
    c = membroker.connect(socket, "bench-ping")
    native = c.native
    for _ in range(200):
        c.ping()
    # Interleaved in rounds, medians: background work in the broker (pages of
    # earlier hand-offs going back) then weighs on both alike.
    rounds, chunk = 20, max(1, n // 20)
    py, cpp = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(chunk):
            c.ping()
        py.append((time.perf_counter() - t0) / chunk * 1e6)
        cpp.append(native.ping_loop(chunk) / chunk * 1e6)  # the same Ping, looped in C++
    py_us, cpp_us = statistics.median(py), statistics.median(cpp)
    return {"bench": "python_ping", "calls": rounds * chunk, "python_us": py_us, "cpp_us": cpp_us,
            "overhead_us": py_us - cpp_us}


def weights_worker(socket, layers, q):
    import membroker
    c = membroker.connect(socket, "bench-weights-worker")
    ts = [c.lookup_tensor(f"bench-weights/{i}", timeout_ms=10000) for i in range(layers)]
    arrays = [t.torch() for t in ts]
    q.put((now(), sum(a.numel() for a in arrays)))


def weights_visible(socket, total, workers):
    import membroker
    c = membroker.connect(socket, "bench-weights-loader")
    layers = 16
    per = total // layers // 4
    kept = []
    for i in range(layers):
        t = c.new_tensor((per,), "float32")
        t.numpy()[:] = 0.5
        c.publish_tensor(f"bench-weights/{i}", t, read_only=True)
        kept.append(t)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    # Start the interpreters first: the clock measures mapping, not Python's start-up.
    procs = [ctx.Process(target=weights_worker, args=(socket, layers, q)) for _ in range(workers)]
    t0 = now()
    for p in procs:
        p.start()
    ends = [q.get()[0] for _ in procs]
    for p in procs:
        p.join()
    for i in range(layers):
        c.unpublish(f"bench-weights/{i}")
    return {"bench": "python_weights", "bytes": total, "workers": workers, "layers": layers,
            "all_visible_ms": (max(ends) - t0) * 1e3,
            "note": "includes starting each worker's interpreter (spawn) and importing torch"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    runs = 3 if args.quick else 10
    for size in SIZES:
        r = max(1, runs // 3) if size >= (1 << 30) else runs
        for method in ("membroker", "torch.multiprocessing", "shared_memory", "pickle"):
            print(json.dumps(run_case(method, size, r, args.socket)), flush=True)
    print(json.dumps(ping_overhead(args.socket, 5000 if args.quick else 50000)), flush=True)
    print(json.dumps(weights_visible(args.socket, 1 << 30, 8)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
