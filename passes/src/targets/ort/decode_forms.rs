//! Op forms for graphs that run a token a step: decoders that read a KV cache.
//!
//! Extraction prices an op by its kind alone. At a prompt's or an encoder's rows ONNX Runtime's
//! `SkipSimplifiedLayerNormalization` is slower than the `Add` and
//! `SimplifiedLayerNormalization` it replaces (1.56x at 128 x 512, `tools/norm_rates.py`), so
//! the ORT cost model keeps the pair. A decoder's steps read one row each: there the fused kernel
//! costs what the pair costs (6.3 against 6.4 µs at 1 x 512, one thread) and each step dispatches
//! one node fewer per norm, which is the form ONNX Runtime's model builder writes. Measured on
//! an INT4 decoder of 8 layers (`docs/benchmarks.md`, fourth run), the 16 fused norms moved its
//! decode speed from 0.98x to 1.00x of the builder's at one thread and from 1.03x to 1.04x at
//! two.
//! [`SkipNorms`] fuses the pairs in the graphs that read a KV cache
//! ([`crate::quant::cache::reads_kv_cache`]) and leaves every other graph to the cost model.

use std::collections::HashSet;

use mmq_ir::edit::NewNode;
use mmq_ir::{At, GraphId, Module, Node, Op, Type, Value, ValueDef};

use crate::pass::{Pass, PassError, PassOptions, PassReport};
use crate::quant::cache::reads_kv_cache;

/// `SimplifiedLayerNormalization(a + b)` (or `RMSNormalization(a + b)`) →
/// `com.microsoft.SkipSimplifiedLayerNormalization(a, b)` in graphs that read a KV cache (see
/// the module documentation); counter `skip-norms`.
#[derive(Clone, Copy, Debug, Default)]
pub struct SkipNorms;

/// One pair to fuse: the `Add`, the norm and its epsilon. Operands are read when the pair is
/// fused: a pair before it may have replaced them.
struct Pair {
    add: Node,
    norm: Node,
    epsilon: f32,
}

impl Pass for SkipNorms {
    fn name(&self) -> &str {
        "decode-skip-norms"
    }

    fn run(&self, m: &mut Module, _opts: &PassOptions) -> Result<PassReport, PassError> {
        let (readers, outputs) = super::readers(m);
        let roots: Vec<GraphId> = m.entries.iter().map(|e| e.graph).collect();
        let mut pairs: Vec<Pair> = Vec::new();
        let mut adds = HashSet::new();
        for g in roots {
            if reads_kv_cache(m, g) {
                // A sum two norms read fuses into the first.
                pairs.extend(
                    m.graphs[g]
                        .nodes()
                        .iter()
                        .filter_map(|&n| pair(m, n))
                        .filter(|p| adds.insert(p.add)),
                );
            }
        }
        for p in &pairs {
            let g = m.nodes[p.norm].graph;
            let sum = m.nodes[p.add].outputs[0].unwrap_or_else(|| unreachable!("a pair's sum"));
            let y = m.nodes[p.norm].outputs[0].unwrap_or_else(|| unreachable!("a pair's result"));
            // The new results take the names of the values they replace (either may be a graph
            // output); the sum is a result only where something else reads it.
            let result =
                |m: &mut Module, v: Value| Some((m.values[v].name.take(), m.value_type(v).clone()));
            let keep_sum = readers.get(&sum).copied().unwrap_or(0) > 1 || outputs.contains(&sum);
            let results = vec![
                result(m, y),
                None,
                None,
                if keep_sum { result(m, sum) } else { None },
            ];
            let name = m.nodes[p.norm].name.clone();
            let mut inputs = m.nodes[p.add].inputs.clone();
            inputs.push(m.nodes[p.norm].inputs[1]);
            // At the `Add`'s place: the operands are defined there and the sum's other readers
            // follow it.
            let fused = m.cursor(g, At::Before(p.add)).insert(NewNode {
                op: Op::SkipSimplifiedLayerNormalization {
                    epsilon: Some(p.epsilon),
                },
                inputs,
                outputs: if keep_sum {
                    results
                } else {
                    results[..1].to_vec()
                },
                name,
            });
            let made = m.nodes[fused].outputs.clone();
            m.replace_uses(y, made[0].unwrap_or_else(|| unreachable!()), g, &[]);
            if keep_sum {
                m.replace_uses(sum, made[3].unwrap_or_else(|| unreachable!()), g, &[]);
            }
            m.remove_node(p.norm);
            m.remove_node(p.add);
        }
        let mut report = PassReport::default();
        report.count("skip-norms", pairs.len());
        Ok(report)
    }
}

