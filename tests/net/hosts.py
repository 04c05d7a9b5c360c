"""Hosts on one machine, for the cross-host transfer tests and benches.

Each host is its own network, IPC, PID, UTS and mount namespace, with a
private /dev/shm (and /tmp where the build is not under /tmp), and runs its
own membrokerd. Two hosts are joined by a veth pair with addresses of our own
(10.213.N.1 and .2); more (tags="abce") each by a veth pair to a bridge in a
namespace of its own, the switch (10.213.N.1, .2, ... in the order of tags).
UCX therefore cannot reach another host through shared memory or
cross-memory attach: its bytes go through the veths.

Everything is removed at the end (Hosts.close, also called on failure and at
exit); namespaces left behind by a run that was killed are removed by the next.
Needs root: HostsUnavailable says why otherwise.
"""
import atexit
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

PREFIX = "mbnet"


class HostsUnavailable(Exception):
    pass


def run(*args, check=True):
    r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(" ".join(args) + ": " + r.stdout.strip())
    return r.stdout


def remove_stale():
    """Namespaces of runs whose driver no longer exists."""
    out = run("ip", "netns", "list", check=False)
    for m in re.finditer(r"^(%s-(\d+)-[a-z]+)\b" % PREFIX, out, re.M):
        if not os.path.exists("/proc/" + m.group(2)):
            run("ip", "netns", "del", m.group(1), check=False)


def children(pid):
    kids = []
    for path in glob.glob("/proc/%d/task/*/children" % pid):
        try:
            kids += [int(x) for x in open(path).read().split()]
        except OSError:
            pass
    return kids


