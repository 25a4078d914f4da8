"""The mmq Python package against the fixtures: loading and inspecting, the reference
interpreter and the compiled models against ONNX Runtime, byte-identical output with the
command line, calibration from an iterator, and errors."""

import logging
import os
import subprocess

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import mmq
from conftest import REPO, fixture


def npz(path):
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def ort_run(model, inputs):
    sess = ort.InferenceSession(
        model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model),
        providers=["CPUExecutionProvider"],
    )
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, inputs)))


def model_outputs(model):
    return [o.name for o in model.graph.output]


def cosine(a, b):
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_load_inspects_as_text_and_json():
    m = mmq.load(fixture("clip") / "model.onnx")
    assert m.inputs == ["input_ids", "attention_mask", "pixel_values"]
    assert "text_embeds" in m.outputs
    text = m.inspect()
    assert "graph @" in text and "MatMul(" in text
    summary = m.inspect("json")
    graph = summary["graphs"][0]
    assert [i["name"] for i in graph["inputs"]] == m.inputs
    assert graph["ops"]["MatMul"] > 0 and graph["nodes"] == sum(graph["ops"].values())
    with pytest.raises(mmq.MmqError, match="unknown format"):
        m.inspect("yaml")


def test_run_matches_the_stored_outputs():
    fx = fixture("vit")
    inputs, expected = npz(fx / "inputs.npz"), npz(fx / "outputs.npz")
    got = mmq.run(fx / "model.onnx", inputs)
    assert set(got) == set(expected)
    for name, want in expected.items():
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-4, err_msg=name)


def test_compiled_model_runs_in_onnx_runtime_with_the_same_outputs():
    fx = fixture("vit")
    inputs, expected = npz(fx / "inputs.npz"), npz(fx / "outputs.npz")
    compiled = mmq.compile(fx / "model.onnx")
    assert isinstance(compiled, onnx.ModelProto)
    onnx.checker.check_model(compiled)
    ops = {n.op_type for n in compiled.graph.node}
    assert "MultiHeadAttention" in ops or "Attention" in ops, ops
    for name, got in ort_run(compiled, inputs).items():
        np.testing.assert_allclose(got, expected[name], rtol=1e-4, atol=1e-4, err_msg=name)


def samples(fx, n):
    """`n` samples drawn around the fixture's stored inputs, one at a time."""
    base = npz(fx / "inputs.npz")
    rng = np.random.default_rng(7)
    for _ in range(n):
        yield {
            k: (v + rng.standard_normal(v.shape).astype(v.dtype) * 0.1)
            if v.dtype.kind == "f" else v
            for k, v in base.items()
        }


def test_the_library_writes_the_bytes_the_command_writes(tmp_path, mmq_bin):
    fx = fixture("clip")
    calib = tmp_path / "calib"
    calib.mkdir()
    for i, s in enumerate(samples(fx, 4)):
        np.savez(calib / f"{i:02}.npz", **s)
    subprocess.run(
        [mmq_bin, "compile", fx / "model.onnx", "--target", "ort", "-o", tmp_path / "cli.onnx",
         "--quant", "int8", "--smoothquant", "0.5", "--calib", calib, "--placement", "all",
         "--no-accuracy"],
        check=True, capture_output=True,
    )
    # The same samples from a generator, a directory, and (the model) from memory.
    mmq.compile(fx / "model.onnx", quant="int8", smoothquant=0.5, calibration=samples(fx, 4),
                placement="all", output=tmp_path / "gen.onnx", progress=False)
    mmq.compile(onnx.load(fx / "model.onnx"), quant="int8", smoothquant=0.5,
                calibration=calib, placement="all", output=tmp_path / "dir.onnx", progress=False)
    cli = (tmp_path / "cli.onnx").read_bytes()
    assert (tmp_path / "gen.onnx").read_bytes() == cli
    assert (tmp_path / "dir.onnx").read_bytes() == cli
    ops = {n.op_type for n in onnx.load(tmp_path / "cli.onnx").graph.node}
    assert "QuantizeLinear" in ops or "DynamicQuantizeLinear" in ops, ops


