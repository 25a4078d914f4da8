#!/usr/bin/env bash
# Builds libmmq_plugins.so (mmq's TensorRT plugins) with nvcc, next to this script.
#   TENSORRT_INCLUDE  TensorRT's include directory (NvInferRuntime.h); default: /usr/include/x86_64-linux-gnu
#   NVCC              nvcc to use; default: nvcc on PATH (or $CUDA_HOME/bin/nvcc)
#   CUDA_ARCHS        SM versions for SASS, space-separated; default: "80 89 90" (PTX for the last)
# No TensorRT library is linked: the plugins use only TensorRT's interfaces, and the CUDA runtime
# is linked statically.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
nvcc="${NVCC:-$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")}"
trt_include="${TENSORRT_INCLUDE:-/usr/include/x86_64-linux-gnu}"
if [[ ! -f "$trt_include/NvInferRuntime.h" ]]; then
    echo "build.sh: NvInferRuntime.h not found in $trt_include (set TENSORRT_INCLUDE)" >&2
    exit 1
fi
gencode=()
last=""
for sm in ${CUDA_ARCHS:-80 89 90}; do
    gencode+=("-gencode=arch=compute_$sm,code=sm_$sm")
    last="$sm"
done
gencode+=("-gencode=arch=compute_$last,code=compute_$last")
# The CUDA libraries beside nvcc (lib64 in a CUDA install, lib in the Python registry's wheels).
libdirs=()
for d in "$(dirname "$nvcc")/../lib64" "$(dirname "$nvcc")/../lib"; do
    [[ -d "$d" ]] && libdirs+=("-L$d")
done
out="${OUT:-$here/libmmq_plugins.so}"
"$nvcc" -std=c++17 -O3 -shared -Xcompiler -fPIC,-Wall,-Wextra,-Werror,-fvisibility=hidden \
    --Werror all-warnings -isystem "$trt_include" -I "$here" "${gencode[@]}" \
    "${libdirs[@]}" "$here/mmq_launch.cu" "$here/mmq_plugins.cpp" -o "$out.tmp"
mv "$out.tmp" "$out"
echo "built $out"
