"""Deployment packages (`mmq compile --package`) run three ways: onnxruntime-genai (from the
package's own genai_config.json, no hand edits), mmq.Pipeline (ONNX Runtime with the KV cache in
its pool), `mmq generate` (the reference interpreter) - against a plain ONNX Runtime greedy loop
over the package's model."""

import json
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest

import mmq
from conftest import REPO, fixture
from decode import cosine, greedy

PROMPT = [1, 17, 33, 100, 7, 99]
NEW = 8

# The KV-cache decoders with dynamic dims, and their generation settings (tools/gen_fixtures.py,
# tools/gen_matrix.py: GPT-2 has bos = eos = 0 and a learned position table).
GPT2 = {"bos_token_id": 0, "eos_token_id": 0, "n_positions": 128}
GPT2_MATRIX = {"bos_token_id": 0, "eos_token_id": 0, "n_positions": 32}
LLAMA = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "max_position_embeddings": 256}
DECODERS = {"gpt2_kv": GPT2, "llama_gqa_kv": LLAMA, "mistral_sw_kv": LLAMA}
for family, config in (("gpt2_kv", GPT2_MATRIX), ("llama_gqa_kv", LLAMA), ("qwen2_kv", LLAMA)):
    for form in ("dynamo18_sdpa_dynamic", "dynamo23_sdpa_dynamic", "torchscript17_sdpa_dynamic"):
        DECODERS[f"matrix/{family}_{form}"] = config
# The decoders whose attention becomes GroupQueryAttention with a shared buffer: all of them
# (the TorchScript exports through their opset raised from 17, the one-input Concat of a first
# layer's past key, and the NaN guard of their -inf mask fill).
SHARED = set(DECODERS)
STATIC = ["matrix/llama_gqa_kv_dynamo20_eager_static", "matrix/gpt2_kv_torchscript17_eager_static"]


def package(mmq_bin, tmp_path: Path, name: str, config: dict | None, *extra: str) -> Path:
    out = tmp_path / (name.replace("/", "-") + "-" + "-".join(extra).replace("-", ""))
    args = [fixture(name) / "model.onnx", "--package", "-o", out, "--no-accuracy", *extra]
    if config is not None:
        gen = tmp_path / "generation_config.json"
        gen.write_text(json.dumps(config))
        args += ["--generation-config", gen]
    compile_cmd(mmq_bin, *args)
    return out


