//! Control-flow and sequence tests on small hand-built modules.

use std::collections::HashMap;

use mmq_ir::{Attr, CustomOp, DType, Module, Op, Type, Value};

use crate::interp::Interpreter;
use crate::tensor::{Data, RtValue, Tensor};

fn i64_ty(dims: &[i64]) -> Type {
    Type::tensor(
        DType::I64,
        dims.iter().map(|&d| mmq_ir::Dim::known(d)).collect(),
    )
}

fn bool_ty() -> Type {
    Type::tensor(DType::Bool, vec![])
}

fn custom(op_type: &str, attrs: Vec<(String, Attr)>) -> Op {
    Op::Custom(CustomOp {
        domain: String::new(),
        op_type: op_type.to_owned(),
        attrs,
    })
}

fn out(m: &Module, v: &RtValue) -> (Vec<usize>, Data) {
    let _ = m;
    let t = v.as_tensor().expect("a tensor");
    (t.shape.clone(), t.data.clone())
}

fn run(m: &Module, g: mmq_ir::GraphId, inputs: Vec<(&str, Tensor)>) -> Vec<RtValue> {
    let inputs: HashMap<String, RtValue> = inputs
        .into_iter()
        .map(|(n, t)| (n.to_owned(), t.into()))
        .collect();
    Interpreter::new(m)
        .run(g, &inputs)
        .expect("run")
        .into_iter()
        .map(|(_, v)| v)
        .collect()
}

fn bool_t(b: bool) -> Tensor {
    Tensor::new(DType::Bool, vec![], Data::Bool(vec![b])).expect("tensor")
}

#[test]
fn if_picks_the_branch() {
    let mut m = Module::new();
    let g = m.add_graph("main", None);
    let c = m.add_input(g, Some("c".into()), bool_ty());
    let x = m.add_input(g, Some("x".into()), i64_ty(&[2]));
    let y = m.add_input(g, Some("y".into()), i64_ty(&[2]));
    let then_g = m.add_graph("then", None);
    m.graphs[then_g].outputs.push(x);
    let else_g = m.add_graph("else", None);
    m.graphs[else_g].outputs.push(y);
    let n = m.add_node(
        g,
        Op::If {
            then_branch: Some(then_g),
            else_branch: Some(else_g),
        },
        vec![Some(c)],
        vec![Some((Some("z".into()), i64_ty(&[2])))],
        None,
    );
    let z: Value = m.nodes[n].outputs[0].expect("output");
    m.graphs[g].outputs.push(z);
    for (cond, want) in [(true, vec![1, 2]), (false, vec![3, 4])] {
        let outs = run(
            &m,
            g,
            vec![
                ("c", bool_t(cond)),
                ("x", Tensor::from_i64(vec![2], vec![1, 2]).expect("x")),
                ("y", Tensor::from_i64(vec![2], vec![3, 4]).expect("y")),
            ],
        );
        assert_eq!(out(&m, &outs[0]), (vec![2], Data::I64(want)));
    }
}

/// `Loop(M, cond, seq)` whose body appends the iteration number to `seq` and also emits it as a
/// scan output.
fn loop_module() -> (Module, mmq_ir::GraphId) {
    let mut m = Module::new();
    let g = m.add_graph("main", None);
    let trips = m.add_input(g, Some("M".into()), i64_ty(&[]));
    let cond = m.add_input(g, Some("cond".into()), bool_ty());
    let empty = m.add_node(
        g,
        custom("SequenceEmpty", vec![]),
        vec![],
        vec![Some((None, Type::Sequence(Box::new(i64_ty(&[])))))],
        None,
    );
    let seq0 = m.nodes[empty].outputs[0].expect("seq");
    let body = m.add_graph("body", None);
    let iter = m.add_input(body, Some("i".into()), i64_ty(&[]));
    let c_in = m.add_input(body, Some("c_in".into()), bool_ty());
    let s_in = m.add_input(
        body,
        Some("s_in".into()),
        Type::Sequence(Box::new(i64_ty(&[]))),
    );
    let ins = m.add_node(
        body,
        custom("SequenceInsert", vec![]),
        vec![Some(s_in), Some(iter)],
        vec![Some((None, Type::Sequence(Box::new(i64_ty(&[])))))],
        None,
    );
    let s_out = m.nodes[ins].outputs[0].expect("seq");
    m.graphs[body].outputs.extend([c_in, s_out, iter]);
    let lp = m.add_node(
        g,
        Op::Loop { body: Some(body) },
        vec![Some(trips), Some(cond), Some(seq0)],
        vec![
            Some((None, Type::Sequence(Box::new(i64_ty(&[]))))),
            Some((None, Type::Unknown)),
        ],
        None,
    );
    let outs: Vec<Value> = m.nodes[lp].outputs.iter().flatten().copied().collect();
    let len = m.add_node(
        g,
        custom("SequenceLength", vec![]),
        vec![Some(outs[0])],
        vec![Some((None, i64_ty(&[])))],
        None,
    );
    let len = m.nodes[len].outputs[0].expect("len");
    m.graphs[g].outputs.extend([len, outs[1]]);
    (m, g)
}

