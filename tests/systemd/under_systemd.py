#!/usr/bin/env python3
"""membrokerd under a real systemd, with the units we ship (packaging/):

  1. socket activation: the first client's connect starts the service;
  2. the broker is SIGKILLed; systemd restarts it (Restart=on-failure) and passes
     back what it kept in the unit's file descriptor store; a client connecting
     meanwhile waits in the socket systemd holds;
  3. the new broker has everything: a holder's memory (it reattaches), a
     persistent name whose publisher had exited and an export of it, and a
     KV-cache store with every block sealed in it (only the fd store can bring
     those back: no live process held them).

PID 1 here is not systemd, so systemd runs as a user manager (`systemd --user`,
the same service manager code) in a private mount namespace, with a tmpfs on
/run/systemd that says "booted with systemd". Exit 77 (skipped) where that
cannot start: not root, no unshare, no systemd binary.

usage: under_systemd.py BUILD_DIR   (MEMBROKERD, MEMBROKERCTL, PYTHONPATH set by ctest)
Everything it makes is under a fresh /var/lib/mb-systemd-test.* directory,
removed at the end, also when it fails.
"""
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time

SKIP = 77
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SYSTEMD = "/lib/systemd/systemd"


def skip(why: str) -> None:
    print("SKIPPED: " + why)
    sys.exit(SKIP)


def wait_until(what: str, check, timeout: float = 20.0):
    """Polls check() (a state systemd or the broker reports) until it is truthy, bounded."""
    deadline = time.monotonic() + timeout
    while True:
        v = check()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.02)


class Manager:
    """A systemd user manager in this mount namespace, and systemctl for it."""

    def __init__(self, top: str):
        self.top = top
        self.env = dict(os.environ)
        self.env.update({
            "XDG_RUNTIME_DIR": os.path.join(top, "xdg"),
            "XDG_CONFIG_HOME": os.path.join(top, "config"),
            "HOME": os.path.join(top, "home"),
            "SYSTEMD_UNIT_PATH": os.path.join(top, "units") + ":",
        })
        for d in ("xdg", "config", "home", "units"):
            os.makedirs(os.path.join(top, d), mode=0o700)
        self.log = open(os.path.join(top, "systemd.log"), "w")
        self.proc = subprocess.Popen([SYSTEMD, "--user", "--log-target=console", "--log-level=info"],
                                     env=self.env, stdout=self.log, stderr=subprocess.STDOUT)

    def ctl(self, *args: str, check: bool = True) -> str:
        r = subprocess.run(["systemctl", "--user", "--no-pager", *args], env=self.env,
                           capture_output=True, text=True, timeout=30)
        if check and r.returncode != 0:
            raise AssertionError("systemctl %s: %s%s" % (" ".join(args), r.stdout, r.stderr))
        return r.stdout.strip()

    def show(self, unit: str, prop: str) -> str:
        return self.ctl("show", "-p", prop, "--value", unit)

    def running(self) -> bool:
        r = subprocess.run(["systemctl", "--user", "is-system-running"], env=self.env,
                           capture_output=True, text=True, timeout=10)
        return r.stdout.strip() in ("running", "degraded")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def make_inaccessible_nodes(where: str) -> None:
    """What PID 1 creates in /run/systemd/inaccessible: the nodes ProtectHome= and
    ProtectKernelTunables= mount over what they hide (without them a unit using
    those fails with 226/NAMESPACE)."""
    os.makedirs(where)
    os.mkdir(os.path.join(where, "dir"), 0)
    os.close(os.open(os.path.join(where, "reg"), os.O_CREAT | os.O_WRONLY, 0))
    os.mkfifo(os.path.join(where, "fifo"), 0)
    os.mknod(os.path.join(where, "chr"), stat.S_IFCHR, os.makedev(0, 0))
    os.mknod(os.path.join(where, "blk"), stat.S_IFBLK, os.makedev(0, 0))
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(os.path.join(where, "sock"))
    for node in ("reg", "fifo", "chr", "blk", "sock"):
        os.chmod(os.path.join(where, node), 0)


