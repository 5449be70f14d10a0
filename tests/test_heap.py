"""homespec/heap.py: what is alive at settle() leaves the collector's walks; what comes later,
and what dies later, is still freed."""

from __future__ import annotations

import gc
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
