#!/usr/bin/env bash
# Fuzzes the parsers that read untrusted files, with cargo-fuzz (libFuzzer + AddressSanitizer,
# nightly toolchain): the ONNX decoder and importer (then verifier and exporter), the .mmir
# parser, the .npz/.npy reader, the precision-map parser and the QPQR table reader. Seeds come
# from the repository's fixtures and from files mmq writes; each target runs RUNS executions
# (default 1,000,000); crashes land in fuzz/artifacts/TARGET/.
#
#   cargo install cargo-fuzz && rustup toolchain install nightly
#   [MAX_LEN=BYTES] tools/fuzz.sh [RUNS] [TARGET...]
#
# MAX_LEN (default 262144) caps an input's size; mmir_parse verifies a whole model per
# execution, so its 1,000,000-execution run uses MAX_LEN=8192 (about 400 executions a second
# instead of 100).
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-1000000}"
max_len="${MAX_LEN:-262144}"
shift || true
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(onnx_import mmir_parse npz_read precision_map qpqr_read)

mmq=target/debug/mmq
[[ -x "$mmq" ]] || cargo build -p mmq-cli
seeds=fuzz/corpus
mkdir -p "$seeds"/{onnx_import,mmir_parse,npz_read,precision_map,qpqr_read}
# Seeds: files of at most 256 KiB.
find tests/fixtures tests/hostile -name '*.onnx' -size -256k -exec cp -t "$seeds/onnx_import" {} + 2>/dev/null || true
for f in $(find tests/fixtures tests/hostile -name '*.onnx' -size -256k); do
    "$mmq" inspect "$f" > "$seeds/mmir_parse/$(echo "$f" | tr / _).mmir" 2>/dev/null || true
done
find tests/fixtures tests/hostile \( -name '*.npz' -o -name '*.npy' \) -size -256k -exec cp -t "$seeds/npz_read" {} + 2>/dev/null || true
find tests/fixtures -name '*.toml' -exec cp -t "$seeds/precision_map" {} +
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for q in int4 int8 fp8; do
    "$mmq" compile tests/fixtures/llama_gqa_kv/model.onnx --target ort --quant "$q" --placement all \
        --calib-random 2 --no-accuracy -o "$tmp/m.onnx" --qparams "$seeds/qpqr_read/$q.qpqr" 2>/dev/null
done

cd fuzz
env -u MMQ_NVCC cargo +nightly fuzz build -O >/dev/null
for t in "${targets[@]}"; do
    start=$(date +%s)
    log="$(mktemp)"
    if env -u MMQ_NVCC cargo +nightly fuzz run -O "$t" "corpus/$t" -- -runs="$runs" -max_len="$max_len" -timeout=10 \
        -print_final_stats=1 >"$log" 2>&1; then
        status="0 crashes"
    else
        status="CRASH (see fuzz/artifacts/$t/)"
    fi
    secs=$(( $(date +%s) - start ))
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
    echo "$t: $execs executions in ${secs} s, $cov, $status"
    rm -f "$log"
done