def install_units(units_dir: str, rt: str, membrokerd: str, log: str) -> None:
    """The shipped units, pointed at this build and a private runtime directory
    (and the broker's log at a file: no journal here)."""
    for name in ("membrokerd.service", "membrokerd.socket"):
        with open(os.path.join(ROOT, "packaging", name + (".in" if name.endswith(".service") else ""))) as f:
            text = f.read()
        # First: the paths put in below must not be rewritten.
        text = text.replace("/run/membroker/", rt + "/").replace("/run/membroker\n", rt + "\n")
        # The group the shipped units admit is the Debian package's to make;
        # here the test's own uid (root) is the one admitted.
        assert "SocketGroup=membroker" in text or "--allow-gid membroker" in text
        text = text.replace("SocketGroup=membroker\n", "").replace(" --allow-gid membroker", "")
        if name.endswith(".service"):
            # What this test is about must be in the unit we ship.
            assert "--fd-store" in text and "FileDescriptorStoreMax=" in text, "the shipped unit lost its fd store"
            assert "Restart=on-failure" in text and "Type=notify" in text
            text = text.replace("@CMAKE_INSTALL_FULL_BINDIR@/membrokerd", membrokerd)
            text = text.replace("[Service]\n", "[Service]\nStandardOutput=append:%s\nStandardError=append:%s\n" %
                                (log, log))
        with open(os.path.join(units_dir, name), "w") as f:
            f.write(text)


