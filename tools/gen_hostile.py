"""Writes the hostile-input corpus in tests/hostile/ (run with .venv/bin/python; the files are
committed, the tests never run this): models and arrays whose sizes explode or overflow."""

import struct
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

OUT = Path(__file__).resolve().parent.parent / "tests" / "hostile"
HUGE = np.array([1_000_000, 1_000_000], np.int64)


def save(name, nodes, inputs, inits, opset=18):
    y = h.make_tensor_value_info("y", T.FLOAT, None)
    g = h.make_graph(nodes, name, inputs, [y], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)], producer_name="gen_hostile")
    onnx.save(m, OUT / f"{name}.onnx")


def npy_header(shape, descr="<f4"):
    """A .npy v1 header claiming `shape`, with no data after it."""
    text = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}"
    text += " " * (63 - (10 + len(text)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode()


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    x = h.make_tensor_value_info("x", T.FLOAT, [1])
    save("expand_1e12", [h.make_node("Expand", ["x", "s"], ["y"], name="big_expand")], [x],
         [nh.from_array(HUGE, "s")])
    save("cos_of_1e12", [h.make_node("ConstantOfShape", ["s"], ["c"], name="big_fill"),
                         h.make_node("Cos", ["c"], ["y"], name="cos")], [x],
         [nh.from_array(HUGE, "s")])
    save("pad_1e12", [h.make_node("Pad", ["x", "p"], ["y"], name="big_pad")], [x],
         [nh.from_array(np.array([0, 10**12], np.int64), "p")])
    save("onehot_1e12",
         [h.make_node("OneHot", ["i", "d", "v"], ["y"], name="big_onehot")],
         [h.make_tensor_value_info("i", T.INT64, [1])],
         [nh.from_array(np.array(10**12, np.int64), "d"),
          nh.from_array(np.array([0, 1], np.float32), "v")])
    w = np.linspace(-1, 1, 32 * 4, dtype=np.float32).reshape(32, 4)
    w[3, 1] = np.nan
    save("nan_weight", [h.make_node("MatMul", ["a", "proj_weight"], ["y"], name="proj")],
         [h.make_tensor_value_info("a", T.FLOAT, [1, 32])], [nh.from_array(w, "proj_weight")],
         opset=20)
    # Models that standard readers refuse, which must not verify either.
    relu = [h.make_node("Relu", ["x"], ["y"], name="act")]
    g = h.make_graph(relu, "no_opset", [x], [h.make_tensor_value_info("y", T.FLOAT, [1])])
    m = h.make_model(g, producer_name="gen_hostile")
    del m.opset_import[:]
    onnx.save(m, OUT / "no_opset.onnx")
    save("unknown_op", [h.make_node("FooBar", ["x"], ["y"], name="mystery")], [x], [])
    then_g = h.make_graph([h.make_node("Relu", ["x"], ["a"]), h.make_node("Neg", ["x"], ["b"])],
                          "then", [], [h.make_tensor_value_info(n, T.FLOAT, [1]) for n in "ab"])
    else_g = h.make_graph([h.make_node("Neg", ["x"], ["c"])], "else", [],
                          [h.make_tensor_value_info("c", T.FLOAT, [1])])
    save("if_branch_counts",
         [h.make_node("If", ["cond"], ["y"], name="branch", then_branch=then_g, else_branch=else_g)],
         [x, h.make_tensor_value_info("cond", T.BOOL, [])], [])
    save("conv_dilation_2e40",
         [h.make_node("Conv", ["img", "w"], ["y"], name="dilated", dilations=[2**40, 2**40])],
         [h.make_tensor_value_info("img", T.FLOAT, [1, 1, 8, 8])],
         [nh.from_array(np.ones((1, 1, 3, 3), np.float32), "w")])
    save("input_2e80", [h.make_node("Relu", ["wide"], ["y"], name="act")],
         [h.make_tensor_value_info("wide", T.FLOAT, [2**40, 2**40])], [])
    np.savez(OUT / "x.npz", x=np.ones(1, np.float32))
    np.savez(OUT / "i.npz", i=np.zeros(1, np.int64))
    # (2^62, 4): the element count wraps to 0 in 64 bits.
    (OUT / "wrapping_shape.npy").write_bytes(npy_header((2**62, 4)))
    # 2^40 f32 elements: 4 TiB claimed, no data.
    (OUT / "huge_shape.npy").write_bytes(npy_header((2**20, 2**20)))


def data_sized():
    """Results sized by an input's values (no static shape to check before the node runs): the
    kernel itself must refuse them."""
    x = h.make_tensor_value_info("x", T.FLOAT, [1])
    x2 = h.make_tensor_value_info("x", T.FLOAT, [1, 1])
    s = h.make_tensor_value_info("s", T.INT64, [2])
    save("expand_by_input", [h.make_node("Expand", ["x", "s"], ["y"], name="data_expand")],
         [x, s], [])
    save("fill_by_input", [h.make_node("ConstantOfShape", ["s"], ["y"], name="data_fill")],
         [x, s], [])
    save("tile_by_input", [h.make_node("Tile", ["x", "s"], ["y"], name="data_tile")], [x2, s], [])
    pads = h.make_tensor_value_info("s", T.INT64, [2])
    save("pad_by_input", [h.make_node("Pad", ["x", "s"], ["y"], name="data_pad")], [x, pads], [])
    save("resize_by_input",
         [h.make_node("Resize", ["x", "", "", "s"], ["y"], name="data_resize", mode="nearest")],
         [x2, s], [])
    np.savez(OUT / "xs.npz", x=np.ones(1, np.float32), s=HUGE)
    np.savez(OUT / "x2s.npz", x=np.ones((1, 1), np.float32), s=HUGE)
    np.savez(OUT / "xp.npz", x=np.ones(1, np.float32), s=np.array([0, 10**12], np.int64))
    # Symbolic dims the inputs bind: [n, 1] x [1, m] is n x m (run with --max-memory 1MiB).
    for name, op in [("outer_by_symbols", "MatMul"), ("broadcast_by_symbols", "Add")]:
        g = h.make_graph([h.make_node(op, ["a", "b"], ["y"], name=f"sym_{op.lower()}")], name,
                         [h.make_tensor_value_info("a", T.FLOAT, ["n", 1]),
                          h.make_tensor_value_info("b", T.FLOAT, [1, "m"])],
                         [h.make_tensor_value_info("y", T.FLOAT, ["n", "m"])])
        onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)],
                               producer_name="gen_hostile"), OUT / f"{name}.onnx")
    np.savez(OUT / "ab.npz", a=np.ones((1024, 1), np.float32), b=np.ones((1, 1024), np.float32))


