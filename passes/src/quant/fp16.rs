//! FP16: float32 weights stored as float16.
//!
//! # What is converted
//! Every float32 constant of at least [`Fp16Pass::min_elements`] elements (16 by default) that a
//! selected node reads: `MatMul`/`Gemm`/`Conv`/`ConvTranspose` weights and biases, norms' gamma
//! and beta, `Gather` embedding tables, `Mul`/`Add` constants, and so on, wherever the constant
//! sits: an initializer, a `Constant` node, or either of those read from inside an
//! `If`/`Loop`/`Scan` body (every graph of the module is visited). An optional node filter (a
//! precision map's plan) chooses the nodes. The float inputs of `QuantizeLinear`,
//! `DequantizeLinear` and `com.microsoft.MatMulNBits` are quantization parameters, not
//! weights, and stay float32.
//!
//! # The form (per target, [`Fp16Form`])
//! On ONNX Runtime's CPU provider (and the generic target) the constant becomes a float16
//! constant followed by `Cast(to = float)`: ONNX Runtime folds the `Cast` when the session
//! starts, so compute stays float32 while the model file holds half the bytes. A weight read by
//! several nodes, selected or not, gets one float16 copy and one `Cast` that every reader
//! shares. An initializer's `Cast` is the first node of its top-level graph; a `Constant` node
//! holds the float16 tensor itself and its `Cast` follows it in its own graph.
//!
//! Finite values beyond float16's range saturate to ±65504 (infinities and NaN stay what they
//! are); other values round to nearest even.
//!
//! Counters: `fp16-weights` (converted constants), `fp16-saturated` (saturated values, also
//! described in a note).

use std::collections::HashMap;

use bytes::Bytes;
use half::f16;
use mmq_ir::edit::NewNode;
use mmq_ir::{At, Const, ConstData, DType, GraphId, Module, Op, Storage, Type, Value, ValueDef};
use rayon::prelude::*;

use crate::pass::{Pass, PassError, PassOptions, PassReport};
use crate::quant::int8::NodeFilter;

/// How FP16 is realized on a target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fp16Form {
    /// Weights stored as float16 and widened to float32 by a `Cast` that the runtime folds at
    /// load: half the bytes on disk and in the loaded file, float32 compute. ONNX Runtime's CPU
    /// provider has few float16 kernels, so this is the form for ONNX Runtime.
    ///
    /// A GPU target (CUDA, TensorRT) would compute in float16 instead: activations cast to
    /// float16 at the selected region's boundary and the ops themselves run in float16. No
    /// such target exists yet.
    WeightStorage,
}

/// The FP16 pass (see the module documentation).
pub struct Fp16Pass {
    /// When set, only constants read by nodes it accepts are converted.
    pub filter: Option<NodeFilter>,
    /// Constants with fewer elements stay float32 (shapes, scalars, small scales).
    pub min_elements: usize,
}

impl Default for Fp16Pass {
    fn default() -> Self {
        Fp16Pass::new()
    }
}

impl std::fmt::Debug for Fp16Pass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fp16Pass")
            .field("filter", &self.filter.is_some())
            .field("min_elements", &self.min_elements)
            .finish()
    }
}

impl Fp16Pass {
    /// A pass converting the weights of every node.
    pub fn new() -> Self {
        Fp16Pass {
            filter: None,
            min_elements: 16,
        }
    }

    /// Converts only the weights read by nodes `filter` accepts.
    pub fn with_filter(mut self, filter: NodeFilter) -> Self {
        self.filter = Some(filter);
        self
    }

    /// The float32 constants of `root`'s graphs that selected nodes read, in first-read order.
    fn weights(&self, m: &Module, root: GraphId) -> Vec<Value> {
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for g in m.graph_tree(root) {
            for &n in m.graphs[g].nodes() {
                if !reads_weights(&m.nodes[n].op) || self.filter.as_ref().is_some_and(|f| !f(m, n))
                {
                    continue;
                }
                for &v in m.nodes[n].inputs.iter().flatten() {
                    if let Some(c) = m.const_source(v)
                        && m.consts[c].dtype == DType::F32
                        && m.consts[c].num_elements() >= self.min_elements
                        && seen.insert(v)
                    {
                        out.push(v);
                    }
                }
            }
        }
        out
    }
}

