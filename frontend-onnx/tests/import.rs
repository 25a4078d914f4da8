//! Import tests on small models built with the prost types.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use mmq_ir::{Attr, DType, Dim, DimExpr, Module, Op, Storage, Type, ValueDef};
use mmq_onnx::proto::onnx::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, SparseTensorProto,
    StringStringEntryProto, TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
    attribute_proto::AttributeType, tensor_shape_proto::Dimension, tensor_shape_proto::dimension,
    type_proto,
};
use mmq_onnx::{LoadError, LoadErrorKind, LoadOptions, load_bytes, load_files};
use prost::Message;

// ---- builders ----

fn opts() -> LoadOptions {
    LoadOptions { infer: false }
}

fn s(x: &str) -> Option<String> {
    Some(x.to_owned())
}

/// A dim: a number, or `dim_param` text.
enum D<'a> {
    N(i64),
    P(&'a str),
}

fn tensor_type(dtype: i32, dims: &[D]) -> TypeProto {
    TypeProto {
        value: Some(type_proto::Value::TensorType(type_proto::Tensor {
            elem_type: Some(dtype),
            shape: Some(TensorShapeProto {
                dim: dims
                    .iter()
                    .map(|d| Dimension {
                        denotation: None,
                        value: Some(match d {
                            D::N(n) => dimension::Value::DimValue(*n),
                            D::P(p) => dimension::Value::DimParam((*p).to_owned()),
                        }),
                    })
                    .collect(),
            }),
        })),
        ..Default::default()
    }
}

fn vi(name: &str, tp: TypeProto) -> ValueInfoProto {
    ValueInfoProto {
        name: s(name),
        r#type: Some(tp),
        ..Default::default()
    }
}

fn untyped(name: &str) -> ValueInfoProto {
    ValueInfoProto {
        name: s(name),
        ..Default::default()
    }
}

fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        op_type: s(op),
        name: if name.is_empty() { None } else { s(name) },
        input: inputs.iter().map(|x| (*x).to_owned()).collect(),
        output: outputs.iter().map(|x| (*x).to_owned()).collect(),
        ..Default::default()
    }
}

fn ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: s(name),
        r#type: Some(AttributeType::Ints as i32),
        ints: v.to_vec(),
        ..Default::default()
    }
}

fn graph_attr(name: &str, g: GraphProto) -> AttributeProto {
    AttributeProto {
        name: s(name),
        r#type: Some(AttributeType::Graph as i32),
        g: Some(g),
        ..Default::default()
    }
}

fn f32_raw(name: &str, dims: &[i64], vals: &[f32]) -> TensorProto {
    TensorProto {
        name: s(name),
        dims: dims.to_vec(),
        data_type: Some(1),
        raw_data: Some(vals.iter().flat_map(|v| v.to_le_bytes()).collect()),
        ..Default::default()
    }
}

fn model(graph: GraphProto, opset: i64) -> ModelProto {
    ModelProto {
        ir_version: Some(8),
        producer_name: s("unit-test"),
        producer_version: s("1.0"),
        model_version: Some(3),
        opset_import: vec![OperatorSetIdProto {
            domain: s(""),
            version: Some(opset),
        }],
        metadata_props: vec![StringStringEntryProto {
            key: s("k"),
            value: s("v"),
        }],
        graph: Some(graph),
        ..Default::default()
    }
}

fn load(m: &ModelProto) -> Result<Module, LoadError> {
    load_bytes(Bytes::from(m.encode_to_vec()), None, "test.onnx", &opts())
}

fn load_err(m: &ModelProto) -> LoadError {
    match load(m) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    }
}

fn conv_relu() -> GraphProto {
    let mut conv = node("Conv", "conv0", &["x", "w", "b"], &["c"]);
    conv.attribute = vec![ints("kernel_shape", &[3, 3]), ints("pads", &[1, 1, 1, 1])];
    GraphProto {
        name: s("convnet"),
        doc_string: s("a conv net"),
        input: vec![vi(
            "x",
            tensor_type(1, &[D::P("batch"), D::N(2), D::N(4), D::N(4)]),
        )],
        output: vec![vi(
            "y",
            tensor_type(1, &[D::P("batch"), D::N(1), D::N(4), D::N(4)]),
        )],
        initializer: vec![
            f32_raw("w", &[1, 2, 3, 3], &[0.5; 18]),
            TensorProto {
                name: s("b"),
                dims: vec![1],
                data_type: Some(1),
                float_data: vec![0.25],
                ..Default::default()
            },
        ],
        node: vec![conv, node("Relu", "", &["c"], &["y"])],
        ..Default::default()
    }
}

