"""Device memory from Python (ctest Python.Device, label device): against the
CUDA driver double where no GPU is (LD_LIBRARY_PATH), the real driver on a GPU.
Debian's torch is CPU-only, so the views' contents are checked directly, and
bytes move through the driver's own copies (ctypes, the way a GPU program's
runtime would), never by touching device memory from the CPU."""
import ctypes

import pytest

import membroker


class Driver:
    """The few driver calls a test needs, found as membroker finds them."""

    def __init__(self):
        lib = ctypes.CDLL("libcuda.so.1")
        get = lib.cuGetProcAddress_v2
        get.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64,
                        ctypes.c_void_p]
        get.restype = ctypes.c_int

        def fn(name, *argtypes):
            p = ctypes.c_void_p()
            assert get(name.encode(), ctypes.byref(p), 12000, 0, None) == 0, name
            return ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)(p.value)

        assert fn("cuInit", ctypes.c_uint)(0) == 0
        ctx = ctypes.c_void_p()
        assert fn("cuDevicePrimaryCtxRetain", ctypes.POINTER(ctypes.c_void_p), ctypes.c_int)(ctypes.byref(ctx), 0) == 0
        assert fn("cuCtxSetCurrent", ctypes.c_void_p)(ctx) == 0
        self.htod = fn("cuMemcpyHtoD", ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t)
        self.dtoh = fn("cuMemcpyDtoH", ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t)

    def write(self, address: int, data: bytes):
        buf = ctypes.create_string_buffer(data, len(data))
        assert self.htod(address, buf, len(data)) == 0

    def read(self, address: int, n: int) -> bytes:
        buf = ctypes.create_string_buffer(n)
        assert self.dtoh(buf, address, n) == 0
        return buf.raw


@pytest.fixture
def driver():
    try:
        return Driver()
    except OSError as e:
        pytest.skip(f"no CUDA driver here: {e}")


def test_a_device_tensor_is_viewed_through_the_cuda_interfaces(mb, driver):
    with membroker.connect(mb.socket, "device") as c:
        t = c.new_tensor((4, 8), "float32", device=0)
        assert t.device == "cuda:0" and t.handle.device == 0
        assert type(t.mapping).__name__ == "DeviceMapping"
        with pytest.raises(TypeError, match="cuda:0 memory"):
            t.numpy()
        with pytest.raises(TypeError):
            memoryview(t.mapping)  # no buffer protocol over device memory
        cai = t.__cuda_array_interface__
        assert cai == {"shape": (4, 8), "typestr": "<f4", "strides": (32, 4),
                       "data": (t.mapping.address, False), "stream": None, "version": 3}
        assert t.mapping.__dlpack_device__() == (2, 0)  # kDLCUDA, device 0
        assert type(t.mapping.__dlpack__()).__name__ == "PyCapsule"

        payload = bytes(range(128))
        driver.write(t.mapping.address, payload)
        c.publish_tensor("dev/t", t, read_only=True)
        with membroker.connect(mb.socket, "reader") as r:
            seen = r.lookup_tensor("dev/t")
            assert seen.device == "cuda:0" and seen.read_only
            assert seen.__cuda_array_interface__["data"][1] is True
            assert driver.read(seen.mapping.address, 128) == payload
            with pytest.raises(membroker.PermissionDenied):
                r.set_access(seen.mapping, "read-write")
            seen.close()
            del seen
        c.unpublish("dev/t")
        t.close()


def test_bfloat16_has_no_cuda_type_string(mb, driver):
    with membroker.connect(mb.socket, "bf16") as c:
        t = c.new_tensor((2,), "bfloat16", device=0)
        with pytest.raises(TypeError, match="DLPack"):
            t.__cuda_array_interface__  # pylint: disable=pointless-statement
        t.close()


