#!/usr/bin/env python3
"""How long a name published for the cluster on host b takes to be seen on
host a (docs/CLUSTER.md): a LookupCluster waiting on a is answered when b's
record, rewritten in etcd, comes back to a through its watch. Two brokers and
one etcd on loopback. The floor beside it: one put to etcd over its JSON
gateway, the one write the publish makes (the watch's delivery comes on top).

    PYTHONPATH=build/python MEMBROKERD=build/broker/membrokerd bench/cluster_names.py [N]

Prints the median and the worst of N publishes (default 50) and of N
unpublishes (until a lookup on a says NOT_FOUND), and the ratio to the floor.
Then what a lookup costs: LookupCluster of another host's name (answered from
the broker's table of the cluster), of this host's own, and a plain local
Lookup (an import of the object), N each. Then a host's death: a third broker,
c, with a lease of 2 s publishes a name and is SIGKILLed, 3 times: the time
until a lookup on a says NOT_FOUND and until a cluster subscriber on a hears
host_gone; and once stopped in order (SIGTERM, its lease revoked).
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


def timed(fn, n):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def measure_lookups(reader, writer, n):
    """(label, times) of a cluster lookup of another host's name, of this host's own, and of a local Lookup."""
    far, near = writer.malloc_physical(1 << 20), reader.malloc_physical(1 << 20)
    writer.publish("bench/far", far, cluster=True)
    reader.publish("bench/near", near, cluster=True)
    other = membroker.connect(reader.socket, "local-reader")
    while True:  # b's record back at a
        try:
            reader.lookup_cluster("bench/far", 0)
            break
        except membroker.NotFound:
            time.sleep(0.01)
    return [("LookupCluster of another host's name", timed(lambda: reader.lookup_cluster("bench/far", 0), n)),
            ("LookupCluster of this host's name", timed(lambda: reader.lookup_cluster("bench/near", 0), n)),
            ("local Lookup (an import of the object)", timed(lambda: other.lookup("bench/near", 0), n))]


def gone_after(reader, events, name, stop):
    """stop() a host; (seconds until a lookup on a says NOT_FOUND, until its name's end is heard:
    host_gone, or unpublished where an orderly stop rewrote the record before it revoked it)."""
    t0 = time.perf_counter()
    stop()
    lookup_gone = heard = None
    while lookup_gone is None or heard is None:
        if lookup_gone is None:
            try:
                reader.lookup_cluster(name, 0)
            except membroker.NotFound:
                lookup_gone = time.perf_counter() - t0
        if heard is None:
            got, _ = events.wait_events(1)
            if any(e["kind"] in ("host_gone", "unpublished") and e["name"] == name for e in got):
                heard = time.perf_counter() - t0
        if time.perf_counter() - t0 > 60:
            raise RuntimeError("the dead host's name did not go within 60 s")
    return lookup_gone, heard


def measure_deaths(cluster, reader):
    events = membroker.connect(reader.socket, "events")
    events.subscribe("bench/", cluster=True)
    rows = []
    with broker(*cluster, "--host-name", "bench-c", "--cluster-ttl-s", "2") as c:
        for i in range(3):
            name = f"bench/c{i}"
            publisher = membroker.connect(c.socket, "publisher")
            publisher.publish(name, publisher.malloc_physical(1 << 20), cluster=True)
            reader.lookup_cluster(name, 60000)
            while not any(e["name"] == name for e in events.wait_events(1000)[0]):
                pass  # its published event: the subscription is quiet before the death
            rows.append(("SIGKILL",) + gone_after(reader, events, name, c.process.kill))
            c.process.wait()
            c.kill_and_restart()
            del publisher
    with broker(*cluster, "--host-name", "bench-d", "--cluster-ttl-s", "2") as d:
        publisher = membroker.connect(d.socket, "publisher")
        publisher.publish("bench/d", publisher.malloc_physical(1 << 20), cluster=True)
        reader.lookup_cluster("bench/d", 60000)
        while not any(e["name"] == "bench/d" for e in events.wait_events(1000)[0]):
            pass
        rows.append(("SIGTERM",) + gone_after(reader, events, "bench/d", lambda: d.process.send_signal(15)))
        d.process.wait()
        d.kill_and_restart()  # the context's end stops a live broker
    return rows


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
            lookups = measure_lookups(reader, writer, n)
            deaths = measure_deaths(cluster, reader)
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
    for label, t in lookups:
        print(f"{label:48s} median {statistics.median(t) * 1e6:7.1f} us  worst {max(t) * 1e6:8.1f} us")
    for how, lookup_gone, heard in deaths:
        print(f"host c {how:7s} (lease 2 s): lookup on a NOT_FOUND after {lookup_gone:6.3f} s, "
              f"its end heard by a subscriber on a after {heard:6.3f} s")


if __name__ == "__main__":
    main()
