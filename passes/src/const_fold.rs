//! Constant folding with the reference kernels.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use mmq_ir::{ConstData, DType, GraphId, Module, Node, NodeData, Op, Storage, Value, ValueDef};
use mmq_kernels::{Data, Interpreter, RtValue, Tensor};

use crate::dce::{graph_outputs, live_graphs, redirect_uses};
use crate::pass::{Pass, PassError, PassOptions, PassReport};

/// Results with more elements than this (and than the largest operand) are not folded.
pub const DEFAULT_MAX_ELEMENTS: usize = 65536;

/// Rounds of folding and shape-value replacement before the pass stops looking for more.
const MAX_ROUNDS: usize = 16;

/// Evaluates what is known at compile time and replaces it by constants.
///
/// - A node whose operands are all constants (or omitted), whose op holds no subgraph and is
///   neither random nor `DequantizeLinear` (quantized weights keep their Q/DQ form, which
///   quantized execution depends on), is evaluated with the reference kernels ([`Interpreter::eval_node`]); its
///   results become constants named after them. Chains fold in one sweep.
/// - An integer value whose contents shape inference knows completely
///   ([`mmq_ir::infer::shape_values`], e.g. `Shape` of a static shape → `Gather` → `Concat`)
///   becomes a constant; its producer is left for [`crate::Dce`].
///
/// Every use (in any graph, including outer-scope reads from bodies) is redirected to the new
/// constant. A graph output keeps its value and name: when its producer folds, an `Identity`
/// of the constant produces it. A result is not folded when it has more elements than the
/// largest operand and more than the limit ([`DEFAULT_MAX_ELEMENTS`]), so folding never blows
/// up the weights. Nodes the kernels cannot evaluate are left as they are.
///
/// Counters: `folded-nodes`, `folded-shape-values`.
#[derive(Clone, Copy, Debug)]
pub struct ConstFold {
    max_elements: usize,
}

impl Default for ConstFold {
    fn default() -> Self {
        ConstFold {
            max_elements: DEFAULT_MAX_ELEMENTS,
        }
    }
}

impl ConstFold {
    /// Folding with the default element limit.
    pub fn new() -> Self {
        Self::default()
    }

    /// Folding that keeps results with more than `max_elements` elements (when they are also
    /// larger than every operand) unfolded.
    pub fn with_max_elements(max_elements: usize) -> Self {
        ConstFold { max_elements }
    }
}

/// Ops whose results differ from run to run; never folded or merged.
pub(crate) fn is_random(op: &Op) -> bool {
    matches!(op.domain(), "" | "ai.onnx")
        && matches!(
            op.op_type(),
            "RandomNormal"
                | "RandomUniform"
                | "RandomNormalLike"
                | "RandomUniformLike"
                | "Multinomial"
                | "Bernoulli"
                | "Dropout"
        )
}

impl Pass for ConstFold {
    fn name(&self) -> &str {
        "const-fold"
    }

    fn run(&self, m: &mut Module, _opts: &PassOptions) -> Result<PassReport, PassError> {
        let mut report = PassReport::default();
        dequantize_forms(m, &mut report);
        for _ in 0..MAX_ROUNDS {
            let folded = self.fold_nodes(m, &mut report);
            let replaced = fold_shape_values(m, &mut report);
            if folded == 0 && replaced == 0 {
                break;
            }
            // New constants and Identity nodes need types before the next round reads them.
            mmq_ir::infer::infer_module(m);
        }
        Ok(report)
    }
}

