"""systemd's notify protocol: one datagram to $NOTIFY_SOCKET (READY=1, STATUS=..., STOPPING=1).

A no-op when not started by systemd (no $NOTIFY_SOCKET), and never raises: a service must not
die because its supervisor went away.
"""

from __future__ import annotations

import logging
import os
import socket

LOG = logging.getLogger("homespec.systemd")


def notify(message: str) -> bool:
    """Send `message` (e.g. "READY=1\\nSTATUS=serving") to systemd; True when sent."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
        return True
    except OSError as exc:
        LOG.warning("could not notify systemd (%s): %s", address, exc)
        return False