def unshaped():
    """Results whose shapes the model does not state and inference cannot know (operands of
    unstated shape, a reshape target read from an input): sized from the run's operands before
    the kernel runs (run with --max-memory 1MiB; each result is 4 MiB)."""
    def model(name, nodes, inputs):
        g = h.make_graph(nodes, name, inputs, [h.make_tensor_value_info("y", T.FLOAT, None)])
        onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)],
                               producer_name="gen_hostile"), OUT / f"{name}.onnx")

    model("outer_unshaped", [h.make_node("MatMul", ["a", "b"], ["y"], name="blind_matmul")],
          [h.make_tensor_value_info("a", T.FLOAT, None),
           h.make_tensor_value_info("b", T.FLOAT, None)])
    model("gather_unshaped", [h.make_node("Gather", ["b", "i"], ["y"], name="blind_gather")],
          [h.make_tensor_value_info("b", T.FLOAT, None),
           h.make_tensor_value_info("i", T.INT64, None)])
    model("outer_by_reshape",
          [h.make_node("Reshape", ["a", "s"], ["r"], name="data_reshape"),
           h.make_node("MatMul", ["r", "b"], ["y"], name="reshaped_matmul")],
          [h.make_tensor_value_info("a", T.FLOAT, [1024]),
           h.make_tensor_value_info("s", T.INT64, [2]),
           h.make_tensor_value_info("b", T.FLOAT, [1, 1024])])
    # outer_unshaped runs on ab.npz.
    np.savez(OUT / "bi.npz", b=np.ones((1, 1024), np.float32), i=np.zeros((1024, 1), np.int64))
    np.savez(OUT / "as.npz", a=np.ones(1024, np.float32), s=np.array([1024, 1], np.int64),
             b=np.ones((1, 1024), np.float32))