/// Weights an exporter stored quantized and dequantizes in the graph, `Mul(Cast(W), s)` or
/// `Mul(Sub(Cast(W), z), s)` with `W` an int8 or uint8 constant cast to f32, `s` a constant f32
/// scale and `z` a constant zero point (f32 of whole numbers in `W`'s range, or a `Cast` of a
/// constant of `W`'s type), each of one value or one per slice of one axis of `W`, become
/// `DequantizeLinear(W, s[, z], axis)`: the same values, the codes kept (folding the product
/// gave an f32 copy of 4x the bytes), in the form ONNX Runtime and TensorRT read as a
/// quantized weight. Needs opset 13 for a scale per slice (10 for one).
///
/// Counter: `dequantize-forms`.
fn dequantize_forms(m: &mut Module, report: &mut PassReport) {
    let mut count = 0;
    for g in live_graphs(m) {
        let opset = m.onnx_opset(g).unwrap_or(0);
        for n in m.graphs[g].nodes().to_vec() {
            if !matches!(m.nodes[n].op, Op::Mul {}) {
                continue;
            }
            let [Some(a), Some(b)] = m.nodes[n].inputs[..] else {
                continue;
            };
            let Some(form) = DequantizeForm::of(m, a, b).or_else(|| DequantizeForm::of(m, b, a))
            else {
                continue;
            };
            if opset < if form.axis.is_some() { 13 } else { 10 } {
                continue;
            }
            // Named after the weight the product made (`fc1.weight_scale`).
            let weight = m.nodes[n].outputs.first().copied().flatten();
            let name = |suffix: &str| {
                weight
                    .and_then(|w| m.values[w].name.clone())
                    .map(|n| format!("{n}_{suffix}"))
            };
            let shape = |len: usize| {
                if form.axis.is_some() {
                    vec![len as i64]
                } else {
                    vec![]
                }
            };
            let scale = ConstData::new(
                name("scale"),
                DType::F32,
                shape(form.scale.len()),
                Storage::Inline(Bytes::from(
                    form.scale
                        .iter()
                        .flat_map(|x| x.to_le_bytes())
                        .collect::<Vec<u8>>(),
                )),
            );
            let zero = form.zero.as_ref().map(|z| {
                ConstData::new(
                    name("zero_point"),
                    form.dtype,
                    shape(z.len()),
                    Storage::Inline(Bytes::from(z.clone())),
                )
            });
            let mut inputs = vec![Some(form.codes), Some(m.add_const(scale))];
            if let Some(z) = zero {
                inputs.push(Some(m.add_const(z)));
            }
            let node = &mut m.nodes[n];
            node.op = Op::DequantizeLinear {
                axis: form.axis,
                block_size: None,
                output_dtype: None,
            };
            node.inputs = inputs;
            count += 1;
        }
    }
    report.count("dequantize-forms", count);
}

/// The operands of a `DequantizeLinear` recognized in `Mul(x, scale)` ([`dequantize_forms`]).
struct DequantizeForm {
    /// The int8 or uint8 constant.
    codes: Value,
    /// Its type.
    dtype: DType,
    /// One scale, or one per slice of `axis`.
    scale: Vec<f32>,
    /// Zero points as `dtype` bytes, as many as the scales; `None` when all are 0.
    zero: Option<Vec<u8>>,
    /// The axis of the per-slice scales.
    axis: Option<i64>,
}

impl DequantizeForm {
    fn of(m: &Module, x: Value, scale: Value) -> Option<DequantizeForm> {
        let (cast, zero) = match m.producer(x).map(|n| (&n.op, &n.inputs[..])) {
            Some((Op::Sub {}, [Some(c), Some(z)])) => (*c, Some(*z)),
            _ => (x, None),
        };
        let cast = m.producer(cast)?;
        let (Op::Cast { to, .. }, [Some(codes)]) = (&cast.op, &cast.inputs[..]) else {
            return None;
        };
        if *to != Some(i64::from(DType::F32.onnx_code())) {
            return None;
        }
        let wc = &m.consts[initializer(m, *codes)?];
        let dtype = wc.dtype;
        if !matches!(dtype, DType::I8 | DType::U8) {
            return None;
        }
        let (scale_values, scale_axis) = per_slice(m, scale, &wc.shape)?;
        if scale_values.iter().any(|s| !s.is_finite()) {
            return None;
        }
        let mut axis = scale_axis;
        let zero = match zero {
            None => None,
            Some(z) => {
                // A zero point stored as codes and cast, or as whole f32 numbers.
                let z = match m.producer(z).map(|n| (&n.op, &n.inputs[..])) {
                    Some((Op::Cast { .. }, [Some(zc)]))
                        if initializer(m, *zc).is_some_and(|c| m.consts[c].dtype == dtype) =>
                    {
                        *zc
                    }
                    _ => z,
                };
                let (values, zero_axis) = per_slice(m, z, &wc.shape)?;
                let (lo, hi) = if dtype == DType::I8 {
                    (-128.0, 127.0)
                } else {
                    (0.0, 255.0)
                };
                if values.iter().any(|&v| v.fract() != 0.0 || v < lo || v > hi) {
                    return None;
                }
                // One zero point for per-slice scales repeats; per-slice zero points need the
                // scales' axis.
                let values = match (zero_axis, axis) {
                    (None, Some(_)) => vec![values[0]; scale_values.len()],
                    (Some(_), None) => {
                        axis = zero_axis;
                        values
                    }
                    (za, a) if za == a => values,
                    _ => return None,
                };
                (values.iter().any(|&v| v != 0.0))
                    .then(|| values.iter().map(|&v| v as i32 as u8).collect())
            }
        };
        // Per-slice zero points with one scale: the scale repeats.
        let count = zero.as_ref().map_or(scale_values.len(), Vec::len);
        let scale = if scale_values.len() == count {
            scale_values
        } else {
            vec![scale_values[0]; count]
        };
        Some(DequantizeForm {
            codes: *codes,
            dtype,
            scale,
            zero,
            axis,
        })
    }
}

