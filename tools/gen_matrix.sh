#!/usr/bin/env bash
# Regenerate the export matrix under tests/fixtures/matrix/: the transformer cells
# (<family>_<exporter><opset>_<attn>_<static|dynamic>, manifest transformers.json) with
# tools/gen_matrix.py, or with `--cnn` the CNN / QAT / paddle / subgraph cases (manifest
# cnn.json) with tools/gen_cnn_cases.py. Same virtual environment as tools/gen_fixtures.sh
# (.venv-fixtures, tools/requirements-fixtures.txt); the other arguments pass through, e.g.
#
#   tools/gen_matrix.sh                          # every transformer cell
#   tools/gen_matrix.sh --only gpt2_kv           # cells whose name starts with gpt2_kv
#   tools/gen_matrix.sh --list                   # cell names
#   tools/gen_matrix.sh --cnn                    # every CNN case
set -euo pipefail
generator=gen_matrix.py
if [ "${1:-}" = "--cnn" ]; then
    generator=gen_cnn_cases.py
    shift
fi
MMQ_GENERATOR="$generator" exec "$(dirname "${BASH_SOURCE[0]}")/gen_fixtures.sh" "$@"
