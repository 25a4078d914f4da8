//! Raising a model's default-domain opset for a form that exists only from a later version.
//!
//! The IR keeps each node in the form its source opset gave it. Raising rewrites the forms that
//! moved without changing meaning: a reduction's `axes` attribute becomes its operand (from 13
//! for `ReduceSum`, from 18 for the others), as opset-17 exports write every RMSNorm's
//! `ReduceMean`. It is refused where a node's meaning differs at the new version:
//! - `GroupNormalization`: scale and bias per channel from 21 (per group before);
//! - `GridSample`: its modes renamed at 20 (`bilinear` → `linear`, `bicubic` → `cubic`);
//! - `DFT`: its `axis` an operand from 20.

use mmq_ir::edit::{Emit, place};
use mmq_ir::{GraphId, Module, Op};

/// The first node of graph `root` (and the graphs it nests) whose form or meaning changes when
/// its default-domain opset goes from `from` to `to`, as `Op 'name'`.
pub(crate) fn clash(m: &Module, root: GraphId, from: i64, to: i64) -> Option<String> {
    let crosses = |at: i64| from < at && to >= at;
    m.graph_tree(root).into_iter().find_map(|g| {
        m.graphs[g].nodes().iter().find_map(|&n| {
            let op = &m.nodes[n].op;
            let kind = op.op_type();
            let changed = (crosses(21) && matches!(op, Op::GroupNormalization { .. }))
                || (crosses(20) && matches!(kind, "GridSample" | "DFT"));
            changed.then(|| {
                let name = m.nodes[n].name.clone().unwrap_or_default();
                format!("{kind} '{name}'")
            })
        })
    })
}

/// Whether entry graph `root`'s opset can be raised to `to` (it is there already, or no node
/// [`clash`]es).
pub(crate) fn can_raise(m: &Module, root: GraphId, to: i64) -> bool {
    let opset = m.onnx_opset(root).unwrap_or(0);
    opset >= to || clash(m, root, opset, to).is_none()
}

/// Raises entry graph `root`'s default-domain opset to at least `to`, for a form that exists
/// only from that version (`what` says which, for the messages); returns a note when it was
/// raised. Refused where a node would change meaning ([`clash`]).
pub(crate) fn raise_graph(
    m: &mut Module,
    root: GraphId,
    to: i64,
    what: &str,
) -> Result<Option<String>, String> {
    let opset = m.onnx_opset(root).unwrap_or(0);
    if opset >= to {
        return Ok(None);
    }
    if let Some(node) = clash(m, root, opset, to) {
        return Err(format!(
            "{what} needs opset {to}, and graph '{}' (opset {opset}) has {node}, whose form \
             or meaning differs at {to}; re-export the model at opset {to} or later",
            m.graphs[root].name
        ));
    }
    if !m.entries.iter().any(|e| e.graph == root) {
        return Ok(None);
    }
    for g in m.graph_tree(root) {
        reduction_axes_as_operands(m, g, opset, to);
    }
    let Some(entry) = m.entries.iter_mut().find(|e| e.graph == root) else {
        return Ok(None);
    };
    entry
        .model
        .opsets
        .retain(|(d, _)| !(d.is_empty() || d == "ai.onnx"));
    entry.model.opsets.insert(0, (String::new(), to));
    Ok(Some(format!(
        "graph '{}': opset {opset} raised to {to} for {what}",
        m.graphs[root].name
    )))
}

/// The `axes` attribute of a reduction in graph `g`, taken out where the opset crosses the
/// version that made it an operand (13 for `ReduceSum`, 18 for the others): `None` elsewhere.
fn take_axes(op: &mut Op, from: i64, to: i64) -> Option<Vec<i64>> {
    let at = if matches!(op, Op::ReduceSum { .. }) {
        13
    } else {
        18
    };
    if !(from < at && to >= at) {
        return None;
    }
    match op {
        Op::ReduceSum { axes, .. }
        | Op::ReduceMean { axes, .. }
        | Op::ReduceMax { axes, .. }
        | Op::ReduceMin { axes, .. }
        | Op::ReduceProd { axes, .. }
        | Op::ReduceL1 { axes, .. }
        | Op::ReduceL2 { axes, .. }
        | Op::ReduceLogSum { axes, .. }
        | Op::ReduceLogSumExp { axes, .. }
        | Op::ReduceSumSquare { axes, .. } => axes.take(),
        _ => None,
    }
}

