"""The Python package against a real broker, with real child processes."""
import contextlib
import gc
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import membroker


def child(code: str, *args: str, **kw) -> subprocess.Popen:
    """A separate Python process running code (its argv follows)."""
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def shm_files() -> set:
    """/dev/shm's files, less those of UCX's shared-memory transport, which come
    and go with the UCX tests ctest runs beside this suite (conftest.py)."""
    return {n for n in os.listdir("/dev/shm") if not n.startswith("ucx_shm_posix_")}


def finish(p: subprocess.Popen, timeout: float = 180) -> str:
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, f"child failed ({p.returncode}):\n{out}\n{err}"
    return out


def test_every_error_class_carries_its_wire_code(mb):
    codes = membroker._membroker.error_codes()
    assert [c for c, _, _ in codes] == list(range(1, len(codes) + 1))  # every code, none skipped
    stubs = open(os.path.join(os.path.dirname(membroker.__file__), "__init__.pyi")).read()
    for code, wire_name, class_name in codes:
        cls = membroker.error_class(code)
        assert cls.__name__ == class_name and cls.code_name == wire_name
        assert getattr(membroker, class_name) is cls
        assert f"class {class_name}(Error): ..." in stubs, f"__init__.pyi lacks {class_name}"
    for code, cls in membroker._errors.CLASSES.items():
        assert issubclass(cls, membroker.Error)
        assert cls.code == code and membroker.error_class(code) is cls
    with pytest.raises(membroker.NotConnected) as e:
        membroker.connect(mb.dir + "/missing.sock", "nobody")
    assert e.value.code == 10 and e.value.code_name == "NOT_CONNECTED"
    c = membroker.connect(mb.socket, "errors")
    with pytest.raises(membroker.Timeout) as e:
        c.lookup("not/there", timeout_ms=50)
    assert "in time" in e.value.message
    with pytest.raises(membroker.NotFound):
        c.lookup("not/there")
    with pytest.raises(membroker.ParamInvalid):
        c.malloc_physical(4096, page_policy="enormous")
    with pytest.raises(membroker.ParamInvalid):
        c.malloc_physical(0)
    with pytest.raises(membroker.NotFound):
        c.import_handle("")
    with pytest.raises(membroker.ResourceExhausted):
        c.malloc_physical(1 << 39)
    c.ping()  # none of it cost the connection


def test_numpy_array_shared_with_another_process_without_a_copy(mb):
    c = membroker.connect(mb.socket, "producer")
    t = c.new_tensor((256, 1024), "float32")
    a = t.numpy()
    a[:] = np.arange(256 * 1024, dtype=np.float32).reshape(256, 1024)
    c.publish_tensor("np/frame", t)
    p = child("""
        import sys, numpy as np, membroker
        c = membroker.connect(sys.argv[1], "consumer")
        t = c.lookup_tensor("np/frame", timeout_ms=5000)
        a = t.numpy()
        assert a.shape == (256, 1024) and a.dtype == np.float32, (a.shape, a.dtype)
        print(float(a.sum()))
        a[0, 0] = -7.0          # visible to the producer: the same pages
        sys.stdout.flush()
    """, mb.socket)
    out = finish(p)
    assert float(out) == float(np.arange(256 * 1024, dtype=np.float64).sum())
    assert a[0, 0] == -7.0


def test_torch_tensors_both_ways(mb):
    import torch
    c = membroker.connect(mb.socket, "torch-producer")
    t = c.new_tensor((64, 64), "float32")
    tt = t.torch()
    tt.copy_(torch.full((64, 64), 3.0))
    c.publish_tensor("torch/x", t)
    p = child("""
        import sys, torch, membroker
        c = membroker.connect(sys.argv[1], "torch-consumer")
        x = c.lookup_tensor("torch/x", timeout_ms=5000).torch()
        assert x.dtype == torch.float32 and tuple(x.shape) == (64, 64)
        assert float(x.sum()) == 3.0 * 64 * 64
        x.mul_(2)              # in place, in broker memory
    """, mb.socket)
    finish(p)
    assert float(tt.sum()) == 6.0 * 64 * 64


def test_dlpack_legacy_and_versioned(mb):
    import torch
    c = membroker.connect(mb.socket, "dlpack")
    h = c.malloc_physical(1 << 16)
    m = c.map_handle(h)
    t = torch.from_dlpack(m)         # legacy capsule (torch 1.13)
    t[:4] = torch.tensor([1, 2, 3, 4], dtype=torch.uint8)
    a = np.from_dlpack(m)            # legacy capsule (numpy 1.24 makes every DLPack import read-only)
    assert a[:4].tolist() == [1, 2, 3, 4]
    t[4] = 9
    assert a[4] == 9                 # the same pages
    assert m.__dlpack_device__() == (1, 0)
    cap = m.__dlpack__(max_version=(1, 0))
    assert "dltensor_versioned" in repr(cap)
    # Read-only memory: the versioned capsule says so; the legacy one cannot, so it is refused.
    token = c.export(h, no_pid_check=True, read_only=True)
    other = membroker.connect(mb.socket, "reader")
    ro = other.map_handle(other.import_handle(token))
    assert ro.read_only and memoryview(ro).readonly
    with pytest.raises(membroker.PermissionDenied):
        ro.__dlpack__()
    assert "dltensor_versioned" in repr(ro.__dlpack__(max_version=(1, 0)))


def test_read_only_publication_refuses_writes(mb):
    c = membroker.connect(mb.socket, "weights-loader")
    w = c.tensor_from(np.ones((8, 8), dtype=np.float16))
    c.publish_tensor("weights/ro", w, read_only=True)
    r = membroker.connect(mb.socket, "worker").lookup_tensor("weights/ro", timeout_ms=1000)
    arr = r.numpy()
    assert r.read_only and not arr.flags.writeable and arr.dtype == np.float16
    with pytest.raises(ValueError):
        arr[0, 0] = 2
    with pytest.raises(TypeError):
        memoryview(r.mapping)[0] = 1
    assert arr.sum() == 64


def test_views_outlive_their_mapping_and_client(mb):
    c = membroker.connect(mb.socket, "short-lived")
    t = c.tensor_from(np.arange(1000, dtype=np.int64))
    view = t.numpy()[10:20]
    mv = memoryview(t.mapping)
    t.close()                         # no new views...
    assert len(memoryview(t.mapping)) == 0
    with pytest.raises(membroker.NotMapped):
        t.mapping.__array_interface__
    del t, c
    gc.collect()
    assert view.tolist() == list(range(10, 20))   # ...but these stay mapped
    assert mv[80] == 10
    assert mb.stats()["allocations_live"] == 1
    del view, mv
    gc.collect()
    assert mb.wait_for_stat("allocations_live", 0) == 0


