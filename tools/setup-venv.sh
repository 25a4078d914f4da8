#!/usr/bin/env bash
# Create or refresh the Python virtual environment used by tools/oracle.py.
#
# The environment lives in .venv at the repository root. A stamp file records
# the sha256 of tools/requirements-test.txt; when it matches, nothing is done
# and nothing is printed.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
req="$root/tools/requirements-test.txt"
stamp="$venv/.requirements.sha256"

die() {
    echo "setup-venv: error: $*" >&2
    exit 1
}

[[ -f "$req" ]] || die "requirements file not found: $req"
command -v sha256sum >/dev/null 2>&1 || die "sha256sum not found"

want="$(sha256sum "$req" | cut -d' ' -f1)"
if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    exit 0
fi

command -v python3 >/dev/null 2>&1 || die "python3 not found on PATH"

if [[ ! -x "$venv/bin/python" ]]; then
    echo "setup-venv: creating $venv" >&2
    python3 -m venv "$venv" || die "python3 -m venv failed (is the venv module installed?)"
fi

rm -f "$stamp"
echo "setup-venv: installing $(basename "$req")" >&2
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req" \
    || die "pip install -r $req failed"
"$venv/bin/python" -c "import onnx, onnxruntime, numpy, pytest" \
    || die "installed packages failed to import"

echo "$want" >"$stamp"
echo "setup-venv: ready ($venv)" >&2