fn names(m: &Module, g: mmq_ir::GraphId) -> Vec<String> {
    m.graphs[g]
        .nodes()
        .iter()
        .map(|&n| m.nodes[n].name.clone().unwrap_or_default())
        .collect()
}

// ---- tests ----

#[test]
fn conv_relu_graph() {
    let mp = model(conv_relu(), 17);
    let buf = Bytes::from(mp.encode_to_vec());
    let m = load_bytes(buf.clone(), None, "test.onnx", &opts()).unwrap();
    assert_eq!(m.entries.len(), 1);
    let e = &m.entries[0];
    assert_eq!(e.model.ir_version, 8);
    assert_eq!(e.model.opsets, vec![(String::new(), 17)]);
    assert_eq!(e.model.producer_name, "unit-test");
    assert_eq!(e.model.model_version, 3);
    assert_eq!(e.model.metadata, vec![("k".to_owned(), "v".to_owned())]);
    let g = &m.graphs[e.graph];
    assert_eq!(g.name, "convnet");
    assert_eq!(g.doc, "a conv net");
    assert_eq!(g.inputs.len(), 1);
    assert_eq!(g.nodes().len(), 2);

    let conv = &m.nodes[g.nodes()[0]];
    assert_eq!(conv.name.as_deref(), Some("conv0"));
    match &conv.op {
        Op::Conv {
            kernel_shape, pads, ..
        } => {
            assert_eq!(kernel_shape.as_deref(), Some(&[3, 3][..]));
            assert_eq!(pads.as_deref(), Some(&[1, 1, 1, 1][..]));
        }
        other => panic!("expected Conv, got {other:?}"),
    }
    // The weight is a constant whose bytes point into the decoded buffer (no copy).
    let w = conv.inputs[1].unwrap();
    let ValueDef::Const(wc) = m.values[w].def else {
        panic!("w is not a constant")
    };
    let Storage::Inline(wb) = &m.consts[wc].storage else {
        panic!("w is not inline")
    };
    let range = buf.as_ptr() as usize..buf.as_ptr() as usize + buf.len();
    assert!(
        range.contains(&(wb.as_ptr() as usize)),
        "raw_data was copied"
    );
    assert_eq!(m.consts[wc].shape, vec![1, 2, 3, 3]);
    // float_data is packed little-endian.
    let b = conv.inputs[2].unwrap();
    let ValueDef::Const(bc) = m.values[b].def else {
        panic!("b is not a constant")
    };
    assert_eq!(m.consts[bc].raw_bytes(), Some(&0.25f32.to_le_bytes()[..]));

    let relu = &m.nodes[g.nodes()[1]];
    assert!(matches!(relu.op, Op::Relu {}));
    assert_eq!(relu.name, None);
    assert_eq!(relu.inputs[0], conv.outputs[0]);
    let y = relu.outputs[0].unwrap();
    assert_eq!(g.outputs, vec![y]);
    let batch = m.find_symbol("batch").unwrap();
    assert_eq!(
        m.value_type(y).shape().unwrap(),
        &[Dim::sym(batch), Dim::known(1), Dim::known(4), Dim::known(4)]
    );
}

