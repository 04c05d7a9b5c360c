#!/usr/bin/env python3
"""A node-wide KV cache shared by several inference "engines" (docs/KV.md).

Each engine process serves its share of a stream of prompts that share
prefixes (a few system prompts, users asking again): it hashes the prompt's
blocks (each key chained over the whole prefix), takes the leading hits from
the store and checks every byte against its key, "computes" the missing blocks
(bytes derived from the key, at a fixed cost per block) and puts them. The run
prints the hit rate and the compute time saved, against the same stream served
with a private cache per engine; with --kill, engines are SIGKILLed at random
mid-run and restarted, and the store must end with nothing held and every byte
read right. With --kill-broker, the broker itself is SIGKILLed halfway through
the shared run: run it under `membrokerd --supervise` (or systemd's unit), which
restarts it with the store from its fd store; the engines reattach, the store
must come back with every block, and the run goes on.

    python3 examples/kv_cache/serve.py --socket /tmp/b.sock [--engines 4] [--prompts 400] [--kill 3] [--kill-broker]
"""
import argparse
import hashlib
import json
import os
import random
import signal
import socket as _socket
import subprocess
import sys
import time

BLOCK = 16 << 10


def prompts(n: int, seed: int = 7) -> list[list[str]]:
    """n prompts as lists of segments: a system prompt (one of 4, 8 blocks),
    a conversation (one of 40, 4 blocks) and a question (one of n/4, 4 blocks)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        s, c, q = rng.randrange(4), rng.randrange(40), rng.randrange(n // 4 + 1)
        system = [f"system-{s}/{b}" for b in range(8)]
        conversation = [f"conv-{c}/{b}" for b in range(4)]
        question = [f"question-{q}/{b}" for b in range(4)]
        out.append(system + conversation + question)
    return out


def keys_of(segments: list[str]) -> list[bytes]:
    h, keys = hashlib.sha256(), []
    for s in segments:
        h.update(s.encode())
        keys.append(h.copy().digest())
    return keys


def compute(key: bytes, cost_s: float) -> bytes:
    """The 'model': the block's bytes follow from its key, at a fixed cost."""
    time.sleep(cost_s)
    return hashlib.shake_256(key).digest(BLOCK)


def connect(membroker, path: str, name: str):
    """A client, waiting (bounded) for a broker that is restarting."""
    for attempt in range(300):
        try:
            return membroker.connect(path, name)
        except membroker.NotConnected:
            if attempt == 299:
                raise
            time.sleep(0.1)


def engine(args) -> int:
    import membroker
    import numpy as np
    c = connect(membroker, args.socket, f"engine-{args.rank}")
    store = None if args.private else membroker.KvStore.open(c, args.store)
    private: dict[bytes, bytes] = {}
    stream = prompts(args.prompts)
    hits = computed = checked = 0
    for i in range(args.start, len(stream)):
        if i % args.engines != args.rank:
            continue
        keys = keys_of(stream[i])
        while True:  # a prompt is served again if the broker went away meanwhile
            seen = c.reattaches
            try:
                if store is None:
                    n = 0
                    while n < len(keys) and keys[n] in private:
                        n += 1
                else:
                    n = store.prefix_hits(keys)
                    with store.batch_get(keys[:n]) as got:
                        n = got.leading  # (a block may have been evicted since prefix_hits)
                        for k, block in zip(keys[:n], got):
                            want = np.frombuffer(hashlib.shake_256(k).digest(BLOCK), dtype=np.uint8)
                            if not np.array_equal(block, want):
                                print(f"engine {args.rank}: WRONG BYTES for a block of prompt {i}", flush=True)
                                return 3
                            checked += BLOCK
                fresh = [compute(k, args.cost_ms / 1000) for k in keys[n:]]
                if store is None:
                    private.update(zip(keys[n:], fresh))
                else:
                    store.batch_set(keys[n:], fresh)
                break
            except membroker.NotConnected:
                c.wait_for_reattach(seen + 1, timeout_ms=30000)
        hits += n
        computed += len(fresh)
        print(json.dumps({"done": i, "hits": n, "computed": len(fresh), "checked": checked}), flush=True)
    print(json.dumps({"end": args.rank}), flush=True)
    return 0


def admin(path: str, command: str) -> str:
    with _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(path)
        s.sendall(command.encode() + b"\n")
        return b"".join(iter(lambda: s.recv(65536), b"")).decode()


def stats_of(path: str) -> dict:
    """The broker's stats, waiting (bounded) for one that is restarting."""
    for attempt in range(300):
        try:
            return json.loads(admin(path, "stats --json"))
        except OSError:
            if attempt == 299:
                raise
            time.sleep(0.1)


def kill_broker(admin_path: str) -> dict:
    """SIGKILLs the broker; waits for its successor (its keeper or systemd
    restarts it) and returns what it restored."""
    before = stats_of(admin_path)
    os.kill(before["pid"], signal.SIGKILL)
    for _ in range(300):
        after = stats_of(admin_path)
        # The new broker serves at once and makes the store again on a worker.
        if after["pid"] != before["pid"] and after.get("kv_stores_restoring", 0) == 0:
            return {"old_pid": before["pid"], "pid": after["pid"], "blocks_before": before["kv_blocks"],
                    "restored": after["kv_restored"], "lost": after["kv_lost"]}
        time.sleep(0.1)
    raise SystemExit("kv_cache: no broker came back after the SIGKILL (run it under --supervise or systemd)")


