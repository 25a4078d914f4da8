#!/usr/bin/env bash
# Times `mmq convert` and `mmq inspect` against copying the files, on a 32-layer LLaMA export
# (hidden 1024, ~1.6 GiB of external f32 weights) made by the fixture generator, and on the
# largest committed fixture. Prints medians of N runs, ratios, and peak RSS.
#
#   tools/bench_convert.sh [DIR] [N]      DIR defaults to target/big-llama (generated if missing)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-target/big-llama}
runs=${2:-5}
if [ ! -f "$dir/model.onnx" ]; then
  tools/gen_fixtures.sh --big-llama "$dir"
fi
cargo build --release -q -p mmq-cli
mmq=target/release/mmq
out=$(mktemp -d)
trap 'rm -rf "$out" "$out.time"' EXIT

# median SECONDS... of a command run $runs times; also records the largest peak RSS (KiB).
bench() {
  local name=$1; shift
  local times=() rss=0
  for _ in $(seq "$runs"); do
    rm -rf "$out"/*
    local t
    /usr/bin/time -o "$out.time" -f "%e %M" "$@" >/dev/null 2>&1
    t=$(tail -n 1 "$out.time")
    times+=("${t% *}")
    [ "${t#* }" -gt "$rss" ] && rss=${t#* }
  done
  local median
  median=$(printf '%s\n' "${times[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  printf '%-34s median %7.3f s   peak RSS %8d KiB   runs: %s\n' "$name" "$median" "$rss" "${times[*]}"
  eval "median_${name//[^a-z_]/_}=$median"
}

weights=$(stat -c %s "$dir/model.onnx.data")
echo "model: $dir ($((weights / 1048576)) MiB external weights), $runs runs each"
bench convert "$mmq" convert "$dir/model.onnx" -o "$out/model.onnx"
bench cp cp "$dir/model.onnx" "$dir/model.onnx.data" "$out/"
bench cp_sync sh -c "cp '$dir/model.onnx' '$dir/model.onnx.data' '$out/' && sync '$out/model.onnx.data' '$out/model.onnx'"
bench inspect_json "$mmq" inspect --format json "$dir/model.onnx"
bench inspect_text "$mmq" inspect "$dir/model.onnx"
bench inspect_llava_text "$mmq" inspect tests/fixtures/llava/model.onnx
awk -v a="$median_convert" -v b="$median_cp" -v c="$median_cp_sync" \
  'BEGIN { printf "convert / cp = %.2fx   convert / (cp + sync) = %.2fx\n", a / b, a / c }'
