"""The shipped units pass `systemd-analyze verify` (with ExecStart pointed at this checkout)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO


@pytest.mark.skipif(sys.platform != "linux", reason="systemd units are Linux-only")
@pytest.mark.parametrize(
    ("unit_name", "must_say"),
    [
        # the daemon: readiness, hardening, and the memory limit users are told about
        ("homespec.service", ["Type=notify", "ProtectSystem=strict", "#MemoryMax="]),
        # the RPC worker: what it runs, and the warning it exists to carry
        (
            "homespec-worker.service",
            ["homespec worker", "NO authentication", "ProtectSystem=strict"],
        ),
    ],
)
def test_unit_file_verifies(tmp_path: Path, unit_name: str, must_say: list[str]) -> None:
    tool = shutil.which("systemd-analyze")
    assert tool, "systemd-analyze not found: install Debian's systemd package (.ci/run does)"
    unit = (REPO / "systemd" / unit_name).read_text()
    for text in must_say:
        assert text in unit
    installed = tmp_path / unit_name
    installed.write_text(unit.replace("/opt/homespec", str(REPO)))
    done = subprocess.run([tool, "verify", str(installed)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert unit_name not in done.stderr, done.stderr  # no warnings about the unit
