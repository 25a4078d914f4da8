//! Op forms chosen for what ONNX Runtime itself does when it loads a model.
//!
//! ONNX Runtime's `SkipLayerNormFusion` (graph optimization level 2, on by default) turns an
//! `Add` of two 3-D tensors whose only reader is a `LayerNormalization` into the contrib op
//! `SkipLayerNormalization`, which on the CPU provider is 3 to 6 times slower than the two ops it
//! replaces (`tools/norm_rates.py`, docs/benchmarks.md). The fusion needs the shapes of both
//! operands, so a raw export whose shapes come from `Shape`/`Concat` chains escapes it, and the
//! same graph after `-O2` (which resolves those shapes) would not: a post-norm BERT ran 1.25x
//! slower. [`ResidualSum`] writes such an `Add` as `Sum`, the same sum with the same
//! broadcasting, which the fusion does not match.

use mmq_ir::{Module, Op, Type, Value, ValueDef};

use crate::pass::{Pass, PassError, PassOptions, PassReport};

/// `Add` → `Sum` where ONNX Runtime would fuse it into `SkipLayerNormalization` (see the module
/// documentation); counter `residual-sums`.
#[derive(Clone, Copy, Debug, Default)]
pub struct ResidualSum;

impl Pass for ResidualSum {
    fn name(&self) -> &str {
        "residual-sum"
    }

    fn run(&self, m: &mut Module, _opts: &PassOptions) -> Result<PassReport, PassError> {
        let (uses, outputs) = super::readers(m);
        let mut adds = Vec::new();
        for (_, g) in m.graphs.iter() {
            for &n in g.nodes() {
                let node = &m.nodes[n];
                if !matches!(node.op, Op::LayerNormalization { .. }) {
                    continue;
                }
                let Some(Some(sum)) = node.inputs.first() else {
                    continue;
                };
                let ValueDef::Output { node: add, .. } = m.values[*sum].def else {
                    continue;
                };
                let three_d = |v: Option<&Option<Value>>| match v {
                    Some(Some(v)) => matches!(
                        m.value_type(*v),
                        Type::Tensor(t) if t.shape.as_ref().is_some_and(|s| s.len() == 3)
                    ),
                    _ => false,
                };
                let a = &m.nodes[add];
                if matches!(a.op, Op::Add {})
                    && uses.get(sum) == Some(&1)
                    && !outputs.contains(sum)
                    && three_d(a.inputs.first())
                    && three_d(a.inputs.get(1))
                {
                    adds.push(add);
                }
            }
        }
        for &add in &adds {
            m.nodes[add].op = Op::Sum {};
        }
        let mut report = PassReport::default();
        report.count("residual-sums", adds.len());
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(src: &str) -> Module {
        mmq_ir::text::parse(src).expect("test module parses").0
    }

    #[test]
    fn only_an_add_of_3d_tensors_read_by_the_norm_alone_becomes_a_sum() {
        let mut m = parse(
            r#"
const $g : f32[4] = dense<[1.0, 1.0, 1.0, 1.0]>
graph @g(%x: f32[batch, 3, 4], %r: f32[batch, 3, 4], %v: f32[4]) -> (f32[batch, 3, 4], f32[batch, 3, 4], f32[batch, 3, 4], f32[batch, 3, 4]) {
  %s = Add(%x, %r) : f32[batch, 3, 4]
  %y = LayerNormalization(%s, $g) {axis = -1} : f32[batch, 3, 4]
  %t = Add(%y, %r) : f32[batch, 3, 4]
  %z = LayerNormalization(%t, $g) {axis = -1} : f32[batch, 3, 4]
  %b = Add(%z, %v) : f32[batch, 3, 4]
  %w = LayerNormalization(%b, $g) {axis = -1} : f32[batch, 3, 4]
  return %z, %t, %w, %y
}
"#,
        );
        let report = ResidualSum
            .run(&mut m, &PassOptions::default())
            .expect("pass");
        assert_eq!(report.counters.get("residual-sums"), Some(&1));
        let ops: Vec<&str> = m.graphs[m.entries[0].graph]
            .nodes()
            .iter()
            .map(|&n| m.nodes[n].op.op_type())
            .collect();
        // %t is also an output; %b adds a bias of rank 1 (no fusion to avoid).
        assert_eq!(
            ops,
            [
                "Sum",
                "LayerNormalization",
                "Add",
                "LayerNormalization",
                "Add",
                "LayerNormalization"
            ]
        );
    }
}