def run(args, private: bool, kills: int, kill_broker_at: int = 0) -> dict:
    """Serves the stream with args.engines processes; returns the totals."""
    rng = random.Random(11)
    me = os.path.abspath(__file__)

    def start(rank: int, first: int) -> subprocess.Popen:
        cmd = [sys.executable, me, "--socket", args.socket, "--engine", str(rank), "--engines", str(args.engines),
               "--prompts", str(args.prompts), "--start", str(first), "--cost-ms", str(args.cost_ms),
               "--store", args.store] + (["--private"] if private else [])
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)

    procs = {r: start(r, 0) for r in range(args.engines)}
    last = {r: -1 for r in range(args.engines)}
    totals = {"hits": 0, "computed": 0, "checked": 0, "killed": 0}
    checked_by = {r: 0 for r in range(args.engines)}
    kill_after = sorted(rng.sample(range(args.prompts // 4, args.prompts * 3 // 4), kills)) if kills else []
    served = 0
    t0 = time.monotonic()
    while procs:
        for r, p in list(procs.items()):
            line = p.stdout.readline()
            if not line:
                code = p.wait()
                if code != 0:
                    raise SystemExit(f"kv_cache: engine {r} failed with {code}")
                del procs[r]
                continue
            m = json.loads(line)
            if "end" in m:
                continue
            last[r] = m["done"]
            totals["hits"] += m["hits"]
            totals["computed"] += m["computed"]
            checked_by[r] = m["checked"]
            served += 1
            if kill_broker_at and served == kill_broker_at:
                totals["broker"] = kill_broker(args.admin_socket or args.socket + ".admin")
            if kill_after and served >= kill_after[0]:
                kill_after.pop(0)
                p.send_signal(signal.SIGKILL)  # mid-prompt, holding whatever it held
                p.wait()
                p.stdout.close()
                totals["checked"] += checked_by[r]
                checked_by[r] = 0
                totals["killed"] += 1
                procs[r] = start(r, last[r] + 1)
    totals["checked"] += sum(checked_by.values())
    totals["seconds"] = time.monotonic() - t0
    return totals


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--admin-socket", help="default: SOCKET.admin")
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=400)
    ap.add_argument("--cost-ms", type=float, default=1.0, help="compute cost per block")
    ap.add_argument("--kill", type=int, default=0, help="SIGKILL this many engines at random mid-run")
    ap.add_argument("--kill-broker", action="store_true",
                    help="SIGKILL the broker halfway (it must run under --supervise or systemd)")
    ap.add_argument("--store", default="demo/kv")
    ap.add_argument("--capacity-blocks", type=int, default=2048, help="the store's size (eviction runs past it)")
    ap.add_argument("--engine", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--private", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.engine is not None:
        args.rank = args.engine
        return engine(args)

    import membroker
    admin_path = args.admin_socket or args.socket + ".admin"
    c = membroker.connect(args.socket, "kv-demo")
    membroker.KvStore.create(c, args.store, block_size=BLOCK, capacity=args.capacity_blocks * BLOCK)
    blocks = args.prompts * 16
    private = run(args, private=True, kills=0)
    shared = run(args, private=False, kills=args.kill, kill_broker_at=args.prompts // 2 if args.kill_broker else 0)
    stats = stats_of(admin_path)
    saved = (shared["hits"] - private["hits"]) * args.cost_ms / 1000
    print(f"kv_cache: {args.engines} engines, {args.prompts} prompts of 16 blocks of {BLOCK >> 10} KiB, "
          f"{args.cost_ms:g} ms of compute per block")
    print(f"kv_cache: private caches: hit rate {private['hits'] / blocks:.1%}, {private['computed']} blocks computed, "
          f"{private['seconds']:.1f} s")
    print(f"kv_cache: shared store:   hit rate {shared['hits'] / blocks:.1%}, {shared['computed']} blocks computed, "
          f"{shared['seconds']:.1f} s; {saved:.1f} s of compute saved; "
          f"{shared['checked'] >> 20} MiB read and checked against their keys"
          + (f"; {shared['killed']} engines SIGKILLed and restarted" if shared["killed"] else ""))
    if "broker" in shared:
        b = shared["broker"]
        print(f"kv_cache: the broker (pid {b['old_pid']}) SIGKILLed halfway with {b['blocks_before']} blocks "
              f"sealed; pid {b['pid']} restored {b['restored']} of them ({b['lost']} lost), the engines reattached")
    print(f"kv_cache: store: {stats['kv_blocks']} blocks, {stats['kv_evictions']} evictions, "
          f"leases held {stats['kv_leases']}, blocks being written {stats['kv_writing']}")
    for _ in range(1000):  # the last SIGKILLed engine's leases end as its connection closes
        if stats["kv_leases"] == 0 and stats["kv_writing"] == 0:
            break
        time.sleep(0.01)
        stats = json.loads(admin(admin_path, "stats --json"))
    check = admin(admin_path, "check").strip()
    if "broker" in shared:
        c.wait_for_reattach(1, timeout_ms=30000)
    membroker.KvStore.drop(c, args.store)
    if shared.get("broker", {}).get("lost"):
        print(f"kv_cache: LOST {shared['broker']['lost']} sealed blocks in the broker's restart")
        return 1
    if stats["kv_leases"] or stats["kv_writing"] or check != "tables: consistent":
        print(f"kv_cache: LEFT BEHIND: leases {stats['kv_leases']}, writing {stats['kv_writing']}, {check}")
        return 1
    if shared["hits"] <= private["hits"]:
        print("kv_cache: the shared store hit no more than private caches")
        return 1
    print(f"kv_cache: ok (nothing held after the run; {check})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
