#!/usr/bin/env bash
# Regenerate the ONNX test fixtures under tests/fixtures/.
#
# Creates (or reuses) a Python virtual environment in .venv-fixtures at the
# repository root, installs the pinned dependencies from
# tools/requirements-fixtures.txt and runs tools/gen_fixtures.py with all
# arguments passed through, e.g.
#
#   tools/gen_fixtures.sh                      # all committed fixtures
#   tools/gen_fixtures.sh --only gpt2_kv       # a single fixture
#   tools/gen_fixtures.sh --big-llama /tmp/big # large external-data model
#   tools/gen_fixtures.sh --big-llama /tmp/big8 --big-llama-layers 8
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
# tools/gen_matrix.sh runs another generator in the same environment.
exec "$VENV/bin/python" "$ROOT/tools/${MMQ_GENERATOR:-gen_fixtures.py}" "$@"
