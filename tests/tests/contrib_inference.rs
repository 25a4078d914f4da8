//! Type inference of the ops of other domains mmq emits (`com.microsoft` contrib ops,
//! `SimplifiedLayerNormalization`): every fixture and export-matrix cell is compiled (`-O2`, and
//! INT4 for `MatMulNBits`), exported, stripped of the declared types of those ops' results, and
//! imported again, as a model optimized by another tool would arrive. Each such node must import
//! as its typed op, and inference must give each stripped result the type the compiler wrote
//! (dtype and every dim).

use std::collections::BTreeMap;

use mmq_compiler::{Accuracy, CompileOptions, Precision, Scheme};
use mmq_ir::Module;
use mmq_ir::text::type_text;
use mmq_onnx::proto::onnx as pb;
use prost::Message;

/// Whether a node of `domain`/`op_type` is one of the ops inferred by the contrib rules.
fn emitted(domain: &str, op_type: &str) -> bool {
    domain == "com.microsoft" || op_type == "SimplifiedLayerNormalization"
}

/// A result's type: dtype and dims, each dim evaluated under several symbol assignments (so
/// `(h + 1) / 2` and `(h - 1) / 2 + 1` compare equal), and the text for messages.
#[derive(Debug)]
struct Shape {
    text: String,
    dtype: Option<mmq_ir::DType>,
    dims: Option<Vec<Option<Vec<Option<i64>>>>>,
}

impl PartialEq for Shape {
    fn eq(&self, o: &Shape) -> bool {
        self.dtype == o.dtype && self.dims == o.dims
    }
}

/// Symbol values by name: assignment `k` gives each symbol a value from its name and `k`.
fn value(name: &str, k: i64) -> i64 {
    let h = name
        .bytes()
        .fold(7i64, |h, b| (h * 31 + i64::from(b)) % 1000);
    1 + (h + 13 * k) % 97
}

/// Result name → type of every named node result of the first graph.
fn types(m: &Module) -> BTreeMap<String, Shape> {
    let g = &m.graphs[m.entries[0].graph];
    g.nodes()
        .iter()
        .flat_map(|&n| m.nodes[n].outputs.iter().flatten())
        .filter_map(|&v| {
            let ty = m.value_type(v);
            let tt = ty.as_tensor();
            let dims = tt.and_then(|t| t.shape.as_ref()).map(|s| {
                s.iter()
                    .map(|d| {
                        let e = d.expr()?;
                        Some(
                            (0..12)
                                .map(|k| e.eval(&|sym| Some(value(&m.symbols[sym].name, k))))
                                .collect(),
                        )
                    })
                    .collect()
            });
            let shape = Shape {
                text: type_text(m, ty),
                dtype: tt.and_then(|t| t.dtype),
                dims,
            };
            Some((m.values[v].name.clone()?, shape))
        })
        .collect()
}

fn load(path: &std::path::Path) -> Module {
    mmq_onnx::load_files(&[path], &mmq_onnx::LoadOptions::default())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn contrib_results_are_inferred_as_the_compiler_typed_them() {
    let dir = mmq_tests::scratch_dir("contrib-inference");
    let mut checked: BTreeMap<String, usize> = BTreeMap::new();
    let mut failures = Vec::new();
    let all = mmq_tests::fixtures()
        .into_iter()
        .chain(mmq_tests::matrix_fixtures());
    for fx in all {
        let Some(model) = fx.models.first().filter(|_| fx.models.len() == 1) else {
            continue;
        };
        for (tag, precision) in [
            ("o2", Precision::Float),
            ("int4", Precision::of(Scheme::Int4)),
        ] {
            let name = format!("{}-{tag}", fx.name.replace('/', "_"));
            let mut m = load(model);
            let options = CompileOptions {
                precision,
                accuracy: Accuracy::Off,
                ..CompileOptions::default()
            };
            if mmq_compiler::compile(&mut m, &options).is_err() {
                continue; // Fixtures a scheme refuses are covered by their own tests.
            }
            let compiled = dir.join(format!("{name}.onnx"));
            mmq_compiler::export::write(&m, &[], &compiled).expect("exports");
            let want = types(&load(&compiled));

            // Strip the declared types of the emitted ops' results.
            let mut proto =
                pb::ModelProto::decode(&*std::fs::read(&compiled).expect("written")).expect("ONNX");
            let g = proto.graph.as_mut().expect("graph");
            let stripped: Vec<(String, String)> = g
                .node
                .iter()
                .filter(|n| emitted(n.domain(), n.op_type()))
                .flat_map(|n| {
                    n.output
                        .iter()
                        .filter(|o| !o.is_empty())
                        .map(|o| (o.clone(), n.op_type().to_owned()))
                })
                .collect();
            if stripped.is_empty() {
                continue;
            }
            let names: std::collections::HashSet<&str> =
                stripped.iter().map(|(o, _)| o.as_str()).collect();
            g.value_info.retain(|v| !names.contains(v.name()));
            let bare = dir.join(format!("{name}.bare.onnx"));
            std::fs::write(&bare, proto.encode_to_vec()).expect("write");
            let imported = load(&bare);
            // Each imports as its typed variant, which the rules, passes and kernels match.
            for (n, nd) in imported.nodes.iter() {
                if emitted(nd.op.domain(), nd.op.op_type()) && nd.op.is_custom() {
                    failures.push(format!(
                        "{name}: node {n:?} ({}) imports opaque",
                        nd.op.op_type()
                    ));
                }
            }
            let got = types(&imported);
            for (out, op) in &stripped {
                let (Some(w), Some(g)) = (want.get(out), got.get(out)) else {
                    continue;
                };
                if g == w {
                    *checked.entry(op.clone()).or_default() += 1;
                } else if !w.text.contains('?') {
                    failures.push(format!(
                        "{name}: {op} result '{out}': inferred {}, compiled {}",
                        g.text, w.text
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
    for op in [
        "MultiHeadAttention",
        "MatMulNBits",
        "FusedConv",
        "FusedGemm",
        "FusedMatMul",
        // (SkipLayerNormalization: the ORT target's cost model never picks it.)
        "SkipSimplifiedLayerNormalization",
        "SimplifiedLayerNormalization",
        "FastGelu",
        "BiasGelu",
        "QuickGelu",
    ] {
        assert!(
            checked.get(op).copied().unwrap_or(0) > 0,
            "no {op} checked: {checked:?}"
        );
    }
}
