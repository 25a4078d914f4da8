"""ONNX Runtime's quantization tools on a large external-data model, for the comparisons in
docs/benchmarks.md (run under /usr/bin/time for wall time and peak RSS):

    .venv-compare/bin/python tools/quant_big.py int4 DIR/model.onnx OUT/model.onnx
    .venv-compare/bin/python tools/quant_big.py int8-dynamic DIR/model.onnx OUT/model.onnx
    .venv-compare/bin/python tools/quant_big.py int8 DIR/model.onnx OUT/model.onnx \
        --calib DIR/inputs.npz --samples 2

int4: `MatMulNBitsQuantizer` (block 32, symmetric). int8-dynamic: `quantize_dynamic` (QInt8
weights). int8: `quantize_static` (QDQ, MinMax) calibrated on `--samples` copies of the
`--calib` arrays, each with a different seed's noise added to its float inputs (as many samples
as `mmq compile --calib-random N` draws, not the same values). Prints the seconds of the tool
call alone.
"""
import argparse
import time
from pathlib import Path

import numpy as np
import onnx


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scheme", choices=["int4", "int8-dynamic", "int8"])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--calib", type=Path, help="an .npz of inputs (int8 only)")
    ap.add_argument("--samples", type=int, default=2)
    a = ap.parse_args()
    start = time.perf_counter()
    if a.scheme == "int4":
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        qz = MatMulNBitsQuantizer(onnx.load(str(a.src)), block_size=32, is_symmetric=True)
        qz.process()
        qz.model.save_model_to_file(str(a.dst), use_external_data_format=True)
    elif a.scheme == "int8-dynamic":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(a.src, a.dst, weight_type=QuantType.QInt8,
                         use_external_data_format=True)
    else:
        from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod,
                                              QuantFormat, quantize_static)

        if a.calib is None:
            ap.error("int8 needs --calib")
        base = dict(np.load(a.calib))

        class Reader(CalibrationDataReader):
            def __init__(self) -> None:
                self.left = list(range(a.samples))

            def get_next(self):
                if not self.left:
                    return None
                rng = np.random.default_rng(self.left.pop())
                return {k: (v + rng.standard_normal(v.shape).astype(v.dtype) * 0.1
                            if v.dtype.kind == "f" else v)
                        for k, v in base.items()}

        quantize_static(a.src, a.dst, Reader(), quant_format=QuantFormat.QDQ,
                        calibrate_method=CalibrationMethod.MinMax,
                        use_external_data_format=True)
    print(f"seconds {time.perf_counter() - start:.2f}")


if __name__ == "__main__":
    main()
