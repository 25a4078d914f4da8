use bytes::Bytes;

use super::*;
use crate::attr::Attr;
use crate::constant::{ConstData, Storage};
use crate::dim::DimExpr;
use crate::module::{Entry, ModelInfo};
use crate::types::TensorType;

/// Builds small modules by hand.
pub(crate) struct B {
    pub m: Module,
    pub g: GraphId,
}

impl B {
    pub fn new(opset: i64) -> B {
        let mut m = Module::new();
        let g = m.add_graph("main", None);
        m.entries.push(Entry {
            graph: g,
            model: ModelInfo {
                opsets: vec![(String::new(), opset)],
                ..ModelInfo::default()
            },
        });
        B { m, g }
    }

    pub fn sym(&mut self, name: &str) -> Dim {
        Dim::sym(self.m.symbol(name))
    }

    pub fn input(&mut self, name: &str, dtype: DType, dims: Vec<Dim>) -> Value {
        self.m
            .add_input(self.g, Some(name.to_owned()), Type::tensor(dtype, dims))
    }

    pub fn ints(&mut self, vals: &[i64], shape: Vec<i64>) -> Value {
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.m.add_const(ConstData::new(
            None,
            DType::I64,
            shape,
            Storage::Inline(Bytes::from(bytes)),
        ))
    }

    pub fn floats(&mut self, vals: &[f32], shape: Vec<i64>) -> Value {
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.m.add_const(ConstData::new(
            None,
            DType::F32,
            shape,
            Storage::Inline(Bytes::from(bytes)),
        ))
    }

    pub fn weight(&mut self, shape: Vec<i64>) -> Value {
        self.m
            .add_const(ConstData::new(None, DType::F32, shape, Storage::Absent))
    }

    pub fn node_in(&mut self, g: GraphId, op: Op, inputs: &[Value], outs: usize) -> Vec<Value> {
        let n = self.m.add_node(
            g,
            op,
            inputs.iter().map(|&v| Some(v)).collect(),
            (0..outs).map(|_| Some((None, Type::Unknown))).collect(),
            None,
        );
        self.m.nodes[n].outputs.iter().flatten().copied().collect()
    }

    pub fn op(&mut self, op: &str, attrs: Vec<(&str, Attr)>, inputs: &[Value]) -> Value {
        let op = Op::from_parts(
            "",
            op,
            attrs.into_iter().map(|(k, a)| (k.to_owned(), a)).collect(),
        );
        assert!(!op.is_custom(), "attributes must fit the typed op");
        self.node_in(self.g, op, inputs, 1)[0]
    }

    pub fn show(&self, v: Value) -> String {
        show_type(&self.m, self.m.value_type(v))
    }
}

