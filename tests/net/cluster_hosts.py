#!/usr/bin/env python3
"""The cluster (docs/CLUSTER.md) between two hosts (tests/net/hosts.py: network,
IPC, PID and mount namespaces joined by a veth pair). etcd runs in host a; each
host's broker registers with --cluster. A prefill engine on a connects to
decode-0 on b by its name alone and writes into it over the veth, every byte
checked; then the link is cut: b's record vanishes from a's table within its
lease, b serves on and says etcd is out of reach; the link comes back: b
registers again with a new generation.

usage: cluster_hosts.py BUILD_DIR   exit 77 (skipped) where namespaces cannot be made or etcd is missing
"""
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hosts import Hosts, HostsUnavailable  # noqa: E402

MiB = 1 << 20
SKIP = 77
ETCD_PORT = 47379
ENGINE_PORT = 47312


def wait_for(what, cond, bound_s=60):
    """Polls cond until it is true; the bound only keeps a broken build from hanging."""
    deadline = time.monotonic() + bound_s
    while True:
        v = cond()
        if v:
            return v
        assert time.monotonic() < deadline, "still waiting after %d s: %s" % (bound_s, what)
        time.sleep(0.05)


def hosts_seen(host):
    """{name: row} of `membrokerctl list hosts` on host; {} while it answers an error."""
    p = host.spawn([host.build + "/tools/membrokerctl", "--admin-socket", host.socket + ".admin", "--json", "list",
                    "hosts"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = p.communicate(timeout=30)
    if p.returncode != 0:
        return {}
    import json
    return {row["host"]: row for row in json.loads(out)}


def main():
    build = os.path.abspath(sys.argv[1])
    if shutil.which("etcd") is None:
        print("SKIPPED: etcd-server is not installed (scripts/test installs it)")
        return SKIP
    try:
        hosts = Hosts(build, start_brokers=False)
    except HostsUnavailable as e:
        print("SKIPPED: " + str(e))
        return SKIP
    failed = 0
    etcd = None
    try:
        url = "http://%s:%d" % (hosts.ip["a"], ETCD_PORT)
        peer = "http://127.0.0.1:%d" % (ETCD_PORT + 1)
        data = os.path.join(hosts.a.dir, "etcd")
        etcd = hosts.a.spawn(["etcd", "--name", "e", "--data-dir", data, "--listen-client-urls", url,
                              "--advertise-client-urls", url, "--listen-peer-urls", peer,
                              "--initial-advertise-peer-urls", peer, "--initial-cluster", "e=" + peer],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def healthy():
            p = hosts.a.spawn(["etcdctl", "--endpoints", url, "endpoint", "health"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
            return p.wait(timeout=30) == 0
        wait_for("etcd to serve", healthy)
        for h in hosts.hosts:
            h.start_broker(["--cluster", "etcd://%s:%d" % (hosts.ip["a"], ETCD_PORT), "--cluster-namespace", "net",
                            "--host-name", "host-" + h.tag, "--cluster-ttl-s", "2"])
        wait_for("both hosts in a's table", lambda: {"host-a", "host-b"} <= set(hosts_seen(hosts.a)))
        secrets = hosts.write_secret("cluster-hosts-secret")

        t0 = time.monotonic()
        decode = hosts.b.agent("decode")
        decode("init decode-0 listen_address=%s:%d secret_file=%s" % (hosts.ip["b"], ENGINE_PORT, secrets["b"]))
        bi, bbase = decode("alloc broker %d" % (4 * MiB))
        prefill = hosts.a.agent("prefill")
        prefill("init prefill-0 secret_file=%s" % secrets["a"])
        ai, _ = prefill("alloc broker %d" % (4 * MiB))
        prefill("fill %s 53" % ai)
        path = prefill("connect decode-0 60000")  # by name: resolved through a's table of the cluster
        assert path[0] == "ucx" and hosts.dev["a"] in path[1], path
        prefill("transfer decode-0 write %s %s 64 65536 65536 10000" % (ai, bbase))
        decode("check %s 53 0 %d" % (bi, 4 * MiB))
        row = hosts_seen(hosts.a)["host-b"]
        assert row["engines"] == "decode-0=%s:%d" % (hosts.ip["b"], ENGINE_PORT), row
        print("PASS an engine on the other host connected by its name (%.1f s)" % (time.monotonic() - t0))
        prefill.quit()
        decode.quit()

        t0 = time.monotonic()
        generation = row["generation"]
        hosts.link(False)  # b can no longer reach etcd (nor a)
        wait_for("b's record to vanish from a's table", lambda: "host-b" not in hosts_seen(hosts.a))
        assert hosts.a.ctl("stats")["cluster_hosts_gone"] >= 1
        wait_for("b to say etcd is out of reach", lambda: hosts.b.ctl("stats")["cluster"] == "unreachable")
        assert hosts.b.ctl("check")["tables"] == "consistent"  # b serves on
        hosts.link(True)
        back = wait_for("b back in a's table", lambda: hosts_seen(hosts.a).get("host-b"))
        assert back["generation"] > generation, (back, generation)
        assert hosts.b.ctl("stats")["cluster_up"] == 1
        print("PASS the link cut: b's record went within its lease, b came back with generation %d > %d (%.1f s)" %
              (back["generation"], generation, time.monotonic() - t0))
    except Exception as e:
        failed += 1
        print("FAIL %s" % e)
    finally:
        if etcd is not None:
            subprocess.run(["kill", "-KILL"] + [str(p) for p in _children(etcd.pid)], check=False)
            etcd.kill()
            etcd.wait()
        for problem in hosts.close():
            failed += 1
            print("FAIL " + problem)
    print("%d failed" % failed)
    return 1 if failed else 0


def _children(pid):
    from hosts import children
    return children(pid)


if __name__ == "__main__":
    sys.exit(main())