def test_observer_auto_chooses_as_the_command_does(tmp_path, mmq_bin):
    fx = fixture("clip")
    proc = subprocess.run(
        [mmq_bin, "compile", fx / "model.onnx", "-o", tmp_path / "cli.onnx", "--quant", "int8",
         "--observer", "auto", "--calib-random", "12", "--placement", "all"],
        check=True, capture_output=True, text=True,
    )
    assert "observer auto: cosine of 'text_embeds'" in proc.stderr, proc.stderr
    _, report = mmq.compile(fx / "model.onnx", quant="int8", observer="auto", calibration=12,
                            placement="all", output=tmp_path / "py.onnx", report=True,
                            progress=False)
    notes = [n for p in report["passes"] for n in p.get("notes", []) if "observer auto" in n]
    assert len(notes) == 1 and notes[0].endswith("; chose mse"), notes
    assert (tmp_path / "py.onnx").read_bytes() == (tmp_path / "cli.onnx").read_bytes()
    with pytest.raises(mmq.MmqError,
                       match=r'observer="auto" needs quant="int8" or auto, not quant="int4"'):
        mmq.compile(fx / "model.onnx", quant="int4", observer="auto",
                    output=tmp_path / "x.onnx", progress=False)


def test_int4_accuracy_level_is_the_targets_unless_given(tmp_path, mmq_bin):
    fx = fixture("llama_gqa_kv")

    def levels(model):
        return {
            next((onnx.helper.get_attribute_value(a) for a in n.attribute
                  if a.name == "accuracy_level"), None)
            for n in model.graph.node if n.op_type == "MatMulNBits"
        }

    assert levels(mmq.compile(fx / "model.onnx", quant="int4", progress=False)) == {4}
    assert levels(mmq.compile(fx / "model.onnx", quant="int4", int4_accuracy_level=0,
                              progress=False)) == {None}
    subprocess.run(
        [mmq_bin, "compile", fx / "model.onnx", "--target", "ort", "--quant", "int4",
         "--int4-accuracy-level", "1",
         "--no-accuracy", "-o", tmp_path / "cli.onnx"],
        check=True, capture_output=True,
    )
    mmq.compile(fx / "model.onnx", quant="int4", int4_accuracy_level=1,
                output=tmp_path / "lib.onnx", progress=False)
    assert levels(onnx.load(tmp_path / "cli.onnx")) == {1}
    assert (tmp_path / "lib.onnx").read_bytes() == (tmp_path / "cli.onnx").read_bytes()