pub(crate) fn show_type(m: &Module, ty: &Type) -> String {
    let name = |s: crate::Sym| m.symbols[s].name.clone();
    match ty {
        Type::Tensor(TensorType { dtype, shape }) => {
            let dt = dtype.map_or("?".to_owned(), |d| d.name().to_owned());
            match shape {
                Some(s) => format!(
                    "{dt}[{}]",
                    s.iter()
                        .map(|d| d.render(&name))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                None => format!("{dt}[*]"),
            }
        }
        other => format!("{other:?}"),
    }
}

fn ints(v: &[i64]) -> Attr {
    Attr::Ints(v.to_vec())
}

#[test]
fn shape_gather_concat_reshape_chain() {
    let mut b = B::new(17);
    let (batch, seq) = (b.sym("batch"), b.sym("seq"));
    let x = b.input("x", DType::F32, vec![batch, seq, Dim::known(64)]);
    let s = b.op("Shape", vec![], &[x]);
    let i0 = b.ints(&[0], vec![]);
    let i1 = b.ints(&[1], vec![]);
    let d0 = b.op("Gather", vec![("axis", Attr::Int(0))], &[s, i0]);
    let d1 = b.op("Gather", vec![], &[s, i1]);
    let ax = b.ints(&[0], vec![1]);
    let u0 = b.op("Unsqueeze", vec![], &[d0, ax]);
    let u1 = b.op("Unsqueeze", vec![], &[d1, ax]);
    let four = b.ints(&[4], vec![1]);
    let sixteen = b.ints(&[16], vec![1]);
    let target = b.op(
        "Concat",
        vec![("axis", Attr::Int(0))],
        &[u0, u1, four, sixteen],
    );
    let r = b.op("Reshape", vec![], &[x, target]);
    let (warnings, sv) = infer_module_with_values(&mut b.m);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(b.show(s), "i64[3]");
    assert_eq!(b.show(d0), "i64[]");
    assert_eq!(b.show(u0), "i64[1]");
    assert_eq!(b.show(target), "i64[4]");
    assert_eq!(b.show(r), "f32[batch, seq, 4, 16]");
    let name = |s: crate::Sym| b.m.symbols[s].name.clone();
    let rendered: Vec<String> = sv
        .get(target)
        .unwrap()
        .iter()
        .map(|d| d.render(&name))
        .collect();
    assert_eq!(rendered, ["batch", "seq", "4", "16"]);
    assert_eq!(shape_values(&b.m).get(target).map(<[Dim]>::len), Some(4));
}

#[test]
fn conv_and_pool_sizes_are_dim_expressions() {
    let mut b = B::new(17);
    let (n, h, w) = (b.sym("n"), b.sym("h"), b.sym("w"));
    let x = b.input("x", DType::F32, vec![n, Dim::known(3), h, w]);
    let wt = b.weight(vec![64, 3, 7, 7]);
    let c = b.op(
        "Conv",
        vec![("strides", ints(&[2, 2])), ("pads", ints(&[3, 3, 3, 3]))],
        &[x, wt],
    );
    let p = b.op(
        "MaxPool",
        vec![
            ("kernel_shape", ints(&[3, 3])),
            ("strides", ints(&[2, 2])),
            ("pads", ints(&[1, 1, 1, 1])),
        ],
        &[c],
    );
    let same = b.op(
        "AveragePool",
        vec![
            ("kernel_shape", ints(&[3, 3])),
            ("strides", ints(&[2, 2])),
            ("auto_pad", Attr::String("SAME_UPPER".into())),
        ],
        &[x],
    );
    let dil = b.op(
        "Conv",
        vec![
            ("dilations", ints(&[2, 2])),
            ("kernel_shape", ints(&[3, 3])),
        ],
        &[x, wt],
    );
    infer_module(&mut b.m);
    assert_eq!(b.show(c), "f32[n, 64, (h + 1) / 2, (w + 1) / 2]");
    assert_eq!(
        b.show(p),
        "f32[n, 64, ((h + 1) / 2 + 1) / 2, ((w + 1) / 2 + 1) / 2]"
    );
    assert_eq!(b.show(same), "f32[n, 3, (h + 1) / 2, (w + 1) / 2]");
    assert_eq!(b.show(dil), "f32[n, 64, h - 4, w - 4]");
    // 224 → 112 → 56, as ResNet's stem.
    let d = b.m.value_type(p).shape().unwrap()[2].clone();
    let hs = b.m.find_symbol("h").unwrap();
    let v = d.expr().unwrap().eval(&|s| (s == hs).then_some(224));
    assert_eq!(v, Some(56));

    // ceil_mode on constant sizes drops a window that would start in the padding.
    let mut b = B::new(17);
    let x = b.input(
        "x",
        DType::F32,
        vec![1.into(), 1.into(), 5.into(), 6.into()],
    );
    let p = b.op(
        "MaxPool",
        vec![
            ("kernel_shape", ints(&[2, 2])),
            ("strides", ints(&[2, 2])),
            ("ceil_mode", Attr::Int(1)),
        ],
        &[x],
    );
    let n = b.m.nodes.keys().last().unwrap();
    let idx = b.m.nodes[n].outputs.len();
    assert_eq!(idx, 1);
    infer_module(&mut b.m);
    assert_eq!(b.show(p), "f32[1, 1, 3, 3]");
}

#[test]
fn vit_sequence_length() {
    let mut b = B::new(17);
    let (batch, h, w) = (b.sym("batch"), b.sym("h"), b.sym("w"));
    let x = b.input("pixels", DType::F32, vec![batch, Dim::known(3), h, w]);
    let wt = b.weight(vec![768, 3, 16, 16]);
    let patches = b.op(
        "Conv",
        vec![
            ("strides", ints(&[16, 16])),
            ("kernel_shape", ints(&[16, 16])),
        ],
        &[x, wt],
    );
    let target = b.ints(&[0, 768, -1], vec![3]);
    let flat = b.op("Reshape", vec![], &[patches, target]);
    let tokens = b.op("Transpose", vec![("perm", ints(&[0, 2, 1]))], &[flat]);
    // cls token expanded to [batch, 1, 768] via a Shape chain.
    let cls = b.weight(vec![1, 1, 768]);
    let s = b.op("Shape", vec![("end", Attr::Int(1))], &[x]);
    let rest = b.ints(&[1, 768], vec![2]);
    let cls_shape = b.op("Concat", vec![("axis", Attr::Int(0))], &[s, rest]);
    let cls_b = b.op("Expand", vec![], &[cls, cls_shape]);
    let seq = b.op("Concat", vec![("axis", Attr::Int(1))], &[cls_b, tokens]);
    let flat2 = b.op("Flatten", vec![("axis", Attr::Int(2))], &[patches]);
    infer_module(&mut b.m);
    assert_eq!(b.show(patches), "f32[batch, 768, h / 16, w / 16]");
    assert_eq!(b.show(flat), "f32[batch, 768, (h / 16) * (w / 16)]");
    assert_eq!(b.show(cls_b), "f32[batch, 1, 768]");
    assert_eq!(b.show(seq), "f32[batch, (h / 16) * (w / 16) + 1, 768]");
    assert_eq!(b.show(flat2), "f32[768 * batch, (h / 16) * (w / 16)]");
}

#[test]
fn kv_cache_concat() {
    let mut b = B::new(17);
    let (batch, past, seq) = (b.sym("batch"), b.sym("past"), b.sym("seq"));
    let pk = b.input(
        "past_key",
        DType::F16,
        vec![batch.clone(), 12.into(), past, 64.into()],
    );
    let k = b.input("k", DType::F16, vec![batch, 12.into(), seq, 64.into()]);
    let present = b.op("Concat", vec![("axis", Attr::Int(-2))], &[pk, k]);
    let scores = b.op(
        "Einsum",
        vec![("equation", Attr::String("bhqd,bhkd->bhqk".into()))],
        &[k, present],
    );
    infer_module(&mut b.m);
    assert_eq!(b.show(present), "f16[batch, 12, past + seq, 64]");
    assert_eq!(b.show(scores), "f16[batch, 12, seq, past + seq]");
}

#[test]
fn broadcasting() {
    let mut b = B::new(17);
    let (batch, seq) = (b.sym("batch"), b.sym("seq"));
    let a = b.input("a", DType::F32, vec![batch.clone(), 1.into(), seq.clone()]);
    let c = b.input("c", DType::F32, vec![4.into(), 1.into()]);
    let bias = b.input("bias", DType::F32, vec![seq.clone()]);
    let three = b.input("three", DType::F32, vec![3.into()]);
    let unk = b.input("unk", DType::F32, vec![Dim::Unknown]);
    let s1 = b.op("Add", vec![], &[a, c]);
    let s2 = b.op("Mul", vec![], &[a, bias]);
    let s3 = b.op("Sub", vec![], &[three, bias]);
    let s4 = b.op("Less", vec![], &[bias, unk]);
    let s5 = b.op("Where", vec![], &[s4, a, c]);
    let mm = b.op("MatMul", vec![], &[a, c]);
    infer_module(&mut b.m);
    assert_eq!(b.show(s1), "f32[batch, 4, seq]");
    assert_eq!(b.show(s2), "f32[batch, 1, seq]");
    assert_eq!(b.show(s3), "f32[3]");
    assert_eq!(b.show(s4), "bool[?]");
    assert_eq!(b.show(s5), "f32[batch, 4, ?]");
    assert_eq!(b.show(mm), "f32[batch, 1, 1]");
}

#[test]
fn reshape_minus_one_with_symbolic_dims() {
    let mut b = B::new(17);
    let (batch, seq) = (b.sym("batch"), b.sym("seq"));
    let x = b.input(
        "x",
        DType::F32,
        vec![batch.clone(), seq.clone(), 768.into()],
    );
    let t1 = b.ints(&[0, 0, 12, -1], vec![4]);
    let t2 = b.ints(&[-1, 768], vec![2]);
    let t3 = b.ints(&[-1, 5], vec![2]);
    let r1 = b.op("Reshape", vec![], &[x, t1]);
    let r2 = b.op("Reshape", vec![], &[x, t2]);
    let r3 = b.op("Reshape", vec![], &[x, t3]);
    // Back from [batch * seq, 768] to [batch, -1, 768] through a shape value.
    let s = b.op("Shape", vec![("end", Attr::Int(1))], &[x]);
    let tail = b.ints(&[-1, 768], vec![2]);
    let t4 = b.op("Concat", vec![("axis", Attr::Int(0))], &[s, tail]);
    let r4 = b.op("Reshape", vec![], &[r2, t4]);
    infer_module(&mut b.m);
    assert_eq!(b.show(r1), "f32[batch, seq, 12, 64]");
    assert_eq!(b.show(r2), "f32[batch * seq, 768]");
    assert_eq!(b.show(r3), "f32[?, 5]");
    assert_eq!(b.show(r4), "f32[batch, seq, 768]");
}

#[test]
fn opset_dependent_axes() {
    for opset in [11, 13] {
        let mut b = B::new(opset);
        let (batch, seq) = (b.sym("batch"), b.sym("seq"));
        let x = b.input("x", DType::F32, vec![batch, 1.into(), seq]);
        let axes = b.ints(&[1], vec![1]);
        let (sq, red) = if opset < 13 {
            (
                b.op("Squeeze", vec![("axes", ints(&[1]))], &[x]),
                b.op(
                    "ReduceSum",
                    vec![("axes", ints(&[2])), ("keepdims", Attr::Int(0))],
                    &[x],
                ),
            )
        } else {
            let red_axes = b.ints(&[2], vec![1]);
            (
                b.op("Squeeze", vec![], &[x, axes]),
                b.op(
                    "ReduceSum",
                    vec![("keepdims", Attr::Int(0))],
                    &[x, red_axes],
                ),
            )
        };
        let sm = b.op("Softmax", vec![], &[x]);
        let all = b.op("Squeeze", vec![], &[x]);
        infer_module(&mut b.m);
        assert_eq!(b.show(sq), "f32[batch, seq]", "opset {opset}");
        assert_eq!(b.show(red), "f32[batch, 1]", "opset {opset}");
        assert_eq!(b.show(sm), "f32[batch, 1, seq]", "opset {opset}");
        // Without axes, symbolic dims might be 1: the rank is unknown.
        assert_eq!(b.show(all), "f32[*]", "opset {opset}");
    }
    // Opset 13 ignores a legacy axes attribute and reads the input instead.
    let mut b = B::new(13);
    let x = b.input(
        "x",
        DType::F32,
        vec![2.into(), 1.into(), 3.into(), 1.into()],
    );
    let sq = b.op("Squeeze", vec![("axes", ints(&[1]))], &[x]);
    infer_module(&mut b.m);
    assert_eq!(b.show(sq), "f32[2, 3]");
}

#[test]
fn if_with_agreeing_branches() {
    let mut b = B::new(17);
    let (batch, seq) = (b.sym("batch"), b.sym("seq"));
    let cond = b.input("cond", DType::Bool, vec![]);
    let x = b.input("x", DType::F32, vec![batch.clone(), seq.clone()]);
    let then_g = b.m.add_graph("then", None);
    let else_g = b.m.add_graph("else", None);
    let node = b.m.add_node(
        b.g,
        Op::If {
            then_branch: Some(then_g),
            else_branch: Some(else_g),
        },
        vec![Some(cond)],
        vec![
            Some((Some("y".into()), Type::Unknown)),
            Some((None, Type::Unknown)),
        ],
        None,
    );
    b.m.graphs[then_g].parent = Some(node);
    b.m.graphs[else_g].parent = Some(node);
    let t1 = b.node_in(then_g, Op::Relu {}, &[x], 1)[0];
    let t2 = b.node_in(then_g, Op::Identity {}, &[x], 1)[0];
    let e1 = b.node_in(else_g, Op::Neg {}, &[x], 1)[0];
    let five = b.ints(&[0, 5], vec![2]);
    let e2 = b.node_in(else_g, Op::Reshape { allowzero: None }, &[x, five], 1)[0];
    b.m.graphs[then_g].outputs = vec![t1, t2];
    b.m.graphs[else_g].outputs = vec![e1, e2];
    infer_module(&mut b.m);
    let outs: Vec<Value> = b.m.nodes[node].outputs.iter().flatten().copied().collect();
    assert_eq!(b.show(outs[0]), "f32[batch, seq]");
    assert_eq!(b.show(outs[1]), "f32[batch, ?]");
}

#[test]
fn declared_types_win_and_conflicts_warn() {
    let mut b = B::new(17);
    let x = b.input("x", DType::F32, vec![2.into(), 3.into()]);
    let n = b.m.add_node(
        b.g,
        Op::Relu {},
        vec![Some(x)],
        vec![Some((
            Some("y".into()),
            Type::tensor(DType::F32, vec![2.into(), 4.into()]),
        ))],
        None,
    );
    let y = b.m.nodes[n].outputs[0].unwrap();
    let partial = b.m.add_node(
        b.g,
        Op::Relu {},
        vec![Some(x)],
        vec![Some((
            Some("z".into()),
            Type::Tensor(TensorType {
                dtype: None,
                shape: Some(vec![Dim::Unknown, 3.into()]),
            }),
        ))],
        None,
    );
    let z = b.m.nodes[partial].outputs[0].unwrap();
    let custom = b.m.add_node(
        b.g,
        Op::from_parts("com.example", "Mystery", vec![]),
        vec![Some(x)],
        vec![Some((None, Type::Unknown))],
        None,
    );
    let c = b.m.nodes[custom].outputs[0].unwrap();
    let warnings = infer_module(&mut b.m);
    assert_eq!(b.show(y), "f32[2, 4]");
    assert_eq!(b.show(z), "f32[2, 3]");
    assert_eq!(b.m.value_type(c), &Type::Unknown);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].entity, Entity::Value(y));
    assert_eq!(warnings[0].severity, crate::Severity::Warning);
    assert!(
        warnings[0].message.contains("'y'"),
        "{}",
        warnings[0].message
    );
}

