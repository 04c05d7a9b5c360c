import os

import pytest

from membroker.testing import broker


@pytest.fixture
def mb():
    """A private broker for one test; it must end with nothing held."""
    with broker() as b:
        yield b
        assert b.admin("check") == "tables: consistent\n"


def _dev_shm() -> set:
    """/dev/shm's files, less UCX's: its shared-memory transport makes
    ucx_shm_posix_* files that come and go with every process using UCX, and
    ctest runs UCX tests beside this suite (one was there at the end of a run,
    made by another test). membroker itself never makes a file there."""
    names = os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []
    return {n for n in names if not n.startswith("ucx_shm_posix_")}


@pytest.fixture(autouse=True, scope="session")
def dev_shm_unchanged():
    """Nothing this suite does leaves a file in /dev/shm (SIGKILLed children included)."""
    before = _dev_shm()
    yield
    after = _dev_shm()
    assert after - before == set(), f"left in /dev/shm: {sorted(after - before)}"