/// `norm` as a pair to fuse: a `SimplifiedLayerNormalization` or opset-23 `RMSNormalization`
/// (the same op) over the last axis (its variance unread, float32 statistics) of an `Add` of two operands of one 2-D or 3-D type, scaled by a
/// vector of the hidden size.
fn pair(m: &Module, norm: Node) -> Option<Pair> {
    let node = &m.nodes[norm];
    let (Op::SimplifiedLayerNormalization {
        axis,
        epsilon,
        stash_type,
    }
    | Op::RMSNormalization {
        axis,
        epsilon,
        stash_type,
    }) = node.op
    else {
        return None;
    };
    if node.outputs.iter().skip(1).any(Option::is_some) || stash_type.unwrap_or(1) != 1 {
        return None;
    }
    let (sum, gamma) = (
        node.inputs.first().copied()??,
        node.inputs.get(1).copied()??,
    );
    let ValueDef::Output { node: add, .. } = m.values[sum].def else {
        return None;
    };
    let a = &m.nodes[add];
    if !matches!(a.op, Op::Add {}) || a.graph != node.graph {
        return None;
    }
    let operands = [a.inputs.first().copied()??, a.inputs.get(1).copied()??];
    let ty = m.value_type(operands[0]);
    let shape = ty.shape()?;
    let rank = shape.len() as i64;
    let hidden = shape.last()?.as_known()?;
    let last = axis.unwrap_or(-1);
    let gamma_is_vector = matches!(
        m.value_type(gamma),
        Type::Tensor(t) if t.shape.as_deref().is_some_and(|s| s.len() == 1 && s[0].as_known() == Some(hidden))
    );
    ((2..=3).contains(&rank)
        && (last == -1 || last == rank - 1)
        && ty == m.value_type(operands[1])
        && ty.dtype() == m.value_type(gamma).dtype()
        && gamma_is_vector)
        .then_some(Pair {
            add,
            norm,
            epsilon: epsilon.unwrap_or(1e-5),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(src: &str) -> Module {
        mmq_ir::text::parse(src).expect("test module parses").0
    }

    fn ops(m: &Module) -> Vec<&str> {
        m.graphs[m.entries[0].graph]
            .nodes()
            .iter()
            .map(|&n| m.nodes[n].op.op_type())
            .collect()
    }

    const DECODER: &str = r#"
const $g : f32[4] = dense<[1.0, 2.0, 1.0, 1.0]>
const $b : f32[4] = dense<[0.5, 0.5, 0.5, 0.5]>
graph @g(%x: f32[batch, seq, 4], %r: f32[batch, seq, 4], %past_key_values.0.key: f32[batch, 1, past, 4]) -> (f32[batch, seq, 4], f32[batch, seq, 4], f32[batch, 1, total, 4]) {
  %s = Add(%x, %r) : f32[batch, seq, 4]
  %y = SimplifiedLayerNormalization(%s, $g) {axis = -1, epsilon = 0.001} : f32[batch, seq, 4]
  %t = Add(%y, %s) : f32[batch, seq, 4]
  %z = RMSNormalization(%t, $g) {axis = -1} : f32[batch, seq, 4]
  %u = Add(%z, $b) : f32[batch, seq, 4]
  %w = SimplifiedLayerNormalization(%u, $g) : f32[batch, seq, 4]
  %present.0.key = Identity(%past_key_values.0.key) : f32[batch, 1, total, 4]
  return %w, %t, %present.0.key
}
"#;

    #[test]
    fn a_decoder_reads_its_residual_norms_fused_and_keeps_the_sums_it_reads() {
        let mut m = parse(DECODER);
        let report = SkipNorms
            .run(&mut m, &PassOptions::default())
            .expect("pass");
        assert_eq!(report.counters.get("skip-norms"), Some(&2));
        // The bias add is not a residual (a vector against a tensor) and stays.
        assert_eq!(
            ops(&m),
            [
                "SkipSimplifiedLayerNormalization",
                "SkipSimplifiedLayerNormalization",
                "Add",
                "SimplifiedLayerNormalization",
                "Identity"
            ]
        );
        let g = m.entries[0].graph;
        let nodes = m.graphs[g].nodes().to_vec();
        let (first, second) = (&m.nodes[nodes[0]], &m.nodes[nodes[1]]);
        assert_eq!(
            first.op,
            Op::SkipSimplifiedLayerNormalization {
                epsilon: Some(0.001)
            }
        );
        assert_eq!(
            second.op,
            Op::SkipSimplifiedLayerNormalization {
                epsilon: Some(1e-5)
            }
        );
        // %s is read by the next residual add, so the first keeps it as result 3, which the
        // second reads; %t is a graph output, so the second keeps it too, under its name.
        assert_eq!(first.outputs.len(), 4);
        assert_eq!(second.inputs[1], first.outputs[3]);
        assert_eq!(second.inputs[0], first.outputs[0]);
        let t = second.outputs[3].expect("the kept sum");
        assert_eq!(m.graphs[g].outputs[1], t);
        assert_eq!(m.values[t].name.as_deref(), Some("t"));
        mmq_ir::verify::verify(&m).expect("the fused module verifies");
    }

    #[test]
    fn a_graph_without_a_kv_cache_is_left_to_the_cost_model() {
        let src = DECODER
            .replace("%present.0.key = Identity", "%out = Identity")
            .replace("%present.0.key\n", "%out\n");
        let mut m = parse(&src);
        let before = ops(&m).len();
        let report = SkipNorms
            .run(&mut m, &PassOptions::default())
            .expect("pass");
        assert_eq!(report.counters.get("skip-norms").copied().unwrap_or(0), 0);
        assert_eq!(ops(&m).len(), before);
    }

    #[test]
    fn a_norm_whose_sum_is_read_once_has_one_result() {
        let mut m = parse(
            r#"
const $g : f32[4] = dense<[1.0, 2.0, 1.0, 1.0]>
graph @g(%x: f32[1, 4], %r: f32[1, 4], %past_key_0: f32[1, 4]) -> (f32[1, 4], f32[2, 4]) {
  %s = Add(%x, %r) : f32[1, 4]
  %y = SimplifiedLayerNormalization(%s, $g) : f32[1, 4]
  %present_key_0 = Concat(%past_key_0, %y) {axis = 0} : f32[2, 4]
  return %y, %present_key_0
}
"#,
        );
        SkipNorms
            .run(&mut m, &PassOptions::default())
            .expect("pass");
        let g = m.entries[0].graph;
        let fused = &m.nodes[m.graphs[g].nodes()[0]];
        assert_eq!(fused.op.op_type(), "SkipSimplifiedLayerNormalization");
        assert_eq!(fused.outputs.len(), 1);
        assert_eq!(m.graphs[g].outputs[0], fused.outputs[0].expect("y"));
    }
}
