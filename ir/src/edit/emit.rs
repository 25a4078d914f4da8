//! [`Emit`]: a small builder of the nodes a pass inserts at one place of one graph: ops with
//! fresh names (types left to inference), constants, and the usual shape plumbing.

use super::NewNode;
use crate::constant::{ConstData, Storage};
use crate::{At, DType, GraphId, Module, Node, Op, Type, Value};
use bytes::Bytes;

/// Emits nodes at one place of one graph.
pub struct Emit {
    /// The graph.
    pub graph: GraphId,
    prefix: String,
    /// The graph's default-domain opset.
    pub opset: i64,
    /// The nodes emitted so far, in order.
    pub nodes: Vec<Node>,
    next: usize,
}

impl Emit {
    /// Emits into `graph`, naming with `prefix`: its names (`prefix_what_N`) continue after the
    /// ones an earlier `Emit` of the same prefix gave the module's values.
    pub fn new(m: &Module, graph: GraphId, prefix: &str) -> Self {
        let start = format!("{prefix}_");
        let next = m
            .values
            .iter()
            .filter_map(|(_, v)| v.name.as_deref()?.strip_prefix(start.as_str()))
            .filter_map(|rest| rest.rsplit_once('_')?.1.parse::<usize>().ok())
            .max()
            .unwrap_or(0);
        Emit {
            graph,
            prefix: prefix.to_owned(),
            opset: m.onnx_opset(graph).unwrap_or(0),
            nodes: Vec::new(),
            next,
        }
    }

    /// A fresh name for `what`.
    pub fn fresh(&mut self, what: &str) -> String {
        self.next += 1;
        format!("{}_{what}_{}", self.prefix, self.next)
    }

    /// A node of `op` on `inputs`; its one result.
    pub fn op(&mut self, m: &mut Module, op: Op, inputs: Vec<Value>) -> Value {
        let name = self.fresh(&op.op_type().to_ascii_lowercase());
        let n = m.cursor(self.graph, At::Unlisted).insert(
            NewNode::new(op, inputs.into_iter().map(Some).collect())
                .output(name.clone())
                .named(name),
        );
        self.nodes.push(n);
        m.nodes[n].outputs[0].expect("one result")
    }

    /// A node of `op` with two results.
    pub fn op2(&mut self, m: &mut Module, op: Op, inputs: Vec<Value>) -> [Value; 2] {
        let name = self.fresh(&op.op_type().to_ascii_lowercase());
        let outs = (0..2)
            .map(|i| Some((Some(format!("{name}_{i}")), Type::Unknown)))
            .collect();
        let n = m.cursor(self.graph, At::Unlisted).insert(
            NewNode::new(op, inputs.into_iter().map(Some).collect())
                .outputs(outs)
                .named(name),
        );
        self.nodes.push(n);
        let out = |i: usize| m.nodes[n].outputs[i].expect("declared results");
        [out(0), out(1)]
    }

    /// `Shape(x)`.
    pub fn shape(&mut self, m: &mut Module, x: Value) -> Value {
        let op = Op::Shape {
            start: None,
            end: None,
        };
        self.op(m, op, vec![x])
    }

    /// A constant of `dtype` and `shape` holding `bytes`, with a fresh name.
    fn constant(&mut self, m: &mut Module, dtype: DType, shape: Vec<i64>, bytes: Vec<u8>) -> Value {
        let name = self.fresh("const");
        m.add_const(ConstData::new(
            Some(name),
            dtype,
            shape,
            Storage::Inline(Bytes::from(bytes)),
        ))
    }

    /// A 1-D i64 constant.
    pub fn i64s(&mut self, m: &mut Module, vals: &[i64]) -> Value {
        let bytes = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.constant(m, DType::I64, vec![vals.len() as i64], bytes)
    }

    /// An i64 scalar constant.
    pub fn i64_scalar(&mut self, m: &mut Module, v: i64) -> Value {
        self.constant(m, DType::I64, vec![], v.to_le_bytes().to_vec())
    }

    /// An i64 constant of `shape` (row-major `vals`).
    pub fn i64_tensor(&mut self, m: &mut Module, shape: Vec<i64>, vals: &[i64]) -> Value {
        let bytes = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.constant(m, DType::I64, shape, bytes)
    }

    /// An f32 constant of `shape` (row-major `vals`).
    pub fn f32s(&mut self, m: &mut Module, shape: Vec<i64>, vals: &[f32]) -> Value {
        let bytes = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.constant(m, DType::F32, shape, bytes)
    }

    /// An f32 scalar constant.
    pub fn f32(&mut self, m: &mut Module, v: f32) -> Value {
        self.constant(m, DType::F32, vec![], v.to_le_bytes().to_vec())
    }

