"""The shipped unit passes `systemd-analyze verify` (with ExecStart pointed at this checkout)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO


@pytest.mark.skipif(sys.platform != "linux", reason="systemd units are Linux-only")
def test_unit_file_verifies(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    assert tool, "systemd-analyze not found: install Debian's systemd package (.ci/run does)"
    unit = (REPO / "systemd" / "homespec.service").read_text()
    assert "Type=notify" in unit and "ProtectSystem=strict" in unit
    assert "#MemoryMax=" in unit
    installed = tmp_path / "homespec.service"
    installed.write_text(unit.replace("/opt/homespec", str(REPO)))
    done = subprocess.run([tool, "verify", str(installed)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "homespec.service" not in done.stderr, done.stderr  # no warnings about the unit


@pytest.mark.skipif(sys.platform != "linux", reason="systemd units are Linux-only")
def test_worker_unit_file_verifies(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    assert tool, "systemd-analyze not found: install Debian's systemd package (.ci/run does)"
    unit = (REPO / "systemd" / "homespec-worker.service").read_text()
    assert "homespec worker" in unit and "NO authentication" in unit
    installed = tmp_path / "homespec-worker.service"
    installed.write_text(unit.replace("/opt/homespec", str(REPO)))
    done = subprocess.run([tool, "verify", str(installed)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "homespec-worker.service" not in done.stderr, done.stderr