#[test]
fn slices_split_and_misc_ops() {
    let mut b = B::new(18);
    let (batch, seq) = (b.sym("batch"), b.sym("seq"));
    let x = b.input(
        "x",
        DType::F32,
        vec![batch.clone(), seq.clone(), 768.into()],
    );
    let mask = b.input("mask", DType::I64, vec![batch.clone(), 4096.into()]);
    // mask[:, :seq] with seq taken from x's shape.
    let s = b.op(
        "Shape",
        vec![("start", Attr::Int(1)), ("end", Attr::Int(2))],
        &[x],
    );
    let zero = b.ints(&[0], vec![1]);
    let one = b.ints(&[1], vec![1]);
    let sl = b.op("Slice", vec![], &[mask, zero, s, one]);
    let last = b.ints(&[-1], vec![1]);
    let huge = b.ints(&[i64::MAX], vec![1]);
    let tail = b.op("Slice", vec![], &[x, last, huge, one]);
    let head = b.op("Slice", vec![], &[x, zero, one, one]);
    let sixteen = b.ints(&[16], vec![1]);
    let head16 = b.op("Slice", vec![], &[x, zero, sixteen, one]);
    let parts = b.node_in(
        b.g,
        Op::Split {
            axis: Some(-1),
            num_outputs: Some(3),
            split: None,
        },
        &[x],
        3,
    );
    let cast = b.op("Cast", vec![("to", Attr::Int(10))], &[x]);
    let nz = b.op("NonZero", vec![], &[mask]);
    let tk = b.ints(&[5], vec![1]);
    let topk = b.node_in(
        b.g,
        Op::TopK {
            axis: None,
            largest: None,
            sorted: None,
        },
        &[x, tk],
        2,
    );
    let q = b.op("QuantizeLinear", vec![], &[x]);
    let rmax = b.op("ReduceMax", vec![], &[x]);
    let arg = b.op(
        "ArgMax",
        vec![("axis", Attr::Int(1)), ("keepdims", Attr::Int(0))],
        &[x],
    );
    let pads = b.ints(&[0, 1, 0, 0, 1, 0], vec![6]);
    let pad = b.op("Pad", vec![], &[x, pads]);
    let scales = b.floats(&[1.0, 1.0, 2.0], vec![3]);
    let empty = b.floats(&[], vec![0]);
    let up = b.op("Resize", vec![], &[x, empty, scales]);
    let range_end = b.op("Squeeze", vec![], &[s]);
    let start = b.ints(&[0], vec![]);
    let delta = b.ints(&[1], vec![]);
    let pos = b.op("Range", vec![], &[start, range_end, delta]);
    infer_module(&mut b.m);
    assert_eq!(b.show(sl), "i64[batch, seq]");
    assert_eq!(b.show(tail), "f32[batch, 1, 768]");
    // seq >= 1 by default, so [0, 1) lies inside it; [0, 16) might not.
    assert_eq!(b.show(head), "f32[batch, 1, 768]");
    assert_eq!(b.show(head16), "f32[batch, ?, 768]");
    assert_eq!(b.show(parts[2]), "f32[batch, seq, 256]");
    assert_eq!(b.show(cast), "f16[batch, seq, 768]");
    assert_eq!(b.show(nz), "i64[2, ?]");
    assert_eq!(b.show(topk[0]), "f32[batch, seq, 5]");
    assert_eq!(b.show(topk[1]), "i64[batch, seq, 5]");
    assert_eq!(b.show(q), "u8[batch, seq, 768]");
    assert_eq!(b.show(rmax), "f32[1, 1, 1]");
    assert_eq!(b.show(arg), "i64[batch, 768]");
    assert_eq!(b.show(pad), "f32[batch, seq + 2, 768]");
    assert_eq!(b.show(up), "f32[batch, seq, 1536]");
    assert_eq!(b.show(pos), "i64[seq]");
}

