//! A small builder of the nodes a pass inserts at one place of one graph: ops with fresh names
//! (types left to inference), constants, and the usual shape plumbing.

use bytes::Bytes;
use mmq_ir::constant::{ConstData, Storage};
use mmq_ir::{At, DType, GraphId, Module, Node, Op, Type, Value};

/// Emits nodes at one place of one graph.
pub(crate) struct Emit {
    pub(crate) graph: GraphId,
    prefix: String,
    pub(crate) opset: i64,
    pub(crate) nodes: Vec<Node>,
    next: usize,
}

impl Emit {
    pub(crate) fn new(m: &Module, graph: GraphId, prefix: &str) -> Self {
        Emit {
            graph,
            prefix: prefix.to_owned(),
            opset: m.onnx_opset(graph).unwrap_or(0),
            nodes: Vec::new(),
            next: 0,
        }
    }

    pub(crate) fn fresh(&mut self, what: &str) -> String {
        self.next += 1;
        format!("{}_{what}_{}", self.prefix, self.next)
    }

    pub(crate) fn op(&mut self, m: &mut Module, op: Op, inputs: Vec<Value>) -> Value {
        let name = self.fresh(&op.op_type().to_ascii_lowercase());
        let n = m.insert_node(
            self.graph,
            At::Unlisted,
            op,
            inputs.into_iter().map(Some).collect(),
            vec![Some((Some(name.clone()), Type::Unknown))],
            Some(name),
        );
        self.nodes.push(n);
        m.nodes[n].outputs[0].expect("one result")
    }

    /// A node of `op` with two results.
    pub(crate) fn op2(&mut self, m: &mut Module, op: Op, inputs: Vec<Value>) -> [Value; 2] {
        let name = self.fresh(&op.op_type().to_ascii_lowercase());
        let outs = (0..2)
            .map(|i| Some((Some(format!("{name}_{i}")), Type::Unknown)))
            .collect();
        let n = m.insert_node(
            self.graph,
            At::Unlisted,
            op,
            inputs.into_iter().map(Some).collect(),
            outs,
            Some(name),
        );
        self.nodes.push(n);
        let out = |i: usize| m.nodes[n].outputs[i].expect("declared results");
        [out(0), out(1)]
    }

    /// `Shape(x)`.
    pub(crate) fn shape(&mut self, m: &mut Module, x: Value) -> Value {
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

    pub(crate) fn i64s(&mut self, m: &mut Module, vals: &[i64]) -> Value {
        let bytes = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.constant(m, DType::I64, vec![vals.len() as i64], bytes)
    }

    /// An i64 scalar constant.
    pub(crate) fn i64_scalar(&mut self, m: &mut Module, v: i64) -> Value {
        self.constant(m, DType::I64, vec![], v.to_le_bytes().to_vec())
    }

    pub(crate) fn f32(&mut self, m: &mut Module, v: f32) -> Value {
        self.constant(m, DType::F32, vec![], v.to_le_bytes().to_vec())
    }

    pub(crate) fn cast(&mut self, m: &mut Module, x: Value, to: DType) -> Value {
        let op = Op::Cast {
            round_mode: None,
            saturate: None,
            to: Some(i64::from(to.onnx_code())),
        };
        self.op(m, op, vec![x])
    }

    pub(crate) fn binary(&mut self, m: &mut Module, op: Op, a: Value, b: Value) -> Value {
        self.op(m, op, vec![a, b])
    }

    /// `Shape(x)[axis]` as a 1-element tensor.
    pub(crate) fn dim(&mut self, m: &mut Module, x: Value, axis: i64) -> Value {
        let shape = self.shape(m, x);
        let idx = self.i64s(m, &[axis]);
        self.binary(m, Op::Gather { axis: Some(0) }, shape, idx)
    }

    pub(crate) fn reduce_max_last(&mut self, m: &mut Module, x: Value) -> Value {
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

    pub(crate) fn unsqueeze_last(&mut self, m: &mut Module, x: Value) -> Value {
        let axes = self.i64s(m, &[-1]);
        self.op(m, Op::Unsqueeze { axes: None }, vec![x, axes])
    }

    pub(crate) fn squeeze_last(&mut self, m: &mut Module, x: Value) -> Value {
        let axes = self.i64s(m, &[-1]);
        self.op(m, Op::Squeeze { axes: None }, vec![x, axes])
    }

    pub(crate) fn reshape(&mut self, m: &mut Module, x: Value, shape: Value) -> Value {
        self.op(m, Op::Reshape { allowzero: None }, vec![x, shape])
    }

    /// `x` (rank `rank`) padded with zeros along the token axis to a multiple of `tokens`;
    /// returns the padded tensor and the original token count (1 element).
    pub(crate) fn pad_tokens(
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
    pub(crate) fn take_tokens(&mut self, m: &mut Module, x: Value, rank: usize, t: Value) -> Value {
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
    pub(crate) fn rows(&mut self, m: &mut Module, keep: usize, last: &[i64]) -> Value {
        let mut shape = vec![0; keep];
        shape.push(-1);
        shape.extend_from_slice(last);
        self.i64s(m, &shape)
    }
}

/// Places the emitted nodes: at the start of the graph's list (they read inputs and constants
/// only) or at its end (they feed outputs only).
pub(crate) fn place(m: &mut Module, e: Emit, start: bool) {
    let list = &mut m.graphs[e.graph].nodes;
    if start {
        list.splice(0..0, e.nodes);
    } else {
        list.extend(e.nodes);
    }
}

/// Places the emitted nodes right before `node` in its graph's list.
pub(crate) fn place_before(m: &mut Module, e: Emit, node: Node) {
    let list = &mut m.graphs[e.graph].nodes;
    let at = list.iter().position(|&n| n == node).unwrap_or(list.len());
    list.splice(at..at, e.nodes);
}