#[test]
fn input_with_initializer_has_default() {
    let g = GraphProto {
        name: s("g"),
        input: vec![vi("x", tensor_type(1, &[D::N(2)])), untyped("bias")],
        output: vec![vi("y", tensor_type(1, &[D::N(2)]))],
        initializer: vec![f32_raw("bias", &[2], &[1.0, 2.0])],
        node: vec![node("Add", "add", &["x", "bias"], &["y"])],
        ..Default::default()
    };
    let m = load(&model(g, 17)).unwrap();
    let graph = &m.graphs[m.entries[0].graph];
    assert_eq!(graph.inputs.len(), 2);
    let bias = graph.inputs[1];
    let ValueDef::Input {
        index,
        default: Some(c),
        ..
    } = m.values[bias].def
    else {
        panic!("bias has no default: {:?}", m.values[bias].def)
    };
    assert_eq!(index, 1);
    assert_eq!(m.consts[c].name.as_deref(), Some("bias"));
    // The untyped input takes the initializer's type.
    assert_eq!(
        m.value_type(bias),
        &Type::tensor(DType::F32, vec![Dim::known(2)])
    );
}

#[test]
fn unsorted_nodes_are_sorted() {
    let mut g = conv_relu();
    g.node.reverse();
    let m = load(&model(g, 17)).unwrap();
    let gid = m.entries[0].graph;
    assert_eq!(names(&m, gid), vec!["conv0".to_owned(), String::new()]);
}

#[test]
fn cycle_is_an_error() {
    let g = GraphProto {
        name: s("g"),
        input: vec![vi("x", tensor_type(1, &[D::N(2)]))],
        output: vec![vi("y", tensor_type(1, &[D::N(2)]))],
        node: vec![
            node("Add", "a", &["x", "q"], &["p"]),
            node("Relu", "b", &["p"], &["q"]),
            node("Relu", "c", &["p"], &["y"]),
        ],
        ..Default::default()
    };
    let e = load_err(&model(g, 17));
    assert_eq!(e.kind, LoadErrorKind::Cycle, "{e}");
    let node = e.node.clone().unwrap();
    assert!(node == "a" || node == "b", "{e}");
    assert!(
        e.to_string().contains("a -> b") || e.to_string().contains("b -> a"),
        "{e}"
    );
}

#[test]
fn dangling_input_is_an_error() {
    let g = GraphProto {
        name: s("g"),
        input: vec![vi("x", tensor_type(1, &[D::N(2)]))],
        output: vec![vi("y", tensor_type(1, &[D::N(2)]))],
        node: vec![node("Add", "", &["x", "nowhere"], &["y"])],
        ..Default::default()
    };
    let e = load_err(&model(g, 17));
    assert_eq!(e.kind, LoadErrorKind::DanglingInput);
    assert_eq!(e.node.as_deref(), Some("Add#0"));
    assert_eq!(
        e.to_string(),
        "test.onnx: node 'Add#0': input 'nowhere' is never defined"
    );
}

#[test]
fn duplicate_names_are_errors() {
    let g = GraphProto {
        name: s("g"),
        input: vec![vi("x", tensor_type(1, &[D::N(2)]))],
        output: vec![vi("y", tensor_type(1, &[D::N(2)]))],
        node: vec![
            node("Relu", "r1", &["x"], &["y"]),
            node("Neg", "r2", &["x"], &["y"]),
        ],
        ..Default::default()
    };
    let e = load_err(&model(g, 17));
    assert_eq!(e.kind, LoadErrorKind::DuplicateName);
    assert_eq!(e.node.as_deref(), Some("r2"));
    assert!(e.message.contains("'y'") && e.message.contains("r1"), "{e}");

    // A node output that redefines a graph input.
    let g = GraphProto {
        name: s("g"),
        input: vec![vi("x", tensor_type(1, &[D::N(2)]))],
        output: vec![vi("x", tensor_type(1, &[D::N(2)]))],
        node: vec![node("Relu", "r", &["x"], &["x"])],
        ..Default::default()
    };
    assert_eq!(load_err(&model(g, 17)).kind, LoadErrorKind::DuplicateName);
}