def test_trt_writes_the_package_the_command_writes(tmp_path, mmq_bin):
    fx = fixture("vit_dynamic")
    subprocess.run(
        [mmq_bin, "compile", fx / "model.onnx", "--target", "trt", "--quant", "int8",
         "--calib-random", "4", "--symbol", "batch=1:2:8", "-o", tmp_path / "cli",
         "--no-accuracy"],
        check=True, capture_output=True,
    )
    manifest = mmq.compile(fx / "model.onnx", target="trt", quant="int8", calibration=4,
                           symbols={"batch": (1, 2, 8)}, output=tmp_path / "lib",
                           progress=False)
    assert manifest["findings"] == []
    assert manifest["profiles"]["batch"] == {"min": 1, "opt": 2, "max": 8}
    assert manifest["models"][0]["file"] == "model.onnx"
    for name in ["model.onnx", "build_engine.sh", "manifest.json"]:
        assert (tmp_path / "lib" / name).read_bytes() == (tmp_path / "cli" / name).read_bytes()
    qdq = {n.op_type for n in onnx.load(tmp_path / "lib" / "model.onnx").graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= qdq, qdq
    with pytest.raises(ValueError, match="output=DIR"):
        mmq.compile(fx / "model.onnx", target="trt")
    with pytest.raises(mmq.MmqError, match="needs target=\"trt\""):
        mmq.compile(fx / "model.onnx", symbols={"batch": "1:1:1"})
    with pytest.raises(mmq.MmqError, match="MIN <= OPT <= MAX"):
        mmq.compile(fx / "model.onnx", target="trt", symbols={"batch": (4, 2, 1)},
                    output=tmp_path / "bad")


def test_trt_packages_with_plugins_match_the_command(tmp_path, mmq_bin):
    """Asymmetric INT4 for TensorRT: the MatMulNBits plugin, its sources in plugins/, the same
    bytes as the command writes."""
    fx = fixture("llama_gqa_kv")
    subprocess.run(
        [mmq_bin, "compile", fx / "model.onnx", "--target", "trt", "--quant", "int4", "--asym",
         "-o", tmp_path / "cli", "--no-accuracy"],
        check=True, capture_output=True,
    )
    manifest = mmq.compile(fx / "model.onnx", target="trt", quant="int4", asym=True,
                           output=tmp_path / "lib", progress=False)
    assert manifest["findings"] == []
    assert [p["name"] for p in manifest["plugins"]] == ["MmqMatMulNBits"]
    assert manifest["plugins"][0]["namespace"] == "mmq"
    assert manifest["plugin_library"]["library"] == "plugins/libmmq_plugins.so"
    for name in ["model.onnx", "manifest.json", "plugins/mmq_plugins.cpp", "plugins/build.sh"]:
        assert (tmp_path / "lib" / name).read_bytes() == (tmp_path / "cli" / name).read_bytes()
    nodes = onnx.load(tmp_path / "lib" / "model.onnx").graph.node
    plugins = [n for n in nodes if n.domain == "mmq.trt"]
    assert plugins and all(n.op_type == "MmqMatMulNBits" for n in plugins)


def test_report_lists_the_quantization_passes_and_the_accuracy(capfd):
    fx = fixture("clip")
    # f32 compute (accuracy level 0): the interpreter and ONNX Runtime agree to rounding. With
    # ONNX Runtime's int8 compute (the default) both round the activations to int8, and an
    # upstream difference in the last bit (ONNX Runtime's own fusions) can flip a code.
    model, report = mmq.compile(fx / "model.onnx", quant="int4", calibration=samples(fx, 4),
                                report=True, int4_accuracy_level=0)
    names = [p["name"] for p in report["passes"]]
    assert names.index("quant-int4") > names.index("rewrite(simplify)")
    q = next(p for p in report["passes"] if p["name"] == "quant-int4")
    assert q["stage"] == "quantize" and q["counters"]
    assert any(n.op_type == "MatMulNBits" for n in model.graph.node)
    e2e = report["accuracy"]["end_to_end"]
    out = e2e["output"]
    assert out in model_outputs(model) and e2e["samples"] == 1
    # The cosine the report states is the one ONNX Runtime gives on that held-back sample.
    held = list(samples(fx, 4))[-1]
    want = ort_run(onnx.load(fx / "model.onnx"), held)[out]
    got = ort_run(model, held)[out]
    assert abs(cosine(got, want) - e2e["cosine_mean"]) < 1e-3
    assert "calibrating 4" not in capfd.readouterr().err  # INT4 needs no calibration


def test_calibration_progress_only_on_a_terminal_unless_asked(capfd):
    fx = fixture("clip")
    # stderr is captured here, not a terminal: no progress by default.
    mmq.compile(fx / "model.onnx", quant="int8", calibration=samples(fx, 3))
    assert "calibrating" not in capfd.readouterr().err
    mmq.compile(fx / "model.onnx", quant="int8", calibration=samples(fx, 3), progress=True)
    assert "calibrating" in capfd.readouterr().err
    mmq.compile(fx / "model.onnx", quant="int8", calibration=samples(fx, 3), progress=False)
    assert "calibrating" not in capfd.readouterr().err


def test_notes_and_warnings_go_to_the_mmq_logger(caplog):
    fx = fixture("clip")
    clip_map = REPO / "tests" / "fixtures" / "precision_maps" / "clip.toml"
    with caplog.at_level(logging.INFO, logger="mmq"):
        mmq.compile(fx / "model.onnx", quant="mixed", precision_map=clip_map, progress=False)
    records = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "mmq"]
    assert any(lvl == logging.WARNING and "rule 'patch embedding' (line 9): fp8 left 1" in msg
               for lvl, msg in records), records
    assert any(lvl == logging.INFO and "precision map on graph" in msg for lvl, msg in records)