/// Whether the float inputs of `op` may be weights (not quantization parameters).
fn reads_weights(op: &Op) -> bool {
    !matches!(
        op,
        Op::QuantizeLinear { .. }
            | Op::DequantizeLinear { .. }
            | Op::MatMulNBits { .. }
            | Op::MmqMatMulNBits { .. }
    )
}

/// A float16 copy of `data` (float32, little endian) and the number of finite values that
/// saturated to ±65504.
pub fn to_f16_bytes(data: &[u8]) -> (Vec<u8>, usize) {
    let max = f32::from(f16::MAX);
    let chunks: Vec<(Vec<u8>, usize)> = data
        .par_chunks(4 << 16)
        .map(|part| {
            let mut out = Vec::with_capacity(part.len() / 2);
            let mut saturated = 0;
            for b in part.chunks_exact(4) {
                let x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                let y = if x.is_finite() && x.abs() > max {
                    // Values that round to ±65504 are in range; only the rest saturate.
                    let h = f16::from_f32(x);
                    if h.is_infinite() {
                        saturated += 1;
                        f16::from_f32(max.copysign(x))
                    } else {
                        h
                    }
                } else {
                    f16::from_f32(x)
                };
                out.extend_from_slice(&y.to_le_bytes());
            }
            (out, saturated)
        })
        .collect();
    let mut bytes = Vec::with_capacity(data.len() / 2);
    let mut saturated = 0;
    for (b, s) in chunks {
        bytes.extend_from_slice(&b);
        saturated += s;
    }
    (bytes, saturated)
}

/// The float16 copy of float32 constant `c` (named `<name>_fp16`) and its saturated count.
fn f16_copy(c: &ConstData) -> Result<(ConstData, usize), PassError> {
    let name = c.name.as_deref().unwrap_or("?");
    let Some(raw) = c.raw_bytes() else {
        return Err(fail(format!("weight '{name}' has no data")));
    };
    let need = c.num_elements() * 4;
    if raw.len() < need {
        return Err(fail(format!(
            "weight '{name}' has {} bytes, its type needs {need}",
            raw.len()
        )));
    }
    let (bytes, saturated) = to_f16_bytes(&raw[..need]);
    let data = ConstData::new(
        c.name.as_ref().map(|n| format!("{n}_fp16")),
        DType::F16,
        c.shape.clone(),
        Storage::Inline(Bytes::from(bytes)),
    );
    Ok((data, saturated))
}

fn fail(message: String) -> PassError {
    PassError::Failed {
        pass: "fp16".into(),
        message,
    }
}

fn cast_to_f32() -> Op {
    Op::Cast {
        round_mode: None,
        saturate: None,
        to: Some(i64::from(DType::F32.onnx_code())),
    }
}

impl Pass for Fp16Pass {
    fn name(&self) -> &str {
        "fp16"
    }

