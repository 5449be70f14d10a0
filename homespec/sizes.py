"""Byte sizes as people write them ("1.5GiB", "512M") and as homespec prints them."""

from __future__ import annotations

import re

GiB = 1024**3
MiB = 1024**2

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1000,
    "kib": 1024,
    "m": MiB,
    "mb": 1000**2,
    "mib": MiB,
    "g": GiB,
    "gb": 1000**3,
    "gib": GiB,
    "t": 1024**4,
    "tb": 1000**4,
    "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """'1.5GiB' → bytes. K/M/G/T alone and KiB/MiB/GiB/TiB are binary; KB/MB/GB/TB decimal.

    Raises ValueError with a message fit for a user.
    """
    m = _SIZE.match(text)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise ValueError(f"{text!r} is not a size (write e.g. 1.5GiB, 512MiB or 8G)")
    return int(float(m.group(1)) * _UNITS[unit])


def fmt_size(n: float) -> str:
    """Bytes for people: '1.50 GiB', '97.4 MiB', '12 KiB'."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    if n >= GiB:
        return f"{sign}{n / GiB:.2f} GiB"
    if n >= MiB:
        return f"{sign}{n / MiB:.1f} MiB"
    return f"{sign}{n / 1024:.0f} KiB"
