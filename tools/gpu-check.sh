#!/usr/bin/env bash
# The GPU checks of the CUDA kernels in one run: every CUDA test with REQUIRE_GPU=1 (a skip is a
# failure), the TensorRT plugins' enqueue on device buffers against the reference interpreter
# (the plugin harness over the nodes of every plugin package of tests/tests/trt_plugins.rs), then
# the kernel benchmark (bandwidth against device copies, the INT4 GEMV against binary16 GEMVs).
# Under 5 minutes on an H200.
#
#   tools/gpu-check.sh build   build the test and benchmark binaries (release, fatbin from the
#                              pip nvcc in .venv; run tools/setup-venv.sh first) into
#                              target/gpu-check/bin, and the plugin library with its harness and
#                              device data into target/gpu-check/plugins; needs no GPU
#   tools/gpu-check.sh run     run them; needs the GPU and its driver, no toolchain
#   tools/gpu-check.sh         both
#
# `run` writes gpu-check.md (device, test results, benchmark tables) to $OUT, or target/gpu-check.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=target/gpu-check
mode="${1:-all}"

build() {
    local cu13
    cu13="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/nvidia/cu13"
    [[ -x "$cu13/bin/nvcc" ]] || { echo "gpu-check: no nvcc in .venv (run tools/setup-venv.sh)" >&2; exit 1; }
    export MMQ_NVCC="$cu13/bin/nvcc"
    mkdir -p "$dir/bin"
    local exe
    for target in "test --release --test cuda" "bench --bench cuda"; do
        # shellcheck disable=SC2086
        exe="$(CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_BENCH_DEBUG=0 cargo $target \
            -p mmq-kernels --locked --no-run --message-format=json \
            | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "cuda":
        print(m["executable"])' | tail -1)"
        cp "$exe" "$dir/bin/cuda-${target%% *}"
    done
    strip "$dir/bin/"* 2>/dev/null || true
    ls -la "$dir/bin"
    # The plugin library (sm_90), the harness and the nodes' operands and CPU results.
    LD_LIBRARY_PATH="$cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" MMQ_REQUIRE_CUDA_TOOLS=1 \
        cargo test -p mmq-tests --test trt_plugins --locked -q >/dev/null
    rm -rf "$dir/plugins"
    cp -r target/mmq-test-scratch/trt-plugins-library "$dir/plugins"
    du -sh "$dir/plugins"
}

# cuBLAS (the benchmark's binary16 GEMV) and NVRTC come from the machine's CUDA, or from the
# NVIDIA wheels of its python3 where it has no system CUDA.
cuda_libs() {
    local d lib="" site
    site="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null || true)"
    for d in /usr/local/cuda/lib64 ${site:+"$site"/nvidia/*/lib}; do
        [[ -d "$d" ]] && lib="${lib:+$lib:}$d"
    done
    echo "$lib"
}

run() {
    local out="${OUT:-$dir}" status=0 libs
    mkdir -p "$out"
    libs="$(cuda_libs)"
    export LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    {
        echo "# GPU check ($(date -u +%Y-%m-%dT%H:%MZ))"
        echo
        echo '```'
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
        echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
        echo '```'
        echo
        echo "## Tests (REQUIRE_GPU=1)"
        echo
        echo '```'
    } >"$out/gpu-check.md"
    REQUIRE_GPU=1 "$dir/bin/cuda-test" --test-threads 1 >>"$out/gpu-check.md" 2>&1 || status=$?
    { echo '```'; echo; echo "## TensorRT plugins: enqueue against the CPU"; echo; echo '```'; } \
        >>"$out/gpu-check.md"
    "$dir/plugins/harness" "$dir/plugins/libmmq_plugins.so" "$dir/plugins/harness.spec" --enqueue \
        | grep -E "device|FAIL|failure" >>"$out/gpu-check.md" 2>&1 || status=$?
    { echo '```'; echo; echo "## Benchmark"; echo; } >>"$out/gpu-check.md"
    "$dir/bin/cuda-bench" >>"$out/gpu-check.md" 2>&1 || status=$?
    cat "$out/gpu-check.md"
    return "$status"
}

case "$mode" in
    build) build ;;
    run) run ;;
    all) build && run ;;
    *) echo "usage: tools/gpu-check.sh [build|run]" >&2; exit 2 ;;
esac
