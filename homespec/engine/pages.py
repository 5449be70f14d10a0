"""2 MiB pages for the weights a pair holds in RAM (Linux transparent huge pages).

Decoding one token reads every weight once. With the weights memory-mapped from the GGUF file
they sit in 4 KiB pages, and the demo's 513 MiB F32 target is 131,000 of them: more than the
TLB holds, so each token pays page walks. Read into anonymous memory instead (llama.cpp's load
mode "none") and collapsed into 2 MiB pages (`madvise(MADV_COLLAPSE)`, Linux 6.1+), the same
weights are 257 pages. Measured here: decoding 4-7% faster (see README).

What it costs: reading the file into memory takes longer than mapping it (0.3 against 0.1 s
for 513 MiB here), the collapse is kernel work (1.4 s here) that the engine does in the
background while it already serves, and weights in memory of their own can no longer be
dropped and re-read by the kernel under pressure. `choose` is the decision (pure: the planner
calls it with the plan's numbers); the rest finds the memory a load created and asks the
kernel. No llama_cpp here.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from homespec.sizes import GiB, fmt_size

MADV_HUGEPAGE = 14  # linux/mman.h
MADV_COLLAPSE = 25  # Linux 6.1
HUGE_PAGE = 2 << 20
# Smaller regions are the Python heap, threads' stacks (8 MiB) and small buffers.
MIN_REGION = 16 << 20
MAPS = Path("/proc/self/maps")

# Weights read into memory of their own cannot be dropped and re-read the way mapped ones can:
# only where this much RAM (or a quarter of the weights, if more) stays free after the plan.
ROOM = 1 * GiB

Region = tuple[int, int]  # [start, end) of addresses


def choose(asked: bool, thp: str | None, *, weights: int, left: int) -> tuple[bool, str]:
    """Whether a pair's `weights` in RAM go into 2 MiB pages, and a note when asked and not.
    `asked`: models.toml's huge_pages, for a pair that stays loaded; `thp`: the system's
    setting (resources.probe_thp); `left`: RAM free after the plan."""
    if not asked or thp is None:  # None: not Linux, or no huge pages: nothing to say
        return False, ""
    if thp == "never":
        return False, (
            "huge pages: off on this system (/sys/kernel/mm/transparent_hugepage/enabled is "
            '"never"); the weights stay memory-mapped in 4 KiB pages'
        )
    if left < max(ROOM, weights // 4):
        return False, (
            f"huge pages: not with {fmt_size(left)} of RAM left after the plan; the weights "
            "stay memory-mapped, where the kernel can drop and re-read them"
        )
    return True, ""


def anonymous_regions(maps_text: str) -> set[Region]:
    """The private, writable mappings with no file behind them, from /proc/PID/maps text:
    where malloc puts a large buffer (llama.cpp's weights when it reads rather than maps)."""
    out: set[Region] = set()
    for line in maps_text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 5 or not fields[1].startswith("rw") or fields[1][3] != "p":
            continue
        if len(fields) == 6 and fields[5].strip():  # a file, [heap], [stack], …
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        out.add((start, end))
    return out


def snapshot() -> set[Region]:
    """This process's anonymous mappings now (empty where there is no /proc)."""
    try:
        return anonymous_regions(MAPS.read_text())
    except OSError:
        return set()


def new_regions(before: set[Region], after: set[Region]) -> list[Region]:
    """The address ranges of at least MIN_REGION mapped in `after` and not in `before`. By
    address, not by mapping: the kernel merges a new mapping into its neighbour, so the draft's
    memory can land in the same mapping as the target's weights."""
    out: list[Region] = []
    for start, end in sorted(after):
        pieces = [(start, end)]
        for old_start, old_end in before:
            pieces = [
                piece
                for s, e in pieces
                for piece in ((s, min(e, old_start)), (max(s, old_end), e))
                if piece[1] > piece[0]
            ]
        out += [p for p in pieces if p[1] - p[0] >= MIN_REGION]
    return out


@dataclass(frozen=True)
class Settled:
    """What asking for huge pages got one model: the size of the memory its load created,
    how much of it the kernel now backs with huge pages, how long that took, and why not all
    of it ("" when the rest is memory not written yet, which gets huge pages when it is)."""

    bytes: int
    huge: int
    ms: float
    note: str = ""

    def to_dict(self) -> dict[str, object]:
        return {"bytes": self.bytes, "huge": self.huge, "ms": round(self.ms), "note": self.note}


def _madvise() -> Callable[[int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    fn = libc.madvise
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def collapses(release: str) -> bool:
    """Whether a kernel of this `uname -r` release knows MADV_COLLAPSE (Linux 6.1+)."""
    parts = release.split(".")
    try:
        return (int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)) >= (6, 1)
    except (IndexError, ValueError):
        return False


def settle(regions: list[Region], stop: Callable[[], bool] = lambda: False) -> Settled:
    """Mark `regions` for huge pages and collapse them, 2 MiB at a time (ctypes lets go of the
    GIL: a background thread does this while the engine decodes; the kernel keeps the memory's
    contents and addresses). Step by step because the kernel refuses a whole range at its first
    stretch never written (EINVAL: a context's buffers are only partly written yet); the mark
    gives those stretches huge pages when they are. Each step the kernel accepts is a huge page
    now (already one included). `stop()` is asked between steps. Never raises."""
    size = sum(end - start for start, end in regions)
    t0 = time.perf_counter()
    madvise = _madvise()
    if madvise is None:
        return Settled(size, 0, 0.0, "huge pages: Linux only")
    release = os.uname().release
    now = collapses(release)
    huge, short = 0, False
    for start, end in regions:
        if madvise(start, end - start, MADV_HUGEPAGE) != 0 or not now:
            continue  # ENOMEM: freed since (a load's scratch buffer); EINVAL: not eligible
        step = (start + HUGE_PAGE - 1) // HUGE_PAGE * HUGE_PAGE
        while step + HUGE_PAGE <= end and not stop():
            if madvise(step, HUGE_PAGE, MADV_COLLAPSE) == 0:
                huge += HUGE_PAGE
            else:
                short |= ctypes.get_errno() in (errno.EAGAIN, errno.ENOMEM)
            step += HUGE_PAGE
    note = ""
    if not now:
        note = (
            f"kernel {release} has no MADV_COLLAPSE (Linux 6.1+): khugepaged moves the "
            "weights into huge pages over time"
        )
    elif short:
        note = "the kernel found too few free 2 MiB pages for all of it"
    return Settled(size, huge, (time.perf_counter() - t0) * 1000.0, note)