    fn run(&self, m: &mut Module, opts: &PassOptions) -> Result<PassReport, PassError> {
        let mut report = PassReport::default();
        match opts.target.fp16_form() {
            Fp16Form::WeightStorage => {}
        }
        let roots: Vec<GraphId> = m.entries.iter().map(|e| e.graph).collect();
        let mut saturated_weights = 0;
        // One float16 copy per constant: an initializer value, or an attribute constant.
        let mut initializers: HashMap<Const, Value> = HashMap::new();
        let mut attributes: HashMap<Const, Const> = HashMap::new();
        for root in roots {
            for v in self.weights(m, root) {
                let Some(c) = m.const_source(v) else {
                    continue;
                };
                let ty = m.value_type(v).clone();
                let vname = m.values[v].name.clone();
                match m.values[v].def {
                    ValueDef::Const(_) => {
                        let v16 = match initializers.get(&c) {
                            Some(&x) => x,
                            None => {
                                let (data, saturated) = f16_copy(&m.consts[c])?;
                                saturated_weights += usize::from(saturated > 0);
                                report.count("fp16-saturated", saturated);
                                let x = m.add_const(data);
                                initializers.insert(c, x);
                                x
                            }
                        };
                        // The Cast is the first node of the top-level graph, so every graph
                        // of the tree can read it.
                        let cast = m.cursor(root, At::Start).insert(NewNode {
                            op: cast_to_f32(),
                            inputs: vec![Some(v16)],
                            outputs: vec![Some((vname, ty))],
                            name: None,
                        });
                        let Some(out) = m.nodes[cast].outputs[0] else {
                            return Err(fail("Cast without a result".into()));
                        };
                        m.replace_uses(v, out, root, &[cast]);
                    }
                    ValueDef::Output { node, .. } => {
                        let c16 = match attributes.get(&c) {
                            Some(&x) => x,
                            None => {
                                let (data, saturated) = f16_copy(&m.consts[c])?;
                                saturated_weights += usize::from(saturated > 0);
                                report.count("fp16-saturated", saturated);
                                let x = m.add_attr_const(data);
                                attributes.insert(c, x);
                                x
                            }
                        };
                        // The Constant node holds the float16 tensor; its Cast follows it.
                        let graph = m.nodes[node].graph;
                        if let Op::Constant { value, .. } = &mut m.nodes[node].op {
                            *value = Some(c16);
                        }
                        let ty16 = match ty.shape() {
                            Some(s) => Type::tensor(DType::F16, s.to_vec()),
                            None => Type::Unknown,
                        };
                        m.set_type(v, ty16);
                        m.values[v].name = vname.as_ref().map(|n| format!("{n}_fp16"));
                        let cast = m.cursor(graph, At::After(node)).insert(NewNode {
                            op: cast_to_f32(),
                            inputs: vec![Some(v)],
                            outputs: vec![Some((vname, ty))],
                            name: None,
                        });
                        let Some(out) = m.nodes[cast].outputs[0] else {
                            return Err(fail("Cast without a result".into()));
                        };
                        m.replace_uses(v, out, graph, &[cast]);
                    }
                    ValueDef::Input { .. } => continue,
                }
                report.count("fp16-weights", 1);
            }
        }
        if let Some(&n) = report.counters.get("fp16-saturated") {
            report.notes.push(format!(
                "{n} values in {saturated_weights} weights beyond the float16 range saturated to ±65504"
            ));
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn convert(xs: &[f32]) -> (Vec<f32>, usize) {
        let bytes: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
        let (out, saturated) = to_f16_bytes(&bytes);
        let vals = out
            .chunks_exact(2)
            .map(|b| f32::from(f16::from_le_bytes([b[0], b[1]])))
            .collect();
        (vals, saturated)
    }

    #[test]
    fn rounds_half_to_even_and_saturates_only_finite_overflow() {
        let ulp = 2f32.powi(-10);
        let (vals, saturated) = convert(&[
            1.0 + ulp / 2.0,       // tie: down to the even 1.0
            1.0 + 3.0 * ulp / 2.0, // tie: up to the even 1 + 2 ulp
            65519.0,               // rounds to 65504, not a saturation
            65520.0,               // rounds past the largest float16: saturates
            -1e9,
            f32::NEG_INFINITY,
        ]);
        assert_eq!(
            vals,
            [
                1.0,
                1.0 + 2.0 * ulp,
                65504.0,
                65504.0,
                -65504.0,
                f32::NEG_INFINITY
            ]
        );
        assert_eq!(saturated, 2);
        let (nan, _) = convert(&[f32::NAN]);
        assert!(nan[0].is_nan());
    }

    #[test]
    fn every_target_stores_weights() {
        for t in crate::targets::TargetRef::ALL {
            assert_eq!(t.fp16_form(), Fp16Form::WeightStorage);
        }
    }
}
