#!/usr/bin/env python3
"""The cluster (docs/CLUSTER.md) between three hosts and etcd on a fourth
(tests/net/hosts.py: network, IPC, PID and mount namespaces joined by a
switch), each host's broker registered with --cluster:
  - a prefill engine on host a connects to decode-0 on host b by its name
    alone and writes into it over the veths, every byte checked;
  - a tensor published for the cluster on b is looked up on c and fetched into
    c's memory through b's membroker-share, every value checked;
  - b's broker SIGKILLed: a cluster subscriber on c hears host_gone, b's names
    leave c's table within the lease, and b's new broker registers with a
    larger generation;
  - etcd SIGKILLed and started again: every host says it is out of reach and
    serves on, then registers again;
  - c's link cut: its record leaves a's table within its lease, c serves on,
    and registers again with a larger generation when the link is back.
Every namespace and process is removed at the end, also when a step fails.

usage: cluster_hosts.py BUILD_DIR   exit 77 (skipped) where namespaces cannot be made or etcd is missing
"""
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hosts import Hosts, HostsUnavailable, children  # noqa: E402

MiB = 1 << 20
SKIP = 77
ETCD_PORT = 47379
ENGINE_PORT = 47312
SHARE_PORT = 47313


def wait_for(what, cond, bound_s=60):
    """Polls cond until it is true; the bound only keeps a broken build from hanging."""
    deadline = time.monotonic() + bound_s
    while True:
        v = cond()
        if v:
            return v
        assert time.monotonic() < deadline, "still waiting after %d s: %s" % (bound_s, what)
        time.sleep(0.05)