#[test]
fn loop_scan_and_attention() {
    let mut b = B::new(23);
    let (batch, seq, past) = (b.sym("batch"), b.sym("seq"), b.sym("past"));
    // Loop with a static trip count: the scan output gets it as leading dim.
    let trip = b.ints(&[10], vec![]);
    let init = b.input("acc", DType::F32, vec![batch.clone(), 4.into()]);
    let body = b.m.add_graph("body", None);
    let node = b.m.add_node(
        b.g,
        Op::Loop { body: Some(body) },
        vec![Some(trip), None, Some(init)],
        vec![Some((None, Type::Unknown)), Some((None, Type::Unknown))],
        None,
    );
    b.m.graphs[body].parent = Some(node);
    let _iter = b.m.add_input(body, Some("i".into()), Type::Unknown);
    let cond_in = b.m.add_input(body, Some("c".into()), Type::Unknown);
    let acc = b.m.add_input(body, Some("acc_in".into()), Type::Unknown);
    let next = b.node_in(body, Op::Relu {}, &[acc], 1)[0];
    let slice = b.node_in(body, Op::Identity {}, &[next], 1)[0];
    b.m.graphs[body].outputs = vec![cond_in, next, slice];
    // Scan over axis 1 of a [batch, seq, 8] input.
    let xs = b.input("xs", DType::F32, vec![batch.clone(), seq.clone(), 8.into()]);
    let state = b.input("state", DType::F32, vec![batch.clone(), 8.into()]);
    let sbody = b.m.add_graph("scan_body", None);
    let scan = b.m.add_node(
        b.g,
        Op::Scan {
            body: Some(sbody),
            num_scan_inputs: Some(1),
            scan_input_axes: Some(vec![1]),
            scan_input_directions: None,
            scan_output_axes: Some(vec![1]),
            scan_output_directions: None,
        },
        vec![Some(state), Some(xs)],
        vec![Some((None, Type::Unknown)), Some((None, Type::Unknown))],
        None,
    );
    b.m.graphs[sbody].parent = Some(scan);
    let s_in = b.m.add_input(sbody, None, Type::Unknown);
    let x_in = b.m.add_input(sbody, None, Type::Unknown);
    let s_out = b.node_in(sbody, Op::Add {}, &[s_in, x_in], 1)[0];
    b.m.graphs[sbody].outputs = vec![s_out, s_out];
    // Opset-23 attention with a KV cache, 3-d inputs.
    let q = b.input(
        "q",
        DType::F16,
        vec![batch.clone(), seq.clone(), 512.into()],
    );
    let k = b.input(
        "k",
        DType::F16,
        vec![batch.clone(), seq.clone(), 128.into()],
    );
    let pk = b.input(
        "past_k",
        DType::F16,
        vec![batch.clone(), 2.into(), past, 64.into()],
    );
    let att = b.m.add_node(
        b.g,
        Op::from_parts(
            "",
            "Attention",
            vec![
                ("q_num_heads".into(), Attr::Int(8)),
                ("kv_num_heads".into(), Attr::Int(2)),
            ],
        ),
        vec![Some(q), Some(k), Some(k), None, Some(pk), Some(pk)],
        (0..3).map(|_| Some((None, Type::Unknown))).collect(),
        None,
    );
    infer_module(&mut b.m);
    let outs = |n: Node| -> Vec<Value> { b.m.nodes[n].outputs.iter().flatten().copied().collect() };
    let (lo, so, ao) = (outs(node), outs(scan), outs(att));
    assert_eq!(b.show(acc), "f32[batch, 4]");
    assert_eq!(b.show(lo[0]), "f32[batch, 4]");
    assert_eq!(b.show(lo[1]), "f32[10, batch, 4]");
    assert_eq!(b.show(x_in), "f32[batch, 8]");
    assert_eq!(b.show(so[0]), "f32[batch, 8]");
    assert_eq!(b.show(so[1]), "f32[batch, seq, 8]");
    assert_eq!(b.show(ao[0]), "f16[batch, seq, 512]");
    assert_eq!(b.show(ao[1]), "f16[batch, 2, seq + past, 64]");
}

