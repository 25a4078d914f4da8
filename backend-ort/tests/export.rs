//! Module → ONNX export: names, types, attributes, subgraphs, tensors, external data, atomicity.

mod common;

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;
use common::*;
use mmq_backend_ort::proto::tensor_shape_proto::dimension::Value as DimValue;
use mmq_backend_ort::proto::{self, attribute_proto::AttributeType, type_proto};
use mmq_backend_ort::{
    ExportError, ExportOptions, ExternalData, InlineSink, to_model_proto, write_model,
};
use mmq_ir::{
    Attr, ConstData, CustomOp, DType, Dim, DimExpr, ExternalFile, Op, Storage, Type, ValueDef,
};

fn graph(model: &proto::ModelProto) -> &proto::GraphProto {
    model.graph.as_ref().expect("model has a graph")
}

fn dims(vi: &proto::ValueInfoProto) -> Vec<Option<DimValue>> {
    match vi.r#type.as_ref().and_then(|t| t.value.as_ref()) {
        Some(type_proto::Value::TensorType(t)) => t
            .shape
            .as_ref()
            .expect("shape is set")
            .dim
            .iter()
            .map(|d| d.value.clone())
            .collect(),
        other => panic!("not a tensor type: {other:?}"),
    }
}

fn elem_type(vi: &proto::ValueInfoProto) -> (Option<i32>, bool) {
    match vi.r#type.as_ref().and_then(|t| t.value.as_ref()) {
        Some(type_proto::Value::TensorType(t)) => (t.elem_type, t.shape.is_some()),
        other => panic!("not a tensor type: {other:?}"),
    }
}

fn param(s: &str) -> Option<DimValue> {
    Some(DimValue::DimParam(s.to_owned()))
}

fn ext_entry<'a>(t: &'a proto::TensorProto, key: &str) -> &'a str {
    t.external_data
        .iter()
        .find(|e| e.key.as_deref() == Some(key))
        .and_then(|e| e.value.as_deref())
        .unwrap_or_else(|| panic!("tensor {:?} has no external_data `{key}`", t.name))
}

