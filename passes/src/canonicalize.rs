//! Canonicalization: common subexpressions, duplicate small constants, and `Identity` nodes.

use std::collections::{HashMap, HashSet};

use mmq_ir::{Const, Module, Node, Op, Storage, Value, ValueDef};

use crate::const_fold::is_random;
use crate::dce::{graph_outputs, live_graphs, redirect_uses};
use crate::pass::{Pass, PassError, PassOptions, PassReport};

/// Constants up to this many bytes are compared for merging.
pub const MAX_MERGED_CONST_BYTES: u64 = 4096;

/// Makes equal computations share one value:
///
/// - identical constants (same dtype, shape and bytes, at most [`MAX_MERGED_CONST_BYTES`]
///   bytes) are read through the first of them;
/// - `Identity` nodes whose result is not a graph output are bypassed (their readers read the
///   operand) and removed;
/// - nodes of the same graph with equal ops (attributes included), equal operands and no
///   subgraphs merge into the first; a later duplicate whose result is a graph output becomes
///   an `Identity` of the first one's result, so the output keeps its value and name. Random
///   ops never merge.
///
/// Counters: `merged-consts`, `bypassed-identities`, `merged-nodes`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Canonicalize;

impl Pass for Canonicalize {
    fn name(&self) -> &str {
        "canonicalize"
    }

    fn run(&self, m: &mut Module, _opts: &PassOptions) -> Result<PassReport, PassError> {
        let mut report = PassReport::default();
        let outputs = graph_outputs(m);
        let mut map = merge_consts(m, &mut report);

        let resolve = |map: &HashMap<Value, Value>, v: Value| {
            let mut v = v;
            // Chains are short (Identity of Identity); the bound guards against cycles.
            for _ in 0..64 {
                match map.get(&v) {
                    Some(&to) if to != v => v = to,
                    _ => break,
                }
            }
            v
        };

        let mut bypassed = 0;
        let mut merged = 0;
        for g in live_graphs(m) {
            let mut seen: HashMap<(String, Vec<Option<Value>>), Vec<Node>> = HashMap::new();
            let mut removed: HashSet<Node> = HashSet::new();
            let nodes = m.graphs[g].nodes().to_vec();
            for n in nodes {
                let inputs: Vec<Option<Value>> = m.nodes[n]
                    .inputs
                    .iter()
                    .map(|o| o.map(|v| resolve(&map, v)))
                    .collect();
                m.set_operands(n, inputs.clone());
                let node = &m.nodes[n];
                if matches!(node.op, Op::Identity {})
                    && let ([Some(src)], [Some(out)]) = (&node.inputs[..], &node.outputs[..])
                    && !outputs.contains(out)
                {
                    map.insert(*out, *src);
                    removed.insert(n);
                    bypassed += 1;
                    continue;
                }
                if !node.op.subgraphs().is_empty() || is_random(&node.op) {
                    continue;
                }
                let key = (node.op.op_type().to_owned(), inputs);
                let candidates = seen.entry(key).or_default();
                let first = candidates.iter().copied().find(|&c| {
                    let cd = &m.nodes[c];
                    cd.op == node.op
                        && cd.outputs.len() == node.outputs.len()
                        && cd
                            .outputs
                            .iter()
                            .zip(&node.outputs)
                            .all(|(a, b)| a.is_some() == b.is_some())
                });
                let Some(first) = first else {
                    candidates.push(n);
                    continue;
                };
                let kept: Vec<Option<Value>> = m.nodes[first].outputs.clone();
                let dup: Vec<Option<Value>> = node.outputs.clone();
                let exposed: Vec<usize> = dup
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| v.is_some_and(|v| outputs.contains(&v)))
                    .map(|(i, _)| i)
                    .collect();
                match exposed.as_slice() {
                    [] => {
                        for (d, k) in dup.iter().zip(&kept) {
                            if let (Some(d), Some(k)) = (d, k) {
                                map.insert(*d, *k);
                            }
                        }
                        removed.insert(n);
                    }
                    // A single-result duplicate that a graph returns stays as an Identity.
                    [0] if dup.len() == 1 => {
                        if let (Some(d), Some(k)) = (dup[0], kept[0]) {
                            map.insert(d, k);
                        }
                        let node = &mut m.nodes[n];
                        node.op = Op::Identity {};
                        node.inputs = vec![kept[0]];
                    }
                    _ => continue,
                }
                merged += 1;
            }
            m.retain_nodes(g, |n| !removed.contains(n));
        }
        // Readers in bodies processed before a bypass was known, and chains, resolve here.
        let resolved: HashMap<Value, Value> = map.keys().map(|&v| (v, resolve(&map, v))).collect();
        redirect_uses(m, &resolved);
        report.count("bypassed-identities", bypassed);
        report.count("merged-nodes", merged);
        Ok(report)
    }
}

