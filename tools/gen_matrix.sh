#!/usr/bin/env bash
# Regenerate the transformer export matrix under tests/fixtures/matrix/
# (cells <family>_<exporter><opset>_<attn>_<static|dynamic> and the manifest
# tests/fixtures/matrix/transformers.json).
#
# Creates (or reuses) the Python virtual environment in .venv-fixtures at the
# repository root (shared with tools/gen_fixtures.sh), installs the pinned
# dependencies from tools/requirements-fixtures.txt and runs
# tools/gen_matrix.py with all arguments passed through, e.g.
#
#   tools/gen_matrix.sh                          # every cell
#   tools/gen_matrix.sh --only gpt2_kv           # cells whose name starts with gpt2_kv
#   tools/gen_matrix.sh --only bert_dynamo23     # a single cell
#   tools/gen_matrix.sh --list                   # cell names
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv-fixtures"
REQ="$ROOT/tools/requirements-fixtures.txt"
PYTHON="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi

# Reinstall only when the requirements file changed since the last install.
STAMP="$VENV/.requirements-fixtures.stamp"
if [ ! -f "$STAMP" ] || ! cmp -s "$REQ" "$STAMP"; then
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet -r "$REQ"
    cp "$REQ" "$STAMP"
fi

export HF_HUB_OFFLINE=1
export TRANSFORMERS_OFFLINE=1
export TOKENIZERS_PARALLELISM=false
cd "$ROOT"
exec "$VENV/bin/python" "$ROOT/tools/gen_matrix.py" "$@"