/// A constant's values as f32 and the axis of `shape` they vary along: `None` for one value,
/// `Some(axis)` when its dims, right-aligned against `shape`, are 1 except one equal to
/// `shape[axis]`.
fn per_slice(m: &Module, v: Value, shape: &[i64]) -> Option<(Vec<f32>, Option<i64>)> {
    let c = &m.consts[initializer(m, v)?];
    if c.shape.len() > shape.len() {
        return None;
    }
    let offset = shape.len() - c.shape.len();
    let mut axis = None;
    for (i, &d) in c.shape.iter().enumerate() {
        if d == 1 {
            continue;
        }
        if d != shape[offset + i] || axis.is_some() {
            return None;
        }
        axis = Some((offset + i) as i64);
    }
    let values = Tensor::from_const(c).ok()?.to_f32().ok()?;
    Some((values, axis))
}

/// Whether `v` is a constant operand (not a graph input with a default, which callers may
/// override).
fn initializer(m: &Module, v: Value) -> Option<mmq_ir::Const> {
    match m.values.get(v)?.def {
        ValueDef::Const(c) => Some(c),
        _ => None,
    }
}

fn elements(v: &RtValue) -> Option<usize> {
    v.as_tensor().map(|t| t.len())
}

/// The static element count of a value's type, when every dim is known.
fn static_elements(m: &Module, v: Value) -> Option<usize> {
    let dims = m.value_type(v).shape()?;
    dims.iter()
        .map(|d| d.as_known().and_then(|k| usize::try_from(k).ok()))
        .try_fold(1usize, |acc, d| acc.checked_mul(d?))
}

/// A tensor value's bytes (strings count their bytes).
fn bytes_of(v: &RtValue) -> Option<u64> {
    let t = v.as_tensor()?;
    Some(match &t.data {
        Data::Str(v) => v.iter().map(|s| s.len() as u64).sum(),
        _ => t.dtype.storage_bytes(t.len())? as u64,
    })
}

/// A value's bytes when inference knows its element type and count (not for strings).
fn static_bytes(m: &Module, v: Value) -> Option<u64> {
    let dtype = m.value_type(v).dtype()?;
    Some(dtype.storage_bytes(static_elements(m, v)?)? as u64)
}