    /// `Cast(x, to)`.
    pub fn cast(&mut self, m: &mut Module, x: Value, to: DType) -> Value {
        let op = Op::Cast {
            round_mode: None,
            saturate: None,
            to: Some(i64::from(to.onnx_code())),
        };
        self.op(m, op, vec![x])
    }

    /// A binary `op` of `a` and `b`.
    pub fn binary(&mut self, m: &mut Module, op: Op, a: Value, b: Value) -> Value {
        self.op(m, op, vec![a, b])
    }

    /// `Shape(x)[axis]` as a 1-element tensor.
    pub fn dim(&mut self, m: &mut Module, x: Value, axis: i64) -> Value {
        let shape = self.shape(m, x);
        let idx = self.i64s(m, &[axis]);
        self.binary(m, Op::Gather { axis: Some(0) }, shape, idx)
    }

    /// The maximum over the last axis, kept as a dim of 1.
    pub fn reduce_max_last(&mut self, m: &mut Module, x: Value) -> Value {
        let abs = self.op(m, Op::Abs {}, vec![x]);
        if self.opset >= 18 {
            let axes = self.i64s(m, &[-1]);
            let op = Op::ReduceMax {
                axes: None,
                keepdims: Some(1),
                noop_with_empty_axes: None,
            };
            self.op(m, op, vec![abs, axes])
        } else {
            let op = Op::ReduceMax {
                axes: Some(vec![-1]),
                keepdims: Some(1),
                noop_with_empty_axes: None,
            };
            self.op(m, op, vec![abs])
        }
    }

    /// `x` with a trailing axis of 1.
    pub fn unsqueeze_last(&mut self, m: &mut Module, x: Value) -> Value {
        let axes = self.i64s(m, &[-1]);
        self.op(m, Op::Unsqueeze { axes: None }, vec![x, axes])
    }

    /// `x` without its trailing axis of 1.
    pub fn squeeze_last(&mut self, m: &mut Module, x: Value) -> Value {
        let axes = self.i64s(m, &[-1]);
        self.op(m, Op::Squeeze { axes: None }, vec![x, axes])
    }

    /// `Reshape(x, shape)`.
    pub fn reshape(&mut self, m: &mut Module, x: Value, shape: Value) -> Value {
        self.op(m, Op::Reshape { allowzero: None }, vec![x, shape])
    }

    /// `x` (rank `rank`) padded with zeros along the token axis to a multiple of `tokens`;
    /// returns the padded tensor and the original token count (1 element).
    pub fn pad_tokens(
        &mut self,
        m: &mut Module,
        x: Value,
        rank: usize,
        tokens: i64,
    ) -> (Value, Value) {
        let axis = rank as i64 - 2;
        let t = self.dim(m, x, axis);
        let bt = self.i64s(m, &[tokens]);
        let rem = self.binary(m, Op::Mod { fmod: None }, t, bt);
        let short = self.binary(m, Op::Sub {}, bt, rem);
        let padn = self.binary(m, Op::Mod { fmod: None }, short, bt);
        let head = self.i64s(m, &vec![0; 2 * rank - 2]);
        let tail = self.i64s(m, &[0]);
        let pads = self.op(m, Op::Concat { axis: Some(0) }, vec![head, padn, tail]);
        let op = Op::Pad {
            mode: None,
            pads: None,
            value: None,
        };
        let padded = self.op(m, op, vec![x, pads]);
        (padded, t)
    }

    /// `x[..., :t, :]` along the token axis.
    pub fn take_tokens(&mut self, m: &mut Module, x: Value, rank: usize, t: Value) -> Value {
        let starts = self.i64s(m, &[0]);
        let axes = self.i64s(m, &[rank as i64 - 2]);
        let op = Op::Slice {
            starts: None,
            ends: None,
            axes: None,
        };
        self.op(m, op, vec![x, starts, t, axes])
    }

    /// `[0, …, 0, -1, last]`: keeps the leading dims, merges the rest into rows of `last`.
    pub fn rows(&mut self, m: &mut Module, keep: usize, last: &[i64]) -> Value {
        let mut shape = vec![0; keep];
        shape.push(-1);
        shape.extend_from_slice(last);
        self.i64s(m, &shape)
    }
}

/// Places the emitted nodes: at the start of the graph's list (they read inputs and constants
/// only) or at its end (they feed outputs only).
pub fn place(m: &mut Module, e: Emit, start: bool) {
    let at = if start { At::Start } else { At::End };
    m.list_nodes(e.graph, at, &e.nodes);
}

/// Places the emitted nodes right before `node` in its graph's list.
pub fn place_before(m: &mut Module, e: Emit, node: Node) {
    m.list_nodes(e.graph, At::Before(node), &e.nodes);
}
