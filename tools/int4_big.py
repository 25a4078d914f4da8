"""ONNX Runtime's MatMulNBitsQuantizer on a large external-data model, for the INT4 comparison
in docs/benchmarks.md (run under /usr/bin/time -v for wall time and peak RSS):

    /usr/bin/time -v .venv-compare/bin/python tools/int4_big.py DIR/model.onnx OUT/model.onnx
"""
import sys
import time

import onnx
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

src, dst = sys.argv[1:3]
start = time.perf_counter()
qz = MatMulNBitsQuantizer(onnx.load(src), block_size=32, is_symmetric=True)
qz.process()
qz.model.save_model_to_file(dst, use_external_data_format=True)
print(f"seconds {time.perf_counter() - start:.2f}")
