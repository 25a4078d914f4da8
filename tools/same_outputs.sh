#!/usr/bin/env bash
# Compiles every fixture and export-matrix cell with two mmq binaries and compares the results
# byte for byte (models, TensorRT packages, stderr), for refactors that must not change outputs:
#
#   tools/same_outputs.sh OLD_MMQ NEW_MMQ [WORK_DIR]
#
# Modes: -O1, -O2, --quant int8, --quant int4, and --target trt --quant int8. Exits non-zero and
# lists the differing files when anything differs (the package paths in stderr are ignored).
set -u
old=$1 new=$2 work=${3:-$(mktemp -d)}
compile_all() {
    local mmq=$1 out=$2
    mkdir -p "$out"
    for d in tests/fixtures/*/ tests/fixtures/matrix/*/; do
        [ -f "$d/model.onnx" ] || continue
        local n
        n=$(echo "$d" | tr '/' '_')
        for mode in "o1:-O1" "o2:" "int8:--quant int8" "int4:--quant int4"; do
            local tag=${mode%%:*} args=${mode#*:}
            # shellcheck disable=SC2086
            "$mmq" compile "$d/model.onnx" $args -o "$out/$n.$tag.onnx" >/dev/null 2>"$out/$n.$tag.err"
            echo "exit $?" >>"$out/$n.$tag.err"
        done
        "$mmq" compile "$d/model.onnx" --target trt --quant int8 -o "$out/$n.trt" >/dev/null \
            2>"$out/$n.trt.err"
        echo "exit $?" >>"$out/$n.trt.err"
    done
}
rm -rf "$work/old" "$work/new"
compile_all "$old" "$work/old"
compile_all "$new" "$work/new"
if diff -r -q -I 'trt: wrote' "$work/old" "$work/new"; then
    echo "same outputs: $(find "$work/new" -type f | wc -l) files"
else
    exit 1
fi
