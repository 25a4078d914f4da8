//! The `trt` target's last step: what TensorRT's layers cannot express becomes one of mmq's
//! plugins ([`mmq_ir::plugin`]), and what only looks foreign becomes native.
//!
//! - **uint8 Q/DQ** is recoded as int8: `q_u8 = clamp(round(x / s) + z, 0, 255)` is
//!   `q_i8 + 128` with `q_i8 = clamp(round(x / s) + (z - 128), -128, 127)`, so a unit with zero
//!   point `z` becomes an int8 unit with zero point `z - 128` (constant codes shift by 128), the
//!   same numbers. A uint8 unit with zero point 128 (PyTorch's symmetric `quint8`) becomes
//!   TensorRT's native symmetric int8.
//! - **Q/DQ with a non-zero constant zero point** (asymmetric) becomes `MmqQuantize` /
//!   `MmqDequantize`: TensorRT's Q/DQ layers are symmetric only.
//! - **`com.microsoft.MatMulNBits`** (4-bit weights in blocks along K, with zero points: what
//!   `--quant int4 --asym` produces, or a model quantized by ONNX Runtime's tools) becomes
//!   `MmqMatMulNBits` on binary16 activations (`Cast` before and after when the graph is float32),
//!   binary16 scales and explicit zero points; a K that is not a multiple of the block is padded.
//!
//! A unit is lowered only where every piece is known: constant scales and zero points, a
//! quantize whose readers are all dequantizes. Anything else stays, and the TensorRT linter names
//! it.

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use mmq_ir::edit::NewNode;
use mmq_ir::plugin::{DOMAIN, NAMESPACE, VERSION};
use mmq_ir::{At, Attr, ConstData, DType, GraphId, Module, Node, Op, Storage, Type, Value};

use crate::dce::{Dce, live_graphs};
use crate::pass::{Pass, PassError, PassOptions, PassReport};

/// Lowers what TensorRT cannot run natively into plugins (see the module documentation).
pub struct TrtPlugins;

impl Pass for TrtPlugins {
    fn name(&self) -> &str {
        "trt-plugins"
    }

    fn run(&self, m: &mut Module, opts: &PassOptions) -> Result<PassReport, PassError> {
        let mut report = PassReport::default();
        for g in live_graphs(m) {
            lower_qdq(m, g, &mut report);
            lower_nbits(m, g, &mut report).map_err(|e| PassError::Failed {
                pass: self.name().to_owned(),
                message: e,
            })?;
        }
        if report.changed {
            let dce = Dce.run(m, opts)?;
            for (k, v) in dce.counters {
                report.count(&k, v);
            }
        }
        Ok(report)
    }
}

/// The plugin op `name` with its fields (the node's `plugin_namespace` and `plugin_version` set).
pub fn plugin_op(name: &str, fields: &[(&str, i64)]) -> Op {
    let mut attrs = vec![
        (
            "plugin_namespace".to_owned(),
            Attr::String(NAMESPACE.to_owned()),
        ),
        (
            "plugin_version".to_owned(),
            Attr::String(VERSION.to_owned()),
        ),
    ];
    attrs.extend(fields.iter().map(|(n, v)| ((*n).to_owned(), Attr::Int(*v))));
    Op::from_parts(DOMAIN, name, attrs)
}

/// The readers of each value of graph `g` (nodes of `g`; values read inside subgraphs or as
/// graph outputs count as a reader `None`).
fn readers(m: &Module, g: GraphId) -> HashMap<Value, Vec<Option<Node>>> {
    let mut out: HashMap<Value, Vec<Option<Node>>> = HashMap::new();
    for &n in m.graphs[g].nodes() {
        for v in m.nodes[n].inputs.iter().flatten() {
            out.entry(*v).or_default().push(Some(n));
        }
        for &sub in m.nodes[n].op.subgraphs().iter() {
            for sg in m.graph_tree(sub) {
                for &sn in m.graphs[sg].nodes() {
                    for v in m.nodes[sn].inputs.iter().flatten() {
                        out.entry(*v).or_default().push(None);
                    }
                }
            }
        }
    }
    for &v in &m.graphs[g].outputs {
        out.entry(v).or_default().push(None);
    }
    out
}