def compile_cmd(mmq_bin, *args) -> subprocess.CompletedProcess:
    """`mmq compile ARGS`, which must succeed."""
    run = subprocess.run([mmq_bin, "compile", *args], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return run


def genai_tokens(pkg: Path, prompt: list[int], new: int) -> list[int]:
    import onnxruntime_genai as og

    model = og.Model(str(pkg))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + new, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(prompt)
    out = []
    while not gen.is_done():
        gen.generate_next_token()
        out.append(int(gen.get_next_tokens()[0]))
    return out


def ort_loop(model: Path, prompt: list[int], new: int, eos: set[int]) -> list[int]:
    tokens, _ = greedy(
        str(model), {"input_ids": np.array([prompt], np.int64)}, new,
        lambda t: {"input_ids": t},
    )
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


def mmq_generate(mmq_bin, pkg: Path, prompt: list[int], new: int, *extra: str) -> list[int]:
    run = subprocess.run(
        [mmq_bin, "generate", pkg, "--input-ids", ",".join(map(str, prompt)),
         "--max-new-tokens", str(new), *extra],
        capture_output=True, text=True,
    )
    assert run.returncode == 0, run.stderr
    assert "new tokens" in run.stderr
    return [int(t) for t in run.stdout.split()]


def eos_of(config: dict) -> set[int]:
    e = config.get("eos_token_id")
    return set(e if isinstance(e, list) else [e]) if e is not None else set()


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_decoder_packages_generate_the_same_tokens_everywhere(mmq_bin, tmp_path, name):
    config = DECODERS[name]
    fp32 = package(mmq_bin, tmp_path, name, config, "-O2")
    spec = json.loads((fp32 / "pipeline.json").read_text())
    assert spec["onnxruntime_genai"] == {"config": "genai_config.json", "reason": None}
    assert spec["cache_plan"] is None  # a float cache: no quantized pool to plan
    genai = json.loads((fp32 / "genai_config.json").read_text())
    assert genai["model"]["decoder"]["num_hidden_layers"] == len(spec["kv_cache"]["pairs"]) // 2
    # Where the export has the form, the attention is GroupQueryAttention and the past shares
    # the present's buffer (every token check below runs it that way in onnxruntime-genai).
    nodes = onnx.load(str(fp32 / "model.onnx"), load_external_data=False).graph.node
    ops = {n.op_type for n in nodes}
    shared = name in SHARED
    assert genai["search"]["past_present_share_buffer"] is shared, name
    assert ("GroupQueryAttention" in ops) is shared, (name, sorted(ops))
    # Where the head size is a multiple of 16 (the llama fixture's; the matrix cells have 8),
    # the rotary embedding runs inside GQA on tables of the context's positions, at the
    # export's position_ids; INT4 then gives GQA Q, K and V packed in one projection.
    rotary_inside = name in ("llama_gqa_kv", "mistral_sw_kv")
    for n in nodes:
        if n.op_type == "GroupQueryAttention":
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            # Mistral's sliding window (4 keys), read from the export's mask.
            assert attrs.get("local_window_size") == (4 if name == "mistral_sw_kv" else None), \
                (name, attrs)
            assert (attrs.get("do_rotary") == 1) is rotary_inside, (name, attrs)
            assert (list(n.input[7:]) == ["rotary_const_1", "rotary_const_2", "position_ids"]) \
                is rotary_inside, (name, list(n.input))
    gpt2 = "gpt2" in name  # no rotary embedding; Q, K and V split from one projection
    if shared and not gpt2:
        assert ("RotaryEmbedding" in ops) is not rotary_inside, (name, sorted(ops))
    want = ort_loop(fp32 / "model.onnx", PROMPT, NEW, eos_of(config))
    assert genai_tokens(fp32, PROMPT, NEW) == want
    assert mmq.Pipeline(fp32).generate(PROMPT, max_new_tokens=NEW) == want
    assert mmq_generate(mmq_bin, fp32, PROMPT, NEW) == want

    int4 = package(mmq_bin, tmp_path, name, config, "--quant", "int4")
    assert (int4 / "genai_config.json").is_file()
    model = onnx.load(str(int4 / "model.onnx"), load_external_data=False)
    assert any(n.op_type == "MatMulNBits" for n in model.graph.node), name
    packed = [list(n.input[1:3]) == ["", ""] for n in model.graph.node
              if n.op_type == "GroupQueryAttention"]
    assert packed == [rotary_inside or gpt2] * len(packed) and bool(packed) is shared, \
        (name, packed)
    want4 = ort_loop(int4 / "model.onnx", PROMPT, NEW, eos_of(config))
    assert genai_tokens(int4, PROMPT, NEW) == want4
    assert mmq.Pipeline(int4).generate(PROMPT, max_new_tokens=NEW) == want4


def with_qkv_bias(model: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """`model` with a random bias added after every attention block's Q, K and V projections
    (the three `MatMul`s of a constant weight that read one activation), as Qwen2 has."""
    rng = np.random.default_rng(seed)
    inits = {t.name: t for t in model.graph.initializer}
    by_input: dict[str, list] = {}
    for n in model.graph.node:
        if n.op_type == "MatMul" and n.input[1] in inits:
            by_input.setdefault(n.input[0], []).append(n)
    biased = {id(n) for group in by_input.values() if len(group) == 3 for n in group}
    nodes = []
    for n in model.graph.node:
        nodes.append(n)
        if id(n) in biased:
            out = n.output[0]
            width = inits[n.input[1]].dims[1]
            model.graph.initializer.append(onnx.numpy_helper.from_array(
                (rng.standard_normal(width) * 0.5).astype(np.float32), out + "_bias"))
            n.output[0] = out + "_unbiased"
            nodes.append(onnx.helper.make_node("Add", [out + "_unbiased", out + "_bias"], [out]))
    assert len(biased) == 6, len(biased)  # the fixture's two layers
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


@pytest.mark.parametrize("quant", ["fp32", "int4"])
def test_group_query_attention_form_computes_what_the_export_computes(mmq_bin, tmp_path, quant):
    """The package's GroupQueryAttention form, with the rotary embedding inside it (tables of the
    context's positions) and Q, K and V biased (Qwen2-style; with INT4 packed in one projection,
    the biases concatenated), against the same compilation written as a plain model (the
    export's attention): ONNX Runtime's logits agree at every step of a greedy decode."""
    src = tmp_path / "biased.onnx"
    onnx.save(with_qkv_bias(onnx.load(fixture("llama_gqa_kv") / "model.onnx"), 3), src)
    gen = tmp_path / "gen.json"
    gen.write_text(json.dumps(LLAMA))
    extra = ["--quant", "int4"] if quant == "int4" else []
    compile_cmd(mmq_bin, src, "-O2", "--no-accuracy", "-o", tmp_path / "plain.onnx", *extra)
    pkg = tmp_path / "pkg"
    compile_cmd(mmq_bin, src, "--package", "--no-accuracy", "--generation-config", gen,
                "-o", pkg, *extra)
    model = pkg / json.loads((pkg / "pipeline.json").read_text())["stages"][0]["file"]
    nodes = onnx.load(str(model), load_external_data=False).graph.node
    gqa = [n for n in nodes if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == 2 and all(n.input[9] == "position_ids" for n in gqa)
    assert all((list(n.input[1:3]) == ["", ""]) is (quant == "int4") for n in gqa)
    assert not any(n.op_type in ("Split", "RotaryEmbedding") for n in nodes
                   if quant == "int4" and n.output[0] in {g.input[0] for g in gqa})

    same_logits(tmp_path / "plain.onnx", model)


def with_fused_qkv(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with each attention block's Q, K and V projections (the three `MatMul`s of a
    constant weight that read one activation) as one `MatMul` of the concatenated weights and
    three `Slice`s of its last axis, as Phi-3's fused `qkv_proj` exports."""
    inits = {t.name: t for t in model.graph.initializer}
    by_input: dict[str, list] = {}
    for n in model.graph.node:
        if n.op_type == "MatMul" and n.input[1] in inits:
            by_input.setdefault(n.input[0], []).append(n)
    groups = {id(g[0]): g for g in by_input.values() if len(g) == 3}
    dropped = {id(n) for g in groups.values() for n in g[1:]}
    nodes = []
    for n in model.graph.node:
        if id(n) in dropped:
            continue
        group = groups.get(id(n))
        if group is None:
            nodes.append(n)
            continue
        weights = [onnx.numpy_helper.to_array(inits[g.input[1]]) for g in group]
        fused = group[0].output[0] + "_qkv"
        model.graph.initializer.append(
            onnx.numpy_helper.from_array(np.concatenate(weights, axis=1), fused + "_w"))
        nodes.append(onnx.helper.make_node("MatMul", [group[0].input[0], fused + "_w"], [fused]))
        start = 0
        for g, w in zip(group, weights):
            bounds = [fused + f"_{start}", fused + f"_{start + w.shape[1]}", fused + "_axis"]
            for name, value in zip(bounds, ([start], [start + w.shape[1]], [-1])):
                if name not in {t.name for t in model.graph.initializer}:
                    model.graph.initializer.append(
                        onnx.numpy_helper.from_array(np.array(value, np.int64), name))
            nodes.append(onnx.helper.make_node("Slice", [fused, *bounds], [g.output[0]]))
            start += w.shape[1]
    assert len(groups) == 2, len(groups)  # the fixture's two layers
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def test_group_query_attention_takes_q_k_and_v_sliced_from_one_projection(mmq_bin, tmp_path):
    """Q, K and V sliced from one projection (Phi-3's fused qkv_proj) reach GroupQueryAttention
    packed, without the Slices, and the package computes what the same model compiled as a plain
    model computes."""
    src = tmp_path / "fused.onnx"
    onnx.save(with_fused_qkv(onnx.load(fixture("llama_gqa_kv") / "model.onnx")), src)
    gen = tmp_path / "gen.json"
    gen.write_text(json.dumps(LLAMA))
    compile_cmd(mmq_bin, src, "-O2", "--no-accuracy", "-o", tmp_path / "plain.onnx")
    pkg = tmp_path / "pkg"
    compile_cmd(mmq_bin, src, "--package", "--no-accuracy", "--generation-config", gen, "-o", pkg)
    model = pkg / json.loads((pkg / "pipeline.json").read_text())["stages"][0]["file"]
    nodes = onnx.load(str(model), load_external_data=False).graph.node
    gqa = [n for n in nodes if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == 2 and all(list(n.input[1:3]) == ["", ""] for n in gqa)
    assert not any(n.op_type == "Slice" for n in nodes)
    same_logits(tmp_path / "plain.onnx", model)


def same_logits(plain: Path, package_model: Path) -> None:
    """ONNX Runtime's logits of `package_model` at every step of `plain`'s greedy decode (teacher
    forced on its tokens) equal `plain`'s within 1e-4 of their largest."""
    prefill = {"input_ids": np.array([PROMPT], np.int64)}
    tokens, want = greedy(str(plain), prefill, NEW, lambda t: {"input_ids": t})
    _, got = greedy(str(package_model), prefill, NEW, lambda t: {"input_ids": t}, forced=tokens)
    for step, (a, b) in enumerate(zip(want, got)):
        assert np.abs(a - b).max() <= 1e-4 * np.abs(a).max(), (step, np.abs(a - b).max())


@pytest.mark.parametrize("name", sorted(SHARED))
def test_every_group_query_attention_package_computes_what_its_export_computes(
        mmq_bin, tmp_path, name):
    """Each decoder's GroupQueryAttention package (FP32) against the same model compiled at -O2
    as a plain model: the same logits at every step of a greedy decode. GPT-2's positions come
    from its past's length, which the package reads from the mask instead."""
    src = fixture(name) / "model.onnx"
    compile_cmd(mmq_bin, src, "-O2", "--no-accuracy", "-o", tmp_path / "plain.onnx")
    pkg = package(mmq_bin, tmp_path, name, DECODERS[name])
    same_logits(tmp_path / "plain.onnx", pkg / "model.onnx")


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_decoders_at_o2_read_their_residual_norms_fused_and_compute_what_the_export_computes(
        mmq_bin, tmp_path, name):
    """A decoder reading a KV cache runs a token a step: at -O2 for ONNX Runtime its residual
    Add + SimplifiedLayerNormalization (or RMSNormalization) pairs are one
    SkipSimplifiedLayerNormalization each (the decode forms), every norm but the first; GPT-2's LayerNormalization is left alone. The
    compiled decoder's logits equal the export's at every step of a greedy decode."""
    src = fixture(name) / "model.onnx"
    out = tmp_path / "o2.onnx"
    compile_cmd(mmq_bin, src, "-O2", "--no-accuracy", "-o", out)
    ops = [n.op_type for n in onnx.load(str(out), load_external_data=False).graph.node]
    layers = sum(i.name.startswith("past_key_values.") for i in onnx.load(
        str(src), load_external_data=False).graph.input) // 2
    if "gpt2" in name:
        assert "SkipSimplifiedLayerNormalization" not in ops, name
    else:
        assert ops.count("SkipSimplifiedLayerNormalization") == 2 * layers, (name, ops)
        # The first norm reads the embedding alone (opset 23 writes RMSNormalization).
        assert ops.count("SimplifiedLayerNormalization") + ops.count("RMSNormalization") == 1, \
            (name, ops)
    same_logits(src, out)


def test_python_writes_the_package_the_command_writes(mmq_bin, tmp_path):
    """`mmq.compile(..., package=True)` goes through the same build as `mmq compile --package`:
    the same files, byte for byte, and a package both runners generate from."""
    config = LLAMA
    gen = tmp_path / "generation_config.json"
    gen.write_text(json.dumps(config))
    src = fixture("llama_gqa_kv") / "model.onnx"
    cli = tmp_path / "cli"
    compile_cmd(mmq_bin, src, "--package", "--quant", "int4", "--no-accuracy",
                "--generation-config", gen, "-o", cli)
    py = tmp_path / "py"
    spec = mmq.compile(src, quant="int4", package=True, generation_config=gen, output=py,
                       progress=False)
    assert spec == json.loads((py / "pipeline.json").read_text())
    files = sorted(p.relative_to(cli) for p in cli.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(py) for p in py.rglob("*") if p.is_file())
    assert "genai_config.json" in {str(f) for f in files}
    for f in files:
        assert (cli / f).read_bytes() == (py / f).read_bytes(), f
    want = ort_loop(py / "model.onnx", PROMPT, NEW, eos_of(config))
    assert genai_tokens(py, PROMPT, NEW) == want
    assert mmq.Pipeline(py).generate(PROMPT, max_new_tokens=NEW) == want
    # The package's own settings need a package, in the keywords' words.
    with pytest.raises(mmq.MmqError, match="^generation_config goes into a deployment package; "
                                           "it needs package$"):
        mmq.compile(src, generation_config=gen, output=tmp_path / "x.onnx", progress=False)
    with pytest.raises(ValueError, match="package=True writes a package directory"):
        mmq.compile(src, package=True)


@pytest.mark.parametrize("name", STATIC)
def test_packages_outside_the_genai_contract_say_why(mmq_bin, tmp_path, name):
    pkg = tmp_path / "static"
    run = compile_cmd(mmq_bin, fixture(name) / "model.onnx", "--package", "-o", pkg,
                      "--no-accuracy")
    spec = json.loads((pkg / "pipeline.json").read_text())
    assert not (pkg / "genai_config.json").exists()
    assert "static dims" in spec["onnxruntime_genai"]["reason"]
    # A past of static length is outside the GroupQueryAttention form too, and the compile says
    # which layers kept their attention.
    assert ("package: GroupQueryAttention: not applied: 2 attention layer(s) lack the form"
            in run.stderr), run.stderr
    # A quantized KV cache with scale tensors at the interface (the blocks of a decoder without
    # the GroupQueryAttention form: -O1 fuses no attention) is outside it too, and the compile
    # says so.
    out = tmp_path / "kv"
    src = fixture("matrix/gpt2_kv_torchscript17_sdpa_dynamic") / "model.onnx"
    run = compile_cmd(mmq_bin, src, "--package", "-O1", "-o", out, "--kv-cache", "int8")
    assert "onnxruntime-genai: no config: its KV cache is quantized (int8" in run.stderr
    assert not (out / "genai_config.json").exists()
    ops = {n.op_type for n in onnx.load(str(out / "model.onnx"), load_external_data=False).graph.node}
    assert "GroupQueryAttention" not in ops
    # Its plan lays out the blocks: 512-byte code blocks and an f32 scale per block.
    page = json.loads((out / "pipeline.json").read_text())["cache_plan"]["kv_page"]
    assert (page["code_stride"], page["scale_dtype"]) == (512, "f32")


@pytest.mark.parametrize("name", sorted(SHARED))
def test_int8_kv_cache_in_group_query_attention(mmq_bin, tmp_path, name):
    """`--kv-cache int8` on a decoder that takes the GroupQueryAttention form: the op's own INT8
    cache (int8 codes, static per-channel scales calibrated at compile time). onnxruntime-genai,
    mmq.Pipeline (one buffer per cache, bound once) and `mmq generate` (the interpreter) run it
    token for token as a plain ONNX Runtime loop does, with the FP32 package's first token, a
    step-1 logits cosine >= 0.99 against it and a quarter of its KV memory."""
    config = DECODERS[name]
    fp32 = package(mmq_bin, tmp_path, name, config)
    out = tmp_path / "kv8"
    gen = tmp_path / "gen.json"
    gen.write_text(json.dumps(config))
    run = compile_cmd(mmq_bin, fixture(name) / "model.onnx", "--package", "-o", out,
                      "--no-accuracy", "--generation-config", gen, "--kv-cache", "int8")
    assert "static per-channel scales calibrated on 16 sample(s)" in run.stderr
    spec = json.loads((out / "pipeline.json").read_text())
    kv = spec["kv_cache"]
    # The package's plan lays out the same cache: pages of codes, scales in the model, room for
    # the context (one sequence).
    plan = spec["cache_plan"]
    assert plan["kv_page"]["scale_dtype"] == "static" and plan["kv_page"]["scales"]["bytes"] == 0
    context = json.loads((out / "genai_config.json").read_text())["model"]["context_length"]
    assert plan["token_capacity"] >= context > plan["token_capacity"] - plan["kv_page"]["tokens"]
    assert (kv["format"], kv["code_dtype"], kv["scales"], kv["shared_buffer"]) == (
        "int8", "i8", {"kind": "channels"}, True)
    assert all(p["past_scale"] is None and p["present_scale"] is None for p in kv["pairs"])
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    gqa = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == len(kv["pairs"]) // 2
    for n in gqa:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        assert (attrs["k_quant_type"], attrs["v_quant_type"], attrs["kv_cache_bit_width"]) == (
            b"PER_CHANNEL", b"PER_CHANNEL", 8)
    for v in [*model.graph.input, *model.graph.output]:
        if "past" in v.name or "present" in v.name:
            assert v.type.tensor_type.elem_type == onnx.TensorProto.INT8, v.name
    genai = json.loads((out / "genai_config.json").read_text())
    assert genai["search"]["past_present_share_buffer"] is True

    want = ort_loop(out / "model.onnx", PROMPT, NEW, eos_of(config))
    assert genai_tokens(out, PROMPT, NEW) == want
    p8 = mmq.Pipeline(out)
    assert p8.generate(PROMPT, max_new_tokens=NEW) == want
    assert mmq_generate(mmq_bin, out, PROMPT, NEW) == want

    p32 = mmq.Pipeline(fp32)
    assert p32.generate(PROMPT, max_new_tokens=NEW)[0] == want[0]
    step1 = [
        greedy(str(pkg / "model.onnx"), {"input_ids": np.array([PROMPT], np.int64)}, 1,
               lambda t: {"input_ids": t})[1][0]
        for pkg in (fp32, out)
    ]
    assert cosine(*step1) >= 0.99
    assert p8.kv_bytes * 4 == p32.kv_bytes > 0


def test_int8_kv_and_int4_image_features_against_fp32(mmq_bin, tmp_path):
    """A vision encoder and a LLaVA-style decoder with a KV cache, packaged in FP32 and with an
    INT8 KV cache and INT4 image features: the same first token, step-1 logits cosine >= 0.99,
    the second request with the same image identical and faster (the encoder does not run)."""
    from decode import with_image_input

    src = tmp_path / "src"
    src.mkdir()
    enc = src / "vision_encoder.onnx"
    enc.write_bytes((fixture("pipeline") / "vision_encoder.onnx").read_bytes())
    dec = src / "decoder.onnx"
    onnx.save(with_image_input(onnx.load(fixture("llama_gqa_kv") / "model.onnx"), 64), dec)
    gen = tmp_path / "gen.json"
    gen.write_text(json.dumps(LLAMA))

    def build(out: Path, *extra: str) -> Path:
        compile_cmd(mmq_bin, enc, dec, "--package", "-o", out, "--generation-config", gen, *extra)
        return out

    fp32 = build(tmp_path / "fp32")
    quant = build(tmp_path / "quant", "--kv-cache", "int8", "--image-cache", "int4")
    spec = json.loads((quant / "pipeline.json").read_text())
    assert [s["role"] for s in spec["stages"]] == ["vision_encoder", "decoder"]
    # The decoder takes the GroupQueryAttention form: its own INT8 cache, one shared buffer.
    assert spec["kv_cache"]["format"] == "int8"
    assert spec["kv_cache"]["scales"] == {"kind": "channels"} and spec["kv_cache"]["shared_buffer"]
    assert spec["image_cache"]["outputs"] == [
        {"name": "image_embeds", "scale": "image_embeds_scale", "group": 64}
    ]
    assert {(b["from"]["port"], b["to"]["port"]) for b in spec["bindings"]} == {
        ("image_embeds", "image_embeds"), ("image_embeds_scale", "image_embeds_scale")
    }
    pixels = np.load(fixture("pipeline") / "inputs.npz")["pixel_values"][:1]
    prompt = [0] * 16 + [5, 17, 42, 99, 3]

    p32, pq = mmq.Pipeline(fp32), mmq.Pipeline(quant)
    want = p32.generate(prompt, pixels, max_new_tokens=NEW)
    # Which stages run, counted: the second request with the same image must not run the
    # vision encoder (not timed: the fixture's encoder takes well under a millisecond).
    ran = []
    run_stage = pq._run_stage
    pq._run_stage = lambda stage, feeds: (ran.append(stage["role"]), run_stage(stage, feeds))[1]
    got = pq.generate(prompt, pixels, max_new_tokens=NEW)
    first = pq.last_stats
    assert "vision_encoder" in ran, ran
    ran.clear()
    assert first["image_cache_hit"] is False
    assert got[0] == want[0], (got, want)
    again = pq.generate(prompt, pixels, max_new_tokens=NEW)
    second = pq.last_stats
    assert again == got and second["image_cache_hit"] is True
    assert "vision_encoder" not in ran, ran
    # The KV cache in the pool: INT8 codes take a quarter of FP32's bytes.
    assert 0 < pq.kv_bytes * 4 == p32.kv_bytes

    # Step-1 logits: the package's models on the same prompt and image.
    np.savez(tmp_path / "image.npz", pixel_values=pixels)
    def step1(p):
        feeds = {"pixel_values": pixels, "input_ids": np.array([prompt], np.int64)}
        feeds["attention_mask"] = np.ones((1, len(prompt)), np.int64)
        feeds["position_ids"] = np.arange(len(prompt), dtype=np.int64)[None]
        for past in p.sessions["decoder"].get_inputs():
            if "past" in past.name:
                shape = [1 if i == 0 else (d if isinstance(d, int) else 0)
                         for i, d in enumerate(past.shape)]
                dtype = {"tensor(int8)": np.int8}.get(past.type, np.float32)
                feeds[past.name] = np.zeros(shape, dtype)
        return p.run(feeds)["logits"][0, -1]

    assert cosine(step1(p32), step1(pq)) >= 0.99

    # The reference interpreter agrees with ONNX Runtime on the FP32 package.
    assert mmq_generate(mmq_bin, fp32, prompt, NEW, "--inputs", str(tmp_path / "image.npz")) \
        == want


def test_a_merged_export_splits_into_a_runnable_package(mmq_bin, tmp_path):
    """The LLaVA fixture (one graph from pixel_values and input_ids to logits) with
    --image-cache int4: split, packaged, and run by mmq.Pipeline and `mmq run DIR`."""
    out = tmp_path / "llava"
    run = compile_cmd(mmq_bin, fixture("llava") / "model.onnx", "--package", "-o", out,
                      "--image-cache", "int4")
    assert "modality-split: graph 'main_graph' split" in run.stderr
    plan = json.loads((out / "pipeline.json").read_text())["cache_plan"]
    assert (plan["image_slots"], plan["image_slot"]["bytes"], plan["kv_page"]) == (1, 640, None)
    inputs = dict(np.load(fixture("llava") / "inputs.npz"))
    ref = np.load(fixture("llava") / "outputs.npz")["logits"]
    got = mmq.Pipeline(out).run(inputs)
    assert got["logits"].shape == ref.shape
    assert cosine(got["logits"], ref) >= 0.99  # INT4 image features
    npz = tmp_path / "out.npz"
    run = subprocess.run(
        [mmq_bin, "run", out, "--inputs", fixture("llava") / "inputs.npz", "-o", npz],
        capture_output=True, text=True,
    )
    assert run.returncode == 0, run.stderr
    interp = np.load(npz)["logits"]
    np.testing.assert_allclose(interp, got["logits"], rtol=1e-4, atol=1e-4)


def test_packages_refuse_changed_files(tmp_path, mmq_bin):
    pkg = package(mmq_bin, tmp_path, "gpt2_kv", GPT2)
    data = bytearray((pkg / "model.onnx").read_bytes())
    data[-1] ^= 1
    (pkg / "model.onnx").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="changed after the package was written"):
        mmq.Pipeline(pkg)
    run = subprocess.run(
        [mmq_bin, "generate", pkg, "--input-ids", "1,2"], capture_output=True, text=True
    )
    assert run.returncode == 1 and "changed after the package was written" in run.stderr
