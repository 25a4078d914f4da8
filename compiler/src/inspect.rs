//! Summaries of a module as JSON (`mmq inspect --format json`, `mmq.Model.inspect("json")`).

use std::collections::BTreeMap;

use mmq_ir::text::type_text;
use mmq_ir::{Dim, GraphId, Module, Value};
use serde_json::{Value as Json, json};

fn dim_json(m: &Module, d: &Dim) -> Json {
    match d.as_known() {
        Some(n) => json!(n),
        None => json!(render_dim(m, d)),
    }
}

/// A dim as text (`batch`, `seq + 1`, `3`).
pub fn render_dim(m: &Module, d: &Dim) -> String {
    d.render(&|s| m.symbols[s].name.clone())
}

fn value_json(m: &Module, v: Value) -> Json {
    let ty = m.value_type(v);
    let (dtype, shape) = match ty.as_tensor() {
        Some(t) => (
            t.dtype.map_or(Json::Null, |d| json!(d.name())),
            t.shape.as_ref().map_or(Json::Null, |s| {
                Json::Array(s.iter().map(|d| dim_json(m, d)).collect())
            }),
        ),
        None => (json!(type_text(m, ty)), Json::Null),
    };
    json!({"name": m.values[v].name.clone().unwrap_or_default(), "dtype": dtype, "shape": shape})
}

/// An op's `domain.Op` name (`Op` in the default domain).
pub fn op_key(op: &mmq_ir::Op) -> String {
    match op.domain() {
        "" => op.op_type().to_owned(),
        d => format!("{d}.{}", op.op_type()),
    }
}

/// Op counts over a graph and its subgraphs, by `domain.Op` name.
pub fn op_counts(m: &Module, g: GraphId) -> BTreeMap<String, usize> {
    let mut ops = BTreeMap::new();
    for sub in m.graph_tree(g) {
        for &n in m.graphs[sub].nodes() {
            *ops.entry(op_key(&m.nodes[n].op)).or_insert(0) += 1;
        }
    }
    ops
}

/// The module's symbols, entry graphs (inputs and outputs with dtype and shape, node counts by
/// op), constant count and weight bytes.
pub fn summary_json(m: &Module) -> Json {
    let symbols: Vec<Json> = m
        .symbols
        .iter()
        .map(|(_, s)| json!({"name": s.name, "min": s.min, "max": s.max}))
        .collect();
    let graphs: Vec<Json> = m
        .entries
        .iter()
        .map(|e| {
            let g = &m.graphs[e.graph];
            let ops = op_counts(m, e.graph);
            json!({
                "name": g.name,
                "inputs": g.inputs.iter().map(|&v| value_json(m, v)).collect::<Vec<_>>(),
                "outputs": g.outputs.iter().map(|&v| value_json(m, v)).collect::<Vec<_>>(),
                "nodes": ops.values().sum::<usize>(),
                "ops": ops,
            })
        })
        .collect();
    json!({
        "symbols": symbols,
        "graphs": graphs,
        "constants": m.consts.len(),
        "weight_bytes": m.weight_bytes(),
    })
}

/// Weight bytes per dtype name.
pub fn weight_bytes_by_dtype(m: &Module) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (_, c) in m.consts.iter() {
        *out.entry(c.dtype.name().to_owned()).or_insert(0) += c.byte_len();
    }
    out
}