impl ConstFold {
    /// One sweep over every reachable graph in order; returns how many nodes folded.
    fn fold_nodes(&self, m: &mut Module, report: &mut PassReport) -> usize {
        // Evaluate with the module borrowed, then rewrite it.
        let mut known: HashMap<Value, RtValue> = HashMap::new();
        let mut folded: Vec<(GraphId, Node)> = Vec::new();
        {
            let interp = Interpreter::new(m);
            for g in live_graphs(m) {
                for &n in m.graphs[g].nodes() {
                    let node = &m.nodes[n];
                    if let Some(outs) = self.try_eval(m, &interp, &known, n, node) {
                        for (slot, out) in node.outputs.iter().zip(outs) {
                            if let (Some(v), Some(val)) = (slot, out) {
                                known.insert(*v, val);
                            }
                        }
                        folded.push((g, n));
                    }
                }
            }
        }
        if folded.is_empty() {
            return 0;
        }

        // Values read by nodes that stay, or by graph outputs, need constants; intermediate
        // results of folded chains do not.
        let folded_set: HashSet<Node> = folded.iter().map(|&(_, n)| n).collect();
        let outputs = graph_outputs(m);
        let mut needed: HashSet<Value> = outputs.clone();
        for g in live_graphs(m) {
            for &n in m.graphs[g].nodes() {
                if !folded_set.contains(&n) {
                    needed.extend(m.nodes[n].inputs.iter().flatten().copied());
                }
            }
        }

        let mut names = ValueNames::new(m);
        let mut map: HashMap<Value, Value> = HashMap::new();
        let mut identities: HashMap<Node, Vec<Node>> = HashMap::new();
        for &(g, n) in &folded {
            let outs = m.nodes[n].outputs.clone();
            for v in outs.iter().flatten().copied() {
                if !needed.contains(&v) {
                    continue;
                }
                let Some(val) = known.get(&v) else { continue };
                let Some(t) = val.as_tensor() else { continue };
                let base = m.values[v].name.clone();
                let is_output = outputs.contains(&v);
                // A graph output keeps its name on the Identity that now produces it.
                let name = match (&base, is_output) {
                    (Some(b), true) => Some(names.fresh(&format!("{b}_const"))),
                    (Some(b), false) => Some(b.clone()),
                    (None, _) => None,
                };
                let Some(data) = const_data(name, t) else {
                    continue;
                };
                let c = m.add_const(data);
                map.insert(v, c);
                if is_output {
                    let id = m.nodes.push(NodeData {
                        op: Op::Identity {},
                        inputs: vec![Some(c)],
                        outputs: vec![Some(v)],
                        name: m.nodes[n].name.clone(),
                        graph: g,
                    });
                    m.values[v].def = ValueDef::Output { node: id, index: 0 };
                    identities.entry(n).or_default().push(id);
                }
            }
        }
        // Drop the folded nodes; Identity nodes take their place.
        for g in live_graphs(m) {
            let nodes = m.graphs[g].nodes().to_vec();
            let mut kept = Vec::with_capacity(nodes.len());
            for n in nodes {
                if folded_set.contains(&n) {
                    kept.extend(identities.remove(&n).unwrap_or_default());
                } else {
                    kept.push(n);
                }
            }
            m.set_node_order(g, kept);
        }
        redirect_uses(m, &map);
        report.count("folded-nodes", folded.len());
        folded.len()
    }

    /// Evaluates `node` when every operand is known; `None` when it cannot or should not fold.
    fn try_eval(
        &self,
        m: &Module,
        interp: &Interpreter<'_>,
        known: &HashMap<Value, RtValue>,
        n: Node,
        node: &NodeData,
    ) -> Option<Vec<Option<RtValue>>> {
        if is_random(&node.op) || !node.op.subgraphs().is_empty() || node.outputs.is_empty() {
            return None;
        }
        if !matches!(node.op.domain(), "" | "ai.onnx") {
            return None;
        }
        // Dequantizing quantized weights would erase the Q/DQ form that quantized execution
        // (ONNX Runtime's QDQ fusions, TensorRT explicit quantization) relies on.
        if matches!(node.op, Op::DequantizeLinear { .. }) {
            return None;
        }
        // An Identity of a constant is already as folded as it gets (it keeps a graph
        // output's name, or canonicalize bypasses it).
        if matches!(node.op, Op::Identity {})
            && node
                .inputs
                .iter()
                .flatten()
                .all(|&v| initializer(m, v).is_some())
        {
            return None;
        }
        // A Constant node only moves its tensor into the constant table.
        let is_constant = matches!(node.op, Op::Constant { .. });
        // Decide before decoding anything: a weight read by a node with a non-constant operand
        // (the embedding table of a Gather) must not be paged in.
        if !node
            .inputs
            .iter()
            .flatten()
            .all(|v| known.contains_key(v) || initializer(m, *v).is_some())
        {
            return None;
        }
        let mut args = Vec::with_capacity(node.inputs.len());
        let mut largest = 0usize;
        let mut operand_bytes = 0u64;
        for slot in &node.inputs {
            let Some(v) = *slot else {
                args.push(None);
                continue;
            };
            let val = match known.get(&v) {
                Some(val) => val.clone(),
                None => RtValue::Tensor(interp.constant(initializer(m, v)?).ok()?),
            };
            largest = largest.max(elements(&val)?);
            operand_bytes += bytes_of(&val)?;
            args.push(Some(val));
        }
        // Past the element limit, a result folds only when it is no larger than its operands,
        // in elements and in bytes: `Cast` of an int8 weight to f32 (4x the bytes) stays.
        let limit = |count: usize, bytes: Option<u64>| {
            is_constant
                || count <= self.max_elements
                || (count <= largest && bytes.is_none_or(|b| b <= operand_bytes))
        };
        // Skip before evaluating what inference already knows to be too large.
        for v in node.outputs.iter().flatten() {
            if let Some(count) = static_elements(m, *v)
                && !limit(count, static_bytes(m, *v))
            {
                return None;
            }
        }
        let outs = interp.eval_node(n, args).ok()?;
        for (slot, out) in node.outputs.iter().zip(&outs) {
            match (slot, out) {
                (Some(_), Some(val)) if limit(elements(val)?, bytes_of(val)) => {}
                (None, _) => {}
                _ => return None,
            }
        }
        Some(outs)
    }
}