class Agent:
    """tests/engine_agent in a host: one command line in, one answer line out."""

    def __init__(self, host, name="agent"):
        self.host = host
        self.proc = host.spawn([host.agent_path, host.socket],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.name = name

    def __call__(self, cmd, expect_ok=True):
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        while line.startswith("["):  # UCX writes its own log lines to stdout
            sys.stderr.write(line)
            line = self.proc.stdout.readline()
        line = line.strip()
        if not line:
            raise AssertionError("%s on %s: no answer to %r (exited %s)" % (self.name, self.host.tag, cmd, self.proc.poll()))
        if expect_ok and not line.startswith("ok"):
            raise AssertionError("%s on %s: %r answered %r" % (self.name, self.host.tag, cmd, line))
        return line.split()[1:] if expect_ok else line

    def inner_pid(self):
        """The agent's pid as the machine sees it (nsenter forked it)."""
        kids = children(self.proc.pid)
        return kids[0] if kids else self.proc.pid

    def kill(self):
        os.kill(self.inner_pid(), signal.SIGKILL)
        self.proc.wait(timeout=30)

    def quit(self):
        """Ends the agent; AssertionError if it did not exit 0 (a sanitizer's report, say)."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
            if self.proc.returncode != 0:
                raise AssertionError("%s on %s exited %d" % (self.name, self.host.tag, self.proc.returncode))


class Host:
    def __init__(self, hosts, tag, addr, peer_dev):
        self.tag, self.addr, self.dev, self.build = tag, addr, peer_dev, hosts.build
        self.agent_path = hosts.agent_path
        self.netns = "%s-%d-%s" % (PREFIX, os.getpid(), tag)
        self.dir = tempfile.mkdtemp(prefix="mbnet-%s-" % tag, dir="/run" if os.path.isdir("/run") else None)
        self.socket = os.path.join(self.dir, "mb.sock")
        private_tmp = not os.path.realpath(self.build).startswith("/tmp/")
        setup = "mount -t tmpfs tmpfs /dev/shm && hostname mbnet-%s" % tag
        if private_tmp:
            setup += " && mount -t tmpfs tmpfs /tmp"
        # The holder is the PID namespace's init: when its stdin closes (this
        # driver ends, however), it exits and the kernel kills the whole host.
        self.holder = subprocess.Popen(
            ["ip", "netns", "exec", self.netns, "unshare", "--ipc", "--pid", "--mount", "--uts", "--fork",
             "--mount-proc", "--kill-child", "sh", "-c", setup + " && echo ready && exec cat"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if self.holder.stdout.readline().strip() != "ready":
            raise RuntimeError("host %s did not start" % tag)
        init = children(self.holder.pid)  # ip netns exec execs unshare in place; its child is init
        self.init_pid = init[0] if init else None
        if self.init_pid is None:
            raise RuntimeError("host %s: no init process found" % tag)
        self.broker = None
        self.agents = []

    def spawn(self, argv, **kw):
        return subprocess.Popen(["nsenter", "-t", str(self.init_pid), "-n", "-i", "-p", "-m", "-u", "--"] + argv, **kw)

    def start_broker(self, extra=()):
        """Starts this host's membrokerd (extra: more flags; kept for later starts)."""
        self.broker_args = list(extra) or getattr(self, "broker_args", [])
        r, w = os.pipe()
        self.broker = self.spawn([self.build + "/broker/membrokerd", "--socket", self.socket, "--ready-fd", str(w),
                                  "--log-level", "warn"] + self.broker_args, pass_fds=(w,))
        os.close(w)
        with os.fdopen(r) as f:
            line = f.readline()
        if not line.startswith("READY"):
            raise RuntimeError("broker on %s did not start" % self.tag)

    def ctl(self, *args):
        """membrokerctl against this host's broker, run inside the host; its JSON output."""
        p = self.spawn([self.build + "/tools/membrokerctl", "--admin-socket", self.socket + ".admin", "--json"] +
                       list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out, _ = p.communicate(timeout=30)
        if p.returncode != 0:
            raise AssertionError("membrokerctl %s on %s: %s" % (" ".join(args), self.tag, out))
        return json.loads(out)

    def kill_broker(self):
        inner = children(self.broker.pid)
        os.kill(inner[0] if inner else self.broker.pid, signal.SIGKILL)
        self.broker.wait(timeout=30)
        self.broker = None

    def agent(self, name="agent"):
        a = Agent(self, name)
        self.agents.append(a)
        return a

    def close(self):
        for a in self.agents:
            try:
                a.quit()
            except AssertionError as e:  # reported by the test that owned it
                sys.stderr.write("%s\n" % e)
        problem = None
        if self.broker is not None and self.broker.poll() is None:
            inner = children(self.broker.pid)  # nsenter forked the broker, and exits as it does
            os.kill(inner[0] if inner else self.broker.pid, signal.SIGTERM)
            try:
                if self.broker.wait(timeout=10) != 0:
                    problem = "the broker on %s exited %d" % (self.tag, self.broker.returncode)
            except subprocess.TimeoutExpired:
                self.broker.kill()
                problem = "the broker on %s did not stop on SIGTERM" % self.tag
        if self.holder.poll() is None:
            self.holder.stdin.close()
            try:
                self.holder.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.holder.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
        return problem


class Hosts:
    """Hosts a and b (10.213.N.1 and .2), each with a broker; or the hosts of
    tags, joined by a switch. host(tag) and .a, .b, ... are the Host objects."""

    def __init__(self, build, agent_path=None, start_brokers=True, tags="ab"):
        self.agent_path = agent_path or os.path.join(build, "tests", "engine_agent")
        if os.geteuid() != 0:
            raise HostsUnavailable("needs root to make network namespaces")
        for tool in ("ip", "unshare", "nsenter"):
            if shutil.which(tool) is None:
                raise HostsUnavailable("needs %s" % tool)
        self.build = build
        self.hosts = []
        self.netns = []
        self.tags = tags
        remove_stale()
        atexit.register(self.close)
        n = os.getpid() % 250 + 1
        tag = os.getpid() % 100000
        self.dev = {t: "mbv%d%s" % (tag, t) for t in tags}
        self.ip = {t: "10.213.%d.%d" % (n, i + 1) for i, t in enumerate(tags)}
        switched = len(tags) > 2
        try:
            for t in tags + ("s" if switched else ""):
                ns = "%s-%d-%s" % (PREFIX, os.getpid(), "switch" if t == "s" else t)
                run("ip", "netns", "add", ns)
                self.netns.append(ns)
        except RuntimeError as e:
            self.close()
            raise HostsUnavailable("cannot make network namespaces: %s" % e)
        if switched:
            self.switch = self.netns[-1]
            run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
            run("ip", "-n", self.switch, "link", "set", "br0", "up")
            for t in tags:
                run("ip", "link", "add", self.dev[t], "type", "veth", "peer", "name", self.dev[t] + "s")
                run("ip", "link", "set", self.dev[t] + "s", "netns", self.switch)
                run("ip", "-n", self.switch, "link", "set", self.dev[t] + "s", "master", "br0")
                run("ip", "-n", self.switch, "link", "set", self.dev[t] + "s", "up")
        else:
            run("ip", "link", "add", self.dev["a"], "type", "veth", "peer", "name", self.dev["b"])
        for i, t in enumerate(tags):
            ns = self.netns[i]
            run("ip", "link", "set", self.dev[t], "netns", ns)
            run("ip", "-n", ns, "addr", "add", self.ip[t] + "/24", "dev", self.dev[t])
            run("ip", "-n", ns, "link", "set", self.dev[t], "up")
            run("ip", "-n", ns, "link", "set", "lo", "up")
        for t in tags:
            h = Host(self, t, self.ip[t], self.dev[t])
            self.hosts.append(h)
            setattr(self, t, h)
        if start_brokers:
            for h in self.hosts:
                h.start_broker()

    def host(self, tag):
        return getattr(self, tag)

    def write_secret(self, text, name="engine.secret"):
        """The same secret in a file of mode 0600 in each host's directory; {tag: path}."""
        paths = {}
        for h in self.hosts:
            paths[h.tag] = os.path.join(h.dir, name)
            with open(paths[h.tag], "w") as f:
                f.write(text + "\n")
            os.chmod(paths[h.tag], 0o600)
        return paths

    def link(self, up, tag="a"):
        """Brings host tag's end of its veth up or down (cuts it off from every other host)."""
        run("ip", "-n", self.netns[self.tags.index(tag)], "link", "set", self.dev[tag], "up" if up else "down")

    def close(self):
        """Removes everything; returns what went wrong on the way (a broker that failed)."""
        problems = [p for p in (h.close() for h in self.hosts) if p]
        self.hosts = []
        for ns in self.netns:
            run("ip", "netns", "del", ns, check=False)
        self.netns = []
        return problems