#[test]
fn if_branch_uses_outer_value() {
    let then_g = GraphProto {
        name: s("then"),
        output: vec![untyped("t")],
        node: vec![node("Add", "inner_add", &["x", "x"], &["t"])],
        ..Default::default()
    };
    let else_g = GraphProto {
        name: s("else"),
        output: vec![untyped("e")],
        node: vec![node("Identity", "inner_id", &["x"], &["e"])],
        ..Default::default()
    };
    let mut iff = node("If", "if", &["cond"], &["y"]);
    iff.attribute = vec![
        graph_attr("then_branch", then_g),
        graph_attr("else_branch", else_g),
    ];
    // `x` is produced after the If in the source list; the outer-scope use must order it first.
    let g = GraphProto {
        name: s("g"),
        input: vec![
            vi("cond", tensor_type(9, &[])),
            vi("x0", tensor_type(1, &[D::N(2)])),
        ],
        output: vec![vi("y", tensor_type(1, &[D::N(2)]))],
        node: vec![iff, node("Neg", "neg", &["x0"], &["x"])],
        ..Default::default()
    };
    let m = load(&model(g, 17)).unwrap();
    let gid = m.entries[0].graph;
    assert_eq!(names(&m, gid), vec!["neg".to_owned(), "if".to_owned()]);
    let neg = m.graphs[gid].nodes()[0];
    let if_node = m.graphs[gid].nodes()[1];
    let x = m.nodes[neg].outputs[0].unwrap();
    let Op::If {
        then_branch: Some(tb),
        else_branch: Some(eb),
    } = m.nodes[if_node].op
    else {
        panic!("not a typed If: {:?}", m.nodes[if_node].op)
    };
    assert_eq!(m.graphs[tb].parent, Some(if_node));
    assert_eq!(m.graphs[eb].parent, Some(if_node));
    let add = m.graphs[tb].nodes()[0];
    assert_eq!(m.nodes[add].inputs, vec![Some(x), Some(x)]);
    assert_eq!(m.nodes[add].graph, tb);
    assert_eq!(m.graph_tree(gid), vec![gid, tb, eb]);
}

#[test]
fn dim_param_expressions() {
    let g = GraphProto {
        name: s("g"),
        input: vec![
            vi(
                "kv",
                tensor_type(1, &[D::P("batch"), D::P("past_seq + seq")]),
            ),
            vi("img", tensor_type(1, &[D::P("16*h_patches"), D::N(-1)])),
            vi("odd", tensor_type(1, &[D::P("unk__0.x"), D::P("")])),
            vi(
                "paddle",
                tensor_type(1, &[D::P("?"), D::P("?"), D::P(" ? "), D::P("-1")]),
            ),
        ],
        output: vec![untyped("kv")],
        ..Default::default()
    };
    let mut m = load(&model(g, 17)).unwrap();
    let inputs = m.graphs[m.entries[0].graph].inputs.clone();
    let past = m.symbol("past_seq");
    let seq = m.symbol("seq");
    let hp = m.symbol("h_patches");
    let unk = m.find_symbol("unk__0.x").expect("whole-text symbol");
    assert!(
        m.find_symbol("unk__0").is_none(),
        "stray symbol from a failed parse"
    );
    let kv = m.value_type(inputs[0]).shape().unwrap().to_vec();
    assert_eq!(
        kv[1],
        Dim::Expr(
            DimExpr::sym(past)
                .add(&DimExpr::sym(seq))
                .expect("no overflow")
        )
    );
    let img = m.value_type(inputs[1]).shape().unwrap().to_vec();
    assert_eq!(
        img[0],
        Dim::Expr(DimExpr::sym(hp).scale(16).expect("no overflow"))
    );
    assert_eq!(img[1], Dim::Unknown);
    let odd = m.value_type(inputs[2]).shape().unwrap().to_vec();
    assert_eq!(odd, vec![Dim::sym(unk), Dim::Unknown]);
    // paddle2onnx's "?": every occurrence its own unknown, never one shared symbol
    let paddle = m.value_type(inputs[3]).shape().unwrap().to_vec();
    assert_eq!(paddle, vec![Dim::Unknown; 4]);
    assert!(m.find_symbol("?").is_none());
}