def wrong_in_text():
    """Sizes that overflow in a model file, and .mmir text that once verified though wrong."""
    big = onnx.TensorProto()
    big.name, big.data_type = "huge_weight", T.FLOAT
    big.dims.extend([2**62, 1])  # 2^64 bytes, no data
    save("bytes_2e64", [h.make_node("Add", ["x", "huge_weight"], ["y"], name="add")],
         [h.make_tensor_value_info("x", T.FLOAT, [1])], [big])
    sparse = h.make_sparse_tensor(nh.from_array(np.array([1.0], np.float32), "sparse_weight"),
                                  nh.from_array(np.array([0], np.int64), "sparse_weight_idx"),
                                  [2**42])
    g = h.make_graph([h.make_node("Add", ["x", "sparse_weight"], ["y"], name="add")],
                     "sparse_2e42", [h.make_tensor_value_info("x", T.FLOAT, [1])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], sparse_initializer=[sparse])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)],
                           producer_name="gen_hostile"), OUT / "sparse_2e42.onnx")
    texts = {
        "self_reference.mmir": "graph @g(%x: f32[2]) -> (f32[2]) {\n"
                               "  %y = Add(%x, %y) : f32[2]\n  return %y\n}\n",
        "wrong_result_type.mmir": "graph @g(%x: f32[2]) -> (i64[3]) {\n"
                                  "  %y = Relu(%x) : i64[3]\n  return %y\n}\n",
        "dim_wraps.mmir": "sym n\ngraph @g(%x: f32[n * 9223372036854775807 * 4]) -> (f32[2]) {\n"
                          "  %y = Relu(%x) : f32[2]\n  return %y\n}\n",
    }
    for name, text in texts.items():
        (OUT / name).write_text(text)
    # An ONNX output declared with another rank than the graph computes (a real exporter did
    # this: ONNX Runtime warns and returns the computed shape).
    g = h.make_graph([h.make_node("Relu", ["x"], ["y"], name="act")], "wrong_output_rank",
                     [h.make_tensor_value_info("x", T.FLOAT, [2, 3])],
                     [h.make_tensor_value_info("y", T.FLOAT, [6])])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)],
                           producer_name="gen_hostile"), OUT / "wrong_output_rank.onnx")


def interpreter_answers():
    """Answers the interpreter got wrong or panicked on, where ONNX Runtime and numpy answer."""
    x = h.make_tensor_value_info("x", T.FLOAT, [2, 2])
    save("einsum_repeated_output",
         [h.make_node("Einsum", ["x"], ["y"], name="diag_out", equation="ij->jj")], [x], [],
         opset=12)
    # A term naming three labels for an operand of rank 2 (compile exited 0).
    save("einsum_rank",
         [h.make_node("Einsum", ["x"], ["y"], name="rank_term", equation="ijk->i")], [x], [],
         opset=12)
    lo, hi = -(2**63), 2**63 - 1
    cases = [(lo, hi, hi), (0, hi, hi), (hi, lo, lo), (-1, lo, -hi), (2, hi, hi), (lo, hi, 2)]
    nodes, inits = [], []
    for k, (start, end, step) in enumerate(cases):
        for n, v in (("s", start), ("e", end), ("t", step)):
            inits.append(nh.from_array(np.array([v], np.int64), f"{n}{k}"))
        nodes.append(h.make_node("Slice", ["v", f"s{k}", f"e{k}", "axis", f"t{k}"], [f"y{k}"],
                                 name=f"extreme_{k}"))
    inits.append(nh.from_array(np.array([0], np.int64), "axis"))
    nodes.append(h.make_node("Concat", [f"y{k}" for k in range(len(cases))], ["y"], axis=0))
    save("slice_int64_extremes", nodes, [h.make_tensor_value_info("v", T.FLOAT, [5])], inits,
         opset=13)
    # An If whose branches return different element types for one result.
    then_g = h.make_graph([h.make_node("Neg", ["c"], ["a"])], "then", [],
                          [h.make_tensor_value_info("a", T.FLOAT, [1])])
    else_g = h.make_graph([h.make_node("Cast", ["c"], ["b"], to=T.INT64)], "else", [],
                          [h.make_tensor_value_info("b", T.INT64, [1])])
    save("if_branch_types",
         [h.make_node("If", ["cond"], ["y"], name="typed_branch", then_branch=then_g,
                      else_branch=else_g)],
         [h.make_tensor_value_info("c", T.FLOAT, [1]),
          h.make_tensor_value_info("cond", T.BOOL, [])], [])
    # Floats cast to strings: ONNX Runtime writes NaN, INF, -INF and C's %.8g (the interpreter
    # wrote numpy's nan, -inf and 1e-40).
    g = h.make_graph([h.make_node("Cast", ["f"], ["s"], name="to_text", to=T.STRING),
                      h.make_node("Cast", ["d"], ["t"], name="to_text_f64", to=T.STRING)],
                     "cast_float_to_string",
                     [h.make_tensor_value_info("f", T.FLOAT, [12]),
                      h.make_tensor_value_info("d", T.DOUBLE, [12])],
                     [h.make_tensor_value_info("s", T.STRING, [12]),
                      h.make_tensor_value_info("t", T.STRING, [12])])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 21)], producer_name="gen_hostile"),
              OUT / "cast_float_to_string.onnx")
    special = [np.nan, -np.inf, np.inf, 1e-40, 0.1, 1 / 3, 123456789.0, 1e16, 1e-5, -0.0, 100.0,
               2.5e-4]
    np.savez(OUT / "f12.npz", f=np.array(special, np.float32), d=np.array(special, np.float64))
    np.savez(OUT / "v5.npz", v=np.arange(5, dtype=np.float32))
    np.savez(OUT / "x22.npz", x=np.arange(4, dtype=np.float32).reshape(2, 2))