/// A constant holding `t`.
fn const_data(name: Option<String>, t: &Arc<Tensor>) -> Option<ConstData> {
    let shape: Vec<i64> = t
        .shape
        .iter()
        .map(|&d| i64::try_from(d).ok())
        .collect::<Option<_>>()?;
    let storage = match &t.data {
        Data::Str(v) => Storage::Strings(v.iter().map(|s| Bytes::from(s.clone())).collect()),
        _ => Storage::Inline(Bytes::from(t.to_bytes()?)),
    };
    Some(ConstData::new(name, t.dtype, shape, storage))
}

/// Replaces integer values whose contents shape inference knows by constants; returns how many.
fn fold_shape_values(m: &mut Module, report: &mut PassReport) -> usize {
    let sv = mmq_ir::infer::shape_values(m);
    let mut candidates: Vec<(Value, Vec<i64>, Vec<i64>, DType)> = Vec::new();
    let mut read: HashSet<Value> = HashSet::new();
    for g in live_graphs(m) {
        for &n in m.graphs[g].nodes() {
            read.extend(m.nodes[n].inputs.iter().flatten().copied());
        }
    }
    for g in live_graphs(m) {
        for &n in m.graphs[g].nodes() {
            for v in m.nodes[n].outputs.iter().flatten() {
                if !read.contains(v) {
                    continue;
                }
                let Some(ints) = sv.get_ints(*v) else {
                    continue;
                };
                let ty = m.value_type(*v);
                let Some(dtype) = ty.dtype().filter(|d| d.is_int()) else {
                    continue;
                };
                let shape = match ty.shape() {
                    Some([]) if ints.len() == 1 => vec![],
                    Some([d]) if d.as_known() == Some(ints.len() as i64) => {
                        vec![ints.len() as i64]
                    }
                    _ => continue,
                };
                candidates.push((*v, ints, shape, dtype));
            }
        }
    }
    let mut names = ValueNames::new(m);
    let mut map = HashMap::new();
    for (v, ints, shape, dtype) in candidates {
        let Some(bytes) = int_bytes(dtype, &ints) else {
            continue;
        };
        // The producer stays until DCE removes it, so the constant needs a name of its own.
        let name = m.values[v]
            .name
            .clone()
            .map(|n| names.fresh(&format!("{n}_value")));
        let data = ConstData::new(name, dtype, shape, Storage::Inline(Bytes::from(bytes)));
        let c = m.add_const(data);
        map.insert(v, c);
    }
    let count = map.len();
    redirect_uses(m, &map);
    report.count("folded-shape-values", count);
    count
}

/// Little-endian bytes of `ints` as integer `dtype`, when every value fits.
fn int_bytes(dtype: DType, ints: &[i64]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    for &x in ints {
        match dtype {
            DType::I64 => out.extend_from_slice(&x.to_le_bytes()),
            DType::I32 => out.extend_from_slice(&i32::try_from(x).ok()?.to_le_bytes()),
            DType::I16 => out.extend_from_slice(&i16::try_from(x).ok()?.to_le_bytes()),
            DType::I8 => out.extend_from_slice(&i8::try_from(x).ok()?.to_le_bytes()),
            DType::U64 => out.extend_from_slice(&u64::try_from(x).ok()?.to_le_bytes()),
            DType::U32 => out.extend_from_slice(&u32::try_from(x).ok()?.to_le_bytes()),
            DType::U16 => out.extend_from_slice(&u16::try_from(x).ok()?.to_le_bytes()),
            DType::U8 => out.push(u8::try_from(x).ok()?),
            _ => return None,
        }
    }
    Some(out)
}