#[test]
fn typed_fields_pack_like_raw_data() {
    let t = |name: &str, dtype: i32, dims: &[i64], i32s: &[i32]| TensorProto {
        name: s(name),
        dims: dims.to_vec(),
        data_type: Some(dtype),
        int32_data: i32s.to_vec(),
        ..Default::default()
    };
    let g = GraphProto {
        name: s("g"),
        initializer: vec![
            // int4 [1, 2, -3]: two per int32_data entry, low nibble first.
            t("i4", 22, &[3], &[0x21, 0x0d]),
            // uint4 written one element per entry by a lenient writer.
            t("u4", 21, &[3], &[1, 2, 15]),
            // f16 1.0 and -2.0 as bit patterns.
            t("f16", 10, &[2], &[0x3c00, 0xc000]),
            t("bool", 9, &[2], &[1, 0]),
            TensorProto {
                name: s("u32"),
                dims: vec![2],
                data_type: Some(12),
                uint64_data: vec![7, 0xffff_ffff],
                ..Default::default()
            },
            TensorProto {
                name: s("i64"),
                dims: vec![1],
                data_type: Some(7),
                int64_data: vec![-2],
                ..Default::default()
            },
            TensorProto {
                name: s("str"),
                dims: vec![2],
                data_type: Some(8),
                string_data: vec![b"ab".to_vec(), b"c".to_vec()],
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let m = load(&model(g, 21)).unwrap();
    let by_name = |n: &str| {
        m.consts
            .iter()
            .find(|(_, c)| c.name.as_deref() == Some(n))
            .map(|(_, c)| c)
            .unwrap()
    };
    assert_eq!(by_name("i4").dtype, DType::I4);
    assert_eq!(by_name("i4").raw_bytes(), Some(&[0x21, 0x0d][..]));
    assert_eq!(by_name("u4").raw_bytes(), Some(&[0x21, 0x0f][..]));
    assert_eq!(
        by_name("f16").raw_bytes(),
        Some(&[0x00, 0x3c, 0x00, 0xc0][..])
    );
    assert_eq!(by_name("bool").raw_bytes(), Some(&[1, 0][..]));
    assert_eq!(
        by_name("u32").raw_bytes(),
        Some(&[7, 0, 0, 0, 0xff, 0xff, 0xff, 0xff][..])
    );
    assert_eq!(by_name("i64").raw_bytes(), Some(&(-2i64).to_le_bytes()[..]));
    let Storage::Strings(strs) = &by_name("str").storage else {
        panic!("not strings")
    };
    assert_eq!(
        strs,
        &vec![Bytes::from_static(b"ab"), Bytes::from_static(b"c")]
    );
}

#[test]
fn wrong_data_size_is_an_error() {
    let mut t = f32_raw("w", &[3], &[1.0, 2.0]);
    t.dims = vec![3];
    let g = GraphProto {
        name: s("g"),
        initializer: vec![t],
        ..Default::default()
    };
    let e = load_err(&model(g, 17));
    assert_eq!(e.kind, LoadErrorKind::Invalid);
    assert!(
        e.message.contains("'w'") && e.message.contains("12 bytes"),
        "{e}"
    );
}

#[test]
fn unknown_dtype_names_the_tensor() {
    let g = GraphProto {
        name: s("g"),
        initializer: vec![TensorProto {
            name: s("weird"),
            dims: vec![1],
            data_type: Some(99),
            raw_data: Some(Bytes::from_static(&[0])),
            ..Default::default()
        }],
        ..Default::default()
    };
    let e = load_err(&model(g, 17));
    assert_eq!(e.kind, LoadErrorKind::UnknownDType);
    assert!(
        e.message.contains("'weird'") && e.message.contains("99"),
        "{e}"
    );

    let g = GraphProto {
        name: s("g"),
        input: vec![vi("x", tensor_type(77, &[D::N(1)]))],
        ..Default::default()
    };
    let e = load_err(&model(g, 17));
    assert_eq!(e.kind, LoadErrorKind::UnknownDType);
    assert!(e.message.contains("'x'"), "{e}");
}

#[test]
fn sparse_initializer_is_densified() {
    let sparse = |indices: TensorProto| SparseTensorProto {
        values: Some(f32_raw("sp", &[2], &[5.0, 7.0])),
        indices: Some(indices),
        dims: vec![2, 3],
    };
    let i64s = |dims: &[i64], v: &[i64]| TensorProto {
        dims: dims.to_vec(),
        data_type: Some(7),
        int64_data: v.to_vec(),
        ..Default::default()
    };
    let mut expected = [0f32; 6];
    expected[1] = 5.0;
    expected[5] = 7.0;
    let expected: Vec<u8> = expected.iter().flat_map(|v| v.to_le_bytes()).collect();
    for indices in [i64s(&[2], &[1, 5]), i64s(&[2, 2], &[0, 1, 1, 2])] {
        let g = GraphProto {
            name: s("g"),
            sparse_initializer: vec![sparse(indices)],
            output: vec![untyped("sp")],
            ..Default::default()
        };
        let m = load(&model(g, 17)).unwrap();
        let out = m.graphs[m.entries[0].graph].outputs[0];
        let ValueDef::Const(c) = m.values[out].def else {
            panic!("not a constant")
        };
        assert_eq!(m.consts[c].shape, vec![2, 3]);
        assert_eq!(m.consts[c].raw_bytes(), Some(&expected[..]));
    }
}

#[test]
fn attributes_of_every_kind_keep_order() {
    let mut n = node("Foo", "foo", &["x"], &["y", ""]);
    n.domain = s("com.example");
    n.attribute = vec![
        AttributeProto {
            name: s("s"),
            r#type: Some(AttributeType::String as i32),
            s: Some(b"hi".to_vec()),
            ..Default::default()
        },
        ints("is", &[1, 2]),
        AttributeProto {
            name: s("f"),
            r#type: Some(AttributeType::Float as i32),
            f: Some(0.5),
            ..Default::default()
        },
        AttributeProto {
            name: s("t"),
            r#type: Some(AttributeType::Tensor as i32),
            t: Some(f32_raw("", &[1], &[3.0])),
            ..Default::default()
        },
        AttributeProto {
            name: s("tp"),
            r#type: Some(AttributeType::TypeProto as i32),
            tp: Some(tensor_type(7, &[D::P("n")])),
            ..Default::default()
        },
        // No type field: inferred from the value that is set.
        AttributeProto {
            name: s("legacy"),
            i: Some(4),
            ..Default::default()
        },
    ];
    let g = GraphProto {
        name: s("g"),
        input: vec![vi("x", tensor_type(1, &[D::N(1)]))],
        output: vec![untyped("y")],
        node: vec![n],
        ..Default::default()
    };
    let mut mp = model(g, 17);
    mp.opset_import.push(OperatorSetIdProto {
        domain: s("com.example"),
        version: Some(1),
    });
    let mut m = load(&mp).unwrap();
    let nid = m.graphs[m.entries[0].graph].nodes()[0];
    let Op::Custom(c) = m.nodes[nid].op.clone() else {
        panic!("not custom")
    };
    assert_eq!(c.domain, "com.example");
    assert_eq!(c.op_type, "Foo");
    let keys: Vec<&str> = c.attrs.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["s", "is", "f", "t", "tp", "legacy"]);
    assert_eq!(c.attrs[0].1, Attr::String("hi".into()));
    assert_eq!(c.attrs[1].1, Attr::Ints(vec![1, 2]));
    assert_eq!(c.attrs[2].1, Attr::Float(0.5));
    let Attr::Tensor(t) = c.attrs[3].1 else {
        panic!("not a tensor")
    };
    assert_eq!(m.consts[t].raw_bytes(), Some(&3.0f32.to_le_bytes()[..]));
    assert!(m.const_value(t).is_none());
    let n_sym = m.symbol("n");
    assert_eq!(
        c.attrs[4].1,
        Attr::Type(Type::tensor(DType::I64, vec![Dim::sym(n_sym)]))
    );
    assert_eq!(c.attrs[5].1, Attr::Int(4));
    assert_eq!(m.nodes[nid].outputs.len(), 2);
    assert!(m.nodes[nid].outputs[1].is_none());
}

#[test]
fn constant_node_keeps_its_tensor() {
    let mut n = node("Constant", "k", &[], &["y"]);
    n.attribute = vec![AttributeProto {
        name: s("value"),
        r#type: Some(AttributeType::Tensor as i32),
        t: Some(f32_raw("kt", &[2], &[1.0, 2.0])),
        ..Default::default()
    }];
    let g = GraphProto {
        name: s("g"),
        output: vec![vi("y", tensor_type(1, &[D::N(2)]))],
        node: vec![n],
        ..Default::default()
    };
    let m = load(&model(g, 17)).unwrap();
    let nid = m.graphs[m.entries[0].graph].nodes()[0];
    let Op::Constant { value: Some(c), .. } = m.nodes[nid].op else {
        panic!("not a typed Constant: {:?}", m.nodes[nid].op)
    };
    assert_eq!(m.consts[c].name.as_deref(), Some("kt"));
    assert_eq!(m.consts[c].shape, vec![2]);
}

#[test]
fn opset_and_ir_version_limits() {
    let e = load_err(&model(conv_relu(), 30));
    assert_eq!(e.kind, LoadErrorKind::UnsupportedOpset);
    assert!(e.message.contains("opset 30"), "{e}");
    // Old opsets load; attributes that do not fit the typed op keep the node as a custom op.
    let mut g = conv_relu();
    g.node[1].attribute.push(ints("consumed_inputs", &[0]));
    let m = load(&model(g, 1)).unwrap();
    let relu = m.graphs[m.entries[0].graph].nodes()[1];
    assert!(m.nodes[relu].op.is_custom());
    let mut mp = model(conv_relu(), 17);
    mp.ir_version = Some(2);
    assert_eq!(load_err(&mp).kind, LoadErrorKind::UnsupportedOpset);
}

#[test]
fn model_functions_are_kept() {
    use mmq_onnx::proto::onnx::FunctionProto;
    let mut mp = model(conv_relu(), 17);
    let f = FunctionProto {
        name: s("MyFn"),
        domain: s("local"),
        node: vec![node("Relu", "", &["a"], &["b"])],
        input: vec!["a".into()],
        output: vec!["b".into()],
        ..Default::default()
    };
    mp.functions.push(f.clone());
    let m = load(&mp).unwrap();
    let kept = &m.entries[0].model.functions;
    assert_eq!(kept.len(), 1);
    assert_eq!(FunctionProto::decode(kept[0].clone()).unwrap(), f);
}

// ---- files ----

fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn external(
    name: &str,
    location: &str,
    offset: u64,
    len: Option<u64>,
    dims: &[i64],
) -> TensorProto {
    let mut ext = vec![
        StringStringEntryProto {
            key: s("location"),
            value: s(location),
        },
        StringStringEntryProto {
            key: s("offset"),
            value: Some(offset.to_string()),
        },
    ];
    if let Some(len) = len {
        ext.push(StringStringEntryProto {
            key: s("length"),
            value: Some(len.to_string()),
        });
    }
    TensorProto {
        name: s(name),
        dims: dims.to_vec(),
        data_type: Some(1),
        data_location: Some(1),
        external_data: ext,
        ..Default::default()
    }
}

fn ext_model(tensors: Vec<TensorProto>) -> ModelProto {
    let outputs = tensors.iter().map(|t| untyped(t.name())).collect();
    model(
        GraphProto {
            name: s("g"),
            initializer: tensors,
            output: outputs,
            ..Default::default()
        },
        17,
    )
}

#[test]
fn external_data_is_mapped_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let mut data = vec![0u8; 4096];
    data.extend([1.0f32, 2.0, 3.0].iter().flat_map(|v| v.to_le_bytes()));
    data.extend(4.0f32.to_le_bytes());
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    write(&dir.path().join("sub"), "w.bin", &data);
    let mp = ext_model(vec![
        external("a", "sub/w.bin", 4096, Some(12), &[3]),
        external("b", "./sub/w.bin", 4108, None, &[1]),
    ]);
    let path = write(dir.path(), "m.onnx", &mp.encode_to_vec());
    let m = load_files(&[&path], &opts()).unwrap();
    assert_eq!(m.entries[0].model.source.as_deref(), Some(path.as_path()));
    let consts: Vec<_> = m.consts.iter().map(|(_, c)| c).collect();
    let (
        Storage::External {
            file: fa,
            offset,
            len,
        },
        Storage::External { file: fb, .. },
    ) = (&consts[0].storage, &consts[1].storage)
    else {
        panic!("not external")
    };
    assert_eq!((*offset, *len), (4096, 12));
    assert!(Arc::ptr_eq(fa, fb), "one map per file");
    assert_eq!(fa.location, "sub/w.bin");
    assert_eq!(consts[0].raw_bytes(), Some(&data[4096..4108]));
    assert_eq!(consts[1].raw_bytes(), Some(&4.0f32.to_le_bytes()[..]));
}

#[test]
fn external_data_errors() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "short.bin", &[0u8; 10]);
    let cases: Vec<(TensorProto, &[&str])> = vec![
        (
            external("w", "short.bin", 4, None, &[3]),
            &["'w'", "short.bin", "10 bytes", "4..16"],
        ),
        (
            external("w", "missing.bin", 0, None, &[3]),
            &["'w'", "missing.bin"],
        ),
        (
            external("w", "../escape.bin", 0, None, &[3]),
            &["'w'", "../escape.bin"],
        ),
        (
            external("w", "/etc/passwd", 0, None, &[3]),
            &["'w'", "/etc/passwd"],
        ),
        (
            external("w", "short.bin", 0, Some(8), &[3]),
            &["'w'", "length 8"],
        ),
    ];
    for (i, (t, needles)) in cases.into_iter().enumerate() {
        let path = write(
            dir.path(),
            &format!("m{i}.onnx"),
            &ext_model(vec![t]).encode_to_vec(),
        );
        let e = load_files(&[&path], &opts()).unwrap_err();
        assert_eq!(e.kind, LoadErrorKind::ExternalData, "{e}");
        assert_eq!(e.file.as_deref(), Some(path.as_path()));
        for n in needles {
            assert!(e.message.contains(n), "{e} lacks {n}");
        }
    }
    // No directory to resolve against.
    let e = load(&ext_model(vec![external("w", "short.bin", 0, None, &[1])])).unwrap_err();
    assert_eq!(e.kind, LoadErrorKind::ExternalData);
}

