import os

import pytest

from membroker.testing import broker


@pytest.fixture
def mb():
    """A private broker for one test; it must end with nothing held."""
    with broker() as b:
        yield b
        assert b.admin("check") == "tables: consistent\n"


@pytest.fixture(autouse=True, scope="session")
def dev_shm_unchanged():
    """Nothing this suite does leaves a file in /dev/shm (SIGKILLed children included)."""
    before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    yield
    after = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    assert after - before == set(), f"left in /dev/shm: {sorted(after - before)}"