/// The names of values in reachable graphs and constants, for picking unused ones.
struct ValueNames {
    taken: HashSet<String>,
}

impl ValueNames {
    fn new(m: &Module) -> Self {
        let mut taken = HashSet::new();
        for (_, v) in m.values.iter() {
            if let Some(n) = &v.name {
                taken.insert(n.clone());
            }
        }
        ValueNames { taken }
    }

    /// `base`, or `base_1`, `base_2`, ... whichever is free; marks it taken.
    fn fresh(&mut self, base: &str) -> String {
        let mut name = base.to_owned();
        let mut i = 1;
        while self.taken.contains(&name) {
            name = format!("{base}_{i}");
            i += 1;
        }
        self.taken.insert(name.clone());
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dce::Dce;
    use crate::manager::test_util::*;
    use mmq_ir::{Attr, Dim};

    fn dims(d: &[i64]) -> Vec<Dim> {
        d.iter().map(|&k| Dim::known(k)).collect()
    }

    fn ops(m: &Module, g: GraphId) -> Vec<String> {
        m.graphs[g]
            .nodes()
            .iter()
            .map(|&n| m.nodes[n].op.op_type().to_owned())
            .collect()
    }

    #[test]
    fn shape_gather_concat_reshape_chain_folds() {
        let (mut m, g) = module();
        let x = m.add_input(g, Some("x".into()), f32_ty(dims(&[2, 3, 4])));
        let shape = unary(
            &mut m,
            g,
            Op::Shape {
                start: None,
                end: None,
            },
            vec![x],
            "shape",
        );
        let idx = i64_const(&mut m, "idx", &[0], vec![]);
        let batch = node(
            &mut m,
            g,
            Op::Gather { axis: Some(0) },
            vec![shape, idx],
            "batch",
        );
        let axes = i64_const(&mut m, "axes", &[0], vec![1]);
        let batch1 = node(
            &mut m,
            g,
            Op::Unsqueeze { axes: None },
            vec![batch, axes],
            "batch1",
        );
        let rest = i64_const(&mut m, "rest", &[-1], vec![1]);
        let target = node(
            &mut m,
            g,
            Op::Concat { axis: Some(0) },
            vec![batch1, rest],
            "target",
        );
        let y = node(
            &mut m,
            g,
            Op::Reshape { allowzero: None },
            vec![x, target],
            "y",
        );
        m.graphs[g].outputs = vec![y];
        mmq_ir::infer::infer_module(&mut m);

        let report = ConstFold::new()
            .run(&mut m, &PassOptions::default())
            .expect("const-fold runs");
        assert!(report.changed);
        let reshape = m.graphs[g]
            .nodes()
            .iter()
            .copied()
            .find(|&n| matches!(m.nodes[n].op, Op::Reshape { .. }))
            .expect("Reshape stays");
        let operand = m.nodes[reshape].inputs[1].expect("shape operand");
        let c = initializer(&m, operand).expect("the reshape target is a constant");
        let t = Tensor::from_const(&m.consts[c]).expect("decodes");
        assert_eq!(t.to_i64().expect("ints"), vec![2, -1]);
        assert_eq!(t.shape, vec![2]);

        Dce.run(&mut m, &PassOptions::default()).expect("dce runs");
        assert_eq!(ops(&m, g), ["Reshape"]);
        mmq_ir::infer::infer_module(&mut m);
        let errors = mmq_ir::verify::verify_all(&m);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            mmq_ir::text::type_text(&m, m.value_type(y)),
            "f32[2, 12]",
            "the result type is still static"
        );
    }

    #[test]
    fn constant_chains_fold_and_graph_outputs_keep_their_names() {
        let (mut m, g) = module();
        let a = f32_const(&mut m, "a", &[1.0, 2.0, 3.0], vec![3]);
        let b = f32_const(&mut m, "b", &[10.0, 20.0, 30.0], vec![3]);
        let sum = node(&mut m, g, Op::Add {}, vec![a, b], "sum");
        let y = unary(&mut m, g, Op::Neg {}, vec![sum], "y");
        m.graphs[g].outputs = vec![y];
        let report = ConstFold::new()
            .run(&mut m, &PassOptions::default())
            .expect("const-fold runs");
        assert_eq!(report.counters.get("folded-nodes"), Some(&2));
        assert_eq!(ops(&m, g), ["Identity"]);
        let out = m.graphs[g].outputs[0];
        assert_eq!(out, y);
        assert_eq!(m.values[out].name.as_deref(), Some("y"));
        let id = m.graphs[g].nodes()[0];
        let c = initializer(&m, m.nodes[id].inputs[0].expect("operand")).expect("constant");
        let t = Tensor::from_const(&m.consts[c]).expect("decodes");
        assert_eq!(t.to_f32().expect("floats"), vec![-11.0, -22.0, -33.0]);
        // The intermediate sum never became a constant.
        assert_eq!(m.consts.len(), 3);
        let errors = mmq_ir::verify::verify_all(&m);
        assert!(errors.is_empty(), "{errors:?}");
    }

