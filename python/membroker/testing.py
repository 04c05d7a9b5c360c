"""A private broker for tests: membroker.testing.broker() starts membrokerd in a
temporary directory, waits for its readiness line (never a sleep), and stops it
(SIGTERM, then checks it exited cleanly) when the block ends.

    from membroker.testing import broker

    def test_share():
        with broker() as b:
            c = membroker.connect(b.socket, "test")
            ...
            assert b.stats()["allocations_live"] == 0

The membrokerd binary is $MEMBROKERD, else the one on PATH. As a pytest fixture:

    @pytest.fixture
    def mb():
        with broker() as b:
            yield b
"""
from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket as _socket
import subprocess
import tempfile
import time


class Broker:
    def __init__(self, proc: subprocess.Popen, directory: str):
        self.process = proc
        self.pid = proc.pid
        self.dir = directory
        self.socket = os.path.join(directory, "broker.sock")
        self.admin_socket = os.path.join(directory, "admin.sock")

    def admin(self, command: str, timeout: float = 10.0) -> str:
        """One admin command's answer (text; add --json for JSON)."""
        with _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(self.admin_socket)
            s.sendall(command.encode() + b"\n")
            chunks = []
            while True:
                b = s.recv(65536)
                if not b:
                    break
                chunks.append(b)
        return b"".join(chunks).decode()

    def stats(self) -> dict:
        return json.loads(self.admin("stats --json"))

    def kill_and_restart(self) -> None:
        """SIGKILLs the broker and starts a new one on the same sockets and state
        file (clients reattach to it: docs/RESTART.md); waits until it is ready."""
        self.process.kill()
        self.process.wait()
        self.process = _start(self._cmd, self._ready_timeout)
        self.pid = self.process.pid

    def take_over(self) -> None:
        """Starts a new broker with --take-over (a planned upgrade: docs/RESTART.md);
        waits until it is ready and the old one has exited, which must be 0."""
        old = self.process
        self.process = _start([*self._cmd, "--take-over"], self._ready_timeout)
        self.pid = self.process.pid
        code = old.wait(timeout=self._ready_timeout)
        if code != 0:
            raise RuntimeError(f"the old membrokerd exited with status {code} after the take-over")

    def wait_for_stat(self, key: str, value: int, timeout: float = 10.0) -> int:
        """Polls stats until stats[key] == value (bounded); returns the last value."""
        deadline = time.monotonic() + timeout
        v = self.stats()[key]
        while v != value and time.monotonic() < deadline:
            time.sleep(0.002)
            v = self.stats()[key]
        return v


def _binary(explicit: str | None) -> str:
    path = explicit or os.environ.get("MEMBROKERD") or shutil.which("membrokerd")
    if not path:
        raise FileNotFoundError("membrokerd not found: set MEMBROKERD or put it on PATH")
    return path


def _start(cmd: list, ready_timeout: float) -> subprocess.Popen:
    """Starts membrokerd with --ready-fd and waits for its READY line."""
    read_end, write_end = os.pipe()
    proc = subprocess.Popen([*cmd, "--ready-fd", str(write_end)], pass_fds=(write_end,))
    os.close(write_end)
    try:
        ready = b""
        deadline = time.monotonic() + ready_timeout
        while not ready.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_end], [], [], left)[0]:
                proc.kill()
                raise TimeoutError(f"membrokerd did not report ready in {ready_timeout} s")
            chunk = os.read(read_end, 64)
            if not chunk:
                raise RuntimeError(f"membrokerd exited before it was ready (status {proc.wait()})")
            ready += chunk
        if not ready.startswith(b"READY "):
            raise RuntimeError(f"membrokerd said {ready!r} instead of READY")
        return proc
    finally:
        os.close(read_end)


@contextlib.contextmanager
def broker(*args: str, binary: str | None = None, ready_timeout: float = 10.0):
    """Starts a private membrokerd (extra flags in args) and yields a Broker."""
    directory = tempfile.mkdtemp(prefix="membroker-py.")
    os.chmod(directory, 0o755)
    cmd = [_binary(binary), "--socket", os.path.join(directory, "broker.sock"),
           "--admin-socket", os.path.join(directory, "admin.sock"), *args]
    b = Broker(_start(cmd, ready_timeout), directory)
    b._cmd, b._ready_timeout = cmd, ready_timeout
    try:
        yield b
    finally:
        proc = b.process
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
            if code != 0:
                raise RuntimeError(f"membrokerd exited with status {code}")
        shutil.rmtree(directory, ignore_errors=True)