def archives():
    """.npz archives that lie: a wrong CRC-32, one array under two member names."""
    import io
    import warnings
    import zipfile

    def npy(a):
        buf = io.BytesIO()
        np.save(buf, a)
        return buf.getvalue()

    def put(z, name, data):
        # A fixed time stamp: the archives are the same bytes on every run.
        info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
        info.compress_type = z.compression
        z.writestr(info, data, compresslevel=9)

    ones = npy(np.ones(1, np.float32))  # for the input x: f32[1] of expand_by_input.onnx
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        put(z, "x.npy", ones)
    data = bytearray(buf.getvalue())
    at = data.find(ones) + len(ones) - 1
    data[at] ^= 0x01  # the last element's byte: the stored CRC no longer matches
    (OUT / "bad_crc.npz").write_bytes(bytes(data))
    with zipfile.ZipFile(OUT / "dup_names.npz", "w", zipfile.ZIP_STORED) as z:
        put(z, "x.npy", ones)
        put(z, "x", npy(np.zeros(1, np.float32)))
    # One member name twice: the archive reader keys members by name, so one of them vanished.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate name
        with zipfile.ZipFile(OUT / "dup_member.npz", "w", zipfile.ZIP_STORED) as z:
            put(z, "x.npy", ones)
            put(z, "x.npy", npy(np.zeros(1, np.float32)))
    # An inflate bomb: 64 KiB that inflate to 64 MiB of zeros, for the input a: f32[1, 32] of
    # nan_weight.onnx. Its CRC-32 is wrong as well, so an error about the shape proves the header
    # was checked before the data was inflated (inflating first meets the checksum).
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        put(z, "a.npy", npy(np.zeros((1 << 19, 32), np.float32)))
    data = bytearray(buf.getvalue())
    crc = zipfile.ZipFile(io.BytesIO(bytes(data))).getinfo("a.npy").CRC.to_bytes(4, "little")
    at = data.find(crc)
    while at >= 0:
        data[at] ^= 0xFF
        at = data.find(crc, at + 4)
    (OUT / "inflate_bomb.npz").write_bytes(bytes(data))


def qparam_tables():
    """A QPQR table whose first scale is NaN, its checksum recomputed (as a tool editing a table
    in place would leave it). Needs a built `target/debug/mmq` and the `xxhash` package."""
    import subprocess
    import tempfile

    import xxhash

    repo = OUT.parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        table = Path(tmp) / "t.qpqr"
        subprocess.run([str(repo / "target/debug/mmq"), "compile",
                        str(repo / "tests/fixtures/vit/model.onnx"), "--quant", "int4",
                        "--placement", "all", "--no-accuracy", "-q", "-o",
                        str(Path(tmp) / "m.onnx"), "--qparams", str(table)], check=True)
        b = bytearray(table.read_bytes())
    pairs, index = struct.unpack_from("<QQ", b, 16)
    (raw0,) = struct.unpack_from("<Q", b, index + 32)
    b[pairs:pairs + 2] = struct.pack("<H", 0x7E00)  # the f16 pair's scale
    b[raw0:raw0 + 4] = struct.pack("<f", float("nan"))  # the exact f32 scale
    b[56:64] = bytes(8)
    b[56:64] = struct.pack("<Q", xxhash.xxh3_64_intdigest(bytes(b)))
    (OUT / "nan_scale.qpqr").write_bytes(bytes(b))


if __name__ == "__main__":
    main()
    data_sized()
    unshaped()
    wrong_in_text()
    interpreter_answers()
    archives()
    qparam_tables()
