#!/usr/bin/env python3
"""How long a name published for the cluster on host b takes to be seen on
host a (docs/CLUSTER.md): a LookupCluster waiting on a is answered when b's
record, rewritten in etcd, comes back to a through its watch. Two brokers and
one etcd on loopback. The floor beside it: one put to etcd over its JSON
gateway, the one write the publish makes (the watch's delivery comes on top).

    PYTHONPATH=build/python MEMBROKERD=build/broker/membrokerd bench/cluster_names.py [N]

Prints the median and the worst of N publishes (default 50) and of N
unpublishes (until a lookup on a says NOT_FOUND), and the ratio to the floor.
Not part of bench/run's goals.
"""
import base64
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import membroker
from membroker.testing import broker


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_etcd(directory):
    client, peer = free_port(), free_port()
    url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    proc = subprocess.Popen(["etcd", "--name", "bench", "--data-dir", os.path.join(directory, "etcd"),
                             "--listen-client-urls", url, "--advertise-client-urls", url,
                             "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                             "--initial-cluster", "bench=" + peer_url],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while subprocess.run(["etcdctl", "--endpoints", url, "endpoint", "health"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL).returncode != 0:
        if time.monotonic() > deadline:
            raise RuntimeError("etcd did not start")
        time.sleep(0.05)
    return proc, client


def put_floor(port, n):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    times = []
    for i in range(n):
        body = json.dumps({"key": base64.b64encode(b"/bench/floor").decode(),
                           "value": base64.b64encode(b"x" * 200).decode()})
        t0 = time.perf_counter()
        conn.request("POST", "/v3/kv/put", body, {"Content-Type": "application/json"})
        conn.getresponse().read()
        times.append(time.perf_counter() - t0)
    return times


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    directory = tempfile.mkdtemp(prefix="membroker-bench.")
    etcd, port = start_etcd(directory)
    try:
        cluster = ["--cluster", f"etcd://127.0.0.1:{port}", "--cluster-namespace", "bench", "--log-level", "warn"]
        with broker(*cluster, "--host-name", "bench-a") as a, broker(*cluster, "--host-name", "bench-b") as b:
            reader = membroker.connect(a.socket, "reader")
            writer = membroker.connect(b.socket, "writer")
            handle = writer.malloc_physical(1 << 20)
            while True:  # both registered and watching
                try:
                    reader.lookup_cluster("bench/none", 0)
                except membroker.NotFound:
                    break
                except membroker.NotConnected:
                    time.sleep(0.01)
            published, unpublished = [], []
            for i in range(n):
                name = f"bench/w{i}"
                got = {}
                waiter = threading.Thread(target=lambda: got.update(at=reader.lookup_cluster(name, 10000),
                                                                    t=time.perf_counter()))
                waiter.start()
                time.sleep(0.005)  # let the lookup reach the broker and wait there (not a verdict: a timing)
                t0 = time.perf_counter()
                writer.publish(name, handle, cluster=True)
                waiter.join()
                assert got["at"]["host"] == "bench-b", got
                published.append(got["t"] - t0)
                t0 = time.perf_counter()
                writer.unpublish(name)
                while True:
                    try:
                        reader.lookup_cluster(name, 0)
                    except membroker.NotFound:
                        break
                unpublished.append(time.perf_counter() - t0)
            floor = put_floor(port, n)
    finally:
        etcd.kill()
        etcd.wait()
        shutil.rmtree(directory, ignore_errors=True)
    f = statistics.median(floor)
    for label, t in (("publish on b -> waiting lookup on a answered", published),
                     ("unpublish on b -> lookup on a NOT_FOUND", unpublished),
                     ("floor: one etcd put over the JSON gateway", floor)):
        m = statistics.median(t)
        print(f"{label:48s} median {m * 1e3:7.2f} ms  worst {max(t) * 1e3:7.2f} ms  {m / f:5.2f}x the floor")


if __name__ == "__main__":
    main()
