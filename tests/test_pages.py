"""Huge pages for the weights in RAM (engine/pages.py): the decision, reading /proc, and the
kernel's answer on real anonymous memory of this process."""

from __future__ import annotations

import mmap
import os
import sys
from pathlib import Path

import pytest

from homespec.engine import pages
from homespec.engine.generate import generate
from homespec.engine.loader import LoadedPair, load_pair
from homespec.engine.types import Chunk, GenerationRequest, Message
from homespec.manifest import Manifest
from homespec.resources import probe_thp
from homespec.sizes import GiB, MiB

MAPS = """\
55d0c0a00000-55d0c0c21000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0020000000 rw-p 00000000 00:00 0
7f0020000000-7f0020800000 rw-p 00000000 00:00 0
7f0030000000-7f0031000000 r--s 00000000 fd:01 131                        /m/model.gguf
7f0040000000-7f0041000000 rw-s 00000000 00:01 7                          /dev/zero (deleted)
7f0050000000-7f0051000000 r--p 00000000 00:00 0
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
"""


def test_only_private_writable_mappings_without_a_file_count_as_anonymous() -> None:
    assert pages.anonymous_regions(MAPS) == {
        (0x7F0000000000, 0x7F0020000000),
        (0x7F0020000000, 0x7F0020800000),
    }


def test_new_regions_are_the_large_ones_a_load_added() -> None:
    before = {(0x1000, 0x2000)}
    after = {
        (0x1000, 0x2000),
        (0x10000000, 0x10000000 + 600 * MiB),  # weights
        (0x60000000, 0x60000000 + 8 * MiB),  # a thread's stack
    }
    assert pages.new_regions(before, after) == [(0x10000000, 0x10000000 + 600 * MiB)]


def test_new_regions_are_counted_by_address_when_mappings_merge() -> None:
    # The draft's 100 MiB landed right after the target's 600 MiB: one mapping now.
    target = (0x10000000, 0x10000000 + 600 * MiB)
    merged = (target[0], target[1] + 100 * MiB)
    assert pages.new_regions({target}, {merged}) == [(target[1], merged[1])]
    # A hole inside an old mapping's bounds is not new; both sides of one are.
    assert pages.new_regions({(0x2000_0000, 0x2100_0000)}, {(0x1000_0000, 0x4000_0000)}) == [
        (0x1000_0000, 0x2000_0000),
        (0x2100_0000, 0x4000_0000),
    ]


@pytest.mark.parametrize(
    ("release", "known"),
    [
        ("6.18.44-fc-v657", True),
        ("6.1.0-13-amd64", True),
        ("5.15.0-91-generic", False),
        ("x", False),
    ],
)
def test_madv_collapse_needs_linux_6_1(release: str, known: bool) -> None:
    assert pages.collapses(release) is known


def test_the_choice_says_why_not_when_asked() -> None:
    assert pages.choose(True, "madvise", weights=GiB, left=4 * GiB) == (True, "")
    assert pages.choose(True, "always", weights=GiB, left=4 * GiB) == (True, "")
    assert pages.choose(False, "always", weights=GiB, left=4 * GiB) == (False, "")
    assert pages.choose(True, None, weights=GiB, left=4 * GiB) == (False, "")
    on, why = pages.choose(True, "never", weights=GiB, left=4 * GiB)
    assert not on and '"never"' in why
    # Room: 1 GiB, or a quarter of the weights when that is more.
    assert not pages.choose(True, "madvise", weights=GiB, left=GiB - 1)[0]
    assert pages.choose(True, "madvise", weights=GiB, left=GiB)[0]
    on, why = pages.choose(True, "madvise", weights=16 * GiB, left=3 * GiB)
    assert not on and "3.00 GiB of RAM left" in why


def test_the_system_setting_is_the_bracketed_word(tmp_path: Path) -> None:
    setting = tmp_path / "enabled"
    setting.write_text("always [madvise] never\n")
    assert probe_thp(setting) == "madvise"
    setting.write_text("[never]\n")
    assert probe_thp(setting) == "never"
    assert probe_thp(tmp_path / "missing") is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="transparent huge pages: Linux")
def test_settle_backs_written_anonymous_memory_with_huge_pages() -> None:
    """The real thing on this process: a private anonymous mapping, written as a load writes
    weights, is found by the snapshot diff and collapsed, its contents unchanged."""
    thp = probe_thp()
    before = pages.snapshot()
    size = 64 * MiB
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    pattern = bytes(range(256)) * (size // 256)
    buf[:] = pattern
    regions = pages.new_regions(before, pages.snapshot())
    assert regions and sum(e - s for s, e in regions) >= size
    done = pages.settle(regions)
    assert done.bytes >= size and done.ms >= 0
    assert buf[:] == pattern  # the kernel moved the pages, not the bytes
    if thp in (None, "never") or not pages.collapses(os.uname().release):
        pytest.skip(f"no collapse here (transparent huge pages {thp!r}): the call ran, that is all")
    assert done.huge >= size - 2 * pages.HUGE_PAGE, done  # the ends may not be 2 MiB aligned
    # A box whose free memory is fragmented (a CI machine after the model tests) refuses a
    # step now and then (EAGAIN): said, never silent; no other note belongs here.
    assert done.note in ("", "the kernel found too few free 2 MiB pages for all of it"), done
    buf.close()


def test_settle_stops_when_asked() -> None:
    before = pages.snapshot()
    buf = mmap.mmap(-1, 32 * MiB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buf[:] = b"x" * (32 * MiB)
    regions = pages.new_regions(before, pages.snapshot())
    done = pages.settle(regions, stop=lambda: True)
    assert done.huge == 0  # asked to stop before the first step: nothing collapsed
    buf.close()


def test_a_pair_read_into_huge_pages_answers_as_the_mapped_one(
    demo_manifest: Manifest, demo_pair: LoadedPair
) -> None:
    """The demo pair loaded as `bench` and the daemon load it (read, collapsed) writes the same
    greedy answer as the memory-mapped one, and says what it got."""
    ask = dict(messages=[Message("user", "List the planets of the solar system.")], max_tokens=40)
    mapped = "".join(c.text for c in generate_chunks(demo_pair, **ask))
    assert not demo_pair.plan.huge_pages  # `ask`'s way: mapped, nothing settled
    assert demo_pair.held.settled == {}
    with load_pair(demo_manifest, "smollm2", huge_pages="now") as kept:
        text = "".join(c.text for c in generate_chunks(kept, **ask))
        settled = dict(kept.held.settled)
        planned = kept.plan.huge_pages
    assert text == mapped
    if not planned:
        pytest.skip(f"huge pages not planned here: {kept.plan.notes}")
    weights = kept.files.target.tensor_bytes
    assert set(settled) == {"target", "draft"}
    # The weights and the context's buffers of each, counted once (the draft's memory lands
    # next to the target's, in the same mapping).
    assert weights <= settled["target"].bytes < weights * 1.5
    assert kept.files.draft is not None
    assert settled["draft"].bytes < kept.files.draft.tensor_bytes * 3
    if pages.collapses(os.uname().release):
        assert settled["target"].huge >= weights * 0.9, settled["target"]


def generate_chunks(loaded: LoadedPair, **kw: object) -> list[Chunk]:
    req = GenerationRequest(speculative=False, **kw)  # type: ignore[arg-type]
    return [c for c in generate(loaded.runtime, req) if isinstance(c, Chunk)]
