#!/usr/bin/env python3
"""Transfer engines on two hosts (tests/net/hosts.py: namespaces joined by a
veth pair, a membrokerd in each): READ and WRITE in both memory kinds, every
byte checked; validation; refusal without the secret; the remote engine
SIGKILLed mid-batch; the link down; deregistration during transfers; notifies;
an ip:port that is this host's own engine takes the same-host path; CUDA device
memory on both hosts (the driver double where no GPU is).

usage: two_hosts.py BUILD_DIR [TEST ...]   exit 77 (skipped) where namespaces cannot be made
"""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hosts import Hosts, HostsUnavailable  # noqa: E402

MiB = 1 << 20
SKIP = 77
PARAM_INVALID = 1  # ErrorCode::kParamInvalid (ipc/include/membroker/status.h)
PORT = 47311


class Pair:
    """decode (b, listening) and prefill (a, connected to it), each with 64 MiB of each memory kind."""

    def __init__(self, hosts, secrets, port=PORT, decode_options=""):
        self.hosts = hosts
        self.b = hosts.b.agent("decode")
        self.addr = self.b("init decode listen_address=%s:%d secret_file=%s %s" %
                           (hosts.ip["b"], port, secrets["b"], decode_options))[0]
        assert self.addr == "%s:%d" % (hosts.ip["b"], port), self.addr
        self.b_mem = {}
        for kind in ("broker", "host"):
            index, base = self.b("alloc %s %d" % (kind, 64 * MiB))
            self.b_mem[kind] = (int(index), int(base))
            self.b("fill %s 2" % index)
        self.a = hosts.a.agent("prefill")
        self.a("init prefill secret_file=%s" % secrets["a"])
        self.a_mem = {}
        for kind in ("broker", "host"):
            index, base = self.a("alloc %s %d" % (kind, 64 * MiB))
            self.a_mem[kind] = (int(index), int(base))
        path = self.a("connect %s 5000" % self.addr)
        assert path[0] == "ucx", path
        # The veth carries it: UCX names the device it chose.
        assert hosts.dev["a"] in path[1], path
        # And the operator sees the same path (membrokerctl list engines on host a).
        engines = {e["engine"]: e for e in hosts.a.ctl("list", "engines")}
        conns = engines["prefill"]["net_connections"]
        assert conns == "%s=ucx(%s)" % (self.addr, path[1]), engines
        stats = hosts.a.ctl("stats")
        assert stats["engine_connections_ucx"] == 1, stats

    def close(self):
        self.a.quit()
        self.b.quit()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def final_status(agent, bound_s, what):
    """Polls the agent's last TransferAsync until it is no longer WAITING (at most bound_s)."""
    deadline = time.monotonic() + bound_s
    while True:
        st = agent("status")
        if st[0] != "WAITING":
            return st
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_read_write_every_byte(hosts, secrets):
    with Pair(hosts, secrets) as p:
        for a_kind in ("broker", "host"):
            for b_kind in ("broker", "host"):
                ai, _ = p.a_mem[a_kind]
                bi, bbase = p.b_mem[b_kind]
                # 1000 scattered 4 KiB descriptors, every other page.
                p.a("fill %d 7" % ai)
                p.a("transfer %s write %d %d 1000 4096 8192 10000" % (p.addr, ai, bbase))
                for i in (0, 1, 499, 999):
                    p.b("check %d 7 %d 4096" % (bi, i * 8192))
                    p.b("check %d 2 %d 4096" % (bi, i * 8192 + 4096))  # the gaps are untouched
                p.b("check %d 7 %d %d" % (bi, 0, 4096))
                p.b("fill %d 11" % bi)
                p.a("transfer %s read %d %d 1000 4096 8192 10000" % (p.addr, ai, bbase))
                for i in range(0, 1000, 37):
                    p.a("check %d 11 %d 4096" % (ai, i * 8192))
                    p.a("check %d 7 %d 4096" % (ai, i * 8192 + 4096))
                # One 64 MiB descriptor each way.
                p.a("fill %d 13" % ai)
                p.a("transfer %s write %d %d 1 %d 0 20000" % (p.addr, ai, bbase, 64 * MiB))
                p.b("check %d 13 0 %d" % (bi, 64 * MiB))
                p.b("fill %d 17" % bi)
                p.a("transfer %s read %d %d 1 %d 0 20000" % (p.addr, ai, bbase, 64 * MiB))
                p.a("check %d 17 0 %d" % (ai, 64 * MiB))
                p.b("fill %d 2" % bi)