#[test]
fn loop_carries_values_and_stacks_scan_outputs() {
    let (m, g) = loop_module();
    let outs = run(
        &m,
        g,
        vec![
            ("M", Tensor::from_i64(vec![], vec![3]).expect("M")),
            ("cond", bool_t(true)),
        ],
    );
    assert_eq!(out(&m, &outs[0]), (vec![], Data::I64(vec![3])));
    assert_eq!(out(&m, &outs[1]), (vec![3], Data::I64(vec![0, 1, 2])));
}

#[test]
fn loop_with_false_condition_runs_zero_times() {
    let (m, g) = loop_module();
    let outs = run(
        &m,
        g,
        vec![
            ("M", Tensor::from_i64(vec![], vec![3]).expect("M")),
            ("cond", bool_t(false)),
        ],
    );
    assert_eq!(out(&m, &outs[0]), (vec![], Data::I64(vec![0])));
    // Leading dim 0, dtype and trailing dims from the body's declared scan output.
    assert_eq!(out(&m, &outs[1]), (vec![0], Data::I64(vec![])));
}

#[test]
fn scan_reverses_and_places_the_output_axis() {
    let mut m = Module::new();
    let g = m.add_graph("main", None);
    let s0 = m.add_input(g, Some("s".into()), i64_ty(&[1]));
    let x = m.add_input(g, Some("x".into()), i64_ty(&[3, 2]));
    let body = m.add_graph("body", None);
    let s_in = m.add_input(body, Some("s_in".into()), i64_ty(&[1]));
    let x_t = m.add_input(body, Some("x_t".into()), i64_ty(&[2]));
    m.graphs[body].outputs.extend([s_in, x_t]);
    let n = m.add_node(
        g,
        Op::Scan {
            body: Some(body),
            num_scan_inputs: Some(1),
            scan_input_axes: None,
            scan_input_directions: Some(vec![1]),
            scan_output_axes: Some(vec![-1]),
            scan_output_directions: None,
        },
        vec![Some(s0), Some(x)],
        vec![Some((None, i64_ty(&[1]))), Some((None, i64_ty(&[2, 3])))],
        None,
    );
    let outs: Vec<Value> = m.nodes[n].outputs.iter().flatten().copied().collect();
    m.graphs[g].outputs.extend(outs);
    let res = run(
        &m,
        g,
        vec![
            ("s", Tensor::from_i64(vec![1], vec![7]).expect("s")),
            (
                "x",
                Tensor::from_i64(vec![3, 2], vec![0, 1, 2, 3, 4, 5]).expect("x"),
            ),
        ],
    );
    assert_eq!(out(&m, &res[0]), (vec![1], Data::I64(vec![7])));
    // Rows taken last to first, stacked along the last axis.
    assert_eq!(
        out(&m, &res[1]),
        (vec![2, 3], Data::I64(vec![4, 2, 0, 5, 3, 1]))
    );
}