#[test]
fn names_types_and_symbolic_dims() {
    let (mut m, g) = module("main");
    let batch = m.symbol("batch");
    let past = m.symbol("past");
    let seq = m.symbol("seq");
    let total = Dim::Expr(
        DimExpr::sym(past)
            .add(&DimExpr::sym(seq))
            .expect("no overflow"),
    );
    let x = m.add_input(
        g,
        Some("x".into()),
        f32_ty(vec![Dim::sym(batch), total.clone()]),
    );
    // A constant whose source name looks like a generated one: generation must skip it.
    let w = m.add_const(f32_const(Some("mmq_v0"), vec![1], &[2.0]));
    let sum = unary(
        &mut m,
        g,
        Op::Add {},
        vec![x, w],
        None,
        f32_ty(vec![Dim::sym(batch), total]),
    );
    let y = unary(
        &mut m,
        g,
        Op::Relu {},
        vec![sum],
        Some("y"),
        f32_ty(vec![Dim::sym(batch), Dim::Unknown]),
    );
    let unknown = unary(&mut m, g, Op::Identity {}, vec![sum], None, Type::Unknown);
    // Two values with the same source name: the first keeps it.
    let d1 = unary(&mut m, g, Op::Neg {}, vec![x], Some("dup"), f32_ty(vec![]));
    let d2 = unary(&mut m, g, Op::Neg {}, vec![d1], Some("dup"), f32_ty(vec![]));
    let n = m.add_node(
        g,
        Op::Abs {},
        vec![Some(d2)],
        vec![Some((None, Type::Unknown))],
        Some("abs_node".into()),
    );
    let a = m.nodes[n].outputs[0].expect("result");
    m.graphs[g].outputs = vec![y, unknown, a];

    let model = to_model_proto(&m, g, &mut InlineSink).expect("export succeeds");
    let gp = graph(&model);

    // Model facts: producer is ours, the rest comes from the source.
    assert_eq!(model.producer_name.as_deref(), Some("mmq"));
    assert_eq!(
        model.producer_version.as_deref(),
        Some(env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(model.domain.as_deref(), Some("ai.example"));
    assert_eq!(model.model_version, Some(3));
    assert_eq!(model.doc_string.as_deref(), Some("model doc"));
    assert_eq!(model.ir_version, Some(10));
    assert_eq!(model.metadata_props.len(), 1);
    assert_eq!(model.metadata_props[0].key.as_deref(), Some("author"));
    assert_eq!(model.metadata_props[0].value.as_deref(), Some("someone"));
    assert_eq!(model.opset_import.len(), 1);
    assert_eq!(model.opset_import[0].domain.as_deref(), Some(""));
    assert_eq!(model.opset_import[0].version, Some(21));
    assert_eq!(gp.name.as_deref(), Some("main"));

    // Nodes in order with their operands by name.
    let ops: Vec<&str> = gp
        .node
        .iter()
        .map(|n| n.op_type.as_deref().unwrap_or(""))
        .collect();
    assert_eq!(ops, ["Add", "Relu", "Identity", "Neg", "Neg", "Abs"]);
    assert_eq!(gp.node[0].input, ["x", "mmq_v0"]);
    let sum_name = gp.node[0].output[0].clone();
    assert_ne!(
        sum_name, "mmq_v0",
        "generated names never reuse a source name"
    );
    assert!(sum_name.starts_with("mmq_v"));
    assert_eq!(gp.node[1].input, std::slice::from_ref(&sum_name));
    assert_eq!(gp.node[1].output, ["y"]);
    assert_eq!(gp.node[3].output, ["dup"]);
    assert_ne!(gp.node[4].output[0], "dup");
    assert_eq!(gp.node[4].input, ["dup"]);
    assert_eq!(gp.node[5].name.as_deref(), Some("abs_node"));
    assert_eq!(gp.node[0].name, None);

    // Every name is unique and non-empty.
    let mut all: Vec<&String> = gp.node.iter().flat_map(|n| &n.output).collect();
    all.extend(gp.input.iter().filter_map(|i| i.name.as_ref()));
    all.extend(gp.initializer.iter().filter_map(|i| i.name.as_ref()));
    let set: HashSet<&String> = all.iter().copied().collect();
    assert_eq!(set.len(), all.len(), "names are unique: {all:?}");
    assert!(all.iter().all(|n| !n.is_empty()));

    // Inputs and outputs are typed; unknown dims have neither value nor param.
    assert_eq!(gp.input.len(), 1);
    assert_eq!(dims(&gp.input[0]), [param("batch"), param("past + seq")]);
    assert_eq!(gp.output.len(), 3);
    assert_eq!(gp.output[0].name.as_deref(), Some("y"));
    assert_eq!(dims(&gp.output[0]), [param("batch"), None]);
    assert_eq!(elem_type(&gp.output[1]), (Some(0), false));
    assert_eq!(elem_type(&gp.output[2]), (Some(0), false));

    // value_info: known-typed intermediates only (not outputs, not unknown types).
    let vi_names: Vec<&str> = gp
        .value_info
        .iter()
        .filter_map(|v| v.name.as_deref())
        .collect();
    assert_eq!(vi_names.len(), 3, "{vi_names:?}");
    assert_eq!(vi_names[0], sum_name);
    assert_eq!(
        dims(&gp.value_info[0]),
        [param("batch"), param("past + seq")]
    );
    assert_eq!(
        elem_type(&gp.value_info[0]),
        (Some(DType::F32.onnx_code()), true)
    );

    // The constant is an initializer holding exactly its bytes.
    assert_eq!(gp.initializer.len(), 1);
    let t = &gp.initializer[0];
    assert_eq!(t.name.as_deref(), Some("mmq_v0"));
    assert_eq!(t.raw_data.as_deref(), Some(f32_bytes(&[2.0]).as_slice()));
}

#[test]
fn attributes_subgraphs_and_domains() {
    let (mut m, g) = module("main");
    let x = m.add_input(
        g,
        Some("x".into()),
        f32_ty(vec![Dim::known(2), Dim::known(2)]),
    );
    let cond = m.add_input(g, Some("cond".into()), Type::tensor(DType::Bool, vec![]));
    let wt = m.add_const(f32_const(Some("wt"), vec![2, 2], &[1.0, 2.0, 3.0, 4.0]));
    let gemm = unary(
        &mut m,
        g,
        Op::Gemm {
            alpha: Some(0.5),
            beta: None,
            trans_a: None,
            trans_b: Some(1),
        },
        vec![x, wt],
        Some("gemm"),
        f32_ty(vec![Dim::known(2), Dim::known(2)]),
    );

    // A custom op with one attribute of every kind.
    let table = m.add_attr_const(ConstData::new(
        Some("table".into()),
        DType::I64,
        vec![2],
        Storage::Inline(Bytes::from(
            [7i64, 8]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<_>>(),
        )),
    ));
    let custom = Op::Custom(CustomOp {
        domain: "com.example".into(),
        op_type: "Frob".into(),
        attrs: vec![
            ("k".into(), Attr::Int(3)),
            ("eps".into(), Attr::Float(0.25)),
            ("mode".into(), Attr::String("fast".into())),
            ("sizes".into(), Attr::Ints(vec![1, 2])),
            ("scales".into(), Attr::Floats(vec![0.5])),
            ("names".into(), Attr::Strings(vec!["a".into(), "b".into()])),
            ("table".into(), Attr::Tensor(table)),
            ("tables".into(), Attr::Tensors(vec![table])),
            (
                "ty".into(),
                Attr::Type(Type::Sequence(Box::new(f32_ty(vec![Dim::known(3)])))),
            ),
        ],
    });
    let frob = unary(&mut m, g, custom, vec![gemm], None, Type::Unknown);

    // If: the then-branch uses a constant only it needs and an outer value.
    let (_, branch, then_g, else_g) = if_node(
        &mut m,
        g,
        cond,
        "branch",
        f32_ty(vec![Dim::known(2), Dim::known(2)]),
        Some("choose"),
    );
    let bias = m.add_const(f32_const(Some("bias"), vec![2], &[0.5, -0.5]));
    let t_out = unary(
        &mut m,
        then_g,
        Op::Add {},
        vec![gemm, bias],
        None,
        f32_ty(vec![Dim::known(2), Dim::known(2)]),
    );
    m.graphs[then_g].outputs = vec![t_out];
    let e_out = unary(
        &mut m,
        else_g,
        Op::Neg {},
        vec![gemm],
        Some("neg"),
        f32_ty(vec![Dim::known(2), Dim::known(2)]),
    );
    m.graphs[else_g].outputs = vec![e_out];
    m.graphs[g].outputs = vec![frob, branch];

    let model = to_model_proto(&m, g, &mut InlineSink).expect("export succeeds");
    let gp = graph(&model);

    // Typed op attributes keep their ONNX names and types.
    let gemm_n = &gp.node[0];
    assert_eq!(gemm_n.op_type.as_deref(), Some("Gemm"));
    assert_eq!(gemm_n.domain, None);
    let attr = |n: &proto::NodeProto, name: &str| -> proto::AttributeProto {
        n.attribute
            .iter()
            .find(|a| a.name.as_deref() == Some(name))
            .cloned()
            .unwrap_or_else(|| panic!("attribute {name} missing"))
    };
    assert_eq!(gemm_n.attribute.len(), 2);
    let alpha = attr(gemm_n, "alpha");
    assert_eq!(alpha.r#type, Some(AttributeType::Float as i32));
    assert_eq!(alpha.f, Some(0.5));
    let tb = attr(gemm_n, "transB");
    assert_eq!(tb.r#type, Some(AttributeType::Int as i32));
    assert_eq!(tb.i, Some(1));

    let frob_n = &gp.node[1];
    assert_eq!(frob_n.domain.as_deref(), Some("com.example"));
    assert_eq!(frob_n.op_type.as_deref(), Some("Frob"));
    let names: Vec<&str> = frob_n
        .attribute
        .iter()
        .filter_map(|a| a.name.as_deref())
        .collect();
    assert_eq!(
        names,
        [
            "k", "eps", "mode", "sizes", "scales", "names", "table", "tables", "ty"
        ]
    );
    assert_eq!(attr(frob_n, "k").i, Some(3));
    assert_eq!(attr(frob_n, "mode").s.as_deref(), Some(b"fast".as_slice()));
    assert_eq!(
        attr(frob_n, "mode").r#type,
        Some(AttributeType::String as i32)
    );
    assert_eq!(attr(frob_n, "sizes").ints, [1, 2]);
    assert_eq!(
        attr(frob_n, "sizes").r#type,
        Some(AttributeType::Ints as i32)
    );
    assert_eq!(attr(frob_n, "scales").floats, [0.5]);
    assert_eq!(
        attr(frob_n, "names").strings,
        [b"a".to_vec(), b"b".to_vec()]
    );
    assert_eq!(
        attr(frob_n, "names").r#type,
        Some(AttributeType::Strings as i32)
    );
    let t = attr(frob_n, "table");
    assert_eq!(t.r#type, Some(AttributeType::Tensor as i32));
    let t = t.t.expect("tensor set");
    assert_eq!(t.name.as_deref(), Some("table"));
    assert_eq!(t.data_type, Some(DType::I64.onnx_code()));
    assert_eq!(t.dims, [2]);
    assert_eq!(t.raw_data.as_deref().map(<[u8]>::len), Some(16));
    assert_eq!(attr(frob_n, "tables").tensors.len(), 1);
    assert_eq!(
        attr(frob_n, "tables").r#type,
        Some(AttributeType::Tensors as i32)
    );
    let ty = attr(frob_n, "ty");
    assert_eq!(ty.r#type, Some(AttributeType::TypeProto as i32));
    match ty.tp.and_then(|t| t.value) {
        Some(type_proto::Value::SequenceType(s)) => match s.elem_type.and_then(|e| e.value) {
            Some(type_proto::Value::TensorType(t)) => {
                assert_eq!(t.elem_type, Some(DType::F32.onnx_code()));
                assert_eq!(
                    t.shape.expect("shape").dim[0].value,
                    Some(DimValue::DimValue(3))
                );
            }
            other => panic!("sequence element: {other:?}"),
        },
        other => panic!("type attribute: {other:?}"),
    }

    // The custom domain is imported; the default domain keeps the source's opset.
    let opsets: Vec<(Option<&str>, Option<i64>)> = model
        .opset_import
        .iter()
        .map(|o| (o.domain.as_deref(), o.version))
        .collect();
    assert_eq!(
        opsets,
        [(Some(""), Some(21)), (Some("com.example"), Some(1))]
    );

    // Subgraphs: exported in place, outer-scope references by name.
    let if_n = &gp.node[2];
    assert_eq!(if_n.name.as_deref(), Some("choose"));
    assert_eq!(if_n.input, ["cond"]);
    let then_a = attr(if_n, "then_branch");
    assert_eq!(then_a.r#type, Some(AttributeType::Graph as i32));
    let then_gp = then_a.g.expect("graph set");
    assert_eq!(then_gp.name.as_deref(), Some("then"));
    assert_eq!(then_gp.node.len(), 1);
    assert_eq!(then_gp.node[0].input, ["gemm", "bias"]);
    assert_eq!(then_gp.output.len(), 1);
    assert_eq!(
        then_gp.output[0].name,
        Some(then_gp.node[0].output[0].clone())
    );
    let else_gp = attr(if_n, "else_branch").g.expect("graph set");
    assert_eq!(else_gp.node[0].output, ["neg"]);

    // A constant used only in a subgraph is that subgraph's initializer.
    assert_eq!(init_names(gp), ["wt"]);
    assert_eq!(init_names(&then_gp), ["bias"]);
    assert!(
        model.ir_version >= Some(4),
        "IR 3 cannot hold branch initializers"
    );
}

fn init_names(g: &proto::GraphProto) -> Vec<&str> {
    g.initializer
        .iter()
        .filter_map(|t| t.name.as_deref())
        .collect()
}

#[test]
fn constants_live_in_the_innermost_graph_using_them() {
    let (mut m, g) = module("main");
    let sq = || f32_ty(vec![Dim::known(2)]);
    let x = m.add_input(g, Some("x".into()), sq());
    let cond = m.add_input(g, Some("cond".into()), Type::tensor(DType::Bool, vec![]));
    let konst = |m: &mut mmq_ir::Module, name: &str| {
        m.add_const(f32_const(Some(name), vec![2], &[1.0, 2.0]))
    };
    let (top_c, shared, only_then, deep, deep_and_else) = (
        konst(&mut m, "top_and_deep"),
        konst(&mut m, "shared"),
        konst(&mut m, "only_then"),
        konst(&mut m, "deep"),
        konst(&mut m, "deep_and_else"),
    );
    let a = unary(&mut m, g, Op::Add {}, vec![x, top_c], None, sq());
    // then: uses `shared` and `only_then`.
    let (_, y, then_g, else_g) = if_node(&mut m, g, cond, "y", sq(), None);
    let t1 = unary(&mut m, then_g, Op::Add {}, vec![a, shared], None, sq());
    let t2 = unary(&mut m, then_g, Op::Mul {}, vec![t1, only_then], None, sq());
    m.graphs[then_g].outputs = vec![t2];
    // else: uses `shared` and `deep_and_else`, and holds an If whose then-branch uses `deep`,
    // `deep_and_else` and `top_and_deep`, and whose else-branch returns `deep` itself.
    let e1 = unary(&mut m, else_g, Op::Sub {}, vec![a, shared], None, sq());
    let e2 = unary(
        &mut m,
        else_g,
        Op::Mul {},
        vec![e1, deep_and_else],
        None,
        sq(),
    );
    let (_, z, inner_then, inner_else) = if_node(&mut m, else_g, cond, "z", sq(), None);
    let i1 = unary(&mut m, inner_then, Op::Add {}, vec![e2, deep], None, sq());
    let i2 = unary(
        &mut m,
        inner_then,
        Op::Add {},
        vec![i1, deep_and_else],
        None,
        sq(),
    );
    let i3 = unary(&mut m, inner_then, Op::Add {}, vec![i2, top_c], None, sq());
    m.graphs[inner_then].outputs = vec![i3];
    m.graphs[inner_else].outputs = vec![deep];
    m.graphs[else_g].outputs = vec![z];
    m.graphs[g].outputs = vec![y];

    let model = to_model_proto(&m, g, &mut InlineSink).expect("export succeeds");
    let gp = graph(&model);
    let branch = |n: &proto::NodeProto, name: &str| -> proto::GraphProto {
        n.attribute
            .iter()
            .find(|a| a.name.as_deref() == Some(name))
            .and_then(|a| a.g.clone())
            .unwrap_or_else(|| panic!("{name} missing"))
    };
    let outer_if = &gp.node[1];
    let (then_gp, else_gp) = (
        branch(outer_if, "then_branch"),
        branch(outer_if, "else_branch"),
    );
    let inner_if = else_gp
        .node
        .iter()
        .find(|n| n.op_type.as_deref() == Some("If"))
        .expect("inner If");
    let (inner_then_gp, inner_else_gp) = (
        branch(inner_if, "then_branch"),
        branch(inner_if, "else_branch"),
    );
    assert_eq!(init_names(gp), ["top_and_deep", "shared"]);
    assert_eq!(init_names(&then_gp), ["only_then"]);
    assert_eq!(init_names(&else_gp), ["deep_and_else", "deep"]);
    assert!(init_names(&inner_then_gp).is_empty());
    assert!(init_names(&inner_else_gp).is_empty());
    assert_eq!(inner_else_gp.output[0].name.as_deref(), Some("deep"));
}

#[test]
fn tensors_strings_defaults_and_ir_version() {
    let (mut m, g) = module("main");
    m.entries[0].model.ir_version = 8;
    m.entries[0].model.opsets = vec![(String::new(), 17)];
    let x = m.add_input(
        g,
        Some("x".into()),
        Type::tensor(DType::I4, vec![Dim::known(3)]),
    );
    // An input with a default value.
    let opt = m.add_input(g, Some("opt".into()), f32_ty(vec![Dim::known(2)]));
    let c = m.add_attr_const(f32_const(Some("ignored"), vec![2], &[1.5, 2.5]));
    if let ValueDef::Input { default, .. } = &mut m.values[opt].def {
        *default = Some(c);
    }
    let s = m.add_const(ConstData::new(
        Some("words".into()),
        DType::String,
        vec![2],
        Storage::Strings(vec![Bytes::from_static(b"a"), Bytes::from_static(b"bc")]),
    ));
    let q = m.add_const(ConstData::new(
        Some("q".into()),
        DType::I4,
        vec![3],
        Storage::Inline(Bytes::from_static(&[0x21, 0x03])),
    ));
    let y = unary(
        &mut m,
        g,
        Op::Add {},
        vec![x, q],
        Some("y"),
        Type::tensor(DType::I4, vec![Dim::known(3)]),
    );
    let z = unary(
        &mut m,
        g,
        Op::Identity {},
        vec![s],
        Some("z"),
        Type::tensor(DType::String, vec![Dim::known(2)]),
    );
    m.graphs[g].outputs = vec![y, z, opt];

    // A model-local function is written back unchanged.
    let func = proto::FunctionProto {
        name: Some("Twice".into()),
        domain: Some("local".into()),
        input: vec!["a".into()],
        output: vec!["b".into()],
        ..Default::default()
    };
    m.entries[0].model.functions = vec![Bytes::from(prost::Message::encode_to_vec(&func))];

    let model = to_model_proto(&m, g, &mut InlineSink).expect("export succeeds");
    assert_eq!(model.functions, [func]);
    // i4 needs IR 10; opset 17 alone would allow 8.
    assert_eq!(model.ir_version, Some(10));
    let gp = graph(&model);
    let by_name = |n: &str| {
        gp.initializer
            .iter()
            .find(|t| t.name.as_deref() == Some(n))
            .unwrap_or_else(|| panic!("no initializer {n}"))
    };
    let d = by_name("opt");
    assert_eq!(
        d.raw_data.as_deref(),
        Some(f32_bytes(&[1.5, 2.5]).as_slice())
    );
    assert_eq!(d.dims, [2]);
    let w = by_name("words");
    assert_eq!(w.data_type, Some(DType::String.onnx_code()));
    assert_eq!(w.string_data, [b"a".to_vec(), b"bc".to_vec()]);
    assert_eq!(w.raw_data, None);
    let q = by_name("q");
    assert_eq!(q.data_type, Some(DType::I4.onnx_code()));
    assert_eq!(q.raw_data.as_deref(), Some([0x21u8, 0x03].as_slice()));
    assert_eq!(gp.initializer.len(), 3);

    m.entries[0].model.functions = vec![Bytes::from_static(&[0xff, 0xff])];
    let err = to_model_proto(&m, g, &mut InlineSink).expect_err("bad function bytes");
    assert!(err.to_string().contains("function 0"), "{err}");
}

#[test]
fn bad_tensors_are_errors_naming_the_tensor() {
    let (mut m, g) = module("main");
    let w = m.add_const(ConstData::new(
        Some("weights".into()),
        DType::F32,
        vec![4],
        Storage::Absent,
    ));
    let y = unary(
        &mut m,
        g,
        Op::Neg {},
        vec![w],
        Some("y"),
        f32_ty(vec![Dim::known(4)]),
    );
    m.graphs[g].outputs = vec![y];
    let err = to_model_proto(&m, g, &mut InlineSink).expect_err("absent data");
    assert!(matches!(err, ExportError::AbsentData { .. }), "{err:?}");
    assert!(err.to_string().contains("`weights`"), "{err}");

    let (mut m, g) = module("main");
    let w = m.add_const(f32_const(Some("short"), vec![3], &[1.0, 2.0]));
    let y = unary(
        &mut m,
        g,
        Op::Neg {},
        vec![w],
        Some("y"),
        f32_ty(vec![Dim::known(3)]),
    );
    m.graphs[g].outputs = vec![y];
    let err = to_model_proto(&m, g, &mut InlineSink).expect_err("short data");
    assert!(
        err.to_string().contains("`short`") && err.to_string().contains("8 bytes"),
        "{err}"
    );

    // A subgraph cannot be exported as a model.
    let (mut m, g) = module("main");
    let body = m.add_graph("body", None);
    let n = m.add_node(g, Op::Loop { body: Some(body) }, vec![], vec![], None);
    m.graphs[body].parent = Some(n);
    let err = to_model_proto(&m, body, &mut InlineSink).expect_err("not top-level");
    assert!(err.to_string().contains("`body`"), "{err}");
}

#[test]
fn failed_write_leaves_no_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut m, g) = module("main");
    let small = m.add_const(f32_const(Some("small"), vec![1], &[1.0]));
    let w = m.add_const(ConstData::new(
        Some("weights".into()),
        DType::F32,
        vec![4096],
        Storage::Absent,
    ));
    let y = unary(
        &mut m,
        g,
        Op::Add {},
        vec![small, w],
        Some("y"),
        f32_ty(vec![Dim::known(4096)]),
    );
    m.graphs[g].outputs = vec![y];
    let out = dir.path().join("model.onnx");
    for external_data in [ExternalData::Always, ExternalData::Never] {
        let opts = ExportOptions {
            external_data,
            size_threshold: 1,
            ..Default::default()
        };
        let err = write_model(&m, g, &out, &opts).expect_err("absent data");
        assert!(matches!(err, ExportError::AbsentData { .. }), "{err:?}");
        assert_eq!(dir_entries(dir.path()), Vec::<String>::new());
    }
}

#[test]
fn external_data_layout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut m, g) = module("main");
    let big1: Vec<f32> = (0..100).map(|i| i as f32).collect();
    let big2: Vec<f32> = (0..50).map(|i| -(i as f32)).collect();
    let a = m.add_const(f32_const(Some("big1"), vec![100], &big1));
    let b = m.add_const(f32_const(Some("small"), vec![2], &[1.0, 2.0]));
    let c = m.add_const(f32_const(Some("big2"), vec![50], &big2));
    let y1 = unary(
        &mut m,
        g,
        Op::Neg {},
        vec![a],
        Some("y1"),
        f32_ty(vec![Dim::known(100)]),
    );
    let y2 = unary(
        &mut m,
        g,
        Op::Neg {},
        vec![b],
        Some("y2"),
        f32_ty(vec![Dim::known(2)]),
    );
    let y3 = unary(
        &mut m,
        g,
        Op::Neg {},
        vec![c],
        Some("y3"),
        f32_ty(vec![Dim::known(50)]),
    );
    m.graphs[g].outputs = vec![y1, y2, y3];

    let out = dir.path().join("model.onnx");
    let opts = ExportOptions {
        external_data: ExternalData::Always,
        size_threshold: 16,
        ..Default::default()
    };
    let report = write_model(&m, g, &out, &opts).expect("write succeeds");
    let data_path = dir.path().join("model.onnx.data");
    assert_eq!(report.data_path.as_deref(), Some(data_path.as_path()));
    assert_eq!(report.files, [data_path.clone(), out.clone()]);
    assert_eq!(report.external_bytes, 600);
    assert_eq!(report.external_tensors, 2);
    assert_eq!(report.inline_bytes, 8);
    assert_eq!(
        report.model_bytes,
        std::fs::metadata(&out).expect("model").len()
    );
    assert!(report.to_string().contains("model.onnx.data"), "{report}");
    assert_eq!(dir_entries(dir.path()), ["model.onnx", "model.onnx.data"]);
    // Outputs are ordinary files: readable by others unless the umask says otherwise, not the
    // private mode of a temporary file.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        for f in [&out, &data_path] {
            let mode = std::fs::metadata(f).expect("written").permissions().mode();
            assert_eq!(mode & 0o044, 0o044, "{} has mode {mode:o}", f.display());
        }
    }

    let model = read_model(&out);
    let gp = graph(&model);
    let data = std::fs::read(&data_path).expect("data file");
    let by_name = |n: &str| {
        gp.initializer
            .iter()
            .find(|t| t.name.as_deref() == Some(n))
            .expect("initializer")
    };
    for (name, values, offset) in [("big1", &big1, 0usize), ("big2", &big2, 4096)] {
        let t = by_name(name);
        assert_eq!(
            t.data_location,
            Some(proto::tensor_proto::DataLocation::External as i32)
        );
        assert_eq!(t.raw_data, None);
        assert_eq!(ext_entry(t, "location"), "model.onnx.data");
        assert_eq!(ext_entry(t, "offset"), offset.to_string());
        let len = values.len() * 4;
        assert_eq!(ext_entry(t, "length"), len.to_string());
        assert_eq!(&data[offset..offset + len], f32_bytes(values).as_slice());
    }
    assert_eq!(data.len(), 4096 + 200);
    let s = by_name("small");
    assert_eq!(s.data_location, None);
    assert_eq!(
        s.raw_data.as_deref(),
        Some(f32_bytes(&[1.0, 2.0]).as_slice())
    );

    // The file decodes to the same message `to_model_proto` builds (inline variant differs
    // only in data placement, so compare node lists and initializer names).
    let inline = to_model_proto(&m, g, &mut InlineSink).expect("export succeeds");
    assert_eq!(graph(&inline).node, gp.node);
    let names = |g: &proto::GraphProto| -> Vec<Option<String>> {
        g.initializer.iter().map(|t| t.name.clone()).collect()
    };
    assert_eq!(names(graph(&inline)), names(gp));

    // Never: one self-contained file.
    let out2 = dir.path().join("inline.onnx");
    let opts = ExportOptions {
        external_data: ExternalData::Never,
        size_threshold: 16,
        ..Default::default()
    };
    let report = write_model(&m, g, &out2, &opts).expect("write succeeds");
    assert_eq!(report.data_path, None);
    assert_eq!(report.external_bytes, 0);
    assert_eq!(report.inline_bytes, 608);
    assert_eq!(read_model(&out2), inline);
}

/// A module whose weights live in an external file, as the ONNX frontend loads them.
fn module_with_external_source(
    dir: &std::path::Path,
    data_name: &str,
) -> (mmq_ir::Module, mmq_ir::GraphId, Vec<f32>) {
    let values: Vec<f32> = (0..300).map(|i| i as f32 * 0.5).collect();
    let mut bytes = vec![0xAAu8; 8];
    bytes.extend(f32_bytes(&values));
    bytes.extend(f32_bytes(&[9.0, 10.0]));
    let data_path = dir.join(data_name);
    std::fs::write(&data_path, &bytes).expect("write source data");
    let file = Arc::new(ExternalFile::open(&data_path, data_name).expect("open data"));

    let (mut m, g) = module("main");
    m.entries[0].model.source = Some(dir.join("source.onnx"));
    let big = m.add_const(ConstData::new(
        Some("big".into()),
        DType::F32,
        vec![300],
        Storage::External {
            file: file.clone(),
            offset: 8,
            len: 1200,
        },
    ));
    let small = m.add_const(ConstData::new(
        Some("small".into()),
        DType::F32,
        vec![2],
        Storage::External {
            file,
            offset: 1208,
            len: 8,
        },
    ));
    let y1 = unary(
        &mut m,
        g,
        Op::Neg {},
        vec![big],
        Some("y1"),
        f32_ty(vec![Dim::known(300)]),
    );
    let y2 = unary(
        &mut m,
        g,
        Op::Neg {},
        vec![small],
        Some("y2"),
        f32_ty(vec![Dim::known(2)]),
    );
    m.graphs[g].outputs = vec![y1, y2];
    (m, g, values)
}

#[test]
fn external_source_is_copied_file_to_file() {
    let src = tempfile::tempdir().expect("tempdir");
    let dst = tempfile::tempdir().expect("tempdir");
    let (m, g, values) = module_with_external_source(src.path(), "source.onnx.data");

    // Auto: the source was external, so the output is too (tensors >= 1024 bytes).
    let out = dst.path().join("out.onnx");
    let report = write_model(&m, g, &out, &ExportOptions::default()).expect("write succeeds");
    assert_eq!(report.external_bytes, 1200);
    assert_eq!(report.inline_bytes, 8);
    let model = read_model(&out);
    let gp = graph(&model);
    let big = gp
        .initializer
        .iter()
        .find(|t| t.name.as_deref() == Some("big"))
        .expect("big");
    assert_eq!(ext_entry(big, "location"), "out.onnx.data");
    assert_eq!(ext_entry(big, "offset"), "0");
    assert_eq!(ext_entry(big, "length"), "1200");
    let data = std::fs::read(dst.path().join("out.onnx.data")).expect("data file");
    assert_eq!(data, f32_bytes(&values));
    let small = gp
        .initializer
        .iter()
        .find(|t| t.name.as_deref() == Some("small"))
        .expect("small");
    assert_eq!(
        small.raw_data.as_deref(),
        Some(f32_bytes(&[9.0, 10.0]).as_slice())
    );

    // Never: everything inline.
    let out = dst.path().join("inline.onnx");
    let opts = ExportOptions {
        external_data: ExternalData::Never,
        ..Default::default()
    };
    let report = write_model(&m, g, &out, &opts).expect("write succeeds");
    assert_eq!(report.files, std::slice::from_ref(&out));
    let model = read_model(&out);
    let big = graph(&model)
        .initializer
        .iter()
        .find(|t| t.name.as_deref() == Some("big"))
        .expect("big");
    assert_eq!(big.raw_data.as_deref(), Some(f32_bytes(&values).as_slice()));
    assert!(!dst.path().join("inline.onnx.data").exists());

    // A truncated source is an error naming the tensor, and leaves nothing behind.
    let (mut m2, g2, _) = module_with_external_source(src.path(), "other.data");
    if let Storage::External { len, .. } = &mut m2.consts[mmq_ir::Const::from_index(0)].storage {
        *len = 4000;
    }
    let empty = tempfile::tempdir().expect("tempdir");
    let err = write_model(
        &m2,
        g2,
        &empty.path().join("x.onnx"),
        &ExportOptions::default(),
    )
    .expect_err("range outside the file");
    assert!(err.to_string().contains("`big`"), "{err}");
    assert_eq!(dir_entries(empty.path()), Vec::<String>::new());
}

#[test]
fn refuses_to_overwrite_inputs() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The output's data file would replace the source's external data.
    let (m, g, _) = module_with_external_source(dir.path(), "out.onnx.data");
    let before = std::fs::read(dir.path().join("out.onnx.data")).expect("data");
    let err = write_model(
        &m,
        g,
        &dir.path().join("out.onnx"),
        &ExportOptions::default(),
    )
    .expect_err("would overwrite the data file");
    assert!(
        matches!(err, ExportError::OverwritesInput { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("out.onnx.data"), "{err}");
    assert_eq!(
        std::fs::read(dir.path().join("out.onnx.data")).expect("data"),
        before
    );
    assert_eq!(dir_entries(dir.path()), ["out.onnx.data"]);

    // The output is the model the module came from, spelled differently.
    let source = dir.path().join("source.onnx");
    std::fs::write(&source, b"original").expect("write source");
    let spelled = dir
        .path()
        .join(".")
        .join("sub")
        .join("..")
        .join("source.onnx");
    std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
    let err = write_model(&m, g, &spelled, &ExportOptions::default()).expect_err("overwrite");
    assert!(
        matches!(err, ExportError::OverwritesInput { .. }),
        "{err:?}"
    );
    assert_eq!(std::fs::read(&source).expect("source"), b"original");

    // Through a symbolic link.
    let link = dir.path().join("link.onnx");
    std::os::unix::fs::symlink(&source, &link).expect("symlink");
    let err = write_model(&m, g, &link, &ExportOptions::default()).expect_err("overwrite");
    assert!(
        matches!(err, ExportError::OverwritesInput { .. }),
        "{err:?}"
    );
    assert_eq!(
        dir_entries(dir.path()),
        ["link.onnx", "out.onnx.data", "source.onnx", "sub"]
    );
}

#[test]
fn overwrites_previous_output() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut m, g) = module("main");
    let x = m.add_input(g, Some("x".into()), f32_ty(vec![Dim::known(1)]));
    let y = unary(
        &mut m,
        g,
        Op::Neg {},
        vec![x],
        Some("y"),
        f32_ty(vec![Dim::known(1)]),
    );
    m.graphs[g].outputs = vec![y];
    let out = dir.path().join("m.onnx");
    std::fs::write(&out, b"stale").expect("write");
    write_model(&m, g, &out, &ExportOptions::default()).expect("write succeeds");
    let model = read_model(&out);
    assert_eq!(graph(&model).node.len(), 1);
    assert_eq!(dir_entries(dir.path()), ["m.onnx"]);
}

