#!/usr/bin/env bash
# Runs every test: installs the pinned Python oracle (onnx, onnxruntime, numpy) into .venv,
# then runs the Rust test suite, which uses it.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup-venv.sh
cargo test --workspace --locked "$@"