#[test]
fn split_and_concat_sequences() {
    let mut m = Module::new();
    let g = m.add_graph("main", None);
    let x = m.add_input(g, Some("x".into()), i64_ty(&[2, 3]));
    let seq_ty = Type::Sequence(Box::new(Type::Unknown));
    let split = m.add_node(
        g,
        custom(
            "SplitToSequence",
            vec![
                ("axis".into(), Attr::Int(1)),
                ("keepdims".into(), Attr::Int(0)),
            ],
        ),
        vec![Some(x)],
        vec![Some((None, seq_ty.clone()))],
        None,
    );
    let s = m.nodes[split].outputs[0].expect("seq");
    let cat = m.add_node(
        g,
        custom(
            "ConcatFromSequence",
            vec![
                ("axis".into(), Attr::Int(0)),
                ("new_axis".into(), Attr::Int(1)),
            ],
        ),
        vec![Some(s)],
        vec![Some((None, i64_ty(&[3, 2])))],
        None,
    );
    let y = m.nodes[cat].outputs[0].expect("y");
    m.graphs[g].outputs.push(y);
    let res = run(
        &m,
        g,
        vec![(
            "x",
            Tensor::from_i64(vec![2, 3], vec![0, 1, 2, 3, 4, 5]).expect("x"),
        )],
    );
    // Splitting columns and stacking them on a new leading axis transposes.
    assert_eq!(
        out(&m, &res[0]),
        (vec![3, 2], Data::I64(vec![0, 3, 1, 4, 2, 5]))
    );
}

/// An LSTM over an input of size 0 (a hostile but well-formed shape) runs: the input products
/// are empty, the recurrence alone drives the state.
#[test]
fn lstm_over_an_empty_input_runs() {
    let src = "graph @g(%x: f32[1, 1, 0], %w: f32[1, 4, 0], %r: f32[1, 4, 1]) -> (f32[1, 1, 1, 1]) {\n  %y = \"\".LSTM(%x, %w, %r) {hidden_size = 1} : f32[1, 1, 1, 1]\n  return %y\n}\n";
    let (m, _) = mmq_ir::text::parse(src).expect("parses");
    let g = m.entries[0].graph;
    let t = |shape: Vec<usize>, v: Vec<f32>| Tensor::from_f32(shape, v).expect("tensor");
    let y = run(
        &m,
        g,
        vec![
            ("x", t(vec![1, 1, 0], vec![])),
            ("w", t(vec![1, 4, 0], vec![])),
            ("r", t(vec![1, 4, 1], vec![1.0; 4])),
        ],
    );
    // h0 = c0 = 0: every gate sees 0, so c = 0.5 * tanh(0) = 0 and h = 0.
    assert_eq!(out(&m, &y[0]), (vec![1, 1, 1, 1], Data::F32(vec![0.0])));
}

/// An f32 LSTM over many steps takes X Wᵀ as one SGEMM, over few steps as dot products: the
/// first steps of a long sequence agree with the same steps run alone.
#[test]
fn lstm_input_products_agree_across_paths() {
    let (isz, hs) = (8usize, 4usize);
    let lstm = |seq: usize| {
        let src = format!(
            "graph @g(%x: f32[{seq}, 1, {isz}], %w: f32[1, {g}, {isz}], %r: f32[1, {g}, {hs}]) -> (f32[{seq}, 1, 1, {hs}]) {{\n  %y = \"\".LSTM(%x, %w, %r) {{hidden_size = {hs}}} : f32[{seq}, 1, 1, {hs}]\n  return %y\n}}\n",
            g = 4 * hs
        );
        mmq_ir::text::parse(&src).expect("parses").0
    };
    let vals = |n: usize, seed: usize| -> Vec<f32> {
        (0..n)
            .map(|i| (((i * 7919 + seed * 104_729) % 1000) as f32 / 500.0 - 1.0) * 0.7)
            .collect()
    };
    let (w, r) = (vals(4 * hs * isz, 1), vals(4 * hs * hs, 2));
    let x = vals(24 * isz, 3);
    let t = |shape: Vec<usize>, v: Vec<f32>| Tensor::from_f32(shape, v).expect("tensor");
    let y = |seq: usize| -> Vec<f32> {
        let m = lstm(seq);
        let res = run(
            &m,
            m.entries[0].graph,
            vec![
                ("x", t(vec![seq, 1, isz], x[..seq * isz].to_vec())),
                ("w", t(vec![1, 4 * hs, isz], w.clone())),
                ("r", t(vec![1, 4 * hs, hs], r.clone())),
            ],
        );
        match out(&m, &res[0]).1 {
            Data::F32(v) => v,
            other => panic!("f32 expected, got {other:?}"),
        }
    };
    let (long, short) = (y(24), y(5));
    for (i, (a, b)) in long.iter().zip(&short).enumerate() {
        assert!((a - b).abs() <= 1e-6, "element {i}: {a} vs {b}");
    }
    assert!(long.iter().any(|v| v.abs() > 0.05), "the state moves");
}
