"""Paths shared by the tests: the repository's fixtures and the `mmq` command built by
`cargo test` (or named by MMQ_BIN)."""

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def fixture(name: str) -> Path:
    return REPO / "tests" / "fixtures" / name


@pytest.fixture(scope="session")
def mmq_bin() -> Path:
    """The command-line tool, to compare its output with the library's."""
    path = Path(os.environ.get("MMQ_BIN", REPO / "target" / "debug" / "mmq")).resolve()
    if not path.exists():
        subprocess.run(["cargo", "build", "-p", "mmq-cli"], cwd=REPO, check=True)
    assert path.exists(), f"{path} missing: build it with cargo build -p mmq-cli or set MMQ_BIN"
    return path