/// A constant's bytes.
fn const_bytes(m: &Module, v: Value) -> Option<(DType, Vec<i64>, &[u8])> {
    let c = &m.consts[m.const_source(v)?];
    Some((c.dtype, c.shape.clone(), c.raw_bytes()?))
}

fn add_bytes(m: &mut Module, name: String, dtype: DType, shape: Vec<i64>, bytes: Vec<u8>) -> Value {
    m.add_const(ConstData::new(
        Some(name),
        dtype,
        shape,
        Storage::Inline(Bytes::from(bytes)),
    ))
}

/// A Q or DQ node's parts: (data, scale, zero point) and its `axis` / `block_size`.
struct Unit {
    node: Node,
    quantize: bool,
    /// The zero point as int8 after recoding, with its shape; `None`: absent (zero).
    zero: Option<(Vec<i64>, Vec<i8>)>,
    /// The codes are uint8 (recoded as int8).
    unsigned: bool,
    axis: i64,
    block_size: i64,
}

impl Unit {
    fn nonzero(&self) -> bool {
        self.zero
            .as_ref()
            .is_some_and(|(_, z)| z.iter().any(|&v| v != 0))
    }
}

/// The Q/DQ node `n` when it is int8 or uint8 with constant float32 scale and zero point.
fn unit(m: &Module, n: Node) -> Option<Unit> {
    let nd = &m.nodes[n];
    let (quantize, axis, block_size) = match &nd.op {
        Op::QuantizeLinear {
            axis,
            block_size,
            output_dtype,
            saturate,
            ..
        } => {
            if output_dtype.is_some_and(|d| d != 0) || saturate.is_some_and(|s| s == 0) {
                return None;
            }
            (true, axis.unwrap_or(1), block_size.unwrap_or(0))
        }
        Op::DequantizeLinear {
            axis,
            block_size,
            output_dtype,
        } => {
            if output_dtype.is_some_and(|d| d != 0) {
                return None;
            }
            (false, axis.unwrap_or(1), block_size.unwrap_or(0))
        }
        _ => return None,
    };
    let scale = (*nd.inputs.get(1)?)?;
    if m.value_type(scale).dtype() != Some(DType::F32) {
        return None;
    }
    m.const_source(scale)?;
    let codes = if quantize {
        (*nd.outputs.first()?)?
    } else {
        (*nd.inputs.first()?)?
    };
    let code_type = m.value_type(codes).dtype();
    let zp = nd.inputs.get(2).copied().flatten();
    let unsigned = match (code_type, zp.map(|z| m.value_type(z).dtype())) {
        (Some(DType::U8), None | Some(Some(DType::U8))) => true,
        (Some(DType::I8), None | Some(Some(DType::I8))) => false,
        _ => return None,
    };
    let zero = match zp {
        // An absent uint8 zero point is 0: -128 after recoding, one per scale.
        None if unsigned => {
            let (_, shape, bytes) = const_bytes(m, scale)?;
            Some((shape, vec![-128; bytes.len() / 4]))
        }
        None => None,
        Some(z) => {
            let (_, shape, bytes) = const_bytes(m, z)?;
            let vals = bytes
                .iter()
                .map(|&b| if unsigned { (b ^ 0x80) as i8 } else { b as i8 })
                .collect();
            Some((shape, vals))
        }
    };
    // The plugins' kernels take blocks along the last axis only.
    if block_size > 0 {
        let rank = m.value_type(codes).shape()?.len() as i64;
        if axis != -1 && axis != rank - 1 {
            return None;
        }
    }
    Some(Unit {
        node: n,
        quantize,
        zero,
        unsigned,
        axis,
        block_size,
    })
}