def python_client(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(p: subprocess.Popen, timeout: float = 30) -> str:
    out, err = p.communicate(timeout=timeout)
    if p.returncode != 0:
        raise AssertionError("client failed (%d): %s%s" % (p.returncode, out, err))
    return out.strip()


PUBLISHER = """
    import sys, numpy as np, membroker
    c = membroker.connect(sys.argv[1], "publisher")
    t = c.tensor_from(np.arange(4096, dtype=np.float32))
    c.publish_tensor("kept/weights", t, persist=True)
    print(c.export(t.handle, no_pid_check=True))
"""  # and exits: only the name holds the memory now

HOLDER = """
    import sys, numpy as np, membroker
    c = membroker.connect(sys.argv[1], "holder")
    t = c.tensor_from(np.full(1 << 18, 7, dtype=np.int32))
    c.publish_tensor("held/sevens", t)
    print("ready", flush=True)
    assert sys.stdin.readline().strip() == "restarted"
    c.wait_for_reattach(1, timeout_ms=20000)
    c.ping()
    assert (t.numpy() == 7).all()
    print("ok", c.reattaches, flush=True)
    assert sys.stdin.readline().strip() == "exit"
"""

KV_WRITER = """
    import sys, hashlib, membroker
    c = membroker.connect(sys.argv[1], "kv-writer")
    store = membroker.KvStore.create(c, "model/kv", block_size=4096, capacity=64 * 4096)
    keys = [b"block-%d" % i for i in range(48)]
    values = [hashlib.sha256(k).digest() * 128 for k in keys]
    assert store.batch_set(keys, values) == [True] * 48
    print("put")
"""  # and exits: only the broker holds the store

KV_READER = """
    import sys, hashlib, membroker
    c = membroker.connect(sys.argv[1], "kv-reader")
    store = membroker.KvStore.open(c, "model/kv")
    keys = [b"block-%d" % i for i in range(48)]
    with store.batch_get(keys) as got:
        assert got.leading == 48, got.leading
        good = sum(bytes(b) == hashlib.sha256(k).digest() * 128 for k, b in zip(keys, got))
    assert store.batch_set([b"after"], [b"x" * 4096]) == [True]  # the new broker writes it
    print(good)
"""

CONSUMER = """
    import sys, numpy as np, membroker
    c = membroker.connect(sys.argv[1], "consumer")
    w = c.lookup_tensor("kept/weights", timeout_ms=5000)
    s = c.lookup_tensor("held/sevens", timeout_ms=5000)
    # (another client: one client holds an allocation once)
    imported = membroker.connect(sys.argv[1], "importer").import_handle(sys.argv[2])
    print(int(w.numpy().sum()), int(s.numpy().sum()), imported.size)
"""


def stats(ctl: str, admin: str) -> dict:
    out = subprocess.run([ctl, "--admin-socket", admin, "--json", "stats"], capture_output=True, text=True,
                         timeout=10, check=True).stdout
    return json.loads(out)


def inside(build_dir: str) -> None:
    membrokerd = os.environ["MEMBROKERD"]
    ctl = os.environ["MEMBROKERCTL"]
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", "/run/systemd"], check=True)
    os.makedirs("/run/systemd/system")
    make_inaccessible_nodes("/run/systemd/inaccessible")
    # Nothing the service uses may be under /tmp, /var/tmp (PrivateTmp=yes) or
    # /root, /home (ProtectHome=yes), wherever the build is: the runtime
    # directory is made under /var/lib, and the broker binary copied there.
    top = tempfile.mkdtemp(prefix="mb-systemd-test.", dir="/var/lib")
    os.chmod(top, 0o755)
    os.makedirs(os.path.join(top, "bin"))
    membrokerd = shutil.copy2(membrokerd, os.path.join(top, "bin", "membrokerd"))
    rt = os.path.join(top, "rt")
    sock, admin = os.path.join(rt, "membroker.sock"), os.path.join(rt, "membroker.sock.admin")
    broker_log = os.path.join(rt, "broker.log")  # (writable for the service: ReadWritePaths)
    manager = Manager(top)
    clients = []
    try:
        try:
            wait_until("the user manager", manager.running)
        except AssertionError:
            skip("systemd --user did not start here")
        install_units(os.path.join(top, "units"), rt, membrokerd, broker_log)
        manager.ctl("daemon-reload")
        manager.ctl("start", "membrokerd.socket")
        assert manager.show("membrokerd.service", "ActiveState") == "inactive"

        # 1. Socket activation: connecting starts the broker.
        token = finish(python_client(PUBLISHER, sock))
        assert manager.show("membrokerd.service", "ActiveState") == "active"
        print("socket activation: the first connect started membrokerd.service")
        assert finish(python_client(KV_WRITER, sock)) == "put"
        holder = python_client(HOLDER, sock)
        clients.append(holder)
        assert holder.stdout.readline().strip() == "ready"
        before = stats(ctl, admin)
        # 2 allocations, and the store's index and slab
        assert before["fd_store_stored"] >= 4 and before["fd_store_states"] >= 1, before
        assert before["fd_store_failures"] == 0, before

        # 2. SIGKILL; systemd restarts the broker with what its fd store kept.
        old_pid = int(manager.show("membrokerd.service", "MainPID"))
        os.kill(old_pid, 9)
        early = python_client("import sys, membroker; membroker.connect(sys.argv[1], 'early').ping(); print('in')",
                              sock)  # waits in systemd's socket while no broker accepts
        clients.append(early)
        wait_until("the restarted broker", lambda: manager.show("membrokerd.service", "MainPID") not in
                   ("0", str(old_pid)) and manager.show("membrokerd.service", "ActiveState") == "active")
        assert finish(early) == "in"
        restarts = manager.show("membrokerd.service", "NRestarts")
        print("SIGKILL: systemd restarted membrokerd (NRestarts=%s)" % restarts)

        # 3. Everything is back.
        holder.stdin.write("restarted\n")
        holder.stdin.flush()
        line = holder.stdout.readline().strip()
        assert line == "ok 1", line + holder.stderr.read()
        sums = finish(python_client(CONSUMER, sock, token)).split()
        assert sums == [str(sum(range(4096))), str(7 << 18), str(16384)], sums
        assert finish(python_client(KV_READER, sock)) == "48"
        after = stats(ctl, admin)
        assert after["fd_store_restored"] >= 2, after
        assert after["kv_stores"] == 1 and after["kv_blocks"] == 49, after
        assert after["clients_reattached"] >= 1, after
        print("fd store: restored %d allocations; the persistent name, its export and the holder's memory "
              "came back" % after["fd_store_restored"])
        print("fd store: the KV-cache store came back with its 48 blocks, every byte checked")
        holder.stdin.write("exit\n")
        holder.stdin.flush()
        finish(holder)

        # A clean stop leaves the store empty (systemd flushes it) and exits 0.
        manager.ctl("stop", "membrokerd.service", "membrokerd.socket")
        assert manager.show("membrokerd.service", "Result") == "success"
        assert manager.show("membrokerd.service", "NFileDescriptorStore") in ("0", "")
        print("PASSED")
    except BaseException:
        print(manager.ctl("status", "membrokerd.service", "membrokerd.socket", check=False))
        for log in (broker_log, os.path.join(top, "systemd.log")):
            if os.path.exists(log):
                with open(log) as f:
                    print("---- " + os.path.basename(log) + " (last lines)\n" + "".join(f.readlines()[-40:]))
        raise
    finally:
        for p in clients:
            if p.poll() is None:
                p.kill()
                p.wait()
        manager.ctl("stop", "membrokerd.service", "membrokerd.socket", check=False)
        manager.stop()
        if os.environ.get("MEMBROKER_KEEP_SYSTEMD_LOG"):
            shutil.copy(os.path.join(top, "systemd.log"), os.environ["MEMBROKER_KEEP_SYSTEMD_LOG"])
        shutil.rmtree(top, ignore_errors=True)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--inside":
        inside(sys.argv[2])
        return
    build_dir = os.path.abspath(sys.argv[1])
    if os.geteuid() != 0:
        skip("needs root (a mount namespace and a tmpfs on /run/systemd)")
    if not os.path.exists(SYSTEMD) or shutil.which("unshare") is None or shutil.which("systemctl") is None:
        skip("needs systemd and unshare installed")
    if not os.path.isdir("/run/systemd"):
        skip("/run/systemd does not exist to mount a private tmpfs on")
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, os.path.abspath(__file__),
                        "--inside", build_dir], timeout=240)
    sys.exit(r.returncode)


if __name__ == "__main__":
    main()