#[test]
fn more_shape_rules() {
    let mut b = B::new(17);
    let (n, h, w) = (b.sym("n"), b.sym("h"), b.sym("w"));
    let x = b.input("x", DType::F32, vec![n.clone(), 64.into(), h, w]);
    let wt = b.weight(vec![64, 32, 2, 2]);
    let up = b.op("ConvTranspose", vec![("strides", ints(&[2, 2]))], &[x, wt]);
    let d2s = b.op("DepthToSpace", vec![("blocksize", Attr::Int(2))], &[x]);
    let a = b.input("a", DType::F32, vec![n.clone(), 16.into()]);
    let bw = b.weight(vec![32, 16]);
    let gemm = b.op("Gemm", vec![("transB", Attr::Int(1))], &[a, bw]);
    let ein = b.op(
        "Einsum",
        vec![("equation", Attr::String("ij,jk".into()))],
        &[a, bw],
    );
    let ein2 = b.op(
        "Einsum",
        vec![("equation", Attr::String("...i->...".into()))],
        &[x],
    );
    let gap = b.op("GlobalAveragePool", vec![], &[x]);
    let dq = b.op("DequantizeLinear", vec![], &[x, a]);
    infer_module(&mut b.m);
    assert_eq!(b.show(up), "f32[n, 32, 2 * h, 2 * w]");
    assert_eq!(b.show(d2s), "f32[n, 16, 2 * h, 2 * w]");
    assert_eq!(b.show(gemm), "f32[n, 32]");
    assert_eq!(b.show(ein), "f32[n, 16]");
    assert_eq!(b.show(ein2), "f32[n, 64, h]");
    assert_eq!(b.show(gap), "f32[n, 64, 1, 1]");
    assert_eq!(b.show(dq), "f32[n, 64, h, w]");
}