/// Where the codes of quantize output `start` go: through ops that commute with the uint8 → int8
/// recoding (`MaxPool` and layout ops, on their first operand) to dequantizes of the same
/// signedness only. Returns every value on the way (retyped to int8 when the quantize is
/// lowered); `None` when a code reaches anything else.
fn code_flow(
    m: &Module,
    readers: &HashMap<Value, Vec<Option<Node>>>,
    units: &HashMap<Node, Unit>,
    start: Value,
    unsigned: bool,
) -> Option<Vec<Value>> {
    let mut seen = vec![start];
    let mut stack = vec![start];
    while let Some(v) = stack.pop() {
        for r in readers.get(&v)? {
            let r = (*r)?;
            if let Some(d) = units.get(&r) {
                if d.quantize || d.unsigned != unsigned || m.nodes[r].inputs[0] != Some(v) {
                    return None;
                }
                continue;
            }
            let nd = &m.nodes[r];
            let transparent = match &nd.op {
                Op::MaxPool { .. } => nd.outputs.iter().flatten().count() == 1,
                op => op.is_layout(),
            };
            if !transparent || nd.inputs[0] != Some(v) || nd.inputs[1..].contains(&Some(v)) {
                return None;
            }
            let out = nd.outputs[0]?;
            if !seen.contains(&out) {
                seen.push(out);
                stack.push(out);
            }
        }
    }
    Some(seen)
}

/// Recodes uint8 units as int8 and turns asymmetric units into `MmqQuantize` /
/// `MmqDequantize`.
fn lower_qdq(m: &mut Module, g: GraphId, report: &mut PassReport) {
    let readers = readers(m, g);
    let units: HashMap<Node, Unit> = m.graphs[g]
        .nodes()
        .iter()
        .filter_map(|&n| unit(m, n).map(|u| (n, u)))
        .collect();
    // A quantize is lowered when it needs it and every reader is a dequantize that can follow;
    // a dequantize when it needs it and its codes are constant or come from a lowered quantize.
    let needs = |u: &Unit| u.unsigned || u.nonzero();
    // Quantize results lowered, and every value their int8 codes flow through.
    let mut lowered_q: HashSet<Value> = HashSet::new();
    let mut recoded: HashSet<Value> = HashSet::new();
    for u in units.values().filter(|u| u.quantize && needs(u)) {
        let Some(out) = m.nodes[u.node].outputs[0] else {
            continue;
        };
        if let Some(chain) = code_flow(m, &readers, &units, out, u.unsigned) {
            lowered_q.insert(out);
            recoded.extend(chain);
        }
    }
    for &v in &recoded {
        if let Type::Tensor(t) = m.value_type(v).clone() {
            m.set_type(
                v,
                Type::Tensor(mmq_ir::TensorType {
                    dtype: Some(DType::I8),
                    shape: t.shape,
                }),
            );
        }
    }
    let nodes = m.graphs[g].nodes().to_vec();
    for n in nodes {
        let Some(u) = units.get(&n) else {
            continue;
        };
        if !needs(u) {
            continue;
        }
        let base = m.nodes[n]
            .name
            .clone()
            .unwrap_or_else(|| format!("qdq{}", n.index()));
        let codes_in = m.nodes[n].inputs[0];
        if u.quantize {
            let Some(out) = m.nodes[n].outputs[0] else {
                continue;
            };
            if !lowered_q.contains(&out) {
                continue;
            }
        } else {
            let Some(q) = codes_in else { continue };
            let recoded = if !u.unsigned || recoded.contains(&q) {
                Some(q)
            } else if let Some((DType::U8, shape, bytes)) = const_bytes(m, q) {
                let shifted: Vec<u8> = bytes.iter().map(|b| b ^ 0x80).collect();
                Some(add_bytes(
                    m,
                    format!("{base}_codes_i8"),
                    DType::I8,
                    shape,
                    shifted,
                ))
            } else {
                None
            };
            let Some(q) = recoded else { continue };
            m.set_operand(n, 0, Some(q));
        }
        // The zero point, recoded to int8 (all zeros: TensorRT's native form; a quantize needs
        // it to produce int8).
        let zero = u.zero.as_ref().map(|(shape, z)| {
            add_bytes(
                m,
                format!("{base}_zero_i8"),
                DType::I8,
                shape.clone(),
                z.iter().map(|&v| v as u8).collect(),
            )
        });
        let nonzero = u.nonzero();
        let nd = &mut m.nodes[n];
        nd.inputs.truncate(2);
        nd.inputs.extend(zero.map(Some));
        if nonzero {
            let name = if u.quantize {
                "MmqQuantize"
            } else {
                "MmqDequantize"
            };
            nd.op = plugin_op(name, &[("axis", u.axis), ("block_size", u.block_size)]);
            report.count(&format!("plugin-{name}"), 1);
        } else {
            report.count("uint8-unit-recoded-int8", 1);
        }
        report.changed = true;
    }
}

