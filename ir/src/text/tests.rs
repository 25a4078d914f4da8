//! Tests of the `.mmir` printer and parser: round trips, canonical order, error diagnostics
//! (snapshots), robustness on malformed input, and the examples of `docs/ir-text.md`.

use bytes::Bytes;
use codespan_reporting::files::SimpleFiles;
use codespan_reporting::term::{self, Config};

use super::*;
use crate::attr::Attr;
use crate::constant::{ConstData, Storage};
use crate::dim::{Dim, DimExpr};
use crate::dtype::DType;
use crate::module::{Entry, Link, ModelInfo, Value, ValueDef};
use crate::op::{CustomOp, Op};
use crate::types::{TensorType, Type};

fn f32s(v: &[f32]) -> Storage {
    Storage::Inline(Bytes::from(
        v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>(),
    ))
}

fn i64s(v: &[i64]) -> Storage {
    Storage::Inline(Bytes::from(
        v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>(),
    ))
}

fn t(dtype: DType, dims: Vec<Dim>) -> Type {
    Type::tensor(dtype, dims)
}

fn k(n: i64) -> Dim {
    Dim::known(n)
}

/// Asserts the round-trip laws for `m`: the parsed text equals `canonicalize(m)` and prints
/// the same text again. Returns the text.
#[track_caller]
fn round_trip(m: &Module) -> String {
    let text = print(m);
    let (parsed, _) = match parse(&text) {
        Ok(p) => p,
        Err(errors) => panic!("{}\n---\n{}", render_all(&text, &errors), text),
    };
    let canon = canonicalize(m);
    assert!(
        parsed == canon,
        "parse(print(m)) != canonicalize(m)\n{text}"
    );
    assert_eq!(
        print(&parsed),
        text,
        "printing the parsed module changed the text"
    );
    assert!(
        canonicalize(&canon) == canon,
        "canonicalize is not idempotent"
    );
    text
}

fn render_all(src: &str, errors: &[ParseError]) -> String {
    let mut files = SimpleFiles::new();
    let file = files.add("input.mmir", src.to_owned());
    errors
        .iter()
        .map(|e| {
            term::emit_into_string(&Config::default(), &files, &to_diagnostic(e, file))
                .unwrap_or_else(|err| format!("cannot render: {err}"))
        })
        .collect()
}

/// The rendered diagnostics of parsing `src`, which must fail.
#[track_caller]
fn errors_of(src: &str) -> String {
    match parse(src) {
        Ok(_) => panic!("expected errors for:\n{src}"),
        Err(errors) => render_all(src, &errors),
    }
}