def test_auto_returns_the_chosen_map():
    fx = fixture("clip")
    _, report = mmq.compile(fx / "model.onnx", auto=0.98, calibration=3, report=True)
    auto = report["auto"]
    assert auto["target"] == 0.98 and auto["compiled_cosine"] >= 0.98
    assert "[[rule]]" in auto["map"] or "[default]" in auto["map"]


def test_errors_are_mmq_errors_with_the_diagnostic(tmp_path):
    fx = fixture("vit") / "model.onnx"
    with pytest.raises(mmq.MmqError, match="unknown scheme 'int5'"):
        mmq.compile(fx, quant="int5")
    # Option errors name the keywords, as the command's name its flags.
    with pytest.raises(mmq.MmqError, match='^awq needs quant="int4", not quant="int8"$'):
        mmq.compile(fx, quant="int8", awq=True)
    with pytest.raises(mmq.MmqError, match=r'^block=64 needs quant="int4", "mixed" or auto'):
        mmq.compile(fx, quant="int8", block=64)
    with pytest.raises(mmq.MmqError, match=r"^smoothquant=1\.5: alpha must be in \[0, 1\]"):
        mmq.compile(fx, quant="int8", smoothquant=1.5)
    with pytest.raises(mmq.MmqError, match="cannot open"):
        mmq.load(tmp_path / "missing.onnx")
    (tmp_path / "bad.onnx").write_bytes(b"\x08\x07garbage")
    with pytest.raises(mmq.MmqError):
        mmq.compile(tmp_path / "bad.onnx")
    with pytest.raises(mmq.MmqError, match="precision_map:2:10"):
        mmq.compile(fx, precision_map="[default]\nscheme = \"int9\"\n")
    with pytest.raises(mmq.MmqError, match="modality of input 'pixel_values': unknown modality"):
        mmq.compile(fx, modality={"pixel_values": "smell"})
    with pytest.raises(TypeError, match="calibration sample 0"):
        mmq.compile(fx, quant="int8", calibration=[[1, 2]])
    with pytest.raises(mmq.MmqError, match="sample 0"):
        mmq.compile(fx, quant="int8", calibration=[{"nope": np.zeros(3, np.float32)}])
    assert not list(tmp_path.glob("*.tmp*"))


def test_the_example_of_docs_python_md_runs(monkeypatch, capsys):
    from conftest import REPO

    doc = (REPO / "docs" / "python.md").read_text()
    code = doc.split("## A complete example", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(REPO)
    exec(compile(code, "docs/python.md", "exec"), {"__name__": "docs_example"})
    out = capsys.readouterr().out
    assert "['input_ids', 'attention_mask', 'pixel_values']" in out
    assert "int8" in out and "cosine_mean" in out


def test_a_scalar_input_stays_a_scalar():
    """A 0-d array feeds a scalar input (it became shape [1]); ONNX Runtime agrees."""
    from onnx import TensorProto as T
    from onnx import helper as h

    g = h.make_graph(
        [h.make_node("Mul", ["s", "v"], ["y"]), h.make_node("Shape", ["s"], ["rank_of_s"])],
        "scalar",
        [h.make_tensor_value_info("s", T.FLOAT, []), h.make_tensor_value_info("v", T.FLOAT, [3])],
        [h.make_tensor_value_info("y", T.FLOAT, [3]),
         h.make_tensor_value_info("rank_of_s", T.INT64, [0])],
    )
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    feeds = {"s": np.float32(2.0), "v": np.arange(3, dtype=np.float32)}
    got = mmq.run(model, feeds)
    assert got["rank_of_s"].shape == (0,)
    np.testing.assert_array_equal(got["y"], [0.0, 2.0, 4.0])
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"s": np.array(2.0, np.float32), "v": feeds["v"]})
    np.testing.assert_array_equal(got["rank_of_s"], want[1])


def _endless(make):
    i = 0
    while True:
        yield make(i)
        i += 1