    #[test]
    fn large_results_from_small_operands_do_not_fold() {
        let (mut m, g) = module();
        // 300x300 weights: folding Neg keeps the size, folding the Expand would blow it up.
        let w = f32_const(&mut m, "w", &vec![0.5; 300 * 300], vec![300, 300]);
        let neg = unary(&mut m, g, Op::Neg {}, vec![w], "neg");
        let one = f32_const(&mut m, "one", &[1.0], vec![1]);
        let big_shape = i64_const(&mut m, "big", &[512, 512], vec![2]);
        let big = node(&mut m, g, Op::Expand {}, vec![one, big_shape], "big");
        let zeros = m.add_attr_const(ConstData::new(
            None,
            DType::F32,
            vec![1],
            Storage::Inline(Bytes::from(vec![0u8; 4])),
        ));
        let fill = unary(
            &mut m,
            g,
            Op::ConstantOfShape { value: Some(zeros) },
            vec![big_shape],
            "fill",
        );
        m.graphs[g].outputs = vec![neg, big, fill];
        mmq_ir::infer::infer_module(&mut m);
        let report = ConstFold::new()
            .run(&mut m, &PassOptions::default())
            .expect("const-fold runs");
        assert_eq!(report.counters.get("folded-nodes"), Some(&1));
        assert_eq!(ops(&m, g), ["Identity", "Expand", "ConstantOfShape"]);
        // With a higher limit the Expand folds.
        let report = ConstFold::with_max_elements(1 << 20)
            .run(&mut m, &PassOptions::default())
            .expect("const-fold runs");
        assert_eq!(report.counters.get("folded-nodes"), Some(&2));
    }

    #[test]
    fn random_ops_and_unknown_operands_stay() {
        let (mut m, g) = module();
        let x = m.add_input(g, Some("x".into()), f32_ty(dims(&[2])));
        let r = unary(
            &mut m,
            g,
            Op::from_parts(
                "",
                "RandomNormal",
                vec![("shape".into(), Attr::Ints(vec![2]))],
            ),
            vec![],
            "r",
        );
        let y = node(&mut m, g, Op::Add {}, vec![x, r], "y");
        m.graphs[g].outputs = vec![y];
        let report = ConstFold::new()
            .run(&mut m, &PassOptions::default())
            .expect("const-fold runs");
        assert!(!report.changed);
        assert_eq!(ops(&m, g), ["RandomNormal", "Add"]);
    }

    #[test]
    fn folds_inside_bodies_and_redirects_outer_reads() {
        let (mut m, g) = module();
        let x = m.add_input(g, Some("x".into()), f32_ty(dims(&[3])));
        let cond = m.add_input(
            g,
            Some("cond".into()),
            mmq_ir::Type::tensor(DType::Bool, vec![]),
        );
        let a = f32_const(&mut m, "a", &[1.0, 2.0, 3.0], vec![3]);
        let e = unary(&mut m, g, Op::Exp {}, vec![a], "e");
        // The then-branch reads `e` (an outer value that folds) inside a node.
        let y = if_node(&mut m, g, cond, e, x, "y");
        m.graphs[g].outputs = vec![y];
        ConstFold::new()
            .run(&mut m, &PassOptions::default())
            .expect("const-fold runs");
        assert_eq!(ops(&m, g), ["If"]);
        let then_g = m.nodes[m.graphs[g].nodes()[0]].op.subgraphs()[0];
        let inner = m.graphs[then_g].nodes()[0];
        // Relu of a constant folds too; the body output keeps its value through an Identity.
        assert_eq!(m.nodes[inner].op.op_type(), "Identity");
        let errors = mmq_ir::verify::verify_all(&m);
        assert!(errors.is_empty(), "{errors:?}");
    }
}