/// A module that uses every construct of the format, built in canonical order.
fn everything() -> Module {
    let mut m = Module::new();
    let batch = m.symbol("batch");
    let seq = m.symbol("seq");
    let h = m.symbol("h");
    let w = m.symbol("w");
    let odd = m.symbol("unk__0 dim");
    m.symbols[batch].min = Some(1);
    m.symbols[batch].max = Some(64);
    m.symbols[seq].min = Some(1);
    m.symbols[h].max = Some(1024);
    let e = |s| DimExpr::sym(s);
    let patches = e(h)
        .floor_div(16)
        .and_then(|a| a.mul(&e(w).floor_div(16)?))
        .and_then(|a| a.add(&DimExpr::constant(1)))
        .expect("valid dim");
    let neg_half = e(seq)
        .floor_div(2)
        .and_then(|h| h.scale(-1))
        .and_then(|h| h.add(&e(seq)))
        .expect("valid dim");

    // Constants: inline f32 / i64 / bool / f16 (bytes) / strings, a large one (hash), an
    // attribute-only tensor, one without a name, and a repeated name.
    let wv = m.add_const(ConstData::new(
        Some("w".into()),
        DType::F32,
        vec![2, 2],
        f32s(&[1.0, -0.5, 1e-7, f32::INFINITY]),
    ));
    let shape_c = m.add_const(ConstData::new(
        Some("shape".into()),
        DType::I64,
        vec![2],
        i64s(&[-1, 768]),
    ));
    let mask = m.add_const(ConstData::new(
        Some("mask".into()),
        DType::Bool,
        vec![3],
        Storage::Inline(Bytes::from_static(&[1, 0, 1])),
    ));
    let half = m.add_const(ConstData::new(
        Some("half".into()),
        DType::F16,
        vec![2],
        Storage::Inline(Bytes::from_static(&[0x00, 0x3c, 0x00, 0xc0])),
    ));
    let _labels = m.add_const(ConstData::new(
        Some("labels".into()),
        DType::String,
        vec![2],
        Storage::Strings(vec![
            Bytes::from_static(b"cat \"quoted\""),
            Bytes::from_static(b"\xffraw\n"),
        ]),
    ));
    let big = m.add_const(ConstData::new(
        Some("model.layers.0/attn:weight".into()),
        DType::F32,
        vec![8, 8],
        f32s(&[0.25; 64]),
    ));
    let fill = m.add_attr_const(ConstData::new(
        Some("fill".into()),
        DType::F32,
        vec![1],
        f32s(&[0.0]),
    ));
    let _anon = m.add_const(ConstData::new(None, DType::I64, vec![], i64s(&[7])));
    let dup_a = m.add_const(ConstData::new(
        Some("dup".into()),
        DType::I64,
        vec![1],
        i64s(&[1]),
    ));
    let dup_b = m.add_const(ConstData::new(
        Some("dup".into()),
        DType::I64,
        vec![1],
        i64s(&[2]),
    ));
    let absent = m.add_const(
        ConstData::new(
            Some("absent".into()),
            DType::I8,
            vec![4096],
            Storage::Absent,
        )
        .with_hash(0x0123_4567_89ab),
    );
    let c = |v: Value, m: &Module| match m.values[v].def {
        ValueDef::Const(c) => c,
        _ => unreachable!(),
    };
    let shape_const = c(shape_c, &m);
    let fill_tensors = vec![fill, c(big, &m)];

    // Entry 1: a vision-like graph with every type spelling and a control-flow node.
    let g = m.add_graph("vision", None);
    let x = m.add_input(
        g,
        Some("pixel values".into()),
        t(
            DType::F32,
            vec![Dim::sym(batch), k(3), Dim::sym(h), Dim::sym(w)],
        ),
    );
    let flag = m.add_input(g, Some("flag".into()), t(DType::Bool, vec![]));
    let anyv = m.add_input(g, None, Type::Unknown);
    let opt = m.add_input(
        g,
        Some("opt".into()),
        Type::Optional(Box::new(Type::Sequence(Box::new(Type::Tensor(
            TensorType {
                dtype: None,
                shape: None,
            },
        ))))),
    );
    let mp = m.add_input(
        g,
        Some("map".into()),
        Type::Map(
            DType::I64,
            Box::new(Type::SparseTensor(TensorType {
                dtype: Some(DType::F32),
                shape: Some(vec![Dim::Unknown, k(4)]),
            })),
        ),
    );
    let with_default = m.add_input(g, Some("scale".into()), t(DType::F32, vec![k(2), k(2)]));
    let w_const = c(wv, &m);
    if let ValueDef::Input { default, .. } = &mut m.values[with_default].def {
        *default = Some(w_const);
    }
    m.graphs[g].doc = "vision \"encoder\"".into();
    let conv = m.add_node(
        g,
        Op::Conv {
            auto_pad: None,
            dilations: None,
            group: Some(1),
            kernel_shape: Some(vec![16, 16]),
            pads: Some(vec![0, 0, 0, 0]),
            strides: Some(vec![16, 16]),
        },
        vec![Some(x), Some(wv), None],
        vec![Some((
            Some("patches".into()),
            t(
                DType::F32,
                vec![Dim::sym(batch), k(768), Dim::Expr(patches.clone())],
            ),
        ))],
        Some("/embeddings/patch_embeddings/Conv".into()),
    );
    let patches_v = m.nodes[conv].outputs[0].expect("output");
    let resh = m.add_node(
        g,
        Op::Reshape { allowzero: None },
        vec![Some(patches_v), Some(shape_c)],
        vec![Some((
            None,
            t(DType::F32, vec![Dim::Expr(neg_half.clone()), k(768)]),
        ))],
        None,
    );
    let r = m.nodes[resh].outputs[0].expect("output");
    // Subgraphs of an If, each referring to outer-scope values (%r, %flag, $w).
    let then_g = m.add_graph("then", None);
    let tn = m.add_node(
        then_g,
        Op::Relu {},
        vec![Some(r)],
        vec![Some((
            Some("t".into()),
            t(DType::F32, vec![Dim::Unknown, k(768)]),
        ))],
        None,
    );
    let tv = m.nodes[tn].outputs[0].expect("output");
    m.graphs[then_g].outputs = vec![tv];
    let else_g = m.add_graph("else", None);
    let en = m.add_node(
        else_g,
        Op::Add {},
        vec![Some(r), Some(wv)],
        vec![Some((
            Some("t".into()),
            t(DType::F32, vec![Dim::Unknown, k(768)]),
        ))],
        Some(String::new()),
    );
    let ev = m.nodes[en].outputs[0].expect("output");
    m.graphs[else_g].outputs = vec![ev];
    let iff = m.add_node(
        g,
        Op::If {
            then_branch: Some(then_g),
            else_branch: Some(else_g),
        },
        vec![Some(flag)],
        vec![Some((
            Some("chosen".into()),
            t(DType::F32, vec![Dim::Unknown, k(768)]),
        ))],
        Some("if".into()),
    );
    m.graphs[then_g].parent = Some(iff);
    m.graphs[else_g].parent = Some(iff);
    let chosen = m.nodes[iff].outputs[0].expect("output");
    // A custom op with every attribute kind, and a nested graph list.
    let body = m.add_graph("body", None);
    let bi = m.add_input(body, Some("i".into()), t(DType::I64, vec![]));
    let bn = m.add_node(
        body,
        Op::Identity {},
        vec![Some(bi)],
        vec![Some((None, t(DType::I64, vec![])))],
        None,
    );
    let bo = m.nodes[bn].outputs[0].expect("output");
    m.graphs[body].outputs = vec![bo];
    let cattrs = vec![
        ("num_heads".to_owned(), Attr::Int(-12)),
        ("scale".to_owned(), Attr::Float(0.125)),
        ("eps".to_owned(), Attr::Float(1e-6)),
        ("neg_zero".to_owned(), Attr::Float(-0.0)),
        ("big".to_owned(), Attr::Float(f32::MAX)),
        ("tiny".to_owned(), Attr::Float(f32::from_bits(1))),
        ("ninf".to_owned(), Attr::Float(f32::NEG_INFINITY)),
        ("mode".to_owned(), Attr::String("a \"b\"\\ \t\u{1}é".into())),
        ("weird name".to_owned(), Attr::Tensor(fill)),
        ("g".to_owned(), Attr::Graphs(vec![body])),
        (
            "ty".to_owned(),
            Attr::Type(t(DType::F16, vec![Dim::sym(odd)])),
        ),
        (
            "ints".to_owned(),
            Attr::Ints(vec![1, -2, i64::MIN, i64::MAX]),
        ),
        ("floats".to_owned(), Attr::Floats(vec![1.0, 2.5, -3.0e38])),
        (
            "strings".to_owned(),
            Attr::Strings(vec!["x".into(), String::new()]),
        ),
        ("tensors".to_owned(), Attr::Tensors(fill_tensors)),
        ("types".to_owned(), Attr::Types(vec![Type::Unknown])),
        ("no_ints".to_owned(), Attr::Ints(vec![])),
        ("no_floats".to_owned(), Attr::Floats(vec![])),
        ("no_strings".to_owned(), Attr::Strings(vec![])),
        ("no_tensors".to_owned(), Attr::Tensors(vec![])),
        ("no_graphs".to_owned(), Attr::Graphs(vec![])),
        ("no_types".to_owned(), Attr::Types(vec![])),
    ];
    let attn = m.add_node(
        g,
        Op::Custom(CustomOp {
            domain: "com.microsoft".into(),
            op_type: "Attention".into(),
            attrs: cattrs,
        }),
        vec![Some(chosen), None, Some(mask), Some(half)],
        vec![
            Some((
                Some("attn".into()),
                t(DType::F32, vec![Dim::sym(batch), Dim::Unknown]),
            )),
            None,
            Some((Some("present".into()), Type::Unknown)),
        ],
        Some("/attn".into()),
    );
    m.graphs[body].parent = Some(attn);
    let attn_out = m.nodes[attn].outputs[0].expect("output");
    // Unmodeled default-domain op, a modeled op written as custom, zero results, a
    // ConstantOfShape with an attribute tensor, and duplicated names.
    let foo = m.add_node(
        g,
        Op::Custom(CustomOp {
            domain: String::new(),
            op_type: "Foo Bar".into(),
            attrs: vec![],
        }),
        vec![Some(anyv), Some(opt), Some(mp)],
        vec![
            Some((Some("dup".into()), Type::Unknown)),
            Some((Some("dup".into()), Type::Unknown)),
        ],
        None,
    );
    let _ = foo;
    m.add_node(
        g,
        Op::Custom(CustomOp {
            domain: String::new(),
            op_type: "Relu".into(),
            attrs: vec![("alpha".into(), Attr::Int(1))],
        }),
        vec![Some(attn_out)],
        vec![],
        None,
    );
    let cos = m.add_node(
        g,
        Op::ConstantOfShape { value: Some(fill) },
        vec![Some(shape_c)],
        vec![Some((
            Some("12".into()),
            t(DType::F32, vec![Dim::Unknown, k(768)]),
        ))],
        None,
    );
    let cos_v = m.nodes[cos].outputs[0].expect("output");
    let _ = (dup_a, dup_b, absent);
    m.graphs[g].outputs = vec![attn_out, cos_v, dup_a];
    let mut model = ModelInfo {
        ir_version: 8,
        opsets: vec![(String::new(), 17), ("com.microsoft".into(), 1)],
        producer_name: "pytorch".into(),
        producer_version: "2.3".into(),
        domain: String::new(),
        model_version: 3,
        doc: "line 1\nline 2".into(),
        metadata: vec![("k".into(), "v".into()), ("k".into(), "v2".into())],
        source: Some("models/vision.onnx".into()),
        functions: vec![Bytes::from_static(&[0x0a, 0x03, b'f', b'o', b'o'])],
    };
    m.entries.push(Entry {
        graph: g,
        model: model.clone(),
    });

    // Entry 2: a decoder fed by entry 1; it reuses value names of entry 1.
    let d = m.add_graph("decoder", None);
    let emb = m.add_input(
        d,
        Some("attn".into()),
        t(DType::F32, vec![Dim::sym(batch), Dim::Unknown]),
    );
    let past = m.add_input(
        d,
        Some("past".into()),
        t(
            DType::F16,
            vec![
                Dim::sym(batch),
                k(8),
                Dim::Expr(e(seq).add(&DimExpr::constant(-1)).expect("no overflow")),
                k(64),
            ],
        ),
    );
    let sm = m.add_node(
        d,
        Op::Softmax { axis: Some(-1) },
        vec![Some(emb)],
        vec![Some((
            Some("probs".into()),
            t(DType::F32, vec![Dim::sym(batch), Dim::Unknown]),
        ))],
        Some("/decoder/Softmax".into()),
    );
    let probs = m.nodes[sm].outputs[0].expect("output");
    m.graphs[d].outputs = vec![probs, past, shape_c];
    model.source = None;
    m.entries.push(Entry {
        graph: d,
        model: ModelInfo::default(),
    });
    m.links.push(Link {
        from: (g, 0),
        to: (d, 0),
    });
    let _ = shape_const;
    m
}