/// Graph `g`'s reductions with an `axes` attribute read the same axes as an i64 operand, the form
/// from opset 13 (`ReduceSum`) or 18 (the others) on, for a raise from `from` to `to`. The
/// meaning is the same: an absent attribute and an absent operand both reduce every axis.
fn reduction_axes_as_operands(m: &mut Module, g: GraphId, from: i64, to: i64) {
    let nodes = m.graphs[g].nodes().to_vec();
    let mut e = Emit::new(m, g, "axes");
    for n in nodes {
        if let Some(axes) = take_axes(&mut m.nodes[n].op, from, to) {
            let v = e.i64s(m, &axes);
            m.set_operand(n, 1, Some(v));
        }
    }
    place(m, e, true);
}

/// [`raise_graph`] for every entry model; one note per raised model.
pub(crate) fn raise_opset(m: &mut Module, to: i64, what: &str) -> Result<Vec<String>, String> {
    let roots: Vec<GraphId> = m.entries.iter().map(|e| e.graph).collect();
    let mut notes = Vec::new();
    for root in roots {
        notes.extend(raise_graph(m, root, to, what)?);
    }
    Ok(notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(src: &str) -> Module {
        mmq_ir::text::parse(src).expect("test module parses").0
    }

    const REDUCTIONS: &str = r#"
graph @g(%x: f32[2, 3]) -> (f32[2, 1], f32[1, 3], f32[]) model {opsets = {"" = 12}} {
  %s = ReduceSum(%x) {axes = [1]} : f32[2, 1]
  %m = ReduceMax(%x) {axes = [0]} : f32[1, 3]
  %a = ReduceMean(%x) {keepdims = 0} : f32[]
  return %s, %m, %a
}
"#;

    /// (op, the axes operand's values where it has one, the attribute's where it has one).
    fn forms(m: &Module) -> Vec<(String, Option<Vec<i64>>, bool)> {
        let g = m.entries[0].graph;
        m.graphs[g]
            .nodes()
            .iter()
            .map(|&n| {
                let node = &m.nodes[n];
                let operand = node.inputs.get(1).copied().flatten().map(|v| {
                    let c = &m.consts[m.const_source(v).expect("a constant operand")];
                    c.raw_bytes()
                        .expect("inline")
                        .chunks(8)
                        .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
                        .collect()
                });
                let attr = node.op.attrs().iter().any(|(a, _)| *a == "axes");
                (node.op.op_type().to_owned(), operand, attr)
            })
            .collect()
    }

    #[test]
    fn raising_moves_a_reduction_s_axes_into_its_operand_where_the_version_did() {
        let mut m = parse(REDUCTIONS);
        let g = m.entries[0].graph;
        assert!(can_raise(&m, g, 23));
        // To 13: ReduceSum's axes became an operand at 13, the others' not yet.
        raise_graph(&mut m, g, 13, "a test").expect("raises");
        assert_eq!(
            forms(&m),
            [
                ("ReduceSum".into(), Some(vec![1]), false),
                ("ReduceMax".into(), None, true),
                ("ReduceMean".into(), None, false),
            ]
        );
        // To 23: the others' at 18; no attribute, no operand (every axis) stays so.
        raise_graph(&mut m, g, 23, "a test").expect("raises");
        assert_eq!(
            forms(&m),
            [
                ("ReduceSum".into(), Some(vec![1]), false),
                ("ReduceMax".into(), Some(vec![0]), false),
                ("ReduceMean".into(), None, false),
            ]
        );
        assert_eq!(m.onnx_opset(g), Some(23));
        mmq_ir::verify::verify(&m).expect("the raised module verifies");
    }

    #[test]
    fn a_node_whose_meaning_changes_refuses_the_raise() {
        let mut m = parse(
            r#"
const $s : f32[2] = dense<[1.0, 1.0]>
graph @g(%x: f32[1, 2, 4]) -> (f32[1, 2, 4]) model {opsets = {"" = 18}} {
  %y = GroupNormalization(%x, $s, $s) {num_groups = 2} : f32[1, 2, 4]
  return %y
}
"#,
        );
        let g = m.entries[0].graph;
        assert!(!can_raise(&m, g, 23));
        let err = raise_graph(&mut m, g, 23, "a test").expect_err("refused");
        assert!(err.contains("GroupNormalization"), "{err}");
        assert_eq!(m.onnx_opset(g), Some(18));
    }
}