def test_engines_move_device_memory_between_processes_of_this_host(mb, driver, tmp_path):
    """A device tensor registered with one engine (in a process of its own) is
    read into host memory and written from it by another engine; the bytes are
    checked with the driver's copies."""
    import subprocess, sys, textwrap
    with membroker.connect(mb.socket, "decode") as c:
        t = c.new_tensor((64, 1024), "uint8", device=0)
        e = membroker.TransferEngine(c, "py-decode")
        e.register_mem(t, name="kv")
        driver.write(t.mapping.address, bytes(i % 251 for i in range(64 * 1024)))
        prefill = subprocess.run([sys.executable, "-c", textwrap.dedent("""
            import membroker, sys
            with membroker.connect(sys.argv[1], "prefill") as c:
                h = c.new_tensor((64, 1024), "uint8")
                e = membroker.TransferEngine(c, "py-prefill")
                e.register_mem(h)
                e.connect("py-decode", 10000)
                e.transfer_sync("py-decode", "read", [(h, "kv")], 10000)
                got = bytes(h.numpy().tobytes())
                assert got == bytes(i % 251 for i in range(64 * 1024)), "the device bytes read differ"
                h.numpy()[:] = 7
                e.transfer_sync("py-decode", "write", [(h, "kv")], 10000)
                e.disconnect("py-decode", 10000)
                e.finalize()
                print("OK")
            """), mb.socket], capture_output=True, text=True, timeout=300)
        assert prefill.returncode == 0 and prefill.stdout.strip() == "OK", prefill.stderr
        assert driver.read(t.mapping.address, 64 * 1024) == bytes([7]) * (64 * 1024)
        # The device tensor as the local side: host memory of another engine read into it.
        with membroker.connect(mb.socket, "host-side") as hc:
            h = hc.new_tensor((64, 1024), "uint8")
            h.numpy()[:] = 9
            he = membroker.TransferEngine(hc, "py-host")
            he.register_mem(h, name="h")
            e.connect("py-host", 10000)
            e.transfer_sync("py-host", "read", [(t, "h")], 10000)
            assert driver.read(t.mapping.address, 64 * 1024) == bytes([9]) * (64 * 1024)
            e.disconnect("py-host", 10000)
            he.finalize()
            h.close()
        e.finalize()
        t.close()


def test_torch_on_a_gpu_computes_in_a_device_tensor_another_process_reads(mb, driver):
    """Where torch has CUDA (a GPU; Debian's torch here has none): torch takes a
    membroker device tensor through __cuda_array_interface__ and DLPack without
    a copy, writes it on the GPU, and another process sees the bytes."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("this torch has no CUDA device")
    import subprocess, sys, textwrap
    with membroker.connect(mb.socket, "torch") as c:
        t = c.new_tensor((256, 1024), "float32", device=0)
        x = t.torch()  # through __cuda_array_interface__
        assert x.data_ptr() == t.mapping.address and x.shape == (256, 1024) and x.is_cuda
        x.copy_(torch.arange(256 * 1024, dtype=torch.float32, device="cuda").reshape(256, 1024))
        torch.cuda.synchronize()
        flat = torch.from_dlpack(t.mapping)  # DLPack, kDLCUDA: the mapping's bytes
        assert flat.device.type == "cuda" and flat.data_ptr() == t.mapping.address
        y = flat.view(torch.uint8)[: t.nbytes].view(torch.float32).reshape(256, 1024)
        assert torch.equal(y, x)
        head = driver.read(t.mapping.address, 16)
        assert head == torch.arange(4, dtype=torch.float32).numpy().tobytes()
        c.publish_tensor("gpu/t", t, read_only=True)
        reader = subprocess.run([sys.executable, "-c", textwrap.dedent("""
            import membroker, sys, torch
            with membroker.connect(sys.argv[1], "torch-reader") as r:
                seen = r.lookup_tensor("gpu/t")
                assert seen.read_only
                # torch refuses a read-only __cuda_array_interface__; .torch() says why with a warning
                import warnings
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    z = seen.torch()
                assert any("read-only" in str(w.message) for w in caught), "no warning"
                assert z.device.type == "cuda" and z.data_ptr() == seen.mapping.address
                want = torch.arange(256 * 1024, dtype=torch.float32, device="cuda").reshape(256, 1024)
                assert torch.equal(z, want), "the bytes another process wrote differ"
                print("OK", float(z.sum()))
            """), mb.socket], capture_output=True, text=True, timeout=300)
        assert reader.returncode == 0 and reader.stdout.startswith("OK"), reader.stderr
        c.unpublish("gpu/t")
        del x, y
        t.close()
