//! What TensorRT's ONNX parser and its explicit-quantization rules accept, checked on a module:
//! ops in the parser's support matrix (default domain only) with their operand restrictions, and
//! Q/DQ by TensorRT's rules.

use std::collections::HashMap;

use mmq_ir::{Const, DType, GraphId, Module, Node, Op, Value};
use mmq_ir::{OpKind, plugin};
use mmq_kernels::Tensor;
use mmq_passes::targets::OpName;
use mmq_passes::targets::trt::parser_supports;

/// One violation: the node (its name and op) and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Finding {
    /// `name (Op)` of the node.
    pub node: String,
    /// What TensorRT would refuse.
    pub message: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.node, self.message)
    }
}

fn values_f64(m: &Module, c: Const) -> Option<Vec<f64>> {
    Tensor::from_const(&m.consts[c]).ok()?.to_f64().ok()
}

struct Linter<'m> {
    m: &'m Module,
    consumers: HashMap<Value, Vec<Node>>,
    out: Vec<Finding>,
}

impl Linter<'_> {
    fn finding(&mut self, n: Node, message: impl Into<String>) {
        let nd = &self.m.nodes[n];
        self.out.push(Finding {
            node: format!(
                "{} ({})",
                nd.name.as_deref().unwrap_or("<unnamed>"),
                nd.op.op_type()
            ),
            message: message.into(),
        });
    }

    fn input(&self, n: Node, i: usize) -> Option<Value> {
        self.m.nodes[n].inputs.get(i).copied().flatten()
    }

    /// Operand `i`, when present, must be a constant (an initializer for the parser).
    fn constant_operand(&mut self, n: Node, i: usize, what: &str) {
        if let Some(v) = self.input(n, i)
            && self.m.const_source(v).is_none()
        {
            self.finding(n, format!("`{what}` (input {i}) must be an initializer"));
        }
    }

    /// A node of mmq's plugin domain: a plugin the package builds, with its namespace, version
    /// and fields, and as many inputs and outputs as its schema says.
    fn plugin(&mut self, n: Node) {
        let nd = &self.m.nodes[n];
        let Some(schema) = plugin::schema(nd.op.op_type()) else {
            self.finding(n, "no mmq plugin of this name");
            return;
        };
        let attrs = nd.op.attrs();
        let string = |name: &str| {
            attrs.iter().find_map(|(k, a)| match a {
                mmq_ir::Attr::String(s) if *k == name => Some(s.clone()),
                _ => None,
            })
        };
        let mut problems = Vec::new();
        if string("plugin_namespace").as_deref() != Some(plugin::NAMESPACE) {
            problems.push(format!("plugin_namespace must be '{}'", plugin::NAMESPACE));
        }
        if string("plugin_version").as_deref() != Some(plugin::VERSION) {
            problems.push(format!("plugin_version must be '{}'", plugin::VERSION));
        }
        for (k, a) in &attrs {
            if k.starts_with("plugin_") {
                continue;
            }
            if !schema.fields.iter().any(|f| f.name == *k) {
                problems.push(format!("'{k}' is not a field of the plugin"));
            } else if !matches!(a, mmq_ir::Attr::Int(_)) {
                problems.push(format!("field '{k}' must be an INT attribute"));
            }
        }
        let inputs = nd.inputs.iter().flatten().count();
        let required = schema
            .inputs
            .iter()
            .filter(|i| !i.ends_with("(optional)"))
            .count();
        if inputs != nd.inputs.len() || !(required..=schema.inputs.len()).contains(&inputs) {
            problems.push(format!(
                "{} inputs (none omitted) where the plugin takes {required} to {}",
                nd.inputs.len(),
                schema.inputs.len()
            ));
        }
        if nd.outputs.len() != schema.outputs.len() {
            problems.push(format!(
                "{} outputs where the plugin has {}",
                nd.outputs.len(),
                schema.outputs.len()
            ));
        }
        for p in problems {
            self.finding(n, p);
        }
    }

    fn node(&mut self, n: Node) {
        let op = &self.m.nodes[n].op;
        if op.domain() == plugin::DOMAIN {
            self.plugin(n);
            return;
        }
        if !op.domain().is_empty() && op.domain() != "ai.onnx" {
            self.finding(
                n,
                format!(
                    "domain '{}' is not TensorRT's (no plugin backs it)",
                    op.domain()
                ),
            );
            return;
        }
        let name = OpName {
            kind: OpKind::of(op.domain(), op.op_type()),
            domain: op.domain(),
            op_type: op.op_type(),
        };
        if !parser_supports(name) {
            self.finding(n, "not in TensorRT's ONNX parser support matrix");
            return;
        }
        use OpKind as K;
        match name.kind {
            K::QuantizeLinear | K::DequantizeLinear => self.qdq(n),
            K::ReduceL1
            | K::ReduceL2
            | K::ReduceLogSum
            | K::ReduceLogSumExp
            | K::ReduceMax
            | K::ReduceMean
            | K::ReduceMin
            | K::ReduceProd
            | K::ReduceSum
            | K::ReduceSumSquare
            | K::Squeeze
            | K::Unsqueeze => self.constant_operand(n, 1, "axes"),
            K::Slice => self.constant_operand(n, 3, "axes"),
            K::Pad => self.constant_operand(n, 3, "axes"),
            K::CumSum => self.constant_operand(n, 1, "axis"),
            K::OneHot => self.constant_operand(n, 1, "depth"),
            K::MaxPool | K::AveragePool => {
                if let Some(r) = self.input(n, 0).and_then(|v| self.rank(v))
                    && !(4..=5).contains(&r)
                {
                    self.finding(n, format!("2D or 3D pooling only (input rank {r})"));
                }
                if self.m.nodes[n].outputs.get(1).copied().flatten().is_some() {
                    self.finding(n, "the Indices output is not supported");
                }
            }
            K::LayerNormalization
                if self.m.nodes[n].outputs.iter().skip(1).any(Option::is_some) =>
            {
                self.finding(n, "only the first output Y is supported");
            }
            _ => {}
        }
    }

    fn rank(&self, v: Value) -> Option<usize> {
        self.m
            .value_type(v)
            .as_tensor()?
            .shape
            .as_ref()
            .map(Vec::len)
    }

    /// TensorRT's Q/DQ: constant positive scales, zero points absent or constant zeros;
    /// per-channel scales only where a constant weight is dequantized, on the weight's output
    /// channel axis (0 for Conv and `transB = 1` Gemm, 1 for MatMul and Gemm).
    fn qdq(&mut self, n: Node) {
        let is_q = matches!(self.m.nodes[n].op, Op::QuantizeLinear { .. });
        let Some(scale) = self.input(n, 1) else {
            return;
        };
        let Some(sc) = self.m.const_source(scale) else {
            self.finding(n, "the scale must be a constant");
            return;
        };
        match values_f64(self.m, sc) {
            Some(v) if v.iter().all(|x| x.is_finite() && *x > 0.0) => {}
            _ => self.finding(n, "scales must be finite and positive"),
        }
        if let Some(z) = self.input(n, 2) {
            match self.m.const_source(z).and_then(|c| values_f64(self.m, c)) {
                Some(v) if v.iter().all(|x| *x == 0.0) => {}
                _ => self.finding(
                    n,
                    "zero points must be constant zeros: TensorRT quantizes symmetric only (an \
                     asymmetric unit needs a plugin, which this version does not emit)",
                ),
            }
        }
        // The quantized side: INT8, INT4 or FP8 E4M3 (TensorRT's quantized types).
        let q_side = if is_q {
            self.m.nodes[n].outputs.first().copied().flatten()
        } else {
            self.input(n, 0)
        };
        if let Some(dt) =
            q_side.and_then(|v| self.m.value_type(v).as_tensor().and_then(|t| t.dtype))
            && !matches!(dt, DType::I8 | DType::I4 | DType::F8E4M3FN)
        {
            self.finding(
                n,
                format!("quantized type {dt}: TensorRT quantizes to INT8, INT4 or FP8 E4M3 only"),
            );
        }
        let per_channel = self.m.consts[sc].num_elements() > 1;
        if !per_channel {
            return;
        }
        let blocked = matches!(
            self.m.nodes[n].op,
            Op::DequantizeLinear {
                block_size: Some(b),
                ..
            } if b > 0
        );
        let x = self.input(n, 0);
        if is_q || x.and_then(|x| self.m.const_source(x)).is_none() {
            self.finding(
                n,
                "per-channel scales on an activation (TensorRT takes them on weights only)",
            );
            return;
        }
        let axis = self.m.nodes[n].op.get::<i64>("axis").unwrap_or(1);
        let Some(y) = self.m.nodes[n].outputs.first().copied().flatten() else {
            return;
        };
        let consumers = self.consumers.get(&y).cloned().unwrap_or_default();
        if blocked
            && q_side.and_then(|v| self.m.value_type(v).as_tensor().and_then(|t| t.dtype))
                != Some(DType::I4)
        {
            self.finding(
                n,
                "blocked DequantizeLinear: TensorRT takes INT4 weights only",
            );
        }
        for c in consumers {
            let cop = &self.m.nodes[c].op;
            let trans_b = cop.get::<i64>("transB") == Some(1);
            // Per channel: the output-channel axis; blocked: the K (reduction) axis.
            let want = match (cop, blocked) {
                (Op::Conv { .. } | Op::ConvTranspose { .. }, false) => Some(0),
                (Op::MatMul { .. }, false) => Some(1),
                (Op::Gemm { .. }, false) => Some(if trans_b { 0 } else { 1 }),
                (Op::MatMul { .. }, true) => Some(0),
                (Op::Gemm { .. }, true) => Some(if trans_b { 1 } else { 0 }),
                (_, true) => {
                    let t = cop.op_type().to_owned();
                    self.finding(n, format!("blocked DequantizeLinear feeding {t}"));
                    None
                }
                _ => None,
            };
            if let Some(want) = want
                && axis != want
            {
                let t = cop.op_type().to_owned();
                let what = if blocked { "block" } else { "per-channel" };
                self.finding(
                    n,
                    format!("{what} axis {axis} of a {t} weight (TensorRT wants {want})"),
                );
            }
        }
    }
}

