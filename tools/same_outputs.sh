#!/usr/bin/env bash
# Compiles every fixture and export-matrix cell with two mmq binaries and compares the results
# byte for byte (models, TensorRT packages, stderr), for refactors that must not change outputs:
#
#   tools/same_outputs.sh OLD_MMQ NEW_MMQ [WORK_DIR]
#
# EXTRA="a.onnx b.onnx" adds models (real package models) to the fixtures.
# Modes: -O1, -O2, --quant int8, --quant int4, and --target trt --quant int8; with MODES=all also
# int8-dynamic, fp8, fp16, int4 with AWQ and block 64, int8 with SmoothQuant and a percentile
# observer, --auto 0.99, --qparams, --package, --kv-cache int8, --image-cache int4 and trt int4.
# Exits non-zero and lists the differing files when anything differs (the lines naming what was
# written, which hold the output paths, and the durations --auto reports are ignored).
set -u
old=$1 new=$2 work=${3:-$(mktemp -d)}
compile_all() {
    local mmq=$1 out=$2
    mkdir -p "$out"
    local models=(tests/fixtures/*/model.onnx tests/fixtures/matrix/*/model.onnx)
    # shellcheck disable=SC2206
    models+=(${EXTRA:-})
    for model in "${models[@]}"; do
        [ -f "$model" ] || continue
        local n
        n=$(echo "$model" | tr '/' '_')
        local modes=("o1:-O1" "o2:" "int8:--quant int8" "int4:--quant int4")
        if [ "${MODES:-}" = all ]; then
            modes+=("dyn:--quant int8-dynamic" "fp8:--quant fp8" "fp16:--quant fp16"
                "awq:--quant int4 --awq --block 64" "sq:--quant int8 --smoothquant 0.5"
                "obs:--quant int8 --observer percentile" "auto:--auto 0.99"
                "qp:--quant int8 --qparams $out/$n.qp.qpqr" "pkg:--package"
                "kv:--kv-cache int8" "img:--image-cache int4" "trt4:--target trt --quant int4")
        fi
        for mode in "${modes[@]}"; do
            local tag=${mode%%:*} args=${mode#*:}
            # shellcheck disable=SC2086
            "$mmq" compile "$model" $args -o "$out/$n.$tag.onnx" >/dev/null 2>"$out/$n.$tag.err"
            echo "exit $?" >>"$out/$n.$tag.err"
        done
        "$mmq" compile "$model" --target trt --quant int8 -o "$out/$n.trt" >/dev/null \
            2>"$out/$n.trt.err"
        echo "exit $?" >>"$out/$n.trt.err"
    done
}
rm -rf "$work/old" "$work/new"
compile_all "$old" "$work/old"
compile_all "$new" "$work/new"
if diff -r -q -I 'wrote' -I ' in [0-9.]* s$' "$work/old" "$work/new"; then
    echo "same outputs: $(find "$work/new" -type f | wc -l) files"
else
    exit 1
fi