#[test]
fn odd_attributes_do_not_panic() {
    let mut b = B::new(17);
    let x = b.input(
        "x",
        DType::F32,
        vec![1.into(), 2.into(), (-3).into(), 4.into()],
    );
    let wt = b.weight(vec![2, 2, 3, 3]);
    let big = i64::MAX;
    let c = b.op(
        "Conv",
        vec![
            ("strides", ints(&[big, 1])),
            ("dilations", ints(&[big, big])),
            ("pads", ints(&[big, big, big, big])),
        ],
        &[x, wt],
    );
    let p = b.op(
        "MaxPool",
        vec![
            ("kernel_shape", ints(&[i64::MIN, 0])),
            ("strides", ints(&[0, -1])),
        ],
        &[x],
    );
    let s = b.op(
        "Split",
        vec![("axis", Attr::Int(2)), ("num_outputs", Attr::Int(big))],
        &[x],
    );
    let neg = b.ints(&[i64::MIN], vec![1]);
    let sl = b.op("Slice", vec![], &[x, neg, neg, neg, neg]);
    let shape = b.ints(&[big], vec![1]);
    let r = b.op("ConstantOfShape", vec![], &[shape]);
    let d2s = b.op("DepthToSpace", vec![("blocksize", Attr::Int(big))], &[x]);
    let t = b.op("Transpose", vec![("perm", ints(&[9, 9, 9]))], &[x]);
    let empty = b.ints(&[], vec![0]);
    let e = b.op("Slice", vec![], &[empty, neg, neg, empty, neg]);
    infer_module(&mut b.m);
    for v in [c, p, s, sl, r, d2s, t, e] {
        assert!(!b.show(v).is_empty());
    }
    assert_eq!(b.show(t), "f32[?, ?, ?, ?]");
}

#[test]
fn if_with_a_known_condition_takes_its_branch() {
    let mut b = B::new(17);
    let x = b.input("x", DType::F32, vec![2.into(), 3.into()]);
    let s = b.op("Shape", vec![], &[x]);
    let n = b.op("Size", vec![], &[s]);
    let two = b.ints(&[2], vec![]);
    let cond = b.op("Equal", vec![], &[n, two]);
    let then_g = b.m.add_graph("then", None);
    let else_g = b.m.add_graph("else", None);
    let node = b.m.add_node(
        b.g,
        Op::If {
            then_branch: Some(then_g),
            else_branch: Some(else_g),
        },
        vec![Some(cond)],
        vec![Some((None, Type::Unknown))],
        None,
    );
    b.m.graphs[then_g].parent = Some(node);
    b.m.graphs[else_g].parent = Some(node);
    let t = b.node_in(then_g, Op::Relu {}, &[x], 1)[0];
    let flat = b.ints(&[-1], vec![1]);
    let e = b.node_in(else_g, Op::Reshape { allowzero: None }, &[x, flat], 1)[0];
    b.m.graphs[then_g].outputs = vec![t];
    b.m.graphs[else_g].outputs = vec![e];
    infer_module(&mut b.m);
    let y = b.m.nodes[node].outputs[0].unwrap();
    assert_eq!(b.show(cond), "bool[]");
    assert_eq!(b.show(y), "f32[2, 3]");
}

/// The TorchScript exporter's `expand_as`: `Expand(x, Where(Equal(shape, -1), 1, shape))`. A
/// size never equals -1, so the shape passes through and the result keeps its dims.
#[test]
fn expand_through_where_equal_minus_one() {
    let mut b = B::new(17);
    let (batch, seq) = (b.sym("batch"), b.sym("seq"));
    let x = b.input(
        "x",
        DType::Bool,
        vec![batch.clone(), 1.into(), 1.into(), seq.clone()],
    );
    let y = b.input("y", DType::F32, vec![batch, 4.into(), seq.clone(), seq]);
    let s = b.op("Shape", vec![], &[y]);
    let minus_one = b.ints(&[-1], vec![1]);
    let eq = b.op("Equal", vec![], &[s, minus_one]);
    let ones = b.ints(&[1, 1, 1, 1], vec![4]);
    let shape = b.op("Where", vec![], &[eq, ones, s]);
    let e = b.op("Expand", vec![], &[x, shape]);
    infer_module(&mut b.m);
    assert_eq!(b.show(e), "bool[batch, 4, seq, seq]");
}

/// An exporter that names the cache length `total` on the mask input and on the cache output,
/// while the cache is `Concat(past, new)`: `total` is recorded as `past + seq` and written in
/// its place everywhere but the inputs, so the mask broadcasts against the scores.
#[test]
fn declared_symbol_equal_to_an_inferred_expression() {
    let mut b = B::new(17);
    let (batch, past, seq, total) = (b.sym("batch"), b.sym("past"), b.sym("seq"), b.sym("total"));
    let mask = b.input("mask", DType::F32, vec![batch.clone(), total.clone()]);
    let pk = b.input(
        "past_key",
        DType::F32,
        vec![batch.clone(), 2.into(), past, 4.into()],
    );
    let k = b.input(
        "k",
        DType::F32,
        vec![batch.clone(), 2.into(), seq, 4.into()],
    );
    // The mask is read before the concatenation that reveals what `total` is.
    let axes = b.ints(&[1, 2], vec![2]);
    let mask4 = b.op("Unsqueeze", vec![], &[mask, axes]);
    let present = b.op("Concat", vec![("axis", Attr::Int(-2))], &[pk, k]);
    b.m.set_type(
        present,
        Type::tensor(DType::F32, vec![batch, 2.into(), total, 4.into()]),
    );
    let scores = b.op(
        "Einsum",
        vec![("equation", Attr::String("bhqd,bhkd->bhqk".into()))],
        &[k, present],
    );
    let biased = b.op("Add", vec![], &[scores, mask4]);
    let warnings = infer_module(&mut b.m);
    assert!(warnings.is_empty(), "{warnings:?}");
    let t = b.m.find_symbol("total").expect("total");
    let name = |s: crate::Sym| b.m.symbols[s].name.clone();
    let eq = b.m.symbols[t].equals.as_ref().expect("total = past + seq");
    assert_eq!(eq.render(&name), "past + seq");
    assert_eq!(b.show(mask), "f32[batch, total]");
    assert_eq!(b.show(mask4), "f32[batch, 1, 1, past + seq]");
    assert_eq!(b.show(present), "f32[batch, 2, past + seq, 4]");
    assert_eq!(b.show(biased), "f32[batch, 2, seq, past + seq]");
    // Inference again changes nothing and learns nothing new.
    let before = b.m.clone();
    infer_module(&mut b.m);
    assert!(b.m == before);
}