/// Every violation in the graphs of entry `graph` (bodies included).
pub fn lint_graph(m: &Module, graph: GraphId) -> Vec<Finding> {
    let mut consumers: HashMap<Value, Vec<Node>> = HashMap::new();
    let graphs = m.graph_tree(graph);
    for &g in &graphs {
        for &n in m.graphs[g].nodes() {
            for v in m.nodes[n].inputs.iter().flatten() {
                consumers.entry(*v).or_default().push(n);
            }
        }
    }
    let mut l = Linter {
        m,
        consumers,
        out: Vec::new(),
    };
    for &g in &graphs {
        for &n in m.graphs[g].nodes() {
            l.node(n);
        }
    }
    l.out
}

/// Every violation in every entry graph.
pub fn lint(m: &Module) -> Vec<Finding> {
    m.entries
        .iter()
        .flat_map(|e| lint_graph(m, e.graph))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(src: &str) -> Module {
        mmq_ir::text::parse(src).expect("test module parses").0
    }

    fn messages(m: &Module) -> Vec<String> {
        lint(m).iter().map(ToString::to_string).collect()
    }

    #[test]
    fn symmetric_int8_units_of_supported_ops_pass() {
        let m = parse(
            r#"
const $s : f32[] = dense<[0.05]>
const $z : i8[] = dense<[0]>
const $w : i8[4, 4] = dense<[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]>
const $ws : f32[4] = dense<[0.01, 0.02, 0.03, 0.04]>
const $wz : i8[4] = dense<[0, 0, 0, 0]>
graph @g(%x: f32[2, 4]) -> (f32[2, 4]) {
  %q = QuantizeLinear(%x, $s, $z) : i8[2, 4] loc("q")
  %d = DequantizeLinear(%q, $s, $z) : f32[2, 4] loc("d")
  %wd = DequantizeLinear($w, $ws, $wz) {axis = 1} : f32[4, 4] loc("wd")
  %y = MatMul(%d, %wd) : f32[2, 4] loc("mm")
  %r = Relu(%y) : f32[2, 4] loc("relu")
  return %r
}
"#,
        );
        assert_eq!(messages(&m), Vec::<String>::new());
    }

    #[test]
    fn asymmetric_unsigned_and_bad_scales_are_named_by_node() {
        let m = parse(
            r#"
const $s : f32[] = dense<[0.05]>
const $neg : f32[] = dense<[-0.05]>
const $uz : u8[] = dense<[128]>
const $z : i8[] = dense<[0]>
graph @g(%x: f32[2, 4], %t: f32[]) -> (f32[2, 4], f32[2, 4], f32[2, 4]) {
  %q = QuantizeLinear(%x, $s, $uz) : u8[2, 4] loc("asym")
  %d = DequantizeLinear(%q, $s, $uz) : f32[2, 4] loc("asym_dq")
  %q2 = QuantizeLinear(%x, $neg, $z) : i8[2, 4] loc("negative")
  %d2 = DequantizeLinear(%q2, $neg, $z) : f32[2, 4] loc("negative_dq")
  %q3 = QuantizeLinear(%x, %t, $z) : i8[2, 4] loc("runtime_scale")
  %d3 = DequantizeLinear(%q3, $s, $z) : f32[2, 4] loc("fine_dq")
  return %d, %d2, %d3
}
"#,
        );
        let got = messages(&m);
        let has = |node: &str, text: &str| {
            got.iter()
                .any(|f| f.starts_with(&format!("{node} (")) && f.contains(text))
        };
        assert!(
            has("asym", "zero points must be constant zeros"),
            "{got:#?}"
        );
        assert!(has("asym", "quantized type u8"), "{got:#?}");
        assert!(has("asym_dq", "quantized type u8"), "{got:#?}");
        assert!(
            has("negative", "scales must be finite and positive"),
            "{got:#?}"
        );
        assert!(
            has("negative_dq", "scales must be finite and positive"),
            "{got:#?}"
        );
        assert!(
            has("runtime_scale", "the scale must be a constant"),
            "{got:#?}"
        );
        assert!(!got.iter().any(|f| f.starts_with("fine_dq (")), "{got:#?}");
    }

    #[test]
    fn ops_outside_the_parser_matrix_are_reported() {
        let m = parse(
            r#"
graph @g(%x: f32[2, 4], %a: f32[3, 3]) -> (f32[2, 4], f32[]) {
  %y = "com.microsoft".FastGelu(%x) : f32[2, 4] loc("gelu")
  %d = Det(%a) : f32[] loc("det")
  return %y, %d
}
"#,
        );
        let got = messages(&m);
        assert_eq!(
            got,
            [
                "gelu (FastGelu): domain 'com.microsoft' is not TensorRT's (no plugin backs it)",
                "det (Det): not in TensorRT's ONNX parser support matrix"
            ],
        );
    }
}
