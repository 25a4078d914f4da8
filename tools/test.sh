#!/usr/bin/env bash
# Runs every test: installs the pinned test environment (the Python oracle onnx, onnxruntime,
# numpy; maturin and pytest; the CUDA compilers nvcc and NVRTC) into .venv, runs the Rust test
# suite, then builds the mmq Python package into .venv and runs its tests.
set -euo pipefail
cd "$(dirname "$0")/.."
# No incremental state (for the Rust tests and the Python module alike): each state of the
# checkout is built once here, and the cache would be a quarter of target/.
export CARGO_INCREMENTAL=0
tools/setup-venv.sh
# Debian's Chromium renders the HTML report in python/tests/test_report_html.py; installed here
# when missing, and required (the test fails instead of skipping).
if ! command -v chromium >/dev/null 2>&1; then
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 ||
            { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null; }
    else
        echo "tools/test.sh: chromium is missing; install Debian's chromium package (as root)" >&2
        exit 1
    fi
fi
export MMQ_REQUIRE_BROWSER=1
# The CUDA toolchain from the Python registry (no GPU needed): nvcc builds the kernels' fatbin and
# NVRTC compiles their source in the tests; both are required, so neither check can skip.
cu13="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/nvidia/cu13"
export MMQ_NVCC="$cu13/bin/nvcc" MMQ_REQUIRE_CUDA_TOOLS=1
LD_LIBRARY_PATH="$cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" cargo test --workspace --locked "$@"
# The dev profile reuses what the Rust tests just built; only the module itself is compiled.
rm -f target/wheels/mmq-*.whl
.venv/bin/maturin build --manifest-path python/Cargo.toml --profile dev --locked --quiet \
    --interpreter .venv/bin/python --out target/wheels
.venv/bin/python -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps \
    target/wheels/mmq-*.whl
MMQ_BIN=target/debug/mmq .venv/bin/python -m pytest python/tests -q
