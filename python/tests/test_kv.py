"""KV-cache stores from Python (docs/KV.md), between real processes."""
import hashlib
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import membroker
import membroker.testing

BLOCK = 16 << 10


def keys_of(prompt: str, n: int) -> list[bytes]:
    """A prompt's block keys, each hashed over the whole prefix before it."""
    out, h = [], hashlib.sha256()
    for i in range(n):
        h.update(f"{prompt}/{i}".encode())
        out.append(h.copy().digest())
    return out


def bytes_of(key: bytes) -> np.ndarray:
    """A block's content, derived from its key: any reader can check it."""
    return np.frombuffer(hashlib.shake_256(key).digest(BLOCK), dtype=np.uint8)


def child(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(p: subprocess.Popen) -> str:
    out, err = p.communicate(timeout=180)
    assert p.returncode == 0, f"child failed ({p.returncode}):\n{out}\n{err}"
    return out


def test_blocks_set_in_one_process_are_read_in_another(mb):
    c = membroker.connect(mb.socket, "engine-0")
    store = membroker.KvStore.create(c, "model/kv", block_size=BLOCK, capacity=64 * BLOCK)
    assert (store.block_size, store.blocks) == (BLOCK, 64)
    keys = keys_of("the quick brown fox", 12)
    assert store.batch_set(keys[:8], [bytes_of(k) for k in keys[:8]]) == [True] * 8
    assert store.batch_set(keys[:2], [b"x", b"y"]) == [True, True]  # already there: not rewritten
    p = child("""
        import hashlib, sys, numpy as np, membroker
        c = membroker.connect(sys.argv[1], "engine-1")
        store = membroker.KvStore.open(c, "model/kv")
        h, keys = hashlib.sha256(), []
        for i in range(12):
            h.update(f"the quick brown fox/{i}".encode())
            keys.append(h.copy().digest())
        assert store.prefix_hits(keys) == 8
        assert store.batch_exists(keys[6:10]) == [True, True, False, False]
        with store.batch_get(keys) as got:
            assert got.leading == 8 and len(got) == 12
            for k, block in zip(keys, got):
                if block is None:
                    continue
                want = np.frombuffer(hashlib.shake_256(k).digest(len(block)), dtype=np.uint8)
                assert np.array_equal(block, want)
                assert not block.flags.writeable
                try:
                    block[0] = 1
                    raise SystemExit("a sealed block was writable")
                except ValueError:
                    pass
            print("read", sum(b is not None for b in got))
    """, mb.socket)
    assert finish(p).strip() == "read 8"
    assert mb.wait_for_stat("kv_leases", 0) == 0
    assert mb.stats()["kv_blocks"] == 8


def test_writing_in_place_and_the_put_context_manager(mb):
    c = membroker.connect(mb.socket, "writer")
    store = membroker.KvStore.create(c, "kv", block_size=BLOCK, capacity=8 * BLOCK)
    keys = keys_of("prompt", 3)
    with store.reserve(keys) as put:
        assert [put.status(i) for i in range(3)] == ["OK"] * 3
        for i, k in enumerate(keys):
            put.block(i)[:] = bytes_of(k)  # written in place, no copy of ours
    with store.batch_get(keys) as got:
        assert all(np.array_equal(b, bytes_of(k)) for k, b in zip(keys, got))
    # An exception in the with block aborts: nothing becomes visible.
    with pytest.raises(RuntimeError):
        with store.reserve([b"never"]) as put:
            put.block(0)[:] = 1
            raise RuntimeError("the model failed")
    assert store.batch_exists([b"never"]) == [False]
    assert mb.wait_for_stat("kv_writing", 0) == 0
    with pytest.raises(membroker.ParamInvalid):
        store.batch_get([b"k" * 65])
    with pytest.raises(membroker.AlreadyExists):
        membroker.KvStore.create(c, "kv", block_size=2 * BLOCK, capacity=8 * BLOCK)
    with pytest.raises(membroker.NotFound):
        membroker.KvStore.open(c, "none")


def test_a_store_survives_a_take_over(mb):
    c = membroker.connect(mb.socket, "engine")
    store = membroker.KvStore.create(c, "kv", block_size=BLOCK, capacity=64 * BLOCK)
    keys = keys_of("prompt", 24)
    assert store.batch_set(keys, [bytes_of(k) for k in keys]) == [True] * 24
    held = store.batch_get(keys[:4])
    put = store.reserve([b"half-written"])
    put.block(0)[:] = 7
    mb.take_over()
    c.wait_for_reattach(1, timeout_ms=10000)
    # Leases from before stay readable; every block is back for this client and another.
    assert all(np.array_equal(b, bytes_of(k)) for k, b in zip(keys, held))
    with store.batch_get(keys) as got:
        assert got.leading == 24
        assert all(np.array_equal(b, bytes_of(k)) for k, b in zip(keys, got))
    out = finish(child("""
        import sys, membroker
        c = membroker.connect(sys.argv[1], "reader")
        print(membroker.KvStore.open(c, "kv").prefix_hits(eval(sys.argv[2])))
    """, mb.socket, repr(keys)))
    assert out.strip() == "24"
    # The reservation ended with the old broker: its seal says so.
    with pytest.raises(membroker.Stale):
        put.seal()
    held.release()
    assert store.batch_set([b"half-written"], [bytes_of(b"x")]) == [True]
    assert mb.wait_for_stat("kv_leases", 0) == 0


def test_blocks_evicted_to_the_disk_tier_come_back(tmp_path):
    """With --kv-disk, blocks evicted from a small store are written to the
    disk; another process gets every one back, byte for byte (disk hits)."""
    disk = tmp_path / "kv-disk"
    with membroker.testing.broker("--kv-disk", str(disk), "--kv-disk-bytes", "8M") as b:
        c = membroker.connect(b.socket, "writer")
        store = membroker.KvStore.create(c, "kv", block_size=BLOCK, capacity=16 * BLOCK)
        keys = keys_of("long prompt", 48)
        for at in range(0, 48, 8):
            batch = keys[at:at + 8]
            assert store.batch_set(batch, [bytes_of(k) for k in batch]) == [True] * 8
        assert b.wait_for_stat("kv_disk_writing", 0) == 0
        assert b.stats()["kv_spilled"] >= 32
        assert store.batch_exists(keys) == [True] * 48
        out = finish(child("""
            import sys, hashlib, numpy as np, membroker
            c = membroker.connect(sys.argv[1], "reader")
            store = membroker.KvStore.open(c, "kv")
            keys = eval(sys.argv[2])
            for at in range(0, len(keys), 8):
                with store.batch_get(keys[at:at + 8]) as got:
                    assert got.leading == 8, got.leading
                    for k, block in zip(keys[at:at + 8], got):
                        want = np.frombuffer(hashlib.shake_256(k).digest(len(block)), dtype=np.uint8)
                        assert np.array_equal(block, want)
            print("ok")
        """, b.socket, repr(keys)))
        assert out.strip() == "ok"
        stats = b.stats()
        assert stats["kv_disk_hits"] >= 32
        assert stats["kv_disk_damaged"] == 0
        assert b.wait_for_stat("kv_leases", 0) == 0
        assert b.admin("check") == "tables: consistent\n"
    # The tier's files stay for the next broker.
    assert len(list(disk.rglob("*.kv"))) >= 32


def test_a_killed_reader_or_writer_leaves_nothing_held(mb):
    c = membroker.connect(mb.socket, "survivor")
    store = membroker.KvStore.create(c, "kv", block_size=BLOCK, capacity=16 * BLOCK)
    keys = keys_of("shared", 4)
    store.batch_set(keys, [bytes_of(k) for k in keys])
    p = child("""
        import sys, time, membroker
        c = membroker.connect(sys.argv[1], "doomed")
        store = membroker.KvStore.open(c, "kv")
        got = store.batch_get([bytes.fromhex(k) for k in sys.argv[2:]])
        put = store.reserve([b"half-written"])
        put.block(0)[:] = 7
        print("holding", got.leading, flush=True)
        time.sleep(60)
    """, mb.socket, *[k.hex() for k in keys])
    assert p.stdout.readline().strip() == "holding 4"
    assert mb.stats()["kv_leases"] == 4 and mb.stats()["kv_writing"] == 1
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=10)
    p.stdout.close()
    p.stderr.close()
    assert mb.wait_for_stat("clients_connected", 1) == 1
    assert mb.stats()["kv_leases"] == 0 and mb.stats()["kv_writing"] == 0
    assert store.batch_exists([b"half-written"]) == [False]
    assert store.batch_set([b"half-written"], [b"now whole"]) == [True]
    membroker.KvStore.drop(c, "kv")
    assert mb.stats()["kv_stores"] == 0


def test_torch_tensors_as_values(mb):
    torch = pytest.importorskip("torch")
    c = membroker.connect(mb.socket, "torch")
    store = membroker.KvStore.create(c, "kv", block_size=BLOCK, capacity=4 * BLOCK)
    t = torch.arange(BLOCK // 2, dtype=torch.float16)
    assert store.batch_set([b"t"], [t]) == [True]
    with store.batch_get([b"t"]) as got:
        back = torch.from_numpy(got[0].copy()).view(torch.float16)
        assert torch.equal(back, t)


def test_the_kv_cache_demo(mb):
    """examples/kv_cache/serve.py: engines share a store, two are SIGKILLed mid-run;
    every byte read is checked against its key and nothing is left held."""
    import os
    here = os.path.dirname(os.path.abspath(__file__))
    demo = os.path.join(here, "..", "..", "examples", "kv_cache", "serve.py")
    out = subprocess.run([sys.executable, demo, "--socket", mb.socket, "--admin-socket", mb.admin_socket,
                          "--engines", "3", "--prompts", "120", "--kill", "2", "--cost-ms", "0"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "kv_cache: ok" in out.stdout and "2 engines SIGKILLed and restarted" in out.stdout, out.stdout
    assert mb.stats()["kv_stores"] == 0
