#!/usr/bin/env python3
"""KV-cache blocks from Python: membroker's KvStore against Redis, the store
LMCache's Redis backend uses (docs/KV.md, "Speed").

The same blocks (BATCH keys of BLOCK bytes each) are put once, then read as a
batch again and again; every byte read is touched (a sum over it as uint64
words), whatever the store, so both sides pay the same for reading:
  - membroker: KvStore.batch_get (leases; the blocks are numpy views of broker
    memory mapped once) and the leases released;
  - Redis: MGET through redis-py over a Unix socket (redis-server started here,
    no persistence), the values arriving as bytes objects.
Reported per case: the median batch time, GB/s, and membroker's throughput over
Redis's.

    bench/kv_vs_redis.py --socket S [--quick]      (JSON lines on stdout)
Exits 0 with a "kv_redis_skipped" line where redis-server or redis-py is missing.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

CASES = [(16 << 10, 64), (256 << 10, 64), (256 << 10, 256)]


def touch(buf) -> int:
    """Reads every byte (as uint64 words): what a consumer of the block pays."""
    return int(np.frombuffer(buf, dtype=np.uint64).sum(dtype=np.uint64))


def median_ms(fn, rounds: int) -> float:
    fn()  # warm: mappings, connections, allocator
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def start_redis(work: str):
    sock = os.path.join(work, "redis.sock")
    p = subprocess.Popen(["redis-server", "--port", "0", "--unixsocket", sock, "--save", "", "--appendonly", "no",
                          "--dir", work, "--maxmemory", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis
    r = redis.Redis(unix_socket_path=sock)
    deadline = time.monotonic() + 10
    while True:  # bounded wait for its socket to answer
        try:
            r.ping()
            return p, r
        except (redis.ConnectionError, FileNotFoundError):
            if time.monotonic() > deadline or p.poll() is not None:
                p.kill()
                raise SystemExit("redis-server did not start")
            time.sleep(0.02)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    try:
        import redis  # noqa: F401
    except ImportError:
        print(json.dumps({"bench": "kv_redis_skipped", "why": "python3-redis is not installed"}))
        return 0
    if shutil.which("redis-server") is None:
        print(json.dumps({"bench": "kv_redis_skipped", "why": "redis-server is not installed"}))
        return 0
    import membroker
    rounds = 10 if args.quick else 40
    c = membroker.connect(args.socket, "bench-kv-redis")
    with tempfile.TemporaryDirectory(prefix="mb-redis-") as work:
        proc, r = start_redis(work)
        try:
            for block, batch in CASES:
                name = f"bench/redis-{block}-{batch}"
                store = membroker.KvStore.create(c, name, block_size=block, capacity=2 * batch * block)
                keys = [b"block-%d-%d" % (block, i) for i in range(batch)]
                values = [np.random.default_rng(i).integers(0, 255, block, dtype=np.uint8) for i in range(batch)]
                assert store.batch_set(keys, values) == [True] * batch
                r.flushall()
                r.mset({k: v.tobytes() for k, v in zip(keys, values)})
                want = sum(touch(v) for v in values) & ((1 << 64) - 1)

                def get_membroker():
                    with store.batch_get(keys) as got:
                        assert got.leading == batch
                        s = sum(touch(b) for b in got) & ((1 << 64) - 1)
                    assert s == want

                def get_redis():
                    got = r.mget(keys)
                    s = sum(touch(b) for b in got) & ((1 << 64) - 1)
                    assert s == want

                mb_ms = median_ms(get_membroker, rounds)
                redis_ms = median_ms(get_redis, rounds)
                membroker.KvStore.drop(c, name)
                gb = block * batch / 1e9
                print(json.dumps({"bench": "kv_redis", "block_bytes": block, "batch": batch, "rounds": rounds,
                                  "membroker_ms": mb_ms, "redis_ms": redis_ms, "membroker_gbps": gb / (mb_ms / 1000),
                                  "redis_gbps": gb / (redis_ms / 1000), "ratio": redis_ms / mb_ms}), flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