def test_ctrl_c_during_compile_raises_and_writes_nothing(tmp_path, monkeypatch):
    """Ctrl-C while compiling (sent here by the progress display, called from the native code
    at the third calibration sample, where a KeyboardInterrupt used to be swallowed) raises
    KeyboardInterrupt at once; the output is not written. The samples' iterator is endless: it
    is read only as far as calibration goes."""
    import signal

    class Interrupting:
        advances = 0

        def __call__(self, event, total):
            if event == "advance":
                Interrupting.advances += 1
                if Interrupting.advances == 3:
                    os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(mmq, "_Progress", Interrupting)
    pulled = []

    def sample(i):
        pulled.append(i)
        return {"pixel_values": np.random.default_rng(i).standard_normal((2, 3, 32, 32), np.float32)}

    fx = fixture("vit") / "model.onnx"
    out = tmp_path / "out.onnx"
    with pytest.raises(KeyboardInterrupt):
        mmq.compile(fx, quant="int8", calibration=_endless(sample), output=out, progress=True)
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []
    assert 3 <= len(pulled) < 50, len(pulled)


def test_an_endless_iterator_of_wrong_samples_stops_at_the_first():
    fx = fixture("vit") / "model.onnx"
    pulled = []

    def sample(i):
        pulled.append(i)
        return {"pixel_values": np.zeros((2, 3, 32, 32), np.float64)}

    with pytest.raises(mmq.MmqError, match=r"sample 0: .*dtype f64 instead of f32"):
        mmq.compile(fx, quant="int8", calibration=_endless(sample))
    assert pulled == [0]


def test_wrong_python_types_raise_type_error(tmp_path):
    fx = fixture("vit") / "model.onnx"
    for kwargs, match in [
        ({"level": "2"}, r"level: expected int, got str '2'"),
        ({"block": 3.5}, "block: expected int"),
        ({"awq": 1}, "awq: expected bool"),
        ({"smoothquant": "strong"}, "smoothquant: expected int or float or None"),
        ({"modality": {"pixel_values": 3}}, r"modality\['pixel_values'\]: expected str"),
        ({"quant": 8}, "quant: expected str or None"),
        ({"calibration": object()}, "calibration: expected samples"),
        ({"quant": "int8", "calibration": [{"pixel_values": {"a": 1}}]},
         "calibration sample 0: input 'pixel_values': expected an array of numbers"),
        ({"quant": "int8", "calibration": [{"pixel_values": [[1.0, 2.0], [3.0]]}]},
         "calibration sample 0: input 'pixel_values': expected an array, got list"),
        ({"quant": "int8", "calibration": [{0: np.zeros(3)}]}, "input names are strings"),
    ]:
        with pytest.raises(TypeError, match=match):
            mmq.compile(fx, output=tmp_path / "o.onnx", **kwargs)
    with pytest.raises(TypeError, match="inputs: input 'pixel_values': expected an array of numbers"):
        mmq.run(fx, {"pixel_values": object()})
    assert list(tmp_path.iterdir()) == []


def test_the_main_output_agrees_with_the_command_line(tmp_path):
    """The accuracy figures score the pooled output by default, and ``main_output=`` picks
    another, as ``--main-output`` does."""
    import json

    fx = fixture("vit") / "model.onnx"
    for name, extra in [("pooler_output", []), ("last_hidden_state", ["--main-output", "last_hidden_state"])]:
        kwargs = {"main_output": extra[1]} if extra else {}
        _, report = mmq.compile(fx, quant="int8", report=True, **kwargs)
        assert report["accuracy"]["end_to_end"]["output"] == name
        out = tmp_path / "r.json"
        subprocess.run([os.environ["MMQ_BIN"], "compile", str(fx), "--quant", "int8", "-o",
                        str(tmp_path / "o.onnx"), "--report", str(out), *extra], check=True,
                       capture_output=True)
        assert json.loads(out.read_text())["accuracy"]["end_to_end"]["output"] == name
    with pytest.raises(mmq.MmqError, match='main_output="logits": the model has no output'):
        mmq.compile(fx, quant="int8", main_output="logits")