/// Maps every constant value to the first identical small constant; counts the merges.
fn merge_consts(m: &Module, report: &mut PassReport) -> HashMap<Value, Value> {
    // Merged within one model (an entry and its subgraphs) only: a constant of another model
    // may carry a name this model already uses for another value.
    let mut first: HashMap<(usize, i32, Vec<i64>, Vec<u8>), Value> = HashMap::new();
    let mut map = HashMap::new();
    let mut used: Vec<(usize, Value)> = Vec::new();
    let mut seen = HashSet::new();
    for (model, e) in m.entries.iter().enumerate() {
        for g in m.graph_tree(e.graph) {
            for &n in m.graphs[g].nodes() {
                for &v in m.nodes[n].inputs.iter().flatten() {
                    if seen.insert(v) && matches!(m.values[v].def, ValueDef::Const(_)) {
                        used.push((model, v));
                    }
                }
            }
        }
    }
    for (model, v) in used {
        let ValueDef::Const(c) = m.values[v].def else {
            continue;
        };
        let Some(bytes) = small_bytes(m, c) else {
            continue;
        };
        let data = &m.consts[c];
        let key = (model, data.dtype.onnx_code(), data.shape.clone(), bytes);
        match first.get(&key) {
            Some(&keep) => {
                map.insert(v, keep);
            }
            None => {
                first.insert(key, v);
            }
        }
    }
    report.count("merged-consts", map.len());
    map
}

/// The bytes of a constant of at most [`MAX_MERGED_CONST_BYTES`] bytes (strings are encoded
/// with their lengths so that different splits differ).
fn small_bytes(m: &Module, c: Const) -> Option<Vec<u8>> {
    let data = m.consts.get(c)?;
    if data.byte_len() > MAX_MERGED_CONST_BYTES {
        return None;
    }
    match &data.storage {
        Storage::Strings(v) => {
            let mut out = Vec::new();
            for s in v {
                out.extend_from_slice(&(s.len() as u64).to_le_bytes());
                out.extend_from_slice(s);
            }
            Some(out)
        }
        _ => data.raw_bytes().map(<[u8]>::to_vec),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::test_util::*;
    use mmq_ir::Dim;

    fn ops(m: &Module) -> Vec<String> {
        let g = m.entries[0].graph;
        m.graphs[g]
            .nodes()
            .iter()
            .map(|&n| m.nodes[n].op.op_type().to_owned())
            .collect()
    }

    #[test]
    fn equal_nodes_merge_and_outputs_keep_their_names() {
        let (mut m, g) = module();
        let x = m.add_input(g, Some("x".into()), f32_ty(vec![Dim::known(4)]));
        let a = unary(&mut m, g, Op::Relu {}, vec![x], "a");
        let b = unary(&mut m, g, Op::Relu {}, vec![x], "b");
        // Different attributes: no merge.
        let c = unary(&mut m, g, Op::LeakyRelu { alpha: Some(0.1) }, vec![x], "c");
        let d = unary(&mut m, g, Op::LeakyRelu { alpha: Some(0.2) }, vec![x], "d");
        let s1 = node(&mut m, g, Op::Add {}, vec![a, c], "s1");
        let s2 = node(&mut m, g, Op::Add {}, vec![b, c], "s2");
        let t = node(&mut m, g, Op::Add {}, vec![s1, s2], "t");
        let u = node(&mut m, g, Op::Add {}, vec![t, d], "u");
        m.graphs[g].outputs = vec![u, b];
        let report = Canonicalize
            .run(&mut m, &PassOptions::default())
            .expect("canonicalize runs");
        // b merges (it is an output, so it becomes Identity(a)); then s2 merges into s1.
        assert_eq!(report.counters.get("merged-nodes"), Some(&2));
        assert_eq!(
            ops(&m),
            [
                "Relu",
                "Identity",
                "LeakyRelu",
                "LeakyRelu",
                "Add",
                "Add",
                "Add"
            ]
        );
        let tn = m.graphs[g].nodes()[5];
        let s1_twice = m.nodes[tn].inputs.clone();
        assert_eq!(s1_twice, vec![Some(s1), Some(s1)]);
        assert_eq!(m.graphs[g].outputs, vec![u, b]);
        assert_eq!(m.values[b].name.as_deref(), Some("b"));
        let errors = mmq_ir::verify::verify_all(&m);
        assert!(errors.is_empty(), "{errors:?}");
    }

    #[test]
    fn identities_are_bypassed_and_small_constants_merge() {
        let (mut m, g) = module();
        let x = m.add_input(g, Some("x".into()), f32_ty(vec![Dim::known(2)]));
        let k1 = f32_const(&mut m, "k1", &[1.0, 2.0], vec![2]);
        let k2 = f32_const(&mut m, "k2", &[1.0, 2.0], vec![2]);
        let k3 = f32_const(&mut m, "k3", &[1.0, 3.0], vec![2]);
        let id = unary(&mut m, g, Op::Identity {}, vec![x], "id");
        let p = node(&mut m, g, Op::Mul {}, vec![id, k1], "p");
        let q = node(&mut m, g, Op::Mul {}, vec![x, k2], "q");
        let r = node(&mut m, g, Op::Add {}, vec![p, k3], "r");
        let s = node(&mut m, g, Op::Add {}, vec![q, r], "s");
        let out = unary(&mut m, g, Op::Identity {}, vec![s], "out");
        m.graphs[g].outputs = vec![out];
        let report = Canonicalize
            .run(&mut m, &PassOptions::default())
            .expect("canonicalize runs");
        assert_eq!(report.counters.get("merged-consts"), Some(&1));
        assert_eq!(report.counters.get("bypassed-identities"), Some(&1));
        assert_eq!(report.counters.get("merged-nodes"), Some(&1));
        // p and q became Mul(x, k1); the output Identity stays.
        assert_eq!(ops(&m), ["Mul", "Add", "Add", "Identity"]);
        let mul = m.graphs[g].nodes()[0];
        assert_eq!(m.nodes[mul].inputs, vec![Some(x), Some(k1)]);
        let errors = mmq_ir::verify::verify_all(&m);
        assert!(errors.is_empty(), "{errors:?}");
    }
}
