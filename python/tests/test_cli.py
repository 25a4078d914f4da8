"""The `mmq` console command that `pip install` puts on PATH runs the native command line: the
same outputs, messages and exit codes as the `mmq` binary."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import fixture


@pytest.fixture(scope="module")
def console() -> Path:
    """The console script installed beside this interpreter."""
    bindir = Path(sys.executable).parent
    path = bindir / ("mmq.exe" if os.name == "nt" else "mmq")
    assert path.exists(), f"{path} missing: install the package (pip install ./python)"
    return path


def run(cmd: list, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_version_and_help(console, mmq_bin, tmp_path):
    for args in (["--version"], ["--help"], ["compile", "--help"]):
        a, b = run([console, *args], tmp_path), run([mmq_bin, *args], tmp_path)
        assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr), args
        assert a.returncode == 0 and a.stdout, args


def test_compile_writes_the_same_model(console, mmq_bin, tmp_path):
    model = fixture("clip") / "model.onnx"
    for tool, out in ((console, "a.onnx"), (mmq_bin, "b.onnx")):
        r = run([tool, "compile", model, "--quant", "int8", "--calib-random", "4", "-o", out],
                tmp_path)
        assert r.returncode == 0, r.stderr
    a, b = (tmp_path / "a.onnx").read_bytes(), (tmp_path / "b.onnx").read_bytes()
    assert a == b


@pytest.mark.parametrize(
    "args, code",
    [
        (["compile", "missing.onnx", "-o", "out.onnx"], 1),
        (["compile", "--quant", "int9", "x.onnx"], 2),
        (["no-such-command"], 2),
    ],
)
def test_errors_have_the_binarys_exit_codes_and_messages(console, mmq_bin, tmp_path, args, code):
    a, b = run([console, *args], tmp_path), run([mmq_bin, *args], tmp_path)
    assert a.returncode == code, a.stderr
    assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr)
    assert a.stderr
