#!/usr/bin/env python3
"""What a fetch of a named object from another host costs (docs/CLUSTER.md,
"Fetching a name from another host"): Client.fetch_named on host a, from host
b's membroker-share, against the floor of the same bytes moved by one engine
READ between the same two brokers' engines (what a user who carried the
address by hand would do). The fetch adds a cluster lookup, the share's card,
new memory mapped and registered, and the checksum of every byte. New memory
costs what the broker's allocation of it costs (its pages cleared): that is
timed on its own too, so the ratio can be read against the floor with it
(fetch / (READ + new memory)). Two brokers, one etcd and one membroker-share
on loopback.

    PYTHONPATH=build/python MEMBROKERD=build/broker/membrokerd bench/cluster_fetch.py [N]

Prints, per size, the median of N fetches (default 10), of N floor READs and
of N allocations of new memory of that size, in ms (GB/s for the first two),
and the ratios. Not part of bench/run's goals.
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import membroker
from membroker.testing import broker

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster_names import start_etcd  # noqa: E402

SIZES = [1 << 20, 64 << 20, 256 << 20]


def share_binary():
    daemon = os.environ.get("MEMBROKERD") or shutil.which("membrokerd")
    built = os.path.join(os.path.dirname(os.path.dirname(daemon)), "tools", "membroker-share")
    return built if os.path.exists(built) else shutil.which("membroker-share")


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    directory = tempfile.mkdtemp(prefix="membroker-bench.")
    secret = os.path.join(directory, "secret")
    with open(secret, "w") as f:
        f.write("bench-secret\n")
    os.chmod(secret, 0o600)
    etcd, port = start_etcd(directory)
    share = None
    rows = []
    try:
        cluster = ["--cluster", f"etcd://127.0.0.1:{port}", "--cluster-namespace", "bench", "--log-level", "warn"]
        with broker(*cluster, "--host-name", "bench-a") as a, broker(*cluster, "--host-name", "bench-b") as b:
            pub = membroker.connect(b.socket, "publisher")
            floor_b = membroker.TransferEngine(pub, "floor-b", {"listen_address": "127.0.0.1:0", "secret_file": secret})
            objects = []
            for size in SIZES:
                h = pub.malloc_physical(size)
                m = pub.map_handle(h)
                memoryview(m)[:] = os.urandom(4096) * (size // 4096)
                pub.publish(f"bench/obj-{size}", h, read_only=True, cluster=True)
                floor_b.register_mem(m, f"obj-{size}")
                objects.append((size, h, m))
            share = subprocess.Popen([share_binary(), "--socket", b.socket, "--listen", "127.0.0.1:0",
                                      "--secret-file", secret], stdout=subprocess.PIPE, text=True)
            assert share.stdout.readline().startswith("serving as")
            c = membroker.connect(a.socket, "fetcher")
            engine = membroker.TransferEngine(c, "fetcher", {"secret_file": secret})
            engine.connect("floor-b", 60000)
            regions = engine.remote_regions("floor-b")
            for size, _, _ in objects:
                dst_h = c.malloc_physical(size)
                dst = c.map_handle(dst_h)
                engine.register_mem(dst)
                local = dst.address
                remote = regions[f"obj-{size}"]["address"]
                floor, fetch, fresh = [], [], []
                c.fetch_named(engine, f"bench/obj-{size}", 60000)  # warm: connects to the share
                for _ in range(n):
                    t0 = time.perf_counter()
                    engine.transfer_sync("floor-b", "read", [(local, remote, size)], 60000)
                    floor.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    new = c.malloc_physical(size)
                    fresh.append(time.perf_counter() - t0)
                    del new
                    t0 = time.perf_counter()
                    got = c.fetch_named(engine, f"bench/obj-{size}", 60000)
                    fetch.append(time.perf_counter() - t0)
                    assert got["copied"] and got["size"] == size
                    del got
                rows.append((size, statistics.median(fetch), statistics.median(floor), statistics.median(fresh)))
            engine.finalize()
            floor_b.finalize()
    finally:
        if share is not None:
            share.terminate()
            share.wait(60)
        etcd.kill()
        etcd.wait()
        shutil.rmtree(directory, ignore_errors=True)
    print(f"{'size':>8s}  {'fetch_named':>22s}  {'floor: one READ':>22s}  {'new memory':>10s}"
          f"  {'fetch/READ':>10s}  {'fetch/(READ+new)':>16s}   (medians)")
    for size, fm, rm, nm in rows:
        print(f"{size >> 20:6d} MiB  {fm * 1e3:9.2f} ms {size / fm / 1e9:5.2f} GB/s  {rm * 1e3:9.2f} ms "
              f"{size / rm / 1e9:5.2f} GB/s  {nm * 1e3:7.2f} ms  {fm / rm:9.2f}x  {fm / (rm + nm):15.2f}x")


if __name__ == "__main__":
    main()