/// A tensor whose shape is known but whose element type is not (the result of an op without a
/// typing rule) gets no `value_info`: ONNX Runtime rejects `elem_type` 0 there.
#[test]
fn untyped_tensors_get_no_value_info() {
    let (mut m, g) = module("main");
    let x = m.add_input(g, Some("x".into()), f32_ty(vec![Dim::known(4)]));
    let shaped = Type::Tensor(mmq_ir::TensorType {
        dtype: None,
        shape: Some(vec![Dim::known(4)]),
    });
    let r = unary(&mut m, g, Op::Relu {}, vec![x], Some("r"), shaped);
    let y = unary(
        &mut m,
        g,
        Op::Neg {},
        vec![r],
        Some("y"),
        f32_ty(vec![Dim::known(4)]),
    );
    m.graphs[g].outputs = vec![y];
    let model = to_model_proto(&m, g, &mut InlineSink).expect("export succeeds");
    let names: Vec<&str> = graph(&model)
        .value_info
        .iter()
        .map(|v| v.name.as_deref().unwrap_or(""))
        .collect();
    assert!(!names.contains(&"r"), "{names:?}");
    for vi in &graph(&model).value_info {
        assert_ne!(elem_type(vi).0, Some(0), "{vi:?}");
    }
}

/// An untyped result that is a subgraph's output keeps its name but gets no type there (the
/// runtime infers it; `elem_type` 0 would make ONNX Runtime reject the whole model), while the
/// main graph's outputs stay typed.
#[test]
fn untyped_subgraph_outputs_get_no_type() {
    let (mut m, g) = module("main");
    let x = m.add_input(g, Some("x".into()), f32_ty(vec![Dim::known(4)]));
    let cond = m.add_input(g, Some("c".into()), Type::tensor(DType::Bool, vec![]));
    let (_, y, then_g, else_g) = if_node(&mut m, g, cond, "y", f32_ty(vec![Dim::known(4)]), None);
    let t = unary(
        &mut m,
        then_g,
        Op::Relu {},
        vec![x],
        Some("t"),
        Type::Unknown,
    );
    m.graphs[then_g].outputs = vec![t];
    let e = unary(
        &mut m,
        else_g,
        Op::Neg {},
        vec![x],
        Some("e"),
        f32_ty(vec![Dim::known(4)]),
    );
    m.graphs[else_g].outputs = vec![e];
    m.graphs[g].outputs = vec![y];
    let model = to_model_proto(&m, g, &mut InlineSink).expect("export succeeds");
    let node = &graph(&model).node[0];
    let branch = |name: &str| {
        node.attribute
            .iter()
            .find(|a| a.name.as_deref() == Some(name))
            .and_then(|a| a.g.clone())
            .expect("branch")
    };
    let t_out = &branch("then_branch").output[0];
    assert_eq!(t_out.name.as_deref(), Some("t"));
    assert!(t_out.r#type.is_none(), "{t_out:?}");
    let e_out = &branch("else_branch").output[0];
    assert_eq!(elem_type(e_out).0, Some(DType::F32.onnx_code()));
    assert_eq!(
        elem_type(&graph(&model).output[0]).0,
        Some(DType::F32.onnx_code())
    );
}

#[test]
fn the_model_and_its_data_are_published_under_the_directory_lock() {
    // While another writer holds the output directory's lock, nothing is published; once it
    // lets go, the model and its data appear together (and nothing else).
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut m, g) = module("main");
    let big: Vec<f32> = (0..100).map(|i| i as f32).collect();
    let a = m.add_const(f32_const(Some("big"), vec![100], &big));
    let y = unary(
        &mut m,
        g,
        Op::Neg {},
        vec![a],
        Some("y"),
        f32_ty(vec![Dim::known(100)]),
    );
    m.graphs[g].outputs = vec![y];
    let out = dir.path().join("model.onnx");
    let held = mmq_ir::fsio::lock_dir(dir.path()).expect("lock");
    let writer = {
        let out = out.clone();
        std::thread::spawn(move || {
            let opts = ExportOptions {
                external_data: ExternalData::Always,
                size_threshold: 16,
                ..Default::default()
            };
            write_model(&m, g, &out, &opts).expect("write")
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(300));
    let names = |d: &std::path::Path| {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .expect("read")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert!(!writer.is_finished(), "published while the lock was held");
    assert!(names(dir.path()).is_empty(), "{:?}", names(dir.path()));
    drop(held);
    let report = writer.join().expect("writer");
    assert_eq!(report.external_tensors, 1);
    assert_eq!(names(dir.path()), ["model.onnx", "model.onnx.data"]);
}

/// A graph whose output comes through `depth` nested `If`s (the innermost branch returns the
/// input), as `.mmir` text.
fn nested_ifs(depth: usize) -> String {
    fn branch(level: usize, depth: usize) -> String {
        if level == depth {
            return "return %x".to_owned();
        }
        let inner = branch(level + 1, depth);
        format!(
            "%y{level} = If(%c) {{\n then_branch = graph @t{level}() -> (f32[1]) {{\n{inner}\n}},\n \
             else_branch = graph @e{level}() -> (f32[1]) {{\nreturn %x\n}}\n}} : f32[1]\nreturn %y{level}"
        )
    }
    format!(
        "graph @main(%c: bool[], %x: f32[1]) -> (f32[1]) model {{ir_version = 8, opsets = {{\"\" = 17}}}} {{\n{}\n}}\n",
        branch(0, depth)
    )
}

#[test]
fn subgraphs_nested_deeper_than_readers_load_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let limit = mmq_backend_ort::MAX_SUBGRAPH_DEPTH;
    for (depth, ok) in [(limit, true), (limit + 1, false)] {
        let (m, _) = mmq_ir::text::parse(&nested_ifs(depth)).unwrap_or_else(|e| panic!("{e:?}"));
        let out = dir.path().join(format!("nest{depth}.onnx"));
        let r = write_model(&m, m.entries[0].graph, &out, &ExportOptions::default());
        match (ok, r) {
            (true, Ok(_)) => {
                // The deepest nesting written is one ONNX's own reader loads.
                let check = std::process::Command::new(
                    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python"),
                )
                .args(["-c", "import onnx, sys; onnx.load(sys.argv[1])"])
                .arg(&out)
                .output()
                .expect("python");
                assert!(
                    check.status.success(),
                    "onnx.load: {}",
                    String::from_utf8_lossy(&check.stderr)
                );
            }
            (false, Err(ExportError::TooDeep { depth: d, .. })) => {
                assert_eq!(d, limit + 1);
                assert!(!out.exists());
            }
            (ok, r) => panic!("depth {depth}: expected ok={ok}, got {r:?}"),
        }
    }
}
