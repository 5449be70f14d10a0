"""homespec/heap.py: what is alive at settle() leaves the collector's walks; what comes later,
and what dies later, is still freed."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref
from collections.abc import Iterator

import pytest

from homespec import heap


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture()
def thawed() -> Iterator[None]:
    yield
    gc.unfreeze()  # the other tests' collections walk everything again


def test_settle_freezes_what_is_alive_and_later_garbage_is_still_collected(thawed: None) -> None:
    gc.unfreeze()
    kept = Node()
    heap.settle()
    assert gc.get_freeze_count() > 0
    assert gc.is_tracked(kept) and all(o is not kept for o in gc.get_objects())  # not walked

    # A cycle made after settle() is collected as before.
    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    assert gone() is None

    # A frozen object nothing refers to any more is freed by reference counting.
    dies = weakref.ref(kept)
    del kept
    assert dies() is None


FAULTS = """
import resource, sys
import numpy as np
from homespec import heap
if sys.argv[1] == "kept" and not heap.keep_freed_pages():
    print("n/a"); raise SystemExit
row = np.random.default_rng(0).standard_normal(49_152).astype(np.float32)
for _ in range(20):  # warm: the heap reaches its working size
    np.exp((row - row.max()).astype(np.float64)).sum()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(200):  # a draft token's confidence check, the old way: three big temporaries
    np.exp((row - row.max()).astype(np.float64)).sum()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 200)
"""


def test_freed_pages_are_reused_not_faulted_in_again_at_every_step() -> None:
    """In a fresh process: a step's worth of vocabulary-sized numpy temporaries, made and
    dropped 200 times, page-faults (nearly) never once keep_freed_pages() has run."""

    def faults(mode: str) -> str:
        run = subprocess.run([sys.executable, "-c", FAULTS, mode], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        return run.stdout.strip()

    kept = faults("kept")
    if kept == "n/a":
        pytest.skip("not glibc: the allocator is left as it is")
    default = faults("default")
    assert float(kept) < 1.0, f"{kept} page faults a step with keep_freed_pages, {default} without"
