//! Raising a model's default-domain opset for a form that exists only from a later version.
//!
//! The IR keeps each node in the form its source opset gave it, so raising is refused where a
//! node's form or meaning differs at the new version:
//! - `GroupNormalization`: scale and bias per channel from 21 (per group before);
//! - reductions other than `ReduceSum` with `axes` as an attribute: an operand from 18;
//! - `GridSample`: its modes renamed at 20 (`bilinear` → `linear`, `bicubic` → `cubic`);
//! - `DFT`: its `axis` an operand from 20.

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
                || (crosses(18)
                    && kind.starts_with("Reduce")
                    && kind != "ReduceSum"
                    && op.attrs().iter().any(|(a, _)| *a == "axes"))
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

/// [`raise_graph`] for every entry model; one note per raised model.
pub(crate) fn raise_opset(m: &mut Module, to: i64, what: &str) -> Result<Vec<String>, String> {
    let roots: Vec<GraphId> = m.entries.iter().map(|e| e.graph).collect();
    let mut notes = Vec::new();
    for root in roots {
        notes.extend(raise_graph(m, root, to, what)?);
    }
    Ok(notes)
}
