"""Where a process was in llama.cpp when it died: one byte in a file both processes map.

A native crash leaves no Python traceback to read and no chance to send a last message, so the
engine marks what native work it is about to do (loading the draft, decoding with the target…)
in a one-byte shared file before each call and clears it after. The daemon reads that byte once
the engine child is gone: a segfault inside the draft's decode is the draft's fault, and the
pair restarts without it; anything else restarts as it was.

In-process (ask, bench) the marker is a plain bytearray nobody reads.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from enum import IntEnum


class Site(IntEnum):
    IDLE = 0
    LOAD_TARGET = 1
    LOAD_DRAFT = 2
    TARGET = 3  # a target decode: prompt or verify step
    DRAFT = 4  # a draft-model decode: proposing tokens

    @property
    def draft_path(self) -> bool:
        return self in (Site.LOAD_DRAFT, Site.DRAFT)

    @property
    def label(self) -> str:
        return _LABELS[self]


_LABELS = {
    Site.IDLE: "outside llama.cpp",
    Site.LOAD_TARGET: "loading the target",
    Site.LOAD_DRAFT: "loading the draft",
    Site.TARGET: "decoding with the target",
    Site.DRAFT: "drafting with the draft model",
}


class CrashSite:
    """The marker as the engine writes it (`mark`) and the daemon reads it (`read`)."""

    def __init__(self, buf: mmap.mmap | bytearray | None = None) -> None:
        self._buf: mmap.mmap | bytearray = buf if buf is not None else bytearray(1)

    @classmethod
    def shared(cls) -> tuple[CrashSite, int]:
        """A marker backed by an unlinked temporary file; pass the fd to the child
        (`subprocess.Popen(pass_fds=...)`) and open it there with `from_fd`."""
        fd, path = tempfile.mkstemp(prefix="homespec-site-")
        os.unlink(path)
        os.write(fd, b"\0")
        return cls(mmap.mmap(fd, 1)), fd

    @classmethod
    def from_fd(cls, fd: int) -> CrashSite:
        return cls(mmap.mmap(fd, 1))

    def mark(self, site: Site) -> None:
        self._buf[0] = site

    def read(self) -> Site:
        try:
            return Site(self._buf[0])
        except ValueError:
            return Site.IDLE

    def close(self) -> None:
        if isinstance(self._buf, mmap.mmap):
            self._buf.close()