def test_a_consumer_killed_while_holding_views_leaves_nothing(mb):
    c = membroker.connect(mb.socket, "owner")
    t = c.new_tensor((1 << 20,), "uint8")
    c.publish_tensor("crash/t", t)
    p = child("""
        import sys, time, membroker
        c = membroker.connect(sys.argv[1], "doomed")
        a = c.lookup_tensor("crash/t", timeout_ms=5000).numpy()
        v = memoryview(a)
        print("holding", flush=True)
        time.sleep(60)
    """, mb.socket)
    assert p.stdout.readline().strip() == "holding"
    assert mb.stats()["imports"] == 1
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=10)
    p.stdout.close()
    p.stderr.close()
    assert mb.wait_for_stat("clients_connected", 1) == 1
    assert mb.stats()["clients_crashed"] == 1
    c.unpublish("crash/t")
    del t, c
    gc.collect()
    assert mb.wait_for_stat("allocations_live", 0) == 0
    assert mb.stats()["clients_connected"] == 0 or mb.wait_for_stat("clients_connected", 0) == 0


def test_the_weight_sharing_example(mb):
    """examples/python/weights.py: the loader exits, the workers still map its weights."""
    here = os.path.dirname(os.path.abspath(__file__))
    example = os.path.join(here, "..", "..", "examples", "python", "weights.py")
    out = subprocess.run([sys.executable, example, "--socket", mb.socket, "--workers", "3", "--mib", "8"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("checksum") == 3 and "weights: ok" in out.stdout
    assert mb.wait_for_stat("allocations_live", 0) == 0
    assert mb.stats()["named_objects"] == 0


def test_tensor_ring_between_processes_with_a_killed_consumer(mb):
    """Frames cross a ring in order; a consumer SIGKILLed holding a slot loses none."""
    c = membroker.connect(mb.socket, "ring-producer")
    size = membroker.TensorRing.bytes_for(4, 4096)
    h = c.malloc_physical(size)
    ring = membroker.TensorRing.create(c.map_handle(h), 4, 4096)
    c.publish("ring/0", h)
    code = """
        import sys, time, numpy as np, membroker
        c = membroker.connect(sys.argv[1], "ring-consumer")
        h = c.lookup("ring/0", timeout_ms=5000)
        ring = membroker.TensorRing.attach(c.map_handle(h))
        die_at = int(sys.argv[2])
        while True:
            s = ring.acquire_for_read(10000)
            a = s.array("int64", (4,))
            assert (a == s.frame_id).all(), (a, s.frame_id)
            if s.frame_id == die_at:
                print("holding", s.frame_id, flush=True)
                time.sleep(60)             # killed here, slot unreleased
            ring.release(s)
            print(s.frame_id, flush=True)
            if s.frame_id == 40:
                break
    """
    first = child(code, mb.socket, "7")
    for f in range(1, 41):
        s = ring.acquire_for_write(10000)
        s.array("int64", (4,))[:] = f
        ring.publish(s, f, 32)
        if f == 8:
            line = ""
            while not line.startswith("holding"):
                line = first.stdout.readline()
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=10)
            first.stdout.close()
            first.stderr.close()
            second = child(code, mb.socket, "0")
    out = finish(second).split()
    assert out[0] == "7" and out[-1] == "40"      # the killed consumer's slot came back
    assert [int(x) for x in out] == list(range(7, 41))


def test_transfer_engine_write_between_processes(mb):
    c = membroker.connect(mb.socket, "engine-writer")
    src = c.tensor_from(np.arange(1024, dtype=np.int32))
    eng = membroker.TransferEngine(c, "py-writer")
    eng.register_mem(src.mapping)
    p = child("""
        import sys, numpy as np, membroker
        c = membroker.connect(sys.argv[1], "engine-target")
        dst = c.new_tensor((1024,), "int32")
        dst.numpy()[:] = 0
        eng = membroker.TransferEngine(c, "py-target")
        eng.register_mem(dst.mapping)
        print(dst.mapping.address, flush=True)
        sys.stdin.readline()                     # the writer is done
        notes = eng.get_notifies()
        assert notes == [("py-writer", "done", "1024")], notes
        assert (dst.numpy() == np.arange(1024, dtype=np.int32)).all()
        eng.finalize()
    """, mb.socket, stdin=subprocess.PIPE)
    remote = int(p.stdout.readline())
    eng.connect("py-target", 5000)
    eng.transfer_sync("py-target", "write", [(src.mapping.address, remote, 4096)], 5000)
    with pytest.raises(membroker.ParamInvalid):
        eng.transfer_sync("py-target", "write", [(src.mapping.address, remote + (1 << 30), 4096)], 5000)
    eng.send_notify("py-target", "done", "1024")
    p.stdin.write("go\n")
    p.stdin.flush()
    finish(p)
    eng.finalize()


def test_events_host_memory_and_context_managers(mb):
    watcher = membroker.connect(mb.socket, "watcher")
    watcher.subscribe("ev/")
    c = membroker.connect(mb.socket, "events")
    with c.malloc_physical(4096) as h:
        c.publish("ev/one", h)
        events, dropped = watcher.wait_events(timeout_ms=5000)
        assert dropped == 0 and events[0]["kind"] == "published" and events[0]["name"] == "ev/one"
        c.unpublish("ev/one")
        events, _ = watcher.wait_events(timeout_ms=5000)
        assert events[0]["kind"] == "unpublished"
        with c.map_handle(h) as m:
            memoryview(m)[0] = 5
        assert len(memoryview(m)) == 0          # closed by the with block
    assert watcher.wait_events(timeout_ms=0) == ([], 0)
    buf = c.malloc_host(1 << 16)
    mv = memoryview(buf)
    mv[:4] = b"pin!"
    assert bytes(memoryview(buf)[:4]) == b"pin!"
    assert mb.stats()["pinned_bytes"] >= 1 << 16
    import mmap
    own = mmap.mmap(-1, 8192)                    # this process's own, page-aligned memory
    address = c.host_register(own)
    assert mb.stats()["host_registered_bytes"] == 8192
    with pytest.raises(membroker.ParamInvalid):
        c.host_register(memoryview(own)[1:4097])  # not page-aligned: refused, nothing changes
    c.host_unregister(address)
    assert mb.wait_for_stat("host_registered_bytes", 0) == 0
    del mv, buf
    gc.collect()
    assert mb.wait_for_stat("pinned_bytes", 0) == 0


@pytest.mark.parametrize("kill", [False, True])
def test_the_python_pipeline_example(mb, kill):
    """examples/python/pipeline.py: torch tensors through rings; a killed model stage loses no frame."""
    here = os.path.dirname(os.path.abspath(__file__))
    example = os.path.join(here, "..", "..", "examples", "python", "pipeline.py")
    cmd = [sys.executable, example, "--socket", mb.socket, "--frames", "60"] + (["--kill-model"] if kill else [])
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 wrong, 0 twice, 0 lost" in out.stdout and "python pipeline: ok" in out.stdout
    if kill:
        assert "killed the model stage" in out.stdout
        assert mb.stats()["clients_crashed"] == 1
    assert mb.wait_for_stat("allocations_live", 0) == 0


def test_transfer_engine_async_read_within_one_process_pair(mb):
    a = membroker.connect(mb.socket, "async-a")
    b = membroker.connect(mb.socket, "async-b")
    src = b.tensor_from(np.full(4096, 7, dtype=np.uint8))
    dst = a.new_tensor((4096,), "uint8")
    ea, eb = membroker.TransferEngine(a, "async-a"), membroker.TransferEngine(b, "async-b")
    ea.register_mem(dst.mapping)
    eb.register_mem(src.mapping)
    ea.connect("async-b", 5000)
    req = ea.transfer_async("async-b", "read", [(dst.mapping.address, src.mapping.address, 4096)], 5000)
    status = ea.transfer_status(req)
    while status == "waiting":
        status = ea.transfer_status(req)
    assert status == "completed" and (dst.numpy() == 7).all()
    with pytest.raises(membroker.ParamInvalid):
        ea.transfer_status(req)   # reported once, then forgotten
    ea.finalize()
    eb.finalize()


def test_a_published_tensor_survives_a_broker_sigkill(mb):
    # The producer keeps its tensor, mapping and name across the broker's death;
    # a consumer in another process finds it at the new broker.
    c = membroker.connect(mb.socket, "producer")
    w = c.tensor_from(np.arange(4096, dtype=np.float32))
    c.publish_tensor("restart/weights", w)
    arr = w.numpy()
    mb.kill_and_restart()
    c.wait_for_reattach(1, timeout_ms=10000)
    assert c.reattaches == 1
    c.ping()
    assert arr[4095] == 4095.0  # the mapping never went away
    out = finish(child("""
        import sys, numpy as np, membroker
        t = membroker.connect(sys.argv[1], "consumer").lookup_tensor("restart/weights", timeout_ms=2000)
        print(int(t.numpy().sum()))
    """, mb.socket))
    assert int(out) == sum(range(4096))
    assert mb.stats()["handles_adopted"] == 1


def test_a_channel_takes_a_page_policy_and_refuses_an_unknown_one(mb):
    # An explicit policy by name ("normal": the huge-page pool belongs to the
    # hugepage tests, which ctest runs beside this suite and which count the
    # free pages; a "huge-first" channel here took them from under those
    # tests). Channels on huge pages: HugePages.AChannelKeepsItsChunksOnHugePagesWhenAsked.
    c = membroker.connect(mb.socket, "publisher")
    with pytest.raises(membroker.ParamInvalid):
        membroker.ChannelPublisher(c, "py/pages-bad", chunks=2, chunk_bytes=4096, page_policy="enormous")
    pub = membroker.ChannelPublisher(c, "py/pages", chunks=2, chunk_bytes=2 << 20, page_policy="normal")
    sub = membroker.ChannelSubscriber(membroker.connect(mb.socket, "reader"), "py/pages", lookup_timeout_ms=5000)
    pub.wait_for_subscribers(1, timeout_ms=5000)
    chunk = pub.loan(2 << 20)
    chunk.numpy(np.uint32)[:] = np.arange((2 << 20) // 4, dtype=np.uint32)
    pub.publish(chunk, size=2 << 20)
    got = sub.receive(timeout_ms=5000)
    assert np.array_equal(got.numpy(np.uint32), np.arange((2 << 20) // 4, dtype=np.uint32))
    import torch
    t = got.torch(torch.int32, ((2 << 20) // 4,))  # a torch view of the same bytes, no copy
    assert t.dtype == torch.int32 and int(t[12345]) == 12345 and t.data_ptr() == got.numpy().ctypes.data
    sub.release(got)
    pub.close()


def test_every_torch_dtype_travels_exactly_to_another_process(mb):
    # bfloat16 (every current checkpoint), complex32 and bool among them;
    # numpy has no bfloat16 or complex32: .torch() reads the bytes itself.
    import torch
    c = membroker.connect(mb.socket, "publisher")
    types = [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.complex32, torch.complex64,
             torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
    types += [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]
    expect = {}
    for i, dt in enumerate(types):
        src = (torch.arange(24, dtype=torch.float32) * 0.5 - 3).reshape(2, 3, 4).to(dt)
        t = c.tensor_from(src)  # given a torch tensor: its bytes, not a conversion
        c.publish_tensor(f"py/dtypes/{i}", t)
        expect[i] = (str(dt), src.view(torch.uint8).flatten().tolist() if dt != torch.bool else src.tolist())
    for spec in ("bfloat16", torch.bfloat16, "bf16"):
        assert c.new_tensor((2,), spec).element.name == "bfloat16"
    assert c.new_tensor((2,), np.float16).element.name == "float16"
    with pytest.raises(ValueError):
        c.new_tensor((2,), "not-a-type")
    out = finish(child("""
        import sys, json, torch, membroker
        c = membroker.connect(sys.argv[1], "reader")
        got = {}
        for i in range(int(sys.argv[2])):
            t = c.lookup_tensor(f"py/dtypes/{i}", timeout_ms=5000)
            x = t.torch()
            got[i] = (str(x.dtype), list(x.shape), x.view(torch.uint8).flatten().tolist() if x.dtype != torch.bool
                      else x.tolist())
        print(json.dumps(got))
        """, mb.socket, str(len(types))))
    import json
    got = json.loads(out)
    for i, dt in enumerate(types):
        dtype_name, shape, data = got[str(i)]
        assert dtype_name == expect[i][0] and shape == [2, 3, 4], (i, dtype_name, shape)
        assert data == expect[i][1], dtype_name
    bf = c.lookup_tensor("py/dtypes/0")
    with pytest.raises(TypeError, match="numpy has no bfloat16"):
        bf.numpy()


def test_list_names_gives_every_name_of_a_model(mb):
    # ~300 tensors in a 7B model: all of them, not the first 128.
    c = membroker.connect(mb.socket, "publisher")
    h = c.malloc_physical(4096)
    for i in range(300):
        c.publish(f"py/model/w{i:03d}", h)
    reader = membroker.connect(mb.socket, "reader")
    names = [o["name"] for o in reader.list_names("py/model/")]
    assert names == [f"py/model/w{i:03d}" for i in range(300)]


def test_chunk_views_outlive_close_and_leave_and_closed_tensors_make_no_views(mb):
    # In a child: a wrong answer here used to be a SIGSEGV, which would end pytest.
    out = finish(child("""
        import sys, numpy as np, membroker
        c = membroker.connect(sys.argv[1], "publisher")
        pub = membroker.ChannelPublisher(c, "py/outlive", chunks=4, chunk_bytes=4096)
        reader = membroker.connect(sys.argv[1], "reader")
        sub = membroker.ChannelSubscriber(reader, "py/outlive", lookup_timeout_ms=5000)
        pub.wait_for_subscribers(1, timeout_ms=5000)
        loaned = pub.loan(4096)
        never_published = loaned.numpy(np.uint8)
        sent = pub.loan(4096)
        published = sent.numpy(np.uint8)
        published[:] = 7
        pub.publish(sent, size=4096)
        got = sub.receive(timeout_ms=5000)
        received = got.numpy(np.uint8)
        del loaned, sent, got  # only the views are left
        pub.close()
        sub.leave()
        never_published[:] = 1  # a write and reads after close and leave: the memory is still mapped
        print(int(never_published.sum()), int(published.sum()), int(received.sum()))
        try:
            membroker.ChannelSubscriber(reader, "py/outlive", lookup_timeout_ms=0)
        except membroker.Error as e:
            print(type(e).__name__)
        t = c.new_tensor((4,), "float32")
        t.numpy()[:] = 3
        kept = t.numpy()
        t.close()
        for make in (t.numpy, t.torch):
            try:
                make()
            except membroker.NotMapped:
                print("NotMapped")
        print(float(kept.sum()))
        """, mb.socket))
    assert out.split() == ["4096", str(7 * 4096), str(7 * 4096), "NotFound", "NotMapped", "NotMapped", "12.0"], out


def test_a_channel_broadcasts_numpy_chunks_to_two_processes_and_a_killed_subscriber_gives_back(mb):
    # Two subscriber processes read every chunk as a read-only numpy view; one
    # more, SIGKILLed while holding chunks, gives them back to the pool.
    c = membroker.connect(mb.socket, "publisher")
    pub = membroker.ChannelPublisher(c, "py/chan", chunks=4, chunk_bytes=1 << 16, queue_depth=4)
    reader = """
        import sys, numpy as np, membroker
        c = membroker.connect(sys.argv[1], "reader")
        sub = membroker.ChannelSubscriber(c, "py/chan", lookup_timeout_ms=5000)
        print("joined", flush=True)
        total = 0
        while True:
            try:
                chunk = sub.receive(timeout_ms=20000)
            except membroker.NotConnected:
                break
            a = chunk.numpy(np.float32)
            assert not a.flags.writeable
            assert (a == chunk.sequence).all(), (chunk.sequence, a[:4])
            total += int(a.sum())
            sub.release(chunk)
        print(total)
    """
    readers = [child(reader, mb.socket) for _ in range(2)]
    for r in readers:
        assert r.stdout.readline().strip() == "joined"
    pub.wait_for_subscribers(2, timeout_ms=5000)
    for n in range(1, 101):
        chunk = pub.loan(4096 * 4)
        chunk.numpy(np.float32)[:4096] = n
        pub.publish(chunk, size=4096 * 4)
    pub.close()
    expected = sum(n * 4096 for n in range(1, 101))
    assert [int(finish(r).split()[-1]) for r in readers] == [expected, expected]

    pub = membroker.ChannelPublisher(c, "py/chan2", chunks=4, chunk_bytes=4096, queue_depth=4)
    holder = child("""
        import sys, time, membroker
        sub = membroker.ChannelSubscriber(membroker.connect(sys.argv[1], "holder"), "py/chan2", lookup_timeout_ms=5000)
        held = [sub.receive(timeout_ms=5000) for _ in range(4)]
        print("holding", flush=True)
        time.sleep(60)
    """, mb.socket)
    pub.wait_for_subscribers(1, timeout_ms=5000)
    for _ in range(4):
        pub.publish(pub.loan(8))
    assert holder.stdout.readline().strip() == "holding"
    with pytest.raises(membroker.Timeout):
        pub.loan(8, timeout_ms=0)
    holder.kill()
    holder.wait()
    chunks = [pub.loan(8, timeout_ms=1000) for _ in range(4)]  # reaped on the way
    assert pub.stats["reaped"] == 1 and pub.stats["reclaimed"] == 4
    for ch in chunks:
        pub.discard(ch)
    pub.close()


def test_transfer_engine_by_address_between_two_brokers(tmp_path):
    """Two brokers (two "hosts" as far as the engines know), an engine in a child
    process listening on 127.0.0.1 with a secret; this one connects by ip:port
    over UCX, writes and reads, notifies; a connector without the secret is refused."""
    from membroker.testing import broker
    secret = tmp_path / "secret"
    secret.write_text("py-secret\n")
    os.chmod(secret, 0o600)
    with broker() as listener_broker, broker() as connector_broker:
        p = child("""
            import sys, numpy as np, membroker
            c = membroker.connect(sys.argv[1], "listener")
            dst = c.new_tensor((1 << 16,), "uint8")
            dst.numpy()[:] = 1
            try:
                eng = membroker.TransferEngine(c, "py-decode", {"listen_address": "127.0.0.1:0", "secret_file": sys.argv[2]})
            except membroker.Unsupported as e:
                print("unsupported", flush=True)
                sys.exit(0)
            eng.register_mem(dst.mapping)
            print(eng.network_stats()["listen_address"], dst.mapping.address, flush=True)
            sys.stdin.readline()
            assert eng.get_notifies() == [("py-prefill", "kv_ready", "64 KiB")]
            assert (dst.numpy() == 9).all()
            stats = eng.network_stats()
            assert stats["accepted"] == 1 and stats["refused"] == 1, stats
            eng.finalize()
        """, listener_broker.socket, str(secret), stdin=subprocess.PIPE)
        first = p.stdout.readline().split()
        if first == ["unsupported"]:
            finish(p)
            pytest.skip("libmembroker built without UCX")
        addr, remote = first[0], int(first[1])
        c = membroker.connect(connector_broker.socket, "connector")
        src = c.tensor_from(np.full(1 << 16, 9, dtype=np.uint8))
        back = c.new_tensor((1 << 16,), "uint8")
        eng = membroker.TransferEngine(c, "py-prefill", {"secret_file": str(secret)})
        eng.register_mem(src.mapping)
        eng.register_mem(back.mapping)
        eng.connect(addr, 5000)
        info = eng.connection_info(addr)
        assert info["path"] == "ucx" and info["engine"] == "py-decode" and info["address"] == addr, info
        eng.transfer_sync(addr, "read", [(back.mapping.address, remote, 1 << 16)], 5000)
        assert (back.numpy() == 1).all()
        eng.transfer_sync(addr, "write", [(src.mapping.address, remote, 1 << 16)], 5000)
        with pytest.raises(membroker.ParamInvalid):
            eng.transfer_sync(addr, "write", [(src.mapping.address, remote + (1 << 20), 4096)], 5000)
        eng.send_notify(addr, "kv_ready", "64 KiB")
        intruder_client = membroker.connect(connector_broker.socket, "intruder")
        intruder = membroker.TransferEngine(intruder_client, "py-intruder")
        with pytest.raises(membroker.PermissionDenied):
            intruder.connect(addr, 5000)
        p.stdin.write("go\n")
        p.stdin.flush()
        finish(p)
        intruder.finalize()
        eng.finalize()


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _etcd(tmp_path):
    """A real etcd on loopback ports of its own (skips without Debian's etcd);
    yields the --cluster arguments of a broker in namespace "py"."""
    import shutil
    import time
    if shutil.which("etcd") is None or shutil.which("etcdctl") is None:
        pytest.skip("etcd-server and etcd-client are not installed (scripts/test installs them)")
    client_port, peer_port = _free_port(), _free_port()
    url = f"http://127.0.0.1:{client_port}"
    peer = f"http://127.0.0.1:{peer_port}"
    etcd = subprocess.Popen(["etcd", "--name", "py", "--data-dir", str(tmp_path / "etcd"), "--listen-client-urls", url,
                             "--advertise-client-urls", url, "--listen-peer-urls", peer,
                             "--initial-advertise-peer-urls", peer, "--initial-cluster", "py=" + peer],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60  # a bound on a readiness poll, not a verdict
        while subprocess.run(["etcdctl", "--endpoints", url, "endpoint", "health"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL).returncode != 0:
            assert time.monotonic() < deadline, "etcd did not start"
            time.sleep(0.05)
        yield ["--cluster", f"etcd://127.0.0.1:{client_port}", "--cluster-namespace", "py", "--cluster-ttl-s", "2"]
    finally:
        etcd.kill()
        etcd.wait()


@contextlib.contextmanager
def _two_hosts(tmp_path):
    """Brokers py-a and py-b in one cluster (a real etcd), and a secret file
    of mode 0600 for their engines: yields (a, b, secret)."""
    from membroker.testing import broker
    with _etcd(tmp_path) as cluster:
        secret = tmp_path / "secret"
        secret.write_text("py-cluster-secret\n")
        os.chmod(secret, 0o600)
        with broker(*cluster, "--host-name", "py-a") as a, broker(*cluster, "--host-name", "py-b") as b:
            yield a, b, secret


def test_transfer_engine_by_name_on_another_host_of_the_cluster(tmp_path):
    """Two brokers in one cluster (docs/CLUSTER.md, a real etcd on loopback): an
    engine in a child process on host b; this process, on host a, connects to it
    by its name alone and writes into it over the network path."""
    with _two_hosts(tmp_path) as (a, b, secret):
        p = child("""
            import sys, membroker
            c = membroker.connect(sys.argv[1], "decode")
            dst = c.new_tensor((1 << 16,), "uint8")
            try:
                eng = membroker.TransferEngine(c, "py-decode-0", {"listen_address": "127.0.0.1:0", "secret_file": sys.argv[2]})
            except membroker.Unsupported:
                print("unsupported", flush=True)
                sys.exit(0)
            eng.register_mem(dst.mapping)
            print(dst.mapping.address, flush=True)
            sys.stdin.readline()
            assert (dst.numpy() == 7).all()
            eng.finalize()
        """, b.socket, str(secret), stdin=subprocess.PIPE)
        first = p.stdout.readline().split()
        if first == ["unsupported"]:
            finish(p)
            pytest.skip("libmembroker built without UCX")
        remote = int(first[0])
        c = membroker.connect(a.socket, "prefill")
        src = c.tensor_from(np.full(1 << 16, 7, dtype=np.uint8))
        eng = membroker.TransferEngine(c, "py-prefill-0", {"secret_file": str(secret)})
        eng.register_mem(src.mapping)
        eng.connect("py-decode-0", 60000)  # waits until host b's record lists it
        info = eng.connection_info("py-decode-0")
        assert info["path"] == "ucx" and info["engine"] == "py-decode-0", info
        eng.transfer_sync("py-decode-0", "write", [(src.mapping.address, remote, 1 << 16)], 10000)
        with pytest.raises(membroker.NotFound):
            eng.connect("py-nowhere", 0)
        p.stdin.write("go\n")
        p.stdin.flush()
        finish(p)
        eng.finalize()


def test_a_tensor_published_for_the_cluster_is_found_from_another_host(tmp_path):
    """publish_tensor(..., cluster=True) in a child process on host b;
    lookup_cluster on host a waits for it and reads where it lives, its size and
    its metadata; a cluster subscriber on a hears it published and, when the
    child exits, unpublished."""
    import json
    from membroker.testing import broker
    with _etcd(tmp_path) as cluster:
        with broker(*cluster, "--host-name", "py-a") as a, broker(*cluster, "--host-name", "py-b") as b:
            c = membroker.connect(a.socket, "reader")
            with pytest.raises(membroker.NotFound):
                c.lookup_cluster("py/weights", 0)
            events = membroker.connect(a.socket, "events")
            events.subscribe("py/", cluster=True)
            p = child("""
                import sys, membroker
                c = membroker.connect(sys.argv[1], "publisher")
                t = c.new_tensor((256, 4), "float32")
                c.publish_tensor("py/weights", t, read_only=True, metadata={"layer": 3}, cluster=True)
                print("published", flush=True)
                sys.stdin.readline()
            """, b.socket, stdin=subprocess.PIPE)
            at = c.lookup_cluster("py/weights", 60000)  # waits until host b's record lists it
            assert p.stdout.readline().strip() == "published"
            assert at["host"] == "py-b" and at["size"] == 4096 and at["read_only"], at
            assert at["generation"] > 0
            assert json.loads(at["metadata"])["user"] == {"layer": 3}, at["metadata"]
            p.stdin.write("go\n")
            p.stdin.flush()
            finish(p)
            import time
            deadline = time.monotonic() + 60  # a bound on a poll, not a verdict
            while True:
                try:
                    c.lookup_cluster("py/weights", 0)
                except membroker.NotFound:
                    break
                assert time.monotonic() < deadline, "the name outlived its publisher"
                time.sleep(0.02)
            seen = []
            while len(seen) < 2:
                got, dropped = events.wait_events(60000)
                assert got and dropped == 0, (got, dropped)
                seen += [(e["kind"], e["host"], e["name"]) for e in got]
            assert seen == [("published", "py-b", "py/weights"), ("unpublished", "py-b", "py/weights")], seen


def _share_binary():
    """membroker-share beside the membrokerd under test (the build tree's, or
    the installed one on PATH)."""
    import shutil
    daemon = os.environ.get("MEMBROKERD") or shutil.which("membrokerd")
    built = os.path.join(os.path.dirname(os.path.dirname(daemon)), "tools", "membroker-share")
    return built if os.path.exists(built) else shutil.which("membroker-share")


def test_a_tensor_published_for_the_cluster_is_fetched_from_another_host(tmp_path):
    """A child on host b publishes a tensor read-only for the cluster; host b
    runs membroker-share; this process, on host a, fetches it with
    fetch_tensor in one call: new memory here with the same values, dtype,
    shape and user metadata. A name not read-only is refused."""
    import numpy as np
    with _two_hosts(tmp_path) as (a, b, secret):
        p = child("""
            import sys, numpy as np, membroker
            c = membroker.connect(sys.argv[1], "publisher")
            t = c.tensor_from(np.arange(1 << 18, dtype=np.float32).reshape(512, 512))
            c.publish_tensor("py/weights", t, read_only=True, metadata={"layer": 3}, cluster=True)
            c.publish_tensor("py/scratch", t, cluster=True)
            print("published", flush=True)
            sys.stdin.readline()
        """, b.socket, stdin=subprocess.PIPE)
        assert p.stdout.readline().strip() == "published"
        share = subprocess.Popen([_share_binary(), "--socket", b.socket, "--listen", "127.0.0.1:0",
                                  "--secret-file", str(secret)], stdout=subprocess.PIPE, text=True)
        try:
            assert share.stdout.readline().startswith("serving as membroker-share@py-b on 127.0.0.1:")
            c = membroker.connect(a.socket, "fetcher")
            assert c.cluster_host == "py-a"
            engine = membroker.TransferEngine(c, "py-fetcher", {"secret_file": str(secret)})
            t = c.fetch_tensor(engine, "py/weights", 60000)
            assert t.dtype == np.float32 and tuple(t.shape) == (512, 512) and t.user_metadata == {"layer": 3}
            assert np.array_equal(t.numpy(), np.arange(1 << 18, dtype=np.float32).reshape(512, 512))
            f = c.fetch_named(engine, "py/weights", 60000)
            assert f["host"] == "py-b" and f["copied"] and f["size"] == 1 << 20, f
            with pytest.raises(membroker.Unsupported):
                c.fetch_named(engine, "py/scratch", 60000)
            t.close()
            engine.finalize()
        finally:
            share.terminate()
            assert share.wait(60) == 0
            p.stdin.write("go\n")
            p.stdin.flush()
            finish(p)


def test_a_process_off_the_network_never_loads_ucx_and_keeps_pythons_fault_handler(mb):
    """import membroker and a transfer engine on this host only load no UCX (its
    signal handlers would replace Python's faulthandler): a crash of the user's
    own shows Python's traceback. The network module loads with the first
    listen_address (tested from C++ too: NetModule.LoadedOnlyWhenAnEngineAsksForTheNetwork)."""
    p = subprocess.run([sys.executable, "-X", "faulthandler", "-c", textwrap.dedent("""
        import ctypes, sys, membroker
        a = membroker.connect(sys.argv[1], "local-a")
        b = membroker.connect(sys.argv[1], "local-b")
        src = a.new_tensor((1 << 16,), "uint8")
        ea = membroker.TransferEngine(a, "local-a")
        eb = membroker.TransferEngine(b, "local-b")
        ea.register_mem(src.mapping)
        eb.connect("local-a", 5000)
        print("libucs" in open("/proc/self/maps").read(), flush=True)
        ctypes.string_at(0)  # the user's own crash
    """), mb.socket], capture_output=True, text=True, timeout=60)
    assert p.returncode == -signal.SIGSEGV, (p.returncode, p.stdout, p.stderr)
    assert p.stdout.strip() == "False", p.stdout
    assert "Fatal Python error: Segmentation fault" in p.stderr, p.stderr
    assert 'File "<string>", line 11 in <module>' in p.stderr, p.stderr
    assert "ucs_handle_error" not in p.stderr, p.stderr


def test_a_state_dict_is_published_whole_and_a_new_version_replaces_it_for_new_readers_only(mb):
    import torch
    c = membroker.connect(mb.socket, "trainer")
    torch.manual_seed(7)
    v1 = {"embed.weight": torch.randn(64, 32).to(torch.bfloat16), "norm.bias": torch.randn(32),
          "step": torch.tensor(1, dtype=torch.int64), "mask": torch.rand(5, 3) > 0.5,
          "transposed": torch.arange(12, dtype=torch.float16).reshape(3, 4).t(),  # not contiguous
          "empty": torch.zeros(0, 4)}
    c.publish_state_dict("py/model", v1, persist=True)
    # A reader in another process: every tensor, exactly, read-only pages.
    reader = child("""
        import sys, torch, membroker
        c = membroker.connect(sys.argv[1], "server")
        sd = c.lookup_state_dict("py/model", timeout_ms=5000)
        def digest(sd):
            return sorted((k, str(v.dtype), list(v.shape), v.float().sum().item() if v.numel() else 0.0)
                          for k, v in sd.items())
        print(digest(sd), flush=True)
        assert sys.stdin.readline() == "again\\n"
        print(digest(sd), flush=True)  # the old version's pages, after the replace
        fresh = c.lookup_state_dict("py/model")
        print(digest(fresh), flush=True)
        print(sd["embed.weight"].data_ptr() != fresh["embed.weight"].data_ptr(), flush=True)
        """, mb.socket, stdin=subprocess.PIPE)

    def digest(sd):
        return str(sorted((k, str(v.dtype), list(v.shape), v.float().sum().item() if v.numel() else 0.0)
                          for k, v in sd.items()))
    assert reader.stdout.readline().strip() == digest(v1)
    v2 = {k: (v + 1 if v.dtype not in (torch.bool,) else ~v) for k, v in v1.items()}
    other = membroker.connect(mb.socket, "trainer-restarted")  # another process of the same user may replace
    other.publish_state_dict("py/model", v2, persist=True, replace=True)
    reader.stdin.write("again\n")
    reader.stdin.flush()
    assert reader.stdout.readline().strip() == digest(v1)
    assert reader.stdout.readline().strip() == digest(v2)
    assert reader.stdout.readline().strip() == "True"
    finish(reader)
    # Numpy in, numpy out: ndarrays over read-only pages.
    c.publish_state_dict("py/np", {"a": np.arange(10, dtype=np.float32), "b": np.eye(3, dtype=np.int8)})
    arrays = membroker.connect(mb.socket, "numpy-reader").lookup_state_dict("py/np", framework="numpy")
    assert arrays["a"].tolist() == list(range(10)) and arrays["b"].tolist() == np.eye(3).tolist()
    assert not arrays["a"].flags.writeable
    with pytest.raises(membroker.AlreadyExists):
        other.publish_state_dict("py/model", v2)  # no replace: the name is taken
    names = [o["name"] for o in c.list_names("py/model")]
    assert names == ["py/model"]
    c.unpublish("py/model")
    c.unpublish("py/np")
    del arrays
    gc.collect()


def test_a_state_dict_reader_trusts_nothing_in_it(mb):
    import json
    c = membroker.connect(mb.socket, "vandal")
    with pytest.raises(TypeError, match="'opt'"):
        c.publish_state_dict("py/bad", {"w": np.zeros(4), "opt": {"lr": 0.1}})
    with pytest.raises(membroker.NotFound):
        c.lookup("py/bad")  # nothing half-published
    h = c.malloc_physical(4096)
    m = c.map_handle(h)
    cases = {
        "py/damaged/manifest": (b"{not json", {"manifest_bytes": 9}),
        "py/damaged/too-long": (b"{}", {"manifest_bytes": 1 << 20}),
        "py/damaged/outside": (json.dumps({"tensors": [{"name": "w", "dtype": "float32", "shape": [4096],
                                                        "offset": 64}]}).encode(), None),
        "py/damaged/dtype": (json.dumps({"tensors": [{"name": "w", "dtype": "no-such", "shape": [1],
                                                      "offset": 128}]}).encode(), None),
        "py/damaged/overlap": (json.dumps({"tensors": [{"name": "w", "dtype": "uint8", "shape": [1],
                                                        "offset": 0}]}).encode(), None),
    }
    for name, (manifest, meta) in cases.items():
        memoryview(m)[:len(manifest)] = manifest
        meta = meta or {"manifest_bytes": len(manifest)}
        c.publish(name, h, metadata=json.dumps({"kind": "membroker.state_dict", "format": 1, **meta}).encode())
    c.publish("py/damaged/not-one", h, metadata=b"\xff\xfe")
    reader = membroker.connect(mb.socket, "reader")
    for name in [*cases, "py/damaged/not-one"]:
        with pytest.raises(ValueError):
            reader.lookup_state_dict(name, framework="numpy")
    with pytest.raises(ValueError, match="framework"):
        reader.lookup_state_dict("py/damaged/manifest", framework="jax")


def test_publish_tensor_carries_user_metadata_and_replaces(mb):
    c = membroker.connect(mb.socket, "publisher")
    a = c.tensor_from(np.arange(6, dtype=np.int32))
    b = c.tensor_from(np.arange(6, dtype=np.int32) * 2)
    c.publish_tensor("py/layer3", a, metadata={"layer": 3, "source": "ckpt-17"})
    out = finish(child("""
        import sys, membroker
        c = membroker.connect(sys.argv[1], "reader")
        t = c.lookup_tensor("py/layer3", timeout_ms=5000)
        print(t.user_metadata, t.numpy().tolist())
        """, mb.socket))
    assert out.strip() == "{'layer': 3, 'source': 'ckpt-17'} [0, 1, 2, 3, 4, 5]"
    c.publish_tensor("py/layer3", b, replace=True)
    reader = membroker.connect(mb.socket, "reader2")
    t = reader.lookup_tensor("py/layer3")
    assert t.user_metadata is None and t.numpy().tolist() == [0, 2, 4, 6, 8, 10]
    with pytest.raises(TypeError):
        c.publish_tensor("py/x", a, metadata=["not", "a", "dict"])
    with pytest.raises(membroker.ParamInvalid):
        c.publish_tensor("py/x", a, metadata={"big": "x" * 5000})


def test_a_model_loads_a_published_state_dict_without_a_copy(mb):
    import torch
    torch.manual_seed(3)
    src = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    loader = membroker.connect(mb.socket, "loader")
    loader.publish_state_dict("py/mlp", src.state_dict())
    out = finish(child("""
        import sys, torch, membroker
        c = membroker.connect(sys.argv[1], "worker")
        model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        sd = c.lookup_state_dict("py/mlp", timeout_ms=5000)
        # The broker's pages as the model's parameters, no copy: load_state_dict(sd, assign=True)
        # where torch has it (2.1+), functional_call on the torch here.
        try:
            from torch.func import functional_call
        except ImportError:
            from torch.nn.utils.stateless import functional_call
        with torch.no_grad():
            print(functional_call(model, sd, (torch.ones(1, 8),)).tolist())
        """, mb.socket))
    with torch.no_grad():
        assert out.strip() == str(src(torch.ones(1, 8)).tolist())


# A torch.multiprocessing program written as torch's docs show it (a Queue, a
# consumer Process; fork or spawn), with the one line that makes it share
# through the broker. torch's file_system strategy is set on purpose: without the
# broker, every tensor would be a /dev/shm/torch_* file while shared.
TORCH_MP_PROGRAM = """
import os, sys, torch, torch.multiprocessing as mp
import membroker.torch

def consumer(q, results):
    held = []
    while True:
        t = q.get()
        if t is None:
            break
        results.put((str(t.dtype), type(t).__name__, float(t.float().sum())))
        held.append(t)
        if len(held) == 1:
            t.mul_(2)  # shared pages: the producer sees this
        results.put("received")
    results.put("done")

if __name__ == "__main__":
    membroker.torch.enable(sys.argv[1])  # the one line
    torch.multiprocessing.set_sharing_strategy("file_system")
    mode, start = sys.argv[2], sys.argv[3]
    ctx = mp.get_context(start)
    q, results = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=consumer, args=(q, results))
    p.start()
    first = torch.arange(1000, dtype=torch.float32)
    q.put(first)
    print(results.get(timeout=180), results.get(timeout=180), flush=True)
    print("shared", first[1].item() == 2.0, flush=True)
    q.put(torch.nn.Parameter(torch.ones(4, 4)))
    q.put(torch.ones(3, 5, dtype=torch.bfloat16).t())  # not contiguous, no numpy type
    q.put(first)  # already in broker memory: no copy, the consumer maps it once
    for _ in range(3):
        print(results.get(timeout=180), results.get(timeout=180), flush=True)
    print("torch files in /dev/shm:", len([f for f in os.listdir("/dev/shm") if f.startswith("torch_")]), flush=True)
    if mode == "kill":
        print("holding", flush=True)
        sys.stdin.readline()  # SIGKILLed here, the consumer too
    q.put(None)
    print(results.get(timeout=180), flush=True)
    p.join(180)
    print("exit", p.exitcode, flush=True)
"""


def torch_mp_program(tmp_path) -> str:
    """The program as a file: spawned children import their main module again."""
    path = tmp_path / "torch_mp_program.py"
    path.write_text(TORCH_MP_PROGRAM)
    return str(path)


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_torch_multiprocessing_shares_through_the_broker_with_one_line(mb, tmp_path, start):
    p = subprocess.run([sys.executable, torch_mp_program(tmp_path), mb.socket, "normal", start], capture_output=True,
                       text=True, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "('torch.float32', 'Tensor', 499500.0) received", p.stdout
    assert lines[1] == "shared True"
    assert lines[2] == "('torch.float32', 'Parameter', 16.0) received"
    assert lines[3] == "('torch.bfloat16', 'Tensor', 15.0) received"
    assert lines[4] == "('torch.float32', 'Tensor', 999000.0) received"  # the doubled pages
    assert lines[5] == "torch files in /dev/shm: 0"
    assert lines[6:] == ["done", "exit 0"]
    assert mb.wait_for_stat("allocations_live", 0) == 0


def test_torch_multiprocessing_processes_killed_while_sharing_leave_nothing(mb, tmp_path):
    before = shm_files()
    p = subprocess.Popen([sys.executable, torch_mp_program(tmp_path), mb.socket, "kill", "fork"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        for line in iter(p.stdout.readline, ""):
            if line.strip() == "holding":
                break
        else:
            pytest.fail("the program ended before holding: " + p.stderr.read())
        assert mb.stats()["allocations_live"] >= 3  # in broker memory, not in files
        os.killpg(p.pid, signal.SIGKILL)
    finally:
        p.kill()
        p.wait(60)
    assert mb.wait_for_stat("allocations_live", 0) == 0
    assert mb.wait_for_stat("clients_connected", 0) == 0
    assert shm_files() == before


def test_asyncio_waits_for_events_and_notifies_on_the_loop_without_threads(mb):
    """One event loop waits for a name event and an engine notify at once, both
    sent by another process; no thread is started for the waits, and a wait
    with nothing to come ends at its bound."""
    import asyncio
    import threading

    c = membroker.connect(mb.socket, "async-waiter")
    c.subscribe("async/")
    eng = membroker.TransferEngine(c, "async-receiver")
    p = child("""
        import sys, membroker
        c = membroker.connect(sys.argv[1], "async-sender")
        eng = membroker.TransferEngine(c, "async-sender")
        eng.connect("async-receiver", 10000)
        sys.stdin.readline()                      # the loop is waiting
        h = c.malloc_physical(4096)
        c.publish("async/ready", h)
        eng.send_notify("async-receiver", "kv_ready", "block-7")
        sys.stdin.readline()
        c.unpublish("async/ready")
        eng.finalize()
    """, mb.socket, stdin=subprocess.PIPE)

    async def main():
        threads = threading.active_count()
        events = asyncio.ensure_future(c.wait_events_async(timeout_ms=60000))
        notifies = asyncio.ensure_future(eng.wait_notifies_async(timeout_ms=60000))
        await asyncio.sleep(0)                    # both are armed on the loop
        assert threading.active_count() == threads
        p.stdin.write("go\n")
        p.stdin.flush()
        got_events, got_notifies = await asyncio.gather(events, notifies)
        assert threading.active_count() == threads
        assert [(e["kind"], e["name"]) for e in got_events[0]] == [("published", "async/ready")]
        assert got_notifies == [("async-sender", "kv_ready", "block-7")]
        # Nothing more comes: each wait ends at its bound, empty.
        assert await eng.wait_notifies_async(timeout_ms=20) == []
        assert await c.wait_events_async(timeout_ms=20) == ([], 0)

    asyncio.run(main())
    p.stdin.write("done\n")
    p.stdin.flush()
    finish(p)
    # The blocking forms: bounded, and the fd is the client's for any selector.
    assert eng.wait_notifies(timeout_ms=10) == []
    assert eng.fileno() == c.fileno() >= 0
    with pytest.raises(membroker.ParamInvalid):
        eng.wait_notifies(timeout_ms=-1)
    eng.finalize()
    c.close()


def test_a_channel_subscriber_receives_in_asyncio_and_sees_its_publisher_killed(mb):
    """A subscriber in an event loop gets every chunk another process publishes,
    waiting on the loop without a thread, and learns at once (not at its
    timeout) that the publisher was SIGKILLed."""
    import asyncio
    import threading

    p = child("""
        import sys, membroker
        c = membroker.connect(sys.argv[1], "async-publisher")
        pub = membroker.ChannelPublisher(c, "async/chan", chunks=4, chunk_bytes=4096)
        print("created", flush=True)
        pub.wait_for_subscribers(1, 60000)
        for line in sys.stdin:
            n = int(line)
            chunk = pub.loan(8)
            chunk.numpy("int64")[:] = n
            pub.publish(chunk, size=8)
            print("published", flush=True)
    """, mb.socket, stdin=subprocess.PIPE)
    assert p.stdout.readline() == "created\n"
    c = membroker.connect(mb.socket, "async-subscriber")
    sub = membroker.ChannelSubscriber(c, "async/chan", lookup_timeout_ms=10000)

    async def main():
        threads = threading.active_count()
        for n in range(1, 4):
            waiting = asyncio.ensure_future(sub.receive_async(timeout_ms=60000))
            await asyncio.sleep(0)
            p.stdin.write(f"{n}\n")
            p.stdin.flush()
            chunk = await waiting
            assert int(chunk.numpy("int64")[0]) == n and chunk.sequence == n
            sub.release(chunk)
            assert p.stdout.readline() == "published\n"
        assert threading.active_count() == threads
        with pytest.raises(membroker.Timeout):
            await sub.receive_async(timeout_ms=20)
        waiting = asyncio.ensure_future(sub.receive_async(timeout_ms=120000))
        await asyncio.sleep(0)
        p.kill()
        with pytest.raises(membroker.NotConnected):
            await waiting                         # woken by the publisher's pidfd, not by its bound

    asyncio.run(main())
    p.wait()
    sub.leave()
    c.close()


def test_transfers_take_tensors_and_slices_and_name_what_is_wrong(mb):
    """register_mem takes a membroker Tensor or a torch view of one; a descriptor
    is (tensor slice, remote address); what cannot work is refused with a
    message that names it, before anything moves."""
    import torch
    c = membroker.connect(mb.socket, "tensor-writer")
    src = c.new_tensor((1024,), "int32")
    src.numpy()[:] = np.arange(1024, dtype=np.int32)
    eng = membroker.TransferEngine(c, "tensor-writer")
    eng.register_mem(src)
    p = child("""
        import sys, numpy as np, membroker
        c = membroker.connect(sys.argv[1], "tensor-target")
        dst = c.new_tensor((1024,), "int32")
        dst.numpy()[:] = -1
        eng = membroker.TransferEngine(c, "tensor-target")
        eng.register_mem(dst.torch(), name="kv")   # a torch view of broker memory, under a name
        print("registered", flush=True)
        sys.stdin.readline()
        got = dst.numpy()
        assert (got[256:512] == np.arange(256, 512)).all(), got[256:512]
        assert (got[:256] == -1).all() and (got[512:] == -1).all()
        eng.finalize()
    """, mb.socket, stdin=subprocess.PIPE)
    assert p.stdout.readline() == "registered\n"
    eng.connect("tensor-target", 10000)
    regions = eng.remote_regions("tensor-target")
    assert list(regions) == ["kv"] and regions["kv"]["length"] >= 4096 and not regions["kv"]["read_only"]
    remote = regions["kv"]["address"]               # found by its name, not carried by hand
    mine, again = c.new_tensor((16,), "int32"), c.new_tensor((16,), "int32")
    eng.register_mem(mine, name="mine")
    with pytest.raises(membroker.AlreadyExists, match="mine"):
        eng.register_mem(again, name="mine")        # a name is unique in its engine
    with pytest.raises(membroker.ParamInvalid, match="overlaps"):
        eng.register_mem(src.torch()[:8])           # registered already (the whole mapping)
    t = src.torch()
    eng.transfer_sync("tensor-target", "write", [(t[256:384], remote + 256 * 4)], 10000)
    eng.transfer_sync("tensor-target", "write", [(t[384:512], ("kv", 384 * 4))], 10000)  # by the peer's name
    with pytest.raises(membroker.NotFound, match="descriptor 0: .*no range named \"nope\" \\(it has: kv\\)"):
        eng.transfer_sync("tensor-target", "write", [(t[:4], "nope")], 10000)
    with pytest.raises(membroker.ParamInvalid, match="outside \"kv\""):
        eng.transfer_sync("tensor-target", "write", [(t[:8], ("kv", 4096 * 1024))], 10000)
    with pytest.raises(ValueError, match="descriptor 0: .*not contiguous"):
        eng.transfer_sync("tensor-target", "write", [(t[::2], remote)], 10000)
    with pytest.raises(TypeError, match="descriptor 1: "):
        eng.transfer_sync("tensor-target", "write", [(t[:4], remote), ("x", remote, 4)], 10000)
    with pytest.raises(membroker.ParamInvalid, match="not in broker memory"):
        eng.register_mem(torch.zeros(4096))      # the process's own heap
    with pytest.raises(TypeError, match="is not memory"):
        eng.register_mem(object())
    p.stdin.write("check\n")
    p.stdin.flush()
    finish(p)
    eng.finalize()