def listed(host, *what):
    """`membrokerctl --json list WHAT` on host; None while it answers an error (etcd out of reach)."""
    p = host.spawn([host.build + "/tools/membrokerctl", "--admin-socket", host.socket + ".admin", "--json", "list"] +
                   list(what), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = p.communicate(timeout=30)
    return json.loads(out) if p.returncode == 0 else None


def hosts_seen(host):
    """{name: row} of `list hosts` on host; {} while it answers an error."""
    return {row["host"]: row for row in listed(host, "hosts") or []}


def sanitized(build):
    """True for an ASan build (scripts/test's build-asan), whose Python module needs the runtime preloaded."""
    try:
        return "MEMBROKER_SANITIZE:BOOL=ON" in open(os.path.join(build, "CMakeCache.txt")).read()
    except OSError:
        return False


def python(host, script, *args):
    """A Python process in host, with the build's membroker module; lines on stdout."""
    env = dict(os.environ, PYTHONPATH=os.path.join(host.build, "python"))
    if sanitized(host.build):  # CPython itself is not instrumented: the runtime first, and its leaks not ours
        libasan = subprocess.run(["gcc", "-print-file-name=libasan.so"], stdout=subprocess.PIPE, text=True).stdout
        env.update(LD_PRELOAD=libasan.strip(), ASAN_OPTIONS="detect_leaks=0")
    return host.spawn([sys.executable, "-c", textwrap.dedent(script)] + list(args), env=env,
                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def read_line(proc, what, bound_s=60):
    """The next line of proc's output (bounded: a broken build must not hang the run)."""
    ready, _, _ = select.select([proc.stdout], [], [], bound_s)
    assert ready, "no line from %s within %d s" % (what, bound_s)
    line = proc.stdout.readline().strip()
    assert line, "%s ended (%s)" % (what, proc.poll())
    return line


def finish(proc, what):
    assert proc.wait(timeout=60) == 0, "%s exited %s" % (what, proc.returncode)


def kill_inside(proc):
    """SIGKILLs what nsenter started in a host, then nsenter itself."""
    for pid in children(proc.pid):
        os.kill(pid, signal.SIGKILL)
    proc.kill()
    proc.wait(timeout=30)


def main():
    build = os.path.abspath(sys.argv[1])
    if shutil.which("etcd") is None:
        print("SKIPPED: etcd-server is not installed (scripts/test installs it)")
        return SKIP
    try:
        hosts = Hosts(build, start_brokers=False, tags="abce")
    except HostsUnavailable as e:
        print("SKIPPED: " + str(e))
        return SKIP
    failed = 0
    procs = []  # killed at the end, whatever happened
    a, b, c, e = hosts.a, hosts.b, hosts.c, hosts.e
    url = "http://%s:%d" % (hosts.ip["e"], ETCD_PORT)

    def start_etcd():
        peer = "http://127.0.0.1:%d" % (ETCD_PORT + 1)
        proc = e.spawn(["etcd", "--name", "e", "--data-dir", os.path.join(e.dir, "etcd"), "--listen-client-urls", url,
                        "--advertise-client-urls", url, "--listen-peer-urls", peer,
                        "--initial-advertise-peer-urls", peer, "--initial-cluster", "e=" + peer],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(proc)

        def healthy():
            p = e.spawn(["etcdctl", "--endpoints", url, "endpoint", "health"], stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL)
            return p.wait(timeout=30) == 0
        wait_for("etcd to serve", healthy)
        return proc

    try:
        etcd = start_etcd()
        for h in (a, b, c):
            h.start_broker(["--cluster", "etcd://%s:%d" % (hosts.ip["e"], ETCD_PORT), "--cluster-namespace", "net",
                            "--host-name", "host-" + h.tag, "--cluster-ttl-s", "2"])
        wait_for("the three hosts in c's table", lambda: {"host-a", "host-b", "host-c"} <= set(hosts_seen(c)))
        secrets = hosts.write_secret("cluster-hosts-secret")

        t0 = time.monotonic()
        decode = b.agent("decode")
        decode("init decode-0 listen_address=%s:%d secret_file=%s" % (hosts.ip["b"], ENGINE_PORT, secrets["b"]))
        bi, bbase = decode("alloc broker %d" % (4 * MiB))
        prefill = a.agent("prefill")
        prefill("init prefill-0 secret_file=%s" % secrets["a"])
        ai, _ = prefill("alloc broker %d" % (4 * MiB))
        prefill("fill %s 53" % ai)
        path = prefill("connect decode-0 60000")  # by name: resolved through a's table of the cluster
        assert path[0] == "ucx" and hosts.dev["a"] in path[1], path
        prefill("transfer decode-0 write %s %s 64 65536 65536 10000" % (ai, bbase))
        decode("check %s 53 0 %d" % (bi, 4 * MiB))
        assert hosts_seen(c)["host-b"]["engines"] == "decode-0=%s:%d" % (hosts.ip["b"], ENGINE_PORT)
        print("PASS an engine on host b connected from host a by its name (%.1f s)" % (time.monotonic() - t0))
        prefill.quit()
        decode.quit()

        t0 = time.monotonic()
        share = b.spawn([build + "/tools/membroker-share", "--socket", b.socket, "--listen",
                         "%s:%d" % (hosts.ip["b"], SHARE_PORT), "--secret-file", secrets["b"]],
                        stdout=subprocess.PIPE, text=True)
        procs.append(share)
        assert read_line(share, "membroker-share").startswith("serving as membroker-share@host-b"), "share"
        events = python(c, """
            import sys, membroker
            c = membroker.connect(sys.argv[1], "events")
            c.subscribe("net/", cluster=True)
            print("ready", flush=True)
            while True:
                got, dropped = c.wait_events(1000)
                for e in got:
                    print(e["kind"], e["host"], e["name"], flush=True)
        """, c.socket)
        procs.append(events)
        assert read_line(events, "the subscriber on c") == "ready"
        publisher = python(b, """
            import sys, numpy as np, membroker
            c = membroker.connect(sys.argv[1], "publisher")
            t = c.tensor_from(np.arange(1 << 18, dtype=np.float32))
            c.publish_tensor("net/w", t, read_only=True, persist=True, cluster=True)
        """, b.socket)
        finish(publisher, "the publisher on b")
        fetcher = python(c, """
            import sys, numpy as np, membroker
            c = membroker.connect(sys.argv[1], "fetcher")
            at = c.lookup_cluster("net/w", 60000)
            assert at["host"] == "host-b" and at["read_only"], at
            engine = membroker.TransferEngine(c, "fetcher", {"secret_file": sys.argv[2]})
            t = c.fetch_tensor(engine, "net/w", 60000)
            assert np.array_equal(t.numpy(), np.arange(1 << 18, dtype=np.float32))
            print("fetched", at["generation"], flush=True)
            t.close()
            engine.finalize()
        """, c.socket, secrets["c"])
        line = read_line(fetcher, "the fetcher on c")
        finish(fetcher, "the fetcher on c")
        assert line.startswith("fetched"), line
        assert read_line(events, "the subscriber on c") == "published host-b net/w"
        print("PASS a tensor published on b looked up on c and fetched into c's memory (%.1f s)" %
              (time.monotonic() - t0))

        t0 = time.monotonic()
        generation = hosts_seen(c)["host-b"]["generation"]
        kill_inside(share)
        b.kill_broker()
        assert read_line(events, "the subscriber on c") == "host_gone host-b net/w"
        wait_for("b's names gone from c's table", lambda: listed(c, "names", "--cluster") == [])
        wait_for("b gone from c's table", lambda: "host-b" not in hosts_seen(c))
        b.start_broker()
        back = wait_for("b's new broker in c's table", lambda: hosts_seen(c).get("host-b"))
        assert back["generation"] > generation, (back, generation)
        print("PASS b's broker SIGKILLed: host_gone on c, its names gone, its new broker at generation %d > %d "
              "(%.1f s)" % (back["generation"], generation, time.monotonic() - t0))

        t0 = time.monotonic()
        kill_inside(etcd)
        for h in (a, b, c):
            wait_for("%s to say etcd is out of reach" % h.tag, lambda h=h: h.ctl("stats")["cluster"] == "unreachable")
            assert h.ctl("check")["tables"] == "consistent"  # serves on
        etcd = start_etcd()
        wait_for("the three hosts back in a's table", lambda: {"host-a", "host-b", "host-c"} <= set(hosts_seen(a)))
        for h in (a, b, c):
            wait_for("%s registered again" % h.tag, lambda h=h: h.ctl("stats")["cluster_up"] == 1)
        print("PASS etcd SIGKILLed and started again: the hosts served on and registered again (%.1f s)" %
              (time.monotonic() - t0))

        t0 = time.monotonic()
        generation = hosts_seen(a)["host-c"]["generation"]
        hosts.link(False, "c")
        wait_for("c's record to vanish from a's table", lambda: "host-c" not in hosts_seen(a))
        wait_for("c to say etcd is out of reach", lambda: c.ctl("stats")["cluster"] == "unreachable")
        assert c.ctl("check")["tables"] == "consistent"
        hosts.link(True, "c")
        back = wait_for("c back in a's table", lambda: hosts_seen(a).get("host-c"))
        assert back["generation"] > generation, (back, generation)
        print("PASS c's link cut: its record went within its lease, c came back with generation %d > %d (%.1f s)" %
              (back["generation"], generation, time.monotonic() - t0))
    except Exception as ex:
        failed += 1
        print("FAIL %s" % ex)
    finally:
        for proc in procs:
            if proc.poll() is None:
                kill_inside(proc)
        for problem in hosts.close():
            failed += 1
            print("FAIL " + problem)
    print("%d failed" % failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