def test_descriptors_checked_before_any_byte_moves(hosts, secrets):
    with Pair(hosts, secrets) as p:
        ai, _ = p.a_mem["broker"]
        bi, bbase = p.b_mem["broker"]
        p.a("fill %d 5" % ai)
        # Descriptor 3 runs past the end of decode's 64 MiB: nothing is written.
        line = p.a("transfer %s write %d %d 4 %d %d 5000" % (p.addr, ai, bbase + 61 * MiB, MiB, MiB), expect_ok=False)
        assert line.startswith("err PARAM_INVALID descriptor 3:"), line
        p.b("check %d 2 %d %d" % (bi, 61 * MiB, 3 * MiB))
        line = p.a("transfer %s read %d 4096 1 4096 0 5000" % (p.addr, ai), expect_ok=False)
        assert line.startswith("err PARAM_INVALID descriptor 0:"), line
        line = p.a("transfer 10.213.0.99:1 read %d %d 1 4096 0 5000" % (ai, bbase), expect_ok=False)
        assert line.startswith("err NOT_CONNECTED"), line


def test_refused_without_the_secret(hosts, secrets):
    b = hosts.b.agent("decode")
    addr = b("init decode listen_address=%s:%d secret_file=%s allow_from=10.99.0.0/16" %
             (hosts.ip["b"], PORT, secrets["b"]))[0]
    b("alloc broker %d" % MiB)
    intruder = hosts.a.agent("intruder")
    intruder("init intruder")
    line = intruder("connect %s 5000" % addr, expect_ok=False)
    assert line.startswith("err PERMISSION_DENIED") and "presented no secret" in line, line
    wrong = os.path.join(hosts.a.dir, "wrong")
    with open(wrong, "w") as f:
        f.write("not-the-secret\n")
    os.chmod(wrong, 0o600)
    guesser = hosts.a.agent("guesser")
    guesser("init guesser secret_file=%s" % wrong)
    line = guesser("connect %s 5000" % addr, expect_ok=False)
    assert line.startswith("err PERMISSION_DENIED") and "wrong secret" in line, line
    stats = b("stats")
    assert "refused=2" in stats and "accepted=0" in stats, stats
    engines = {e["engine"]: e for e in hosts.b.ctl("list", "engines")}
    assert engines["decode"]["net_refused"] == 2 and engines["decode"]["listen"] == addr, engines
    # A secret file others can read is refused at Initialize.
    os.chmod(wrong, 0o644)
    careless = hosts.a.agent("careless")
    line = careless("init careless secret_file=%s" % wrong, expect_ok=False)
    assert line.startswith("err PERMISSION_DENIED") and "chmod 600" in line, line
    # A listener with neither a secret nor allow_from admits nobody: refused at Initialize.
    open_door = hosts.b.agent("open")
    line = open_door("init open listen_address=%s:0" % hosts.ip["b"], expect_ok=False)
    assert line.startswith("err PARAM_INVALID") and "admits nobody" in line, line
    for x in (b, intruder, guesser, careless, open_door):
        x.quit()
    # allow_from admits host a's address without a secret.
    b = hosts.b.agent("decode")
    addr = b("init decode listen_address=%s:%d allow_from=%s/32" % (hosts.ip["b"], PORT, hosts.ip["a"]))[0]
    guest = hosts.a.agent("guest")
    guest("init guest")
    assert guest("connect %s 5000" % addr)[0] == "ucx"
    guest.quit()
    b.quit()