#[test]
fn truncated_and_foreign_files() {
    let dir = tempfile::tempdir().unwrap();
    let full = model(conv_relu(), 17).encode_to_vec();
    let cut = &full[..full.len() - 20];
    let path = write(dir.path(), "cut.onnx", cut);
    let e = load_files(&[&path], &opts()).unwrap_err();
    assert_eq!(e.kind, LoadErrorKind::Truncated, "{e}");
    assert_eq!(e.offset, Some(cut.len() as u64));
    assert!(
        e.to_string()
            .starts_with(&format!("{}: truncated", path.display())),
        "{e}"
    );
    assert!(
        e.to_string().ends_with(&format!("(at byte {})", cut.len())),
        "{e}"
    );

    for (name, bytes) in [
        ("text.onnx", &b"just some text, not a model\n"[..]),
        ("png.onnx", &b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR"[..]),
        ("empty.onnx", &b""[..]),
    ] {
        let path = write(dir.path(), name, bytes);
        let e = load_files(&[&path], &opts()).unwrap_err();
        assert_eq!(e.kind, LoadErrorKind::NotOnnx, "{name}: {e}");
    }

    let e = load_files(&[&dir.path().join("absent.onnx")], &opts()).unwrap_err();
    assert_eq!(e.kind, LoadErrorKind::Io);
}

#[test]
fn several_files_share_symbols() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(
        dir.path(),
        "vision.onnx",
        &model(conv_relu(), 17).encode_to_vec(),
    );
    let mut g = conv_relu();
    g.name = None;
    let b = write(dir.path(), "decoder.onnx", &model(g, 18).encode_to_vec());
    let m = load_files(&[&a, &b], &opts()).unwrap();
    assert_eq!(m.entries.len(), 2);
    assert_eq!(m.symbols.len(), 1);
    assert_eq!(m.graphs[m.entries[1].graph].name, "decoder");
    assert_eq!(m.entries[1].model.opset(""), Some(18));
    let x0 = m.graphs[m.entries[0].graph].inputs[0];
    let x1 = m.graphs[m.entries[1].graph].inputs[0];
    assert_eq!(m.value_type(x0), m.value_type(x1));
}