/// A `Cast` of `x` to the result type `out.1` (named `out.0`), placed `at`: the node and its result.
fn cast(
    m: &mut Module,
    g: GraphId,
    at: At,
    x: Value,
    out: (Option<String>, Type),
    name: String,
) -> Result<(Node, Value), String> {
    let to = out.1.dtype().ok_or("a Cast to an unknown type")?;
    let op = Op::Cast {
        to: Some(i64::from(to.onnx_code())),
        saturate: None,
        round_mode: None,
    };
    let node = m.cursor(g, at).insert(NewNode {
        op,
        inputs: vec![Some(x)],
        outputs: vec![Some(out)],
        name: Some(name),
    });
    let v = m.nodes[node].outputs[0].ok_or("a Cast without a result")?;
    Ok((node, v))
}

/// `com.microsoft.MatMulNBits` (4 bits) becomes `MmqMatMulNBits`, K padded to whole blocks.
fn lower_nbits(m: &mut Module, g: GraphId, report: &mut PassReport) -> Result<(), String> {
    let nodes = m.graphs[g].nodes().to_vec();
    for n in nodes {
        let Op::MatMulNBits {
            k: Some(k),
            n: Some(nn),
            bits,
            block_size: Some(block),
            ..
        } = m.nodes[n].op
        else {
            continue;
        };
        if bits.unwrap_or(4) != 4 || block <= 0 {
            continue;
        }
        // The kernels take whole blocks: a K that is not a multiple of the block is padded (A
        // with zeros, which cancel whatever the last block's padding codes are).
        let padded_k = (k + block - 1) / block * block;
        let a_rank = m.nodes[n].inputs[0].and_then(|a| m.value_type(a).shape().map(<[_]>::len));
        if padded_k != k && a_rank.is_none() {
            continue;
        }
        let inputs = m.nodes[n].inputs.clone();
        let name = m.nodes[n]
            .name
            .clone()
            .unwrap_or_else(|| format!("nbits{}", n.index()));
        let (Some(a), Some(b), Some(scales)) = (inputs[0], inputs[1], inputs[2]) else {
            continue;
        };
        if inputs.get(4).copied().flatten().is_some() {
            continue; // g_idx
        }
        let a_dtype = m.value_type(a).dtype();
        if !matches!(a_dtype, Some(DType::F32 | DType::F16)) {
            continue;
        }
        let Some(out) = m.nodes[n].outputs[0] else {
            continue;
        };
        let to_f16 = |m: &mut Module, v: Value, what: &str| -> Option<Value> {
            let (dtype, shape, bytes) = const_bytes(m, v)?;
            let halves: Vec<u8> = match dtype {
                DType::F16 => bytes.to_vec(),
                DType::F32 => bytes
                    .chunks_exact(4)
                    .flat_map(|c| {
                        let x = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                        half::f16::from_f32(x).to_le_bytes()
                    })
                    .collect(),
                _ => return None,
            };
            Some(add_bytes(
                m,
                format!("{name}_{what}_f16"),
                DType::F16,
                shape,
                halves,
            ))
        };
        let Some(scales16) = to_f16(m, scales, "scales") else {
            continue;
        };
        let k_blocks = k / block;
        let zeros = match inputs.get(3).copied().flatten() {
            Some(z) => match const_bytes(m, z) {
                Some((DType::U8, _, _)) => z,
                _ => continue, // zero points in the scales' type
            },
            None => {
                let per_row = (k_blocks as usize).div_ceil(2);
                add_bytes(
                    m,
                    format!("{name}_zeros"),
                    DType::U8,
                    vec![nn, per_row as i64],
                    vec![0x88; nn as usize * per_row],
                )
            }
        };
        let bias = match inputs.get(5).copied().flatten() {
            Some(bv) => match to_f16(m, bv, "bias") {
                Some(b16) => Some(b16),
                None => continue,
            },
            None => None,
        };
        let out_ty = m.value_type(out).clone();
        let f16_of = |t: &Type| match t {
            Type::Tensor(t) => Type::Tensor(mmq_ir::TensorType {
                dtype: Some(DType::F16),
                shape: t.shape.clone(),
            }),
            other => other.clone(),
        };
        let mut a16 = if a_dtype == Some(DType::F32) {
            let ty = f16_of(m.value_type(a));
            let at = At::Before(n);
            cast(m, g, at, a, (None, ty), format!("{name}_a_f16"))?.1
        } else {
            a
        };
        if let (true, Some(rank)) = (padded_k != k, a_rank) {
            let mut pads = vec![0i64; 2 * rank];
            pads[2 * rank - 1] = padded_k - k;
            let pads = add_bytes(
                m,
                format!("{name}_k_pads"),
                DType::I64,
                vec![2 * rank as i64],
                pads.iter().flat_map(|p| p.to_le_bytes()).collect(),
            );
            let ty = match m.value_type(a16).clone() {
                Type::Tensor(t) => Type::Tensor(mmq_ir::TensorType {
                    dtype: t.dtype,
                    shape: t.shape.map(|mut s| {
                        if let Some(l) = s.last_mut() {
                            *l = mmq_ir::Dim::known(padded_k);
                        }
                        s
                    }),
                }),
                other => other,
            };
            let op = Op::Pad {
                mode: None,
                pads: None,
                value: None,
            };
            let pad = m.cursor(g, At::Before(n)).insert(NewNode {
                op,
                inputs: vec![Some(a16), Some(pads)],
                outputs: vec![Some((None, ty))],
                name: Some(format!("{name}_a_pad")),
            });
            a16 = m.nodes[pad].outputs[0].ok_or("a Pad without a result")?;
        }
        let mut plugin_inputs = vec![Some(a16), Some(b), Some(scales16), Some(zeros)];
        plugin_inputs.extend(bias.map(Some));
        m.nodes[n].op = plugin_op(
            "MmqMatMulNBits",
            &[
                ("K", padded_k),
                ("N", nn),
                ("bits", 4),
                ("block_size", block),
            ],
        );
        m.set_operands(n, plugin_inputs);
        if a_dtype == Some(DType::F32) {
            // The plugin writes binary16; a Cast after it gives the graph its float32 result back
            // under the result's name.
            let out_name = m.values[out].name.take();
            m.values[out].name = Some(format!("{name}_y_f16"));
            m.set_type(out, f16_of(&out_ty));
            let (node, y32) = cast(
                m,
                g,
                At::After(n),
                out,
                (out_name, out_ty),
                format!("{name}_y_f32"),
            )?;
            m.replace_uses(out, y32, g, &[node]);
        }
        report.count("plugin-MmqMatMulNBits", 1);
        report.changed = true;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use mmq_kernels::{Interpreter, RtValue, Tensor};

    use super::*;
    use crate::targets::TargetRef;

    fn lowered(src: &str) -> (Module, Module, PassReport) {
        let (m, _) = mmq_ir::text::parse(src).unwrap_or_else(|e| panic!("{e:?}"));
        let mut after = m.clone();
        let opts = PassOptions {
            target: TargetRef::TRT,
            explain: false,
        };
        let report = TrtPlugins.run(&mut after, &opts).expect("lowers");
        mmq_ir::verify::verify(&after).unwrap_or_else(|e| panic!("{e:?}"));
        (m, after, report)
    }

    /// The outputs of `m` on an input ramp through zero.
    fn run(m: &Module) -> Vec<f64> {
        let g = m.entries[0].graph;
        let x = m.graphs[g].inputs[0];
        let n: usize = 32;
        let ramp: Vec<f32> = (0..n).map(|i| (i as f32 - 9.5) * 0.11).collect();
        let feeds: HashMap<String, RtValue> = [(
            m.values[x].name.clone().unwrap_or_default(),
            RtValue::from(Tensor::from_f32(vec![1, 2, 4, 4], ramp).expect("tensor")),
        )]
        .into();
        let out = Interpreter::new(m).run(g, &feeds).expect("runs");
        out[0]
            .1
            .as_tensor()
            .expect("tensor")
            .to_f64()
            .expect("numbers")
    }

    fn ops(m: &Module) -> Vec<String> {
        let g = m.entries[0].graph;
        m.graphs[g]
            .nodes()
            .iter()
            .map(|&n| m.nodes[n].op.op_type().to_owned())
            .collect()
    }

    const HEAD: &str = "graph @g(%x: f32[1, 2, 4, 4]) -> (f32[1, 2, 2, 2]) model {ir_version = 8, opsets = {\"\" = 17}} {";

    #[test]
    fn uint8_with_zero_point_128_becomes_native_int8_with_the_same_numbers() {
        let src = format!(
            "const $s : f32[] = dense<[0.05]>\nconst $z : u8[] = dense<[128]>\n{HEAD}\n  \
             %q = QuantizeLinear(%x, $s, $z) : u8[1, 2, 4, 4]\n  \
             %p = MaxPool(%q) {{kernel_shape = [2, 2], strides = [2, 2]}} : u8[1, 2, 2, 2]\n  \
             %y = DequantizeLinear(%p, $s, $z) : f32[1, 2, 2, 2]\n  return %y\n}}\n"
        );
        let (before, after, report) = lowered(&src);
        assert_eq!(
            ops(&after),
            ["QuantizeLinear", "MaxPool", "DequantizeLinear"]
        );
        assert_eq!(report.counters.get("uint8-unit-recoded-int8"), Some(&2));
        let g = after.entries[0].graph;
        for &n in after.graphs[g].nodes() {
            for v in after.nodes[n].outputs.iter().flatten() {
                assert_ne!(after.value_type(*v).dtype(), Some(DType::U8));
            }
        }
        assert_eq!(run(&before), run(&after));
    }

    #[test]
    fn asymmetric_units_become_plugins_with_the_same_numbers() {
        // zero point 3 (uint8) on the activation; a per-channel uint8 weight without zero
        // point (0, so -128 after recoding, one per channel).
        let src = format!(
            "const $s : f32[] = dense<[0.02]>\nconst $z : u8[] = dense<[3]>\n\
             const $w : u8[2] = dense<[200, 7]>\nconst $ws : f32[2] = dense<[0.01, 0.03]>\n\
             {HEAD}\n  \
             %q = QuantizeLinear(%x, $s, $z) : u8[1, 2, 4, 4]\n  \
             %p = MaxPool(%q) {{kernel_shape = [2, 2], strides = [2, 2]}} : u8[1, 2, 2, 2]\n  \
             %d = DequantizeLinear(%p, $s, $z) : f32[1, 2, 2, 2]\n  \
             %wd = DequantizeLinear($w, $ws) {{axis = 0}} : f32[2]\n  \
             %r = Reshape(%wd, $shape) : f32[1, 2, 1, 1]\n  \
             %y = Mul(%d, %r) : f32[1, 2, 2, 2]\n  return %y\n}}\n"
        )
        .replace("{HEAD}", HEAD)
        .replace(
            "const $ws",
            "const $shape : i64[4] = dense<[1, 2, 1, 1]>\nconst $ws",
        );
        let (before, after, report) = lowered(&src);
        assert_eq!(report.counters.get("plugin-MmqQuantize"), Some(&1));
        assert_eq!(report.counters.get("plugin-MmqDequantize"), Some(&2));
        assert_eq!(run(&before), run(&after));
        assert!(free_of_u8(&after));
    }

    #[test]
    fn a_quantized_value_that_leaves_the_graph_stays_as_it_is() {
        let src = "const $s : f32[] = dense<[0.05]>\nconst $z : u8[] = dense<[3]>\n\
             graph @g(%x: f32[1, 2, 4, 4]) -> (u8[1, 2, 4, 4]) model {ir_version = 8, opsets = {\"\" = 17}} {\n  \
             %q = QuantizeLinear(%x, $s, $z) : u8[1, 2, 4, 4]\n  return %q\n}\n";
        let (_, after, report) = lowered(src);
        assert_eq!(ops(&after), ["QuantizeLinear"]);
        assert!(!report.changed);
    }

    #[test]
    fn matmul_nbits_with_a_partial_last_block_pads_k() {
        // K = 40 with blocks of 32: two blocks, the second holding 8 values; the plugin takes
        // K = 64 with A padded by zeros, and gives the same product.
        let b: Vec<String> = (0..64).map(|i| ((i * 37 + 11) % 256).to_string()).collect();
        let src = format!(
            "const $b : u8[2, 2, 16] = dense<[{}]>\n\
             const $s : f32[2, 2] = dense<[0.02, 0.03, 0.025, 0.01]>\n\
             const $z : u8[2, 1] = dense<[0x97, 0x78]>\n\
             graph @g(%x: f32[1, 2, 4, 4]) -> (f32[1, 2]) model {{ir_version = 8, opsets = {{\"\" = 17, \"com.microsoft\" = 1}}}} {{\n  \
             %f = Reshape(%x, $shape) : f32[1, 32]\n  \
             %a = Concat(%f, %f) {{axis = 1}} : f32[1, 64]\n  \
             %a40 = Slice(%a, $st, $en, $ax) : f32[1, 40]\n  \
             %y = \"com.microsoft\".MatMulNBits(%a40, $b, $s, $z) {{K = 40, N = 2, bits = 4, block_size = 32}} : f32[1, 2]\n  \
             return %y\n}}\n",
            b.join(", ")
        )
        .replace(
            "const $b",
            "const $shape : i64[2] = dense<[1, 32]>\nconst $st : i64[1] = dense<[0]>\n\
             const $en : i64[1] = dense<[40]>\nconst $ax : i64[1] = dense<[1]>\nconst $b",
        );
        let (before, after, report) = lowered(&src);
        assert_eq!(report.counters.get("plugin-MmqMatMulNBits"), Some(&1));
        assert!(ops(&after).contains(&"Pad".to_owned()), "{:?}", ops(&after));
        let (want, got) = (run(&before), run(&after));
        for (w, g) in want.iter().zip(&got) {
            assert!((w - g).abs() <= 1e-2 * (1.0 + w.abs()), "{w} vs {g}");
        }
    }

    /// No value of the entry graph is uint8.
    fn free_of_u8(m: &Module) -> bool {
        let g = m.entries[0].graph;
        m.graphs[g].nodes().iter().all(|&n| {
            m.nodes[n]
                .outputs
                .iter()
                .chain(&m.nodes[n].inputs)
                .flatten()
                .all(|v| m.value_type(*v).dtype() != Some(DType::U8))
        })
    }
}