#[test]
fn round_trip_of_every_construct() {
    let m = everything();
    let text = round_trip(&m);
    // Built in canonical order, so the parsed module equals the original exactly.
    let (parsed, spans) = parse(&text).expect("parses");
    assert!(parsed == m);
    // Spans point at the declarations.
    let g = parsed.entries[0].graph;
    let span = spans.get(crate::Entity::Graph(g)).expect("graph span");
    assert_eq!(&text[span], "graph @vision");
    let conv = parsed.graphs[g].nodes[0];
    let span = spans.get(crate::Entity::Node(conv)).expect("node span");
    assert_eq!(&text[span], "%patches = Conv(%\"pixel values\", $w, _)");
    let out = parsed.nodes[conv].outputs[0].expect("result");
    assert_eq!(
        &text[spans.get(crate::Entity::Value(out)).expect("value span")],
        "%patches"
    );
    let s = parsed.find_symbol("h").expect("symbol h");
    assert_eq!(
        &text[spans.get(crate::Entity::Sym(s)).expect("sym span")],
        "h"
    );
}

#[test]
fn print_is_deterministic_and_loc_is_optional() {
    let m = everything();
    assert_eq!(print(&m), print(&m.clone()));
    let opts = PrintOptions {
        loc: false,
        ..PrintOptions::default()
    };
    let text = print_with(&m, &opts);
    assert!(!text.contains("loc("));
    // Without names the module parses, and only node names differ.
    let (parsed, _) = parse(&text).expect("parses");
    let mut expected = m.clone();
    for n in expected.nodes.keys().collect::<Vec<_>>() {
        expected.nodes[n].name = None;
    }
    assert!(parsed == expected);
}

