#!/usr/bin/env python3
"""The KV transfer between two hosts: prefill on host a writes 256 blocks of
64 KiB into decode's memory on host b over UCX, then notifies it; decode checks
every block. The two hosts are network, IPC, PID and mount namespaces on this
machine joined by a veth pair, each with its own membrokerd (tests/net/hosts.py).

  kv_two_hosts.py BUILD_DIR     (root; prints why and exits 0 where it cannot make the hosts)
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "net"))
from hosts import Hosts, HostsUnavailable  # noqa: E402


def main():
    build = os.path.abspath(sys.argv[1])
    try:
        hosts = Hosts(build)
    except HostsUnavailable as e:
        print("kv_two_hosts: skipped: " + str(e))
        return 0
    try:
        kv = os.path.join(build, "examples", "kv_transfer")
        secret = hosts.write_secret(os.urandom(16).hex())  # each host keeps its own copy, mode 0600
        listen = hosts.ip["b"] + ":5000"
        print("host a %s (prefill), host b %s (decode), joined by %s/%s" %
              (hosts.ip["a"], hosts.ip["b"], hosts.dev["a"], hosts.dev["b"]))
        decode = hosts.b.spawn([kv, "--role", "decode", "--socket", hosts.b.socket, "--listen", listen,
                                "--secret-file", secret["b"]], stdout=subprocess.PIPE, text=True)
        line = decode.stdout.readline()
        print(line, end="")
        if "blocks at " not in line:
            raise SystemExit("decode did not start")
        base = line.rsplit("blocks at ", 1)[1].strip()
        prefill = hosts.a.spawn([kv, "--role", "prefill", "--socket", hosts.a.socket, "--connect", listen,
                                 "--remote-base", base, "--secret-file", secret["a"]])
        rc_prefill = prefill.wait(timeout=120)
        rest, _ = decode.communicate(timeout=120)
        print(rest, end="")
        ok = rc_prefill == 0 and decode.returncode == 0
        print("kv_two_hosts: " + ("ok" if ok else "FAILED"))
        return 0 if ok else 1
    finally:
        for problem in hosts.close():
            print("kv_two_hosts: " + problem)


if __name__ == "__main__":
    sys.exit(main())