/// A declared symbol is not made equal to an expression that mentions it, nor to a constant,
/// and one that already stands for an expression keeps it.
#[test]
fn symbol_equalities_stay_acyclic() {
    // `a` is a dim of the graph's input: the caller's, never a constant; `d` names an inner dim
    // only and may stand for one.
    let src = "graph @g(%x: f32[a]) -> (f32[a]) {\n  %y = Relu(%x) : f32[a]\n  return %y\n}\n";
    let (mut m, _) = crate::text::parse(src).expect("parses");
    let a = m.symbol("a");
    let (b, c, d) = (m.symbol("b"), m.symbol("c"), m.symbol("d"));
    let e = |s| DimExpr::sym(s);
    let ok = |x: Option<DimExpr>| x.expect("no overflow");
    assert!(!m.assume_equal(a, &ok(e(a).add(&DimExpr::constant(1)))));
    assert!(!m.assume_equal(a, &DimExpr::constant(3)));
    assert!(m.assume_equal(d, &DimExpr::constant(16)));
    assert_eq!(m.canon_dim(&Dim::sym(d)).as_known(), Some(16));
    assert!(m.assume_equal(a, &ok(e(b).add(&e(c)))));
    assert!(!m.assume_equal(a, &e(c)));
    // b = c * 2 rewrites a's expression, so no expression names a symbol that has one.
    assert!(m.assume_equal(b, &ok(e(c).scale(2))));
    let names = m.clone();
    let name = |s: crate::Sym| names.symbols[s].name.clone();
    assert_eq!(m.symbols[a].equals.as_ref().unwrap().render(&name), "3 * c");
    // c can no longer be defined through a or b: both are c in disguise.
    assert!(!m.assume_equal(c, &e(a)));
    assert_eq!(m.canon_dim(&Dim::sym(a)).render(&name), "3 * c");
}

/// A node's rule applied to operands given from outside the module (a run's concrete shapes
/// and shape contents), where the module knows neither.
#[test]
fn node_types_from_given_operands() {
    let src = "graph @g(%a: f32[*], %s: i64[*], %b: f32[*]) -> (f32[*]) {\n  %r = Reshape(%a, %s) : f32[*]\n  %y = MatMul(%r, %b) : f32[*]\n  return %y\n}\n";
    let (m, _) = crate::text::parse(src).expect("parses");
    let g = m.entries[0].graph;
    let [reshape, matmul] = m.graphs[g].nodes[..] else {
        panic!("two nodes");
    };
    let k = |d: &[i64]| d.iter().map(|&x| Dim::known(x)).collect::<Vec<_>>();
    let f32_of = |d: &[i64]| Type::tensor(DType::F32, k(d));
    let types = [f32_of(&[12]), Type::tensor(DType::I64, k(&[2]))];
    let vals = [None, Some(k(&[-1, 3]))];
    let given = super::Operands {
        types: &types,
        vals: &vals,
    };
    let out = super::infer_node_types(&m, &m.nodes[reshape], 17, &given);
    assert_eq!(out, vec![f32_of(&[4, 3])]);
    let types = [f32_of(&[4, 3]), f32_of(&[3, 5])];
    let given = super::Operands {
        types: &types,
        vals: &[],
    };
    let out = super::infer_node_types(&m, &m.nodes[matmul], 17, &given);
    assert_eq!(out, vec![f32_of(&[4, 5])]);
    // Without given operands the module knows nothing of either result.
    assert!(
        m.value_type(m.nodes[matmul].outputs[0].expect("y"))
            .as_tensor()
            .is_none_or(|t| t.shape.is_none())
    );
}

/// A node of `op_type` with `attrs` and `outs` results (every attribute must fit the table).
fn multi(
    b: &mut B,
    op_type: &str,
    attrs: Vec<(&str, Attr)>,
    inputs: &[Value],
    outs: usize,
) -> Vec<Value> {
    let op = Op::from_parts(
        "",
        op_type,
        attrs.into_iter().map(|(k, a)| (k.to_owned(), a)).collect(),
    );
    assert!(
        !op.is_custom(),
        "{op_type}: attributes must fit the typed op"
    );
    let g = b.g;
    b.node_in(g, op, inputs, outs)
}

