"""The daemon reads its engine's socket on the event loop, from whatever bytes have arrived
(daemon/engine.py `Frames`): every message comes out whole and in order, however the bytes
are cut, including one large enough that multiprocessing sends its header apart."""

from __future__ import annotations

import random
import socket
import threading
from multiprocessing.connection import Connection

from homespec.daemon.engine import Frames
from homespec.engine.protocol import Cancel, Finished
from homespec.engine.types import Chunk


def wire_bytes(messages: list[object]) -> bytes:
    """What the engine's Connection.send puts on the socket for `messages`."""
    ours, theirs = socket.socketpair()
    sender = Connection(theirs.detach())
    got = bytearray()

    def drain() -> None:
        while data := ours.recv(1 << 16):
            got.extend(data)

    reader = threading.Thread(target=drain)
    reader.start()
    for msg in messages:
        sender.send(msg)
    sender.close()
    reader.join(10)
    ours.close()
    return bytes(got)


def test_messages_come_out_whole_and_in_order_however_the_bytes_are_cut() -> None:
    big = [Chunk("x" * 50, True) for _ in range(2000)]  # well over 16 KB pickled
    messages: list[object] = [Cancel("a"), big, Finished("b", None), "tail", Cancel("c")]
    data = wire_bytes(messages)
    rng = random.Random(0)
    for _ in range(50):
        frames, out, at = Frames(), [], 0
        while at < len(data):
            step = rng.choice([1, 2, 3, 5, 4096, 70000])
            out += frames.feed(data[at : at + step])
            at += step
        assert out == messages
    # A byte at a time: nothing comes out before its last byte arrives.
    frames, seen = Frames(), []
    for i in range(len(data)):
        seen += frames.feed(data[i : i + 1])
    assert seen == messages
    assert Frames().feed(data[:3]) == []
