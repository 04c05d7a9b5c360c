#!/usr/bin/env python3
"""TransferSync between two hosts (tests/net/hosts.py: namespaces joined by a
veth pair, a membrokerd in each) against ucx_perftest (ucp_get, ucp_put_bw, with
the engine's UCX settings) and a plain TCP stream (bench_tcp_stream: one
connection) over the same link, in the same run. JSON lines on stdout.

  net_transfer.py BUILD_DIR [--quick]
Exits 0 with one {"bench": "net_skipped", "why": ...} line where the two hosts
cannot be made (not root, no ip/unshare, no ucx_perftest).
"""
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "net"))
from hosts import Hosts, HostsUnavailable, run  # noqa: E402

MiB = 1 << 20
ENGINE_PORT = 47411
PERF_PORT = 47412
TCP_PORT = 47413

def listening(host, port):
    out = run("nsenter", "-t", str(host.init_pid), "-n", "--", "ss", "-ltnH", check=False)
    return (":%d " % port) in out


def wait_listening(host, port, proc, what):
    deadline = time.monotonic() + 20
    while not listening(host, port):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(what + " did not start listening")
        time.sleep(0.01)


def tcp_stream(hosts, total):
    tool = os.path.join(hosts.build, "bench", "bench_tcp_stream")
    server = hosts.b.spawn([tool, "serve", hosts.ip["b"], str(TCP_PORT)], stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().strip() == "ready"
    client = hosts.a.spawn([tool, "send", hosts.ip["b"], str(TCP_PORT), str(total)], stdout=subprocess.PIPE, text=True)
    seconds = float(client.stdout.readline())
    client.wait(timeout=60)
    received = int(server.stdout.readline())
    server.wait(timeout=60)
    return {"bench": "net_tcp", "bytes": received, "seconds": seconds, "bw_Bps": received / seconds}


# ucx_perftest runs with the TCP settings the engine gives UCX (libclient/transfer/ucx/ucx_transport.cc):
# the same transport configuration on both sides of the comparison.
ENGINE_UCX_ENV = {"UCX_TCP_TX_SEG_SIZE": "128k", "UCX_TCP_RX_SEG_SIZE": "512k"}


def perftest(hosts, test, size, iters, warmup, extra=()):
    env = dict(os.environ, **ENGINE_UCX_ENV)
    server = hosts.b.spawn(["ucx_perftest", "-p", str(PERF_PORT)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, env=env)
    try:
        wait_listening(hosts.b, PERF_PORT, server, "ucx_perftest's server")
        client = hosts.a.spawn(["ucx_perftest", hosts.ip["b"], "-p", str(PERF_PORT), "-t", test, "-s", str(size),
                                "-n", str(iters), "-w", str(warmup), "-f"] + list(extra),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        out, _ = client.communicate(timeout=300)
        server.wait(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    rows = [line.split() for line in out.splitlines() if line.strip() and line.split()[0].isdigit()]
    if client.returncode != 0 or not rows:
        raise RuntimeError("ucx_perftest %s -s %d failed: %s" % (test, size, out[-400:]))
    f = rows[-1]  # iterations, latency 50%/avg/overall, MB/s avg/overall, msg/s avg/overall
    return {"bench": "net_perftest", "test": test, "size": size, "iterations": int(f[0]), "options": " ".join(extra),
            "bw_Bps": float(f[5]) * MiB, "msg_rate": float(f[7]), "latency_us": float(f[2])}


# (name, descriptors, size, stride) of each TransferSync case, with the ucx_perftest
# run it is compared with: outstanding operations (-O) and iterations (quick, full).
# -O: the best we found for each size; unlimited (its default) stalls put_bw over TCP
# from 1 MiB up (0.03 GB/s at 64 MiB), and more than one 64 MiB operation in flight does too.
CASES = [("1000x4KiB", 1000, 4096, 8192, "64", (20000, 100000)),
         ("64x1MiB", 64, MiB, MiB, "16", (300, 2000)),
         ("1x64MiB", 1, 64 * MiB, 0, "1", (10, 40))]
PERFTEST_OF = {"read": "ucp_get", "write": "ucp_put_bw"}


def median(values):
    v = sorted(values)
    return v[len(v) // 2]


def interleaved(hosts, quick):
    """Each case's TransferSync and its ucx_perftest run alternate, round after round,
    so a machine that drifts (this VM flips between two speeds) moves both; the rows are
    medians over the rounds."""
    secret = hosts.write_secret("bench")
    b = hosts.b.agent("decode")
    addr = b("init decode listen_address=%s:%d secret_file=%s" % (hosts.ip["b"], ENGINE_PORT, secret["b"]))[0]
    a = hosts.a.agent("prefill")
    a("init prefill secret_file=%s" % secret["a"])
    rounds = 5 if quick else 9
    repeat = 3 if quick else 10
    ours, peer = {}, {}
    try:
        remote, local = {}, {}
        for kind in ("broker", "host"):
            remote[kind] = b("alloc %s %d" % (kind, 64 * MiB))
            local[kind] = a("alloc %s %d" % (kind, 64 * MiB))
        path = a("connect %s 5000" % addr)
        for op in ("read", "write"):
            for name, count, size, stride, _, _ in CASES:
                for kind in ("broker", "host"):  # warm-up
                    a("transfer %s %s %s %s %d %d %d 30000" % (addr, op, local[kind][0], remote[kind][1], count, size, stride))
        for _ in range(rounds):
            for op in ("read", "write"):
                for name, count, size, stride, outstanding, iters in CASES:
                    n = iters[0] if quick else iters[1]
                    peer.setdefault((op, name), []).append(
                        perftest(hosts, PERFTEST_OF[op], size, n, max(n // 10, 2), ("-O", outstanding)))
                    for kind in ("broker", "host"):
                        _, med = (float(x) for x in a("transfer %s %s %s %s %d %d %d 30000 %d" % (
                            addr, op, local[kind][0], remote[kind][1], count, size, stride, repeat)))
                        ours.setdefault((kind, op, name), []).append(med)
    finally:
        a.quit()
        b.quit()
    rows = []
    for (op, name), runs in peer.items():
        row = dict(runs[0])
        row.update({"rounds": len(runs), "bw_Bps": median([r["bw_Bps"] for r in runs]),
                    "msg_rate": median([r["msg_rate"] for r in runs]),
                    "bw_Bps_each": [r["bw_Bps"] for r in runs]})
        rows.append(row)
    for (kind, op, name), meds in ours.items():
        count, size = next((c[1], c[2]) for c in CASES if c[0] == name)
        med = median(meds)
        rows.append({"bench": "net_transfer", "memory": kind, "op": op, "case": name, "count": count, "size": size,
                     "rounds": len(meds), "repeat": repeat, "median_us": med, "median_us_each": meds,
                     "bw_Bps": count * size / (med / 1e6), "msg_rate": count / (med / 1e6),
                     "path": path[0], "transports": path[1]})
    return rows


def main():
    build = os.path.abspath(sys.argv[1])
    quick = "--quick" in sys.argv
    if shutil.which("ucx_perftest") is None:
        print(json.dumps({"bench": "net_skipped", "why": "ucx_perftest is not installed (ucx-utils)"}))
        return 0
    try:
        hosts = Hosts(build, agent_path=os.path.join(build, "bench", "bench_engine_agent"))
    except HostsUnavailable as e:
        print(json.dumps({"bench": "net_skipped", "why": str(e)}))
        return 0
    try:
        rows = [tcp_stream(hosts, (1 << 30) if quick else (4 << 30))]
        rows += interleaved(hosts, quick)
    finally:
        hosts.close()
    for r in rows:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
