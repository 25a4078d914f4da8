//! Quantization: calibration through the reference interpreter, schemes (INT8 static and
//! dynamic, INT4 weight-only, FP8, FP16 weight storage), precision maps (written by hand or
//! chosen automatically for a target cosine), and the accuracy report.
pub mod auto;
pub mod awq;
pub mod cache;
pub mod calibrate;
pub mod fp16;
pub mod granularity;
pub mod int8;
pub mod place;
pub mod precision;
pub mod report;
pub mod smooth;
pub mod weight_only;

use mmq_ir::{Module, Op};

/// Raises every entry model's default-domain opset to at least `to`, for a form that exists only
/// from that version (`what` says which, for the messages); returns one note per raised model.
/// Refused where an op of the graph would change meaning: `GroupNormalization` (changed at 21)
/// and reductions that carry `axes` as an attribute (an operand from 18; `ReduceSum` from 13).
pub(crate) fn raise_opset(m: &mut Module, to: i64, what: &str) -> Result<Vec<String>, String> {
    let mut notes = Vec::new();
    for i in 0..m.entries.len() {
        let root = m.entries[i].graph;
        let opset = m.onnx_opset(root).unwrap_or(0);
        if opset >= to {
            continue;
        }
        let clash = m.graph_tree(root).into_iter().find_map(|g| {
            m.graphs[g].nodes.iter().find_map(|&n| {
                let op = &m.nodes[n].op;
                let changed = (to >= 21 && matches!(op, Op::GroupNormalization { .. }))
                    || (opset < 18
                        && to >= 18
                        && op.op_type().starts_with("Reduce")
                        && op.op_type() != "ReduceSum"
                        && op.attrs().iter().any(|(a, _)| *a == "axes"));
                changed.then(|| {
                    let name = m.nodes[n].name.clone().unwrap_or_default();
                    format!("{} '{name}'", op.op_type())
                })
            })
        });
        if let Some(node) = clash {
            return Err(format!(
                "{what} needs opset {to}, and graph '{}' (opset {opset}) has {node}, whose form \
                 or meaning differs at {to}; re-export the model at opset {to} or later",
                m.graphs[root].name
            ));
        }
        let model = &mut m.entries[i].model;
        model
            .opsets
            .retain(|(d, _)| !(d.is_empty() || d == "ai.onnx"));
        model.opsets.insert(0, (String::new(), to));
        notes.push(format!(
            "graph '{}': opset {opset} raised to {to} for {what}",
            m.graphs[root].name
        ));
    }
    Ok(notes)
}