#[test]
fn inline_limit_elides_weights_but_keeps_equality() {
    let m = everything();
    let opts = PrintOptions {
        inline_limit: 0,
        ..PrintOptions::default()
    };
    let text = print_with(&m, &opts);
    assert!(text.contains("const $w : f32[2, 2] = hash(\""), "{text}");
    assert!(
        text.contains("const $labels : string[2] = dense<["),
        "strings stay inline"
    );
    let (parsed, _) = parse(&text).expect("parses");
    assert!(parsed == m, "content hashes keep elided constants equal");
    let c = crate::Const::from_index(0);
    assert!(matches!(parsed.consts[c].storage, Storage::Absent));
}

#[test]
fn floats_round_trip_bit_exactly() {
    let values = [
        0.1f32,
        -0.0,
        f32::MIN_POSITIVE,
        f32::from_bits(1),
        f32::MAX,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7f80_0001),
        f32::from_bits(0xffc0_1234),
        1.0e-6,
        16_777_217.0,
    ];
    let mut m = Module::new();
    let g = m.add_graph("g", None);
    let c = m.add_const(ConstData::new(
        Some("c".into()),
        DType::F32,
        vec![13],
        f32s(&values),
    ));
    let d64: Vec<f64> = vec![0.1, f64::NAN, f64::from_bits(0xfff0_0000_0000_0001), -1e300];
    let c64 = m.add_const(ConstData::new(
        Some("d".into()),
        DType::F64,
        vec![4],
        Storage::Inline(Bytes::from(
            d64.iter()
                .flat_map(|x| x.to_le_bytes())
                .collect::<Vec<u8>>(),
        )),
    ));
    m.add_node(
        g,
        Op::Custom(CustomOp {
            domain: "x".into(),
            op_type: "F".into(),
            attrs: vec![("f".into(), Attr::Floats(values.to_vec()))],
        }),
        vec![Some(c), Some(c64)],
        vec![],
        None,
    );
    m.entries.push(Entry {
        graph: g,
        model: ModelInfo::default(),
    });
    let text = print(&m);
    assert!(text.contains("nan(0x7f800001)"), "{text}");
    let (p, _) = parse(&text).expect("parses");
    assert_eq!(print(&p), text);
    let node = p.graphs[p.entries[0].graph].nodes[0];
    let Some((_, Attr::Floats(back))) = p.nodes[node].op.attrs().into_iter().next() else {
        panic!("floats attribute")
    };
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&back), bits(&values));
    let cd = crate::Const::from_index(0);
    assert_eq!(p.consts[cd].raw_bytes(), m.consts[cd].raw_bytes());
    let cd = crate::Const::from_index(1);
    assert_eq!(p.consts[cd].raw_bytes(), m.consts[cd].raw_bytes());
}

