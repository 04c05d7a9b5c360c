#!/usr/bin/env python3
"""Python hand-off: a producer process hands a float32 tensor of each size to a
consumer process that reads every element; the clock runs from the producer's
write to the consumer's last read (CLOCK_MONOTONIC, shared by both). Each
hand-off writes every element once and reads it once, whatever the method.

membroker's ways: a channel (chunks in broker memory both sides mapped once:
the best way for a stream of tensors), a fresh published tensor per hand-off,
and its torch sharing strategy (membroker.torch.enable, a torch.multiprocessing
Queue). Peers in the same run: torch.multiprocessing Queues with both of
torch's sharing strategies (file_descriptor, file_system),
multiprocessing.shared_memory (create, attach by name) and pickling through a
pipe. Also: a Python Ping's cost over the C++ Ping it wraps, and a state dict
of 300 tensors (1 GiB) made visible in 8 worker processes, timed from a common
start after each worker has imported torch and connected.

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


def consumer_channel(socket, channel, inbox, outbox):
    import membroker
    c = membroker.connect(socket, "bench-channel-consumer")
    sub = membroker.ChannelSubscriber(c, channel, lookup_timeout_ms=10000)
    outbox.put("joined")
    while inbox.get() is not None:
        chunk = sub.receive(timeout_ms=60000)
        s = float(chunk.numpy("float32").sum(dtype=np.float64))
        t = now()
        sub.release(chunk)
        outbox.put((t, s))
    sub.leave()


def consumer_torch(strategy, socket, inbox, outbox):
    if strategy == "membroker":
        import membroker.torch
        membroker.torch.enable(socket)
    else:
        import torch.multiprocessing
        torch.multiprocessing.set_sharing_strategy(strategy)
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


# The methods, membroker's first; "peer" says which are the others.
METHODS = [("membroker channel", False), ("membroker tensor", False), ("membroker.torch", False),
           ("torch.mp file_descriptor", True), ("torch.mp file_system", True), ("shared_memory", True),
           ("pickle", True)]


def run_case(method, size, runs, socket):
    n = size // 4
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    times = []

    def handed(i, t0, expect):
        end, s = outbox.get()
        assert s == expect, f"{method}: the consumer read {s}, not {expect}"
        if i:
            times.append(end - t0)

    if method == "membroker tensor":
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
            handed(i, t0, float(n))
            c.unpublish(name)
            del t
        inbox.put(None)
    elif method == "membroker channel":
        import membroker
        c = membroker.connect(socket, "bench-channel-producer")
        channel = f"bench-channel/{os.getpid()}/{size}"
        pub = membroker.ChannelPublisher(c, channel, chunks=2, chunk_bytes=size, queue_depth=2)
        p = ctx.Process(target=consumer_channel, args=(socket, channel, inbox, outbox))
        p.start()
        assert outbox.get() == "joined"
        pub.wait_for_subscribers(1, 60000)
        for i in range(runs + 1):
            inbox.put(i)  # the consumer goes into receive; the clock starts with the write, as the peers' do
            t0 = now()
            chunk = pub.loan(size, timeout_ms=60000)
            chunk.numpy("float32")[:] = (i % 7) + 1.0
            pub.publish(chunk, size=size, timeout_ms=60000)
            handed(i, t0, float(n) * ((i % 7) + 1.0))
        inbox.put(None)
        p.join(timeout=60)
        pub.close()
    elif method.startswith("torch.mp") or method == "membroker.torch":
        import torch
        import torch.multiprocessing as tmp
        strategy = "membroker" if method == "membroker.torch" else method.split()[1]
        if strategy == "membroker":
            import membroker.torch
            membroker.torch.enable(socket)
        else:
            tmp.set_sharing_strategy(strategy)
        tctx = tmp.get_context("spawn")
        inbox, outbox = tctx.Queue(), tctx.Queue()
        p = tctx.Process(target=consumer_torch, args=(strategy, socket, inbox, outbox))
        p.start()
        for i in range(runs + 1):
            t0 = now()
            x = torch.empty(n, dtype=torch.float32)
            x.fill_(1.0)
            inbox.put(x)
            handed(i, t0, float(n))
            del x
        inbox.put(None)
        if strategy == "membroker":
            membroker.torch.disable()
    elif method == "shared_memory":
        from multiprocessing import shared_memory
        p = ctx.Process(target=consumer_shm, args=(inbox, outbox))
        p.start()
        for i in range(runs + 1):
            t0 = now()
            shm = shared_memory.SharedMemory(create=True, size=size)
            np.ndarray((n,), dtype=np.float32, buffer=shm.buf)[:] = 1.0
            inbox.put((shm.name, n))
            handed(i, t0, float(n))
            shm.close()
            shm.unlink()
        inbox.put(None)
    else:  # pickle through a pipe
        a_end, b_end = ctx.Pipe()
        p = ctx.Process(target=consumer_pickle, args=(b_end, outbox))
        p.start()
        for i in range(runs + 1):
            t0 = now()
            a = np.ones(n, dtype=np.float32)
            a_end.send_bytes(pickle.dumps(a, protocol=5))
            handed(i, t0, float(n))
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
    # The overhead is the median of each round's own difference: the two loops
    # of a round ran a moment apart, so a round trip that drifts between rounds
    # (the VM's wake-ups) weighs on both sides of it alike.
    each = [p - c for p, c in zip(py, cpp)]
    return {"bench": "python_ping", "calls": rounds * chunk, "rounds": rounds, "python_us": py_us, "cpp_us": cpp_us,
            "overhead_us": statistics.median(each), "overhead_each_us": each}


def state_dict_worker(socket, prefix, ready, go, q):
    import membroker
    import torch  # noqa: F401  (imported before the clock: the bench times the lookups and mappings)
    c = membroker.connect(socket, "bench-state-dict-worker")
    ready.put(os.getpid())
    go.wait(120)
    t0 = now()
    sd = c.lookup_state_dict(prefix, timeout_ms=10000)
    t1 = now()
    q.put((t0, t1, len(sd), sum(t.numel() * t.element_size() for t in sd.values())))


def state_dict_visible(socket, total, tensors, workers):
    """A state dict of `tensors` tensors (total bytes) published once, then looked
    up whole (every tensor mapped, as torch tensors) by `workers` processes at once."""
    import membroker
    import torch
    c = membroker.connect(socket, "bench-state-dict-loader")
    per = total // tensors // 4
    sd = {f"layers.{i}.weight": torch.full((per,), 0.5) for i in range(tensors)}
    prefix = f"bench-sd/{os.getpid()}"
    c.publish_state_dict(prefix, sd, read_only=True)
    del sd
    ctx = mp.get_context("spawn")
    ready, q, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=state_dict_worker, args=(socket, prefix, ready, go, q)) for _ in range(workers)]
    for p in procs:
        p.start()
    for _ in procs:  # every interpreter started, torch imported, connected
        ready.get(timeout=300)
    t0 = now()
    go.set()
    got = [q.get(timeout=300) for _ in procs]
    for p in procs:
        p.join()
    c.unpublish(prefix)
    assert all(n == tensors and b == per * 4 * tensors for _, _, n, b in got), got
    each = sorted((t1 - t) * 1e3 for t, t1, _, _ in got)
    return {"bench": "python_state_dict", "bytes": per * 4 * tensors, "tensors": tensors, "workers": workers,
            "all_visible_ms": (max(t1 for _, t1, _, _ in got) - t0) * 1e3,
            "per_worker_median_ms": statistics.median(each), "per_worker_max_ms": each[-1]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sizes", default="", help="comma-separated sizes in bytes (default: 4 KiB, 1 MiB, 64 MiB, 1 GiB)")
    args = ap.parse_args()
    runs = 3 if args.quick else 10
    sizes = [int(x) for x in args.sizes.split(",")] if args.sizes else SIZES
    for size in sizes:
        r = max(1, runs // 3) if size >= (1 << 30) else runs
        for method, _ in METHODS:
            print(json.dumps(run_case(method, size, r, args.socket)), flush=True)
    print(json.dumps(ping_overhead(args.socket, 5000 if args.quick else 50000)), flush=True)
    print(json.dumps(state_dict_visible(args.socket, 1 << 30, 300, 8)), flush=True)


if __name__ == "__main__":
    main()
