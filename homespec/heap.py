"""Keep Python's cyclic garbage collector, and the C heap's page returns, off the request path.

A full collection walks every tracked object, and a loaded process has many: llama_cpp's
bindings, numpy, Jinja and the manifest in an engine; FastAPI, pydantic and Starlette in the
daemon. It took 13-15 ms on the machine here, and it runs when allocations trigger it, so
always inside some request (an engine makes its garbage while generating): a sixth of a short
answer's time, once every few requests.

`settle()` collects once and freezes what is alive (gc.freeze): those objects are out of the
collector's walks from then on, and later collections cost what the new objects cost (0.1-0.5 ms
here). Frozen objects are still freed by reference counting, and the models' memory by their
explicit close(). Call it where a pause is harmless: after loading, between requests.
"""

from __future__ import annotations

import ctypes
import gc


def settle() -> None:
    gc.collect()
    gc.freeze()


# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_pages(trim: int = 32 << 20, mmap_above: int = 4 << 20) -> bool:
    """Let the C heap keep up to `trim` bytes it has freed instead of handing them back to the
    kernel, and serve blocks up to `mmap_above` from it. Every step of a generation makes and
    drops numpy arrays of a vocabulary's size (a row of 49 152 logits is 192 KiB, 1 MiB for
    Gemma's 262 144): with glibc's defaults those pages went back to the kernel at each free
    and came back as fresh zeroed pages at the next allocation, and a division of one row cost
    124 µs instead of 8, a draft token's confidence check 495 µs instead of 72 (the 2-core
    machine here). Larger blocks (weights, KV caches) stay mmap'd and are returned when freed.
    Returns whether it applied (glibc only; elsewhere the allocator is left as it is)."""
    try:
        libc = ctypes.CDLL(None)  # the C library this process already runs on (as pages.py)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, mmap_above)) and bool(mallopt(_M_TRIM_THRESHOLD, trim))