#[test]
fn canonicalize_renumbers_into_print_order() {
    // Built out of order: the subgraph after its parent node, nodes listed in a different order
    // than created, a dead node, an orphan graph, a constant created after the graph.
    let mut m = Module::new();
    let g = m.add_graph("main", None);
    let x = m.add_input(g, Some("x".into()), t(DType::F32, vec![k(3)]));
    let n1 = m.add_node(
        g,
        Op::Relu {},
        vec![Some(x)],
        vec![Some((Some("a".into()), t(DType::F32, vec![k(3)])))],
        None,
    );
    let a = m.nodes[n1].outputs[0].expect("output");
    let _dead = m.add_node(
        g,
        Op::Neg {},
        vec![Some(x)],
        vec![Some((None, t(DType::F32, vec![k(3)])))],
        None,
    );
    let c = m.add_const(ConstData::new(
        Some("one".into()),
        DType::F32,
        vec![3],
        f32s(&[1.0; 3]),
    ));
    let n2 = m.add_node(
        g,
        Op::Add {},
        vec![Some(a), Some(c)],
        vec![Some((Some("b".into()), t(DType::F32, vec![k(3)])))],
        None,
    );
    let b = m.nodes[n2].outputs[0].expect("output");
    let _orphan = m.add_graph("orphan", None);
    let sub = m.add_graph("body", None);
    let sn = m.add_node(
        sub,
        Op::Sqrt {},
        vec![Some(b)],
        vec![Some((Some("s".into()), t(DType::F32, vec![k(3)])))],
        None,
    );
    let s = m.nodes[sn].outputs[0].expect("output");
    m.graphs[sub].outputs = vec![s];
    let cond = m.add_input(g, Some("cond".into()), t(DType::Bool, vec![]));
    let n3 = m.add_node(
        g,
        Op::If {
            then_branch: Some(sub),
            else_branch: None,
        },
        vec![Some(cond)],
        vec![Some((Some("y".into()), t(DType::F32, vec![k(3)])))],
        None,
    );
    m.graphs[sub].parent = Some(n3);
    let y = m.nodes[n3].outputs[0].expect("output");
    m.graphs[g].nodes = vec![n1, n2, n3];
    m.graphs[g].outputs = vec![y];
    m.entries.push(Entry {
        graph: g,
        model: ModelInfo::default(),
    });

    let canon = canonicalize(&m);
    assert!(canon != m);
    round_trip(&m);
    // The canonical module lists the same program: same text, fewer entities.
    assert_eq!(print(&canon), print(&m));
    assert_eq!(canon.nodes.len(), 4);
    assert_eq!(canon.graphs.len(), 2);
    assert_eq!(canon.consts.len(), 1);
    let cg = canon.entries[0].graph;
    let ifn = *canon.graphs[cg].nodes.last().expect("node");
    let Op::If {
        then_branch: Some(tb),
        ..
    } = canon.nodes[ifn].op
    else {
        panic!("If node")
    };
    assert_eq!(canon.graphs[tb].parent, Some(ifn));
    assert_eq!(canon.graphs[tb].name, "body");
}