def intrude(hosts, *args):
    """tests/ucx_intruder on host a: its lines, without UCX's own log lines (UCX logs to stdout)."""
    proc = hosts.a.spawn([os.path.join(hosts.build, "tests", "ucx_intruder")] + [str(x) for x in args],
                         stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, (proc.returncode, out)
    return [l for l in out.splitlines() if not l.startswith("[")]


def test_a_peer_speaking_ucx_directly_reaches_no_other_memory(hosts, secrets):
    with Pair(hosts, secrets) as p:
        # A range decode registered and deregistered: still mapped in its process.
        index, base = p.b("alloc host %d" % MiB)
        p.b("fill %s 19" % index)
        p.b("dereg %s" % index)
        # Without the secret it learns nothing to speak UCX to; with it, UCX's own
        # put reaches nothing, a data message marked with a token the engine never
        # handed out is dropped, and its own are refused outside registered memory.
        assert intrude(hosts, p.addr, "-", base, 4096) == ["handshake: refused"]
        lines = intrude(hosts, p.addr, secrets["a"], base, 4096)
        assert lines == ["handshake: admitted", "put: no completion", "forged write: no answer",
                         "write: code %d" % PARAM_INVALID, "read: code %d, 0 bytes" % PARAM_INVALID], lines
        p.b("check %s 19 0 %d" % (index, MiB))
        # A batch is all or nothing: one segment outside the ranges, and the one inside is not written either.
        hi, hbase = p.b_mem["host"]
        lines = intrude(hosts, p.addr, secrets["a"], base, 4096, "batch=%d" % hbase)
        assert lines == ["handshake: admitted", "batch: code %d" % PARAM_INVALID], lines
        p.b("check %d 2 0 4096" % hi)
        p.b("check %s 19 0 %d" % (index, MiB))
        # An admitted peer that asks for 8192 pieces and reads none of the answers is
        # cut off at 4096 queued, not queued for without bound.
        lines = intrude(hosts, p.addr, secrets["a"], hbase, 64 * 1024, 8192)
        assert len(lines) == 2 and lines[0] == "handshake: admitted", lines
        assert int(lines[1].split()[1]) < 8192 and lines[1].endswith("then cut off"), lines
        # decode still serves its own connector.
        ai, _ = p.a_mem["broker"]
        _, bbase = p.b_mem["broker"]
        p.a("transfer %s read %d %d 1 4096 0 5000" % (p.addr, ai, bbase))


def test_remote_killed_mid_batch(hosts, secrets):
    with Pair(hosts, secrets) as p:
        ai, _ = p.a_mem["host"]
        _, bbase = p.b_mem["broker"]
        # 400 x 64 MiB (the same remote range again and again): seconds of traffic.
        p.a("async %s write %d %d 400 %d 0 60000" % (p.addr, ai, bbase, 64 * MiB))
        assert p.a("status")[0] == "WAITING"
        killed = time.monotonic()
        p.b.kill()
        st = final_status(p.a, 60, "still WAITING 60 s after the remote engine was killed")
        noticed = time.monotonic() - killed
        assert st[0] == "FAILED" and "NOT_CONNECTED" in " ".join(st), st
        print("    the dead remote was noticed after %.0f ms" % (noticed * 1000))
        line = p.a("transfer %s read %d %d 1 4096 0 5000" % (p.addr, ai, bbase), expect_ok=False)
        assert line.startswith("err NOT_CONNECTED"), line
        # Its replacement, on the same address: Disconnect, Connect, transfer.
        b2 = hosts.b.agent("decode2")
        b2("init decode listen_address=%s secret_file=%s" % (p.addr, secrets["b"]))
        index, base = b2("alloc broker %d" % (4 * MiB))
        p.a("disconnect %s 5000" % p.addr)
        assert p.a("connect %s 5000" % p.addr)[0] == "ucx"
        p.a("fill %d 23" % ai)
        p.a("transfer %s write %d %s 1 %d 0 10000" % (p.addr, ai, base, 4 * MiB))
        b2("check %s 23 0 %d" % (index, 4 * MiB))
        b2.quit()


def test_link_down_times_out_then_recovers(hosts, secrets):
    with Pair(hosts, secrets) as p:
        ai, _ = p.a_mem["broker"]
        bi, bbase = p.b_mem["broker"]
        p.a("transfer %s read %d %d 1 %d 0 10000" % (p.addr, ai, bbase, MiB))
        hosts.link(False)
        try:
            t0 = time.monotonic()
            line = p.a("transfer %s write %d %d 64 %d 0 1500" % (p.addr, ai, bbase, MiB), expect_ok=False)
            took = time.monotonic() - t0
            assert line.startswith("err TIMEOUT"), line
            print("    TIMEOUT after %.0f ms (timeout 1500 ms)" % (took * 1000))
        finally:
            hosts.link(True)
        line = p.a("transfer %s read %d %d 1 4096 0 1000" % (p.addr, ai, bbase), expect_ok=False)
        assert line.startswith("err NOT_CONNECTED"), line
        # The seed's recovery: Disconnect, Connect again, retry.
        p.a("disconnect %s 5000" % p.addr)
        assert p.a("connect %s 10000" % p.addr)[0] == "ucx"
        p.a("fill %d 29" % ai)
        p.a("transfer %s write %d %d 16 %d %d 10000" % (p.addr, ai, bbase, MiB, MiB))
        p.b("check %d 29 0 %d" % (bi, 16 * MiB))


def test_deregistration_during_transfers(hosts, secrets):
    # decode's DeregisterMem waits for the batch, which ends by its own 60 s
    # deadline at the latest: a drain timeout past that makes the verdict
    # independent of how fast this machine moves 1.6 GB today (under ASan on a
    # loaded machine it outlasted the default 10 s).
    with Pair(hosts, secrets, decode_options="drain_timeout_ms=90000") as p:
        ai, _ = p.a_mem["broker"]
        bi, bbase = p.b_mem["host"]
        p.a("fill %d 3" % ai)
        p.a("async %s write %d %d 100 %d 0 60000" % (p.addr, ai, bbase, 16 * MiB))
        assert p.a("status")[0] == "WAITING"
        # decode's DeregisterMem waits until prefill no longer uses the range;
        # then decode writes its own pattern there, which nothing may overwrite.
        p.b("dereg %d" % bi)
        p.b("fill %d 47" % bi)
        st = final_status(p.a, 60, "the batch did not end")
        # The batch either ran to its end before the range went (COMPLETED), or
        # had not started and was refused whole (PARAM_INVALID); never in between.
        assert st[0] == "COMPLETED" or (st[0] == "FAILED" and "PARAM_INVALID" in " ".join(st)), st
        p.b("check %d 47 0 %d" % (bi, 64 * MiB))
        line = p.a("transfer %s read %d %d 1 4096 0 5000" % (p.addr, ai, bbase), expect_ok=False)
        assert line.startswith("err PARAM_INVALID descriptor 0:"), line
        # The other range is still there.
        _, other = p.b_mem["broker"]
        p.a("transfer %s read %d %d 1 4096 0 5000" % (p.addr, ai, other))
        # A range registered after Connect reaches the connector too.
        index, base = p.b("alloc broker %d" % MiB)
        p.b("fill %s 31" % index)
        p.a("transfer %s read %d %s 1 %d 0 5000" % (p.addr, ai, base, MiB))
        p.a("check %d 31 0 %d" % (ai, MiB))


def test_notifies(hosts, secrets):
    with Pair(hosts, secrets) as p:
        p.a("notify %s kv-ready layer=3" % p.addr)
        p.a("notify %s kv-ready layer=4" % p.addr)
        got = p.b("notifies")
        assert got == ["2", "prefill", "kv-ready", "layer=3", "prefill", "kv-ready", "layer=4"], got


def test_same_host_address_takes_the_broker_path(hosts, secrets):
    b = hosts.b.agent("decode")
    addr = b("init decode listen_address=%s:%d secret_file=%s" % (hosts.ip["b"], PORT, secrets["b"]))[0]
    index, base = b("alloc broker %d" % MiB)
    b("fill %s 37" % index)
    local = hosts.b.agent("neighbour")
    local("init neighbour secret_file=%s" % secrets["b"])
    li, _ = local("alloc broker %d" % MiB)
    path = local("connect %s 5000" % addr)
    assert path == ["same-host", "memcpy"], path
    engines = {e["engine"]: e for e in hosts.b.ctl("list", "engines")}
    assert engines["neighbour"]["net_connections"] == "%s=same-host(memcpy)" % addr, engines
    local("transfer %s read %s %s 1 %d 0 5000" % (addr, li, base, MiB))
    local("check %s 37 0 %d" % (li, MiB))
    local.quit()
    b.quit()


def test_transfers_do_not_need_the_brokers(hosts, secrets):
    """Bytes between hosts never pass through a broker: with both brokers SIGKILLed,
    a connection keeps moving every byte; brokers started again, clients reattach."""
    with Pair(hosts, secrets) as p:
        ai, _ = p.a_mem["broker"]
        bi, bbase = p.b_mem["host"]
        for h in hosts.hosts:
            h.kill_broker()
        p.a("fill %d 41" % ai)
        p.a("transfer %s write %d %d 1000 4096 8192 10000" % (p.addr, ai, bbase))
        p.b("check %d 41 %d 4096" % (bi, 999 * 8192))
        p.b("fill %d 43" % bi)
        p.a("transfer %s read %d %d 1 %d 0 10000" % (p.addr, ai, bbase, 64 * MiB))
        p.a("check %d 43 0 %d" % (ai, 64 * MiB))
        for h in hosts.hosts:
            h.start_broker()
        p.a("notify %s after-restart ok" % p.addr)
        assert p.b("notifies")[:3] == ["1", "prefill", "after-restart"]


def test_device_memory_between_hosts(hosts, secrets):
    """CUDA device memory on both hosts (the driver double, from LD_LIBRARY_PATH,
    where no GPU is): this side's device ranges staged through host buffers,
    the peer's copied by its transport with its driver; every byte checked;
    the remote engine SIGKILLed mid-transfer leaves a clear error and nothing
    in flight here."""
    size = 24 * MiB  # a multiple of the double's 2 MiB granularity; three staging batches
    b = hosts.b.agent("decode")
    addr = b("init decode listen_address=%s:%d secret_file=%s" % (hosts.ip["b"], PORT + 7, secrets["b"]))[0]
    answer = b("alloc device %d" % size, expect_ok=False)
    if answer.startswith("err UNSUPPORTED"):
        print("  (skipped: no CUDA driver or double here: %s)" % answer)
        b.quit()
        return
    assert answer.startswith("ok"), answer
    b_dev_i, b_dev = (int(x) for x in answer.split()[1:3])
    b_host_i, b_host = (int(x) for x in b("alloc broker %d" % size))
    a = hosts.a.agent("prefill")
    a("init prefill secret_file=%s" % secrets["a"])
    a_dev_i, _ = (int(x) for x in a("alloc device %d" % size))
    a_host_i, _ = (int(x) for x in a("alloc broker %d" % size))
    path = a("connect %s 5000" % addr)
    assert path[0] == "ucx+staged", path
    # This side's device memory to the peer's host memory and back.
    a("fill %d 21" % a_dev_i)
    a("transfer %s write %d %d 1 %d 0 30000" % (addr, a_dev_i, b_host, size))
    b("check %d 21 0 %d" % (b_host_i, size))
    b("fill %d 22" % b_host_i)
    a("transfer %s read %d %d 1 %d 0 30000" % (addr, a_dev_i, b_host, size))
    a("check %d 22 0 %d" % (a_dev_i, size))
    # Device to device, both ways, and 1000 scattered 4 KiB blocks of it.
    a("fill %d 23" % a_dev_i)
    a("transfer %s write %d %d 1 %d 0 30000" % (addr, a_dev_i, b_dev, size))
    b("check %d 23 0 %d" % (b_dev_i, size))
    b("fill %d 24" % b_dev_i)
    a("transfer %s read %d %d 1 %d 0 30000" % (addr, a_dev_i, b_dev, size))
    a("check %d 24 0 %d" % (a_dev_i, size))
    a("fill %d 25" % a_dev_i)
    a("transfer %s write %d %d 1000 4096 8192 30000" % (addr, a_dev_i, b_dev))
    for i in (0, 1, 500, 999):
        b("check %d 25 %d 4096" % (b_dev_i, i * 8192))
        b("check %d 24 %d 4096" % (b_dev_i, i * 8192 + 4096))  # the gaps keep the last fill
    # The host memory of this side into the peer's device memory.
    a("fill %d 26" % a_host_i)
    a("transfer %s write %d %d 1 %d 0 30000" % (addr, a_host_i, b_dev, size))
    b("check %d 26 0 %d" % (b_dev_i, size))
    # The peer SIGKILLed during a staged transfer: an error, and the engine goes on.
    a("async %s read %d %d 1 %d 0 30000" % (addr, a_dev_i, b_dev, size))
    b.kill()
    st = final_status(a, 60, "the staged transfer did not end after its peer was killed")
    assert st[0] in ("COMPLETED", "FAILED"), st  # it may have finished before the kill
    a("fill %d 27" % a_dev_i)
    a("check %d 27 0 %d" % (a_dev_i, size))
    a.quit()


TESTS = [test_read_write_every_byte, test_descriptors_checked_before_any_byte_moves, test_refused_without_the_secret,
         test_a_peer_speaking_ucx_directly_reaches_no_other_memory, test_remote_killed_mid_batch,
         test_link_down_times_out_then_recovers, test_deregistration_during_transfers,
         test_notifies, test_same_host_address_takes_the_broker_path, test_transfers_do_not_need_the_brokers,
         test_device_memory_between_hosts]


def main():
    build = os.path.abspath(sys.argv[1])
    only = sys.argv[2:]
    try:
        hosts = Hosts(build)
    except HostsUnavailable as e:
        print("SKIPPED: " + str(e))
        return SKIP
    failed = 0
    try:
        secrets = hosts.write_secret("two-hosts-secret")
        for t in TESTS:
            if only and t.__name__ not in only:
                continue
            t0 = time.monotonic()
            try:
                t(hosts, secrets)
                print("PASS %s (%.1f s)" % (t.__name__, time.monotonic() - t0))
            except Exception as e:  # report and go on: each test makes its own agents
                failed += 1
                print("FAIL %s: %s" % (t.__name__, e))
    finally:
        for problem in hosts.close():
            failed += 1
            print("FAIL " + problem)
    print("%d failed" % failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