#[test]
fn long_tail_ops_are_typed() {
    let mut b = B::new(20);
    let (n, t) = (b.sym("n"), b.sym("t"));
    // Recurrent layers, both layouts; the hidden size from the attribute or from R.
    let x = b.input("x", DType::F32, vec![t.clone(), n.clone(), 8.into()]);
    let w = b.weight(vec![2, 64, 8]);
    let r = b.weight(vec![2, 64, 16]);
    let lstm = multi(
        &mut b,
        "LSTM",
        vec![("direction", Attr::String("bidirectional".into()))],
        &[x, w, r],
        3,
    );
    let xb = b.input("xb", DType::F32, vec![n.clone(), t.clone(), 8.into()]);
    let w1 = b.weight(vec![1, 48, 8]);
    let r1 = b.weight(vec![1, 48, 16]);
    let gru = multi(
        &mut b,
        "GRU",
        vec![("hidden_size", Attr::Int(16)), ("layout", Attr::Int(1))],
        &[xb, w1, r1],
        2,
    );
    // Linear algebra, signal and vision ops.
    let m = b.input("m", DType::F32, vec![n.clone(), 3.into(), 3.into()]);
    let det = b.op("Det", vec![], &[m]);
    let size = b.ints(&[400], vec![]);
    let hann = b.op("HannWindow", vec![], &[size]);
    let boxes = b.input("boxes", DType::F32, vec![1.into(), n.clone(), 4.into()]);
    let scores = b.input("scores", DType::F32, vec![1.into(), 2.into(), n.clone()]);
    let nms = b.op("NonMaxSuppression", vec![], &[boxes, scores]);
    let img = b.input(
        "img",
        DType::F32,
        vec![n.clone(), 16.into(), 32.into(), 32.into()],
    );
    let rois = b.input("rois", DType::F32, vec![t.clone(), 4.into()]);
    let idx = b.input("idx", DType::I64, vec![t.clone()]);
    let roi = b.op(
        "RoiAlign",
        vec![
            ("output_height", Attr::Int(7)),
            ("output_width", Attr::Int(5)),
        ],
        &[img, rois, idx],
    );
    let grid = b.input(
        "grid",
        DType::F32,
        vec![n.clone(), 10.into(), 12.into(), 2.into()],
    );
    let sampled = b.op("GridSample", vec![], &[img, grid]);
    let pooled = b.input(
        "pooled",
        DType::F32,
        vec![n.clone(), 16.into(), 16.into(), 16.into()],
    );
    let argmax = b.input(
        "argmax",
        DType::I64,
        vec![n.clone(), 16.into(), 16.into(), 16.into()],
    );
    let unpool = b.op(
        "MaxUnpool",
        vec![("kernel_shape", ints(&[2, 2])), ("strides", ints(&[2, 2]))],
        &[pooled, argmax],
    );
    let sig = b.input("sig", DType::F32, vec![n.clone(), 1000.into(), 1.into()]);
    let step = b.ints(&[100], vec![]);
    let win = b.floats(&[1.0; 400], vec![400]);
    let stft = b.op("STFT", vec![], &[sig, step, win]);
    let dft = b.op("DFT", vec![("onesided", Attr::Int(1))], &[sig]);
    let theta = b.input("theta", DType::F32, vec![n.clone(), 2.into(), 3.into()]);
    let out_size = b.ints(&[2, 3, 24, 32], vec![4]);
    let affine = b.op("AffineGrid", vec![], &[theta, out_size]);
    let scales = b.floats(&[1.0, 1.0, 2.0, 2.0], vec![4]);
    let up = b.op("Upsample", vec![], &[img, scales]);
    // Data-dependent sizes, losses, strings and sequences.
    let cond = b.input("cond", DType::Bool, vec![16.into()]);
    let comp = b.op("Compress", vec![("axis", Attr::Int(1))], &[img, cond]);
    let uniq = multi(&mut b, "Unique", vec![], &[x], 4);
    let logits = b.input("logits", DType::F32, vec![n.clone(), 10.into()]);
    let labels = b.input("labels", DType::I64, vec![n.clone()]);
    let sce = multi(
        &mut b,
        "SoftmaxCrossEntropyLoss",
        vec![("reduction", Attr::String("none".into()))],
        &[logits, labels],
        2,
    );
    let nll = b.op("NegativeLogLikelihoodLoss", vec![], &[logits, labels]);
    let eye = b.op("EyeLike", vec![("dtype", Attr::Int(7))], &[logits]);
    let words = b.input("words", DType::String, vec![n.clone()]);
    let split = multi(&mut b, "StringSplit", vec![], &[words], 2);
    let seq = b.op("SequenceConstruct", vec![], &[logits, logits]);
    let at = b.ints(&[0], vec![]);
    let first = b.op("SequenceAt", vec![], &[seq, at]);
    let len = b.op("SequenceLength", vec![], &[seq]);
    let stacked = b.op(
        "ConcatFromSequence",
        vec![("axis", Attr::Int(0)), ("new_axis", Attr::Int(1))],
        &[seq],
    );
    infer_module(&mut b.m);
    let shows = |vs: &[Value]| vs.iter().map(|&v| b.show(v)).collect::<Vec<_>>();
    assert_eq!(
        shows(&lstm),
        ["f32[t, 2, n, 16]", "f32[2, n, 16]", "f32[2, n, 16]"]
    );
    assert_eq!(shows(&gru), ["f32[n, t, 1, 16]", "f32[n, 1, 16]"]);
    assert_eq!(b.show(det), "f32[n]");
    assert_eq!(b.show(hann), "f32[400]");
    assert_eq!(b.show(nms), "i64[?, 3]");
    assert_eq!(b.show(roi), "f32[t, 16, 7, 5]");
    assert_eq!(b.show(sampled), "f32[n, 16, 10, 12]");
    assert_eq!(b.show(unpool), "f32[n, 16, 32, 32]");
    assert_eq!(b.show(stft), "f32[n, 7, 201, 2]");
    // Opset 20: the axis defaults to -2 (the signal's time axis).
    assert_eq!(b.show(dft), "f32[n, 501, 2]");
    assert_eq!(b.show(affine), "f32[2, 24, 32, 2]");
    assert_eq!(b.show(up), "f32[n, 16, 64, 64]");
    assert_eq!(b.show(comp), "f32[n, ?, 32, 32]");
    assert_eq!(shows(&uniq), ["f32[?]", "i64[?]", "i64[?]", "i64[?]"]);
    assert_eq!(shows(&sce), ["f32[n]", "f32[n, 10]"]);
    assert_eq!(b.show(nll), "f32[]");
    assert_eq!(b.show(eye), "i64[n, 10]");
    assert_eq!(shows(&split), ["string[n, ?]", "i64[n]"]);
    assert_eq!(b.show(first), "f32[n, 10]");
    assert_eq!(b.show(len), "i64[]");
    assert_eq!(b.show(stacked), "f32[?, n, 10]");
}