#[test]
fn external_constants_with_a_data_dir() {
    let dir = std::env::temp_dir().join(format!("mmq-ir-text-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let data: Vec<u8> = (0..64u8).collect();
    std::fs::write(dir.join("w.data"), &data).expect("write data");
    let file = std::sync::Arc::new(
        crate::ExternalFile::open(&dir.join("w.data"), "w.data").expect("open"),
    );
    let mut m = Module::new();
    let c = m.add_const(ConstData::new(
        Some("w".into()),
        DType::F32,
        vec![4, 2],
        Storage::External {
            file,
            offset: 16,
            len: 32,
        },
    ));
    let g = m.add_graph("g", None);
    m.graphs[g].outputs = vec![c];
    m.entries.push(Entry {
        graph: g,
        model: ModelInfo::default(),
    });
    let text = print(&m);
    let hash = m.consts[crate::Const::from_index(0)].short_hash();
    assert!(
        text.contains(&format!(
            "const $w : f32[4, 2] = external(\"w.data\", offset = 16, length = 32, hash = \"{hash}\")"
        )),
        "{text}"
    );
    let opts = ParseOptions {
        data_dir: Some(dir.clone()),
    };
    let (p, _) = parse_with(&text, &opts).expect("parses");
    assert!(p == m);
    assert_eq!(print(&p), text);
    assert_eq!(
        p.consts[crate::Const::from_index(0)].raw_bytes(),
        Some(&data[16..48])
    );
    // Without a data directory only the hash is kept: equal modules, weights absent.
    let (p, _) = parse(&text).expect("parses");
    assert!(p == m);
    assert!(matches!(
        p.consts[crate::Const::from_index(0)].storage,
        Storage::Absent
    ));
    // A range outside the file is an error.
    let bad = text.replace("length = 32", "length = 64");
    let errors = parse_with(&bad, &opts).expect_err("out of range");
    assert!(errors[0].message.contains("outside"), "{:?}", errors);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn hand_written_text_is_accepted() {
    let src = r#"
// Comments, implicit symbols, lenient lists, and dims written in any order.
const $w : f32[2] = dense<[1, 2.5]>
graph @g(%x: f32[n + 1, 2 * m]) -> (f32[1 + n, m * 2]) {
  %y = Mul(%x, $w) : f32[1 + n, m * 2]
  "custom.domain".Print(%y) {values = [1, 2.5], tag = "t"}
  return %y
}
"#;
    let (m, _) = parse(src).expect("parses");
    let text = print(&m);
    assert!(text.contains("sym n\nsym m\n"), "{text}");
    assert!(text.contains("f32[n + 1, 2 * m]"), "{text}");
    assert!(text.contains("values = [1.0, 2.5]"), "{text}");
    round_trip(&m);
}

#[test]
fn dim_expressions_round_trip() {
    let src = "graph @g(%x: f32[(h / 16) * (w / 16) + 1, -x / 2, 3 * (x / 2) - 1, (x + 1) / 2, -3 * y, past + seq, a * b * 2, -9223372036854775808]) -> () {\n  return\n}\n";
    let (m, _) = parse(src).expect("parses");
    let text = print(&m);
    assert!(text.contains("(h / 16) * (w / 16) + 1"), "{text}");
    let (again, _) = parse(&text).expect("reparses");
    assert!(again == m, "{text}");
    assert_eq!(print(&again), text);
}

#[test]
fn every_prefix_and_mutation_parses_without_panicking() {
    let text = print(&everything());
    let bytes = text.as_bytes();
    for end in 0..=bytes.len() {
        if text.is_char_boundary(end) {
            let _ = parse(&text[..end]);
        }
    }
    // xorshift: deterministic pseudo-random mutations (replace, delete, insert, duplicate).
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let alphabet = b"%$@\"\\{}[]()<>,:=-+*/?.#_ \n0x9eEaz";
    for _ in 0..3000 {
        let mut b = bytes.to_vec();
        for _ in 0..(1 + next() % 4) {
            let i = (next() as usize) % b.len().max(1);
            match next() % 4 {
                0 => b[i] = alphabet[(next() as usize) % alphabet.len()],
                1 => {
                    b.remove(i);
                }
                2 => b.insert(i, alphabet[(next() as usize) % alphabet.len()]),
                _ => {
                    let j = (i + (next() as usize) % 40).min(b.len());
                    let chunk = b[i..j].to_vec();
                    b.splice(i..i, chunk);
                }
            }
        }
        let s = String::from_utf8_lossy(&b);
        if let Ok((m, _)) = parse(&s) {
            // Whatever parses, prints and parses back to the same module.
            let again = print(&m);
            let (m2, _) = parse(&again).unwrap_or_else(|e| panic!("{e:?}\n{again}"));
            assert!(m2 == canonicalize(&m) || again.contains("NaN"), "{again}");
        }
    }
    // Deep nesting is an error, not a stack overflow.
    let deep = format!(
        "graph @g(%x: {}f32[1]{}) -> () {{\n return\n}}\n",
        "seq<".repeat(5000),
        ">".repeat(5000)
    );
    assert!(parse(&deep).is_err());
    let deep = format!(
        "graph @g(%x: f32[{}1{}]) -> () {{\n return\n}}\n",
        "(".repeat(5000),
        ")".repeat(5000)
    );
    assert!(parse(&deep).is_err());
}

/// Every ```mmir block of docs/ir-text.md parses, and round-trips.
#[test]
fn documentation_examples_parse() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/ir-text.md");
    let doc = std::fs::read_to_string(path).expect("docs/ir-text.md exists");
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in doc.lines() {
        match &mut current {
            None if line.trim_start().starts_with("```mmir") => current = Some(String::new()),
            Some(block) if line.trim_start().starts_with("```") => {
                blocks.push(std::mem::take(block));
                current = None;
            }
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
            None => {}
        }
    }
    assert!(blocks.len() >= 4, "docs/ir-text.md has mmir examples");
    for block in blocks {
        let (m, _) = match parse(&block) {
            Ok(p) => p,
            Err(errors) => panic!("{}\n---\n{block}", render_all(&block, &errors)),
        };
        round_trip(&m);
    }
}

// ---- diagnostics (snapshots) ----

macro_rules! error_snapshot {
    ($name:ident, $src:expr) => {
        #[test]
        fn $name() {
            insta::assert_snapshot!(errors_of($src));
        }
    };
}

error_snapshot!(
    error_unknown_value,
    "graph @g(%x: f32[3]) -> (f32[3]) {\n  %y = Relu(%z) : f32[3]\n  return %y\n}\n"
);
error_snapshot!(
    error_duplicate_definition,
    "graph @g(%x: f32[3]) -> (f32[3]) {\n  %y = Relu(%x) : f32[3]\n  %y = Neg(%x) : f32[3]\n  return %y\n}\n"
);
error_snapshot!(
    error_unknown_attribute,
    "graph @g(%x: f32[1, 3, 8, 8], %w: f32[4, 3, 3, 3]) -> (f32[1, 4, 8, 8]) {\n  %y = Conv(%x, %w) {stride = [1, 1]} : f32[1, 4, 8, 8]\n  return %y\n}\n"
);
error_snapshot!(
    error_wrong_attribute_type,
    "graph @g(%x: f32[3]) -> (f32[3]) {\n  %y = Softmax(%x) {axis = 1.5} : f32[3]\n  return %y\n}\n"
);
error_snapshot!(
    error_unknown_op,
    "graph @g(%x: f32[3]) -> (f32[3]) {\n  %y = FancyGelu(%x) : f32[3]\n  return %y\n}\n"
);
error_snapshot!(
    error_unknown_dtype,
    "graph @g(%x: f33[3]) -> () {\n  return\n}\n"
);
error_snapshot!(
    error_type_syntax,
    "graph @g(%x: f32[3, ) -> () {\n  return\n}\n"
);
error_snapshot!(
    error_unterminated_string,
    "graph @g(%x: f32[3]) -> () {\n  \"com.example.Foo(%x)\n  return\n}\n"
);
error_snapshot!(
    error_several_statements,
    "sym batch\nsym batch\ngraph @g(%x: f32[3]) -> (f32[3]) {\n  %a = Relu(%nope) : f32[3]\n  %b = Neg(%a) : f32[3]\n  %c = Abs(%x) {bogus = 1} : f32[3]\n  return %c\n}\nconst $k : f16[2] = dense<[1.0, 2.0]>\n"
);
error_snapshot!(
    error_return_type_mismatch,
    "graph @g(%x: f32[3]) -> (f32[4]) {\n  return %x\n}\n"
);
error_snapshot!(
    error_dense_count,
    "const $c : i64[2, 2] = dense<[1, 2, 3]>\nconst $d : u8[1] = dense<[256]>\n"
);
error_snapshot!(
    error_empty_list_kind,
    "graph @g(%x: f32[3]) -> () {\n  \"x\".Foo(%x) {a = []}\n  return\n}\n"
);
error_snapshot!(
    error_dim_division,
    "graph @g(%x: f32[seq / n, seq / 0]) -> () {\n  return\n}\n"
);
error_snapshot!(
    error_tensor_is_not_a_value,
    "tensor $t : f32[1] = dense<[0.0]>\ngraph @g() -> (f32[1]) {\n  return $t\n}\n"
);
error_snapshot!(
    error_unknown_link_graph,
    "graph @a() -> () {\n  return\n}\nlink @a[0] -> @b[0]\n"
);

#[test]
fn irregular_modules_round_trip_through_canonicalize() {
    // The same graph listed twice as an entry, two entries with one name, a link from a
    // subgraph, an unnamed graph, a graph input that shadows nothing but repeats a name.
    let mut m = Module::new();
    let a = m.add_graph("same", None);
    let x = m.add_input(a, Some("x".into()), t(DType::F32, vec![k(1)]));
    let x2 = m.add_input(a, Some("x".into()), t(DType::F32, vec![k(1)]));
    let n = m.add_node(
        a,
        Op::Add {},
        vec![Some(x), Some(x2)],
        vec![Some((None, t(DType::F32, vec![k(1)])))],
        None,
    );
    let y = m.nodes[n].outputs[0].expect("output");
    m.graphs[a].outputs = vec![y];
    let b = m.add_graph("same", None);
    let unnamed = m.add_graph("", None);
    let sub = m.add_graph("sub", None);
    m.entries.push(Entry {
        graph: a,
        model: ModelInfo::default(),
    });
    m.entries.push(Entry {
        graph: a,
        model: ModelInfo::default(),
    });
    m.entries.push(Entry {
        graph: b,
        model: ModelInfo::default(),
    });
    m.entries.push(Entry {
        graph: unnamed,
        model: ModelInfo::default(),
    });
    m.links.push(Link {
        from: (a, 0),
        to: (b, 0),
    });
    m.links.push(Link {
        from: (sub, 0),
        to: (b, 0),
    });
    let text = round_trip(&m);
    assert!(
        text.contains("graph @same(%x: f32[1], %x#1: f32[1])"),
        "{text}"
    );
    assert!(text.contains("graph @same#1()"), "{text}");
    assert!(text.contains("graph @\"\"()"), "{text}");
    assert!(text.contains("link @same[0] -> @same#1[0]"), "{text}");
    let canon = canonicalize(&m);
    assert_eq!(canon.entries.len(), 3);
    assert_eq!(canon.links.len(), 1);
}

#[test]
fn canonicalize_pruned_drops_constants_nothing_reads() {
    let src = "const $a : f32[] = dense<[1.0]>
const $b : f32[] = dense<[2.0]>
tensor $t : f32[1] = dense<[3.0]>

graph @g(%x: f32[2]) -> (f32[2]) {
  %y = Add(%x, $b) : f32[2]
  %z = ConstantOfShape($b) {value = $t} : f32[2]
  %w = Add(%y, %z) : f32[2]
  return %w
}
";
    let (m, _) = parse(src).expect("parses");
    let pruned = canonicalize_pruned(&m);
    let text = print(&pruned);
    assert!(!text.contains("$a"), "{text}");
    assert!(text.contains("$b") && text.contains("$t"), "{text}");
    let (again, _) = parse(&text).expect("pruned text parses");
    assert_eq!(print(&again), text);
}

#[test]
fn symbol_equalities_round_trip_and_are_checked() {
    let src = "sym past\nsym seq\nsym total\nassume total = past + seq\n\ngraph @g(%m: f32[total], %x: f32[past + seq]) -> (f32[past + seq]) {\n  %y = Add(%m, %x) : f32[past + seq]\n  return %y\n}\n";
    let (m, _) = parse(src).expect("parses");
    let t = m.find_symbol("total").expect("total");
    assert!(m.symbols[t].equals.is_some());
    assert_eq!(round_trip(&m), src);
    assert!(crate::verify::verify(&m).is_ok());
    let bad = |assume: &str| {
        errors_of(&format!(
            "sym past\nsym seq\nsym total\n{assume}\ngraph @g() -> () {{\n  return\n}}\n"
        ))
    };
    assert!(bad("assume total = total + 1").contains("expression of itself"));
    assert!(bad("assume nope = past").contains("undeclared symbol `nope`"));
    assert!(bad("assume total = past + other").contains("`other` is not declared"));
    assert!(bad("assume total = past\nassume total = seq").contains("assumed equal twice"));
    assert!(bad("assume total = past\nassume seq = total").contains("stands for an expression"));
    assert!(bad("assume total = past\nassume past = seq").contains("assume it first"));
}

/// Text a careless or hostile writer produces: each is an error at the offending span, never a
/// module that silently lacks the statement (a value used in its own definition once dropped
/// the statement and the graph's outputs) or holds a wrapped size.
#[test]
fn self_reference_and_overflowing_dims_are_errors() {
    let cases = [
        (
            "graph @g(%x: f32[2]) -> (f32[2]) {\n  %y = Add(%x, %y) : f32[2]\n  return %y\n}\n",
            "`%y` is used in its own definition",
            "%y) :",
        ),
        (
            "sym n\ngraph @g(%x: f32[n * 9223372036854775807 * 4]) -> (f32[2]) {\n  %y = Relu(%x) : f32[2]\n  return %y\n}\n",
            "overflows 64 bits",
            "n * 9223372036854775807 * 4",
        ),
        (
            "graph @g(%x: f32[9223372036854775807 + 1]) -> (f32[2]) {\n  %y = Relu(%x) : f32[2]\n  return %y\n}\n",
            "overflows 64 bits",
            "9223372036854775807 + 1",
        ),
    ];
    for (src, want, at) in cases {
        let errors = super::parse(src).expect_err(want);
        let e = errors
            .iter()
            .find(|e| e.message.contains(want))
            .unwrap_or_else(|| panic!("no '{want}' in {errors:?}"));
        assert!(
            src[e.span.clone()].starts_with(at) || at.starts_with(&src[e.span.clone()]),
            "{:?} at {:?}",
            e.message,
            &src[e.span.clone()]
        );
    }
}

/// A declared result type that the node does not compute is a verifier error.
#[test]
fn declared_types_the_node_does_not_compute_are_errors() {
    let src = "graph @g(%x: f32[2]) -> (i64[3]) {\n  %y = Relu(%x) : i64[3]\n  return %y\n}\n";
    let (m, _) = super::parse(src).expect("parses");
    let errors = crate::verify::verify(&m).expect_err("wrong result type");
    let text: Vec<&str> = errors.iter().map(|e| e.message.as_str()).collect();
    assert!(
        text.iter()
            .any(|t| t.contains("element type i64 but inferred f32")),
        "{text:?}"
    );
    assert!(
        text.iter().any(|t| t.contains("dim 0 as 3 but inferred 2")),
        "{text:?}"
    );
}

/// `GroupQueryAttention` with a packed QKV query leaves its key and value out (and a first step
/// its past): those operands may be absent; the query, the sequence lengths and the total
/// length may not.
#[test]
fn group_query_attention_takes_a_packed_query() {
    let gqa = |operands: &str| {
        format!(
            "graph @g(%qkv: f32[1, 3, 64], %pk: f32[1, 2, 0, 8], %pv: f32[1, 2, 0, 8], %sk: i32[1], %tl: i32[]) -> (f32[1, 3, 32]) {{\n  \
             %y = \"com.microsoft\".GroupQueryAttention({operands}) {{num_heads = 4, kv_num_heads = 2}} : f32[1, 3, 32]\n  \
             return %y\n}}\n"
        )
    };
    for ok in [
        "%qkv, _, _, %pk, %pv, %sk, %tl",
        "%qkv, _, _, _, _, %sk, %tl",
    ] {
        let (m, _) = super::parse(&gqa(ok)).expect("parses");
        let r = crate::verify::verify(&m);
        assert!(r.is_ok(), "{ok}: {r:?}");
    }
    let (m, _) = super::parse(&gqa("%qkv, _, _, %pk, %pv, _, %tl")).expect("parses");
    let errors = crate::verify::verify(&m).expect_err("sequence lengths missing");
    assert!(
        errors
            .iter()
            .any(|e| e.message.contains("required operand #5 is missing")),
        "{errors:?}"
    );
}

/// Graphs that ONNX Runtime refuses to load are verifier errors naming the node: operands of two
/// element types for an op that takes one, and a Reshape shape with two inferred dims.
#[test]
fn mixed_operand_types_and_two_inferred_dims_are_errors() {
    let cases = [
        (
            "graph @g(%x: f32[2], %s: string[2]) -> (f32[2]) {\n  %y = Add(%x, %s) : f32[2]\n  return %y\n}\n",
            "operand 0 is f32 and operand 1 is string; Add takes operands of one element type",
        ),
        (
            "graph @g(%x: f32[2], %i: i64[2]) -> (bool[2]) {\n  %y = Equal(%x, %i) : bool[2]\n  return %y\n}\n",
            "Equal takes operands of one element type",
        ),
        (
            "const $sh : i64[2] = dense<[-1, -1]>\ngraph @g(%x: f32[2, 2]) -> (f32[4]) {\n  %y = Reshape(%x, $sh) : f32[4]\n  return %y\n}\n",
            "its shape has 2 entries of -1",
        ),
    ];
    for (src, want) in cases {
        let (m, _) = super::parse(src).expect("parses");
        let errors = crate::verify::verify(&m).expect_err("refused");
        assert!(
            errors.iter().any(|e| e.message.contains(want)),
            "{want}: {errors:?}"
        );
    }
}

/// Einsum equations that ONNX Runtime refuses are verifier errors naming the node.
#[test]
fn bad_einsum_equations_are_errors() {
    let graph = |eq: &str, two: bool| {
        let (ins, args) = if two {
            ("%a: f32[2, 2], %b: f32[2, 2]", "%a, %b")
        } else {
            ("%a: f32[2, 2]", "%a")
        };
        format!(
            "graph @g({ins}) -> (f32[2, 2]) {{\n  %y = Einsum({args}) {{equation = \"{eq}\"}} : f32[2, 2]\n  return %y\n}}\n"
        )
    };
    for (eq, two, want) in [
        ("ij->jj", false, "output label 'j' repeats"),
        ("ij,jk->ik", false, "2 input terms for 1 operands"),
        ("ij->k", false, "output label 'k' is in no input"),
        ("i$->i", false, "'$' in 'i$' is not a label"),
        ("ij,jk->ikk", true, "output label 'k' repeats"),
    ] {
        let (m, _) = super::parse(&graph(eq, two)).expect("parses");
        let errors = crate::verify::verify(&m).expect_err(eq);
        assert!(
            errors.iter().any(|e| e.message.contains(want)),
            "{eq}: {errors:?}"
        );
    }
    let (m, _) = super::parse(&graph("ij,jk->ik", true)).expect("parses");
    assert!(crate::verify::verify(&m).is_ok());
}
