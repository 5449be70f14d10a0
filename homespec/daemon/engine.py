"""The daemon's handle on one pair's engine process (homespec/engine/child.py).

It starts the child with one end of a socket pair and a shared crash-site byte, sends it
messages, and hands every reply, then the child's death (exit status and crash site), to the
event loop. The event loop reads the socket itself, taking whatever bytes have arrived and
unpickling whole messages only (`Frames`), so it never blocks on half of one. (A reader thread
took two wakeups per engine step, its own and the loop's, each waiting for a core that the
decoding threads held: on 2 cores the first token reached the loop 3-6 ms after the engine
sent it.) When the socket closes, a short-lived thread waits for the child's exit status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler

import psutil

from homespec.engine.crashsite import CrashSite, Site
from homespec.engine.protocol import Load, Stop
from homespec.resources import RAM, cuda_used_by

LOG = logging.getLogger("homespec.daemon")
# The engine program (`python -m MODULE`). The tests point it at a scripted fake target
# (tests/fake_engine.py) that speaks the same protocol, to test the daemon without models.
ENGINE_ENV = "HOMESPEC_ENGINE"
ENGINE_MODULE = "homespec.engine.child"
READ_SIZE = 1 << 16


class Frames:
    """multiprocessing.Connection's framing (a 4-byte big-endian length, or -1 and an 8-byte
    one, then the pickle), taken from the bytes as they arrive: `feed` returns every message
    made whole by them and keeps the rest for the next call."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[object]:
        self._buf += data
        out: list[object] = []
        while len(self._buf) >= 4:
            (size,) = struct.unpack_from("!i", self._buf)
            start = 4
            if size == -1:
                if len(self._buf) < 12:
                    break
                (size,) = struct.unpack_from("!Q", self._buf, 4)
                start = 12
            end = start + size
            if len(self._buf) < end:
                break
            out.append(ForkingPickler.loads(bytes(self._buf[start:end])))
            del self._buf[:end]
        return out


class EngineProcess:
    def __init__(
        self,
        pair: str,
        loop: asyncio.AbstractEventLoop,
        on_message: Callable[[object], None],
        on_exit: Callable[[int, Site], None],
    ) -> None:
        self.pair = pair
        self._loop = loop
        self._on_message = on_message
        self._on_exit = on_exit
        self._send_lock = threading.Lock()
        self.proc: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._site: CrashSite | None = None
        self._frames = Frames()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self, load: Load) -> None:
        ours, theirs = socket.socketpair()
        self._site, site_fd = CrashSite.shared()
        level = logging.getLevelName(logging.getLogger("homespec").getEffectiveLevel())
        module = os.environ.get(ENGINE_ENV) or ENGINE_MODULE
        cmd = [
            sys.executable,
            "-m",
            module,
            "--fd",
            str(theirs.fileno()),
            "--site-fd",
            str(site_fd),
            "--pair",
            self.pair,
            "--log-level",
            level,
        ]
        try:
            self.proc = subprocess.Popen(cmd, pass_fds=(theirs.fileno(), site_fd))
        finally:
            theirs.close()
            os.close(site_fd)
        self._conn = Connection(ours.detach())
        LOG.info("pair %s: engine process %d started", self.pair, self.proc.pid)
        self.send(load)
        self._loop.add_reader(self._conn.fileno(), self._readable)

    def send(self, msg: object) -> bool:
        """False when the child is gone (its death is being reported)."""
        if self._conn is None:
            return False
        try:
            with self._send_lock:
                self._conn.send(msg)
        except (OSError, ValueError):
            return False
        return True

    def _readable(self) -> None:
        """On the event loop, when the socket has bytes: one read (it cannot block, as some
        have arrived), then every message they complete, in order."""
        assert self._conn is not None
        fd = self._conn.fileno()
        try:
            data = os.read(fd, READ_SIZE)
        except OSError:
            data = b""
        if not data:  # the child closed its end: it is exiting or dead
            self._loop.remove_reader(fd)
            threading.Thread(target=self._reap, name=f"engine-{self.pair}", daemon=True).start()
            return
        for msg in self._frames.feed(data):
            self._on_message(msg)

    def _reap(self) -> None:
        """Off the loop: the child's exit status and crash site, then the loop is told."""
        assert self._conn is not None and self.proc is not None and self._site is not None
        code = self.proc.wait()
        site = self._site.read()
        self._conn.close()
        self._site.close()
        self._deliver(self._on_exit, code, site)

    def _deliver(self, fn: Callable[..., None], *args: object) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: the daemon is exiting
            self._loop.call_soon_threadsafe(fn, *args)

    def memory(self) -> dict[str, int]:
        """What the engine process holds: its resident memory (`ram`) and, where NVML reports
        it, its memory on each GPU. The exact cost of the pair, draft included."""
        if self.proc is None or self.proc.poll() is not None:
            return {}
        try:
            used = {RAM: psutil.Process(self.proc.pid).memory_info().rss}
        except psutil.Error:
            return {}
        return used | cuda_used_by(self.proc.pid)

    async def stop(self, timeout: float) -> None:
        """Ask the child to finish and free its models; kill it if it takes over `timeout`."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.send(Stop())
        try:
            await asyncio.wait_for(asyncio.to_thread(self.proc.wait), timeout)
        except TimeoutError:
            LOG.warning("pair %s: engine did not stop in %.0f s: killing it", self.pair, timeout)
            self.proc.kill()
            await asyncio.to_thread(self.proc.wait)
