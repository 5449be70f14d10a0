"""A scripted memory probe for the daemon's memory watch (`HOMESPEC_MEMORY_PROBE=
tests.fake_memory:probe`): free RAM is whatever number of bytes the file named by
HOMESPEC_FAKE_FREE_FILE holds, so a test can take memory away from a running daemon and give
it back without starving the machine."""

from __future__ import annotations

import os
from pathlib import Path

from homespec.resources import Machine, Ram
from homespec.sizes import GiB

FREE_FILE_ENV = "HOMESPEC_FAKE_FREE_FILE"


def probe() -> Machine:
    free = int(Path(os.environ[FREE_FILE_ENV]).read_text())
    return Machine(ram=Ram(total=64 * GiB, available=free))
