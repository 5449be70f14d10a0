"""Every process that runs llama.cpp loads its library before numpy's: on an H100 a CUDA build
of llama.cpp crashed at model load when numpy was imported first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .daemon_process import fake_manifest_file


def completed(argv: list[str]) -> list[str]:
    """Module names in the order their imports completed (`python -X importtime`)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *argv], capture_output=True, text=True, timeout=120
    )
    return [
        line.rsplit("|", 1)[-1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    ]


def llama_before_numpy(names: list[str]) -> bool:
    return names.index("llama_cpp.llama_cpp") < names.index("numpy")


@pytest.mark.parametrize(
    "module", ["homespec.engine.child", "homespec.engine.canary", "homespec.memcheck"]
)
def test_the_programs_homespec_starts_load_llama_cpp_first(module: str) -> None:
    assert llama_before_numpy(completed(["-c", f"import {module}"]))


def test_a_command_that_runs_llama_cpp_in_process_loads_it_first(tmp_path: Path) -> None:
    config = fake_manifest_file(tmp_path)  # its model files are missing: doctor says so, exit 2
    names = completed(["-m", "homespec", "doctor", "--plan", "--config", str(config)])
    assert llama_before_numpy(names)


def test_the_daemon_itself_never_loads_llama_cpp() -> None:
    names = completed(["-c", "import homespec.daemon.serve, homespec.daemon.app, homespec.cli"])
    assert "llama_cpp" not in names and "homespec.engine.llama_backend" not in names
