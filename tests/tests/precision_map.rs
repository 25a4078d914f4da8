//! Modality labels and precision maps on the committed fixtures: the CLIP-style example map
//! (`tests/fixtures/precision_maps/clip.toml`, also quoted in `docs/quantization.md`) resolves
//! on the CLIP fixture the way its comments say, before and after the -O2 pipeline.

use std::collections::BTreeMap;

use mmq_ir::modality::{self, Modality};
use mmq_ir::{Module, Node};
use mmq_passes::quant::precision::{Granularity, PrecisionMap, Scheme};
use mmq_passes::{OptLevel, PassOptions, Phase, TargetRef, pipeline};
use mmq_tests::repo_root;

fn load(name: &str, optimize: bool) -> Module {
    let path = repo_root().join(format!("tests/fixtures/{name}/model.onnx"));
    let mut m = mmq_onnx::load_files(&[path.as_path()], &mmq_onnx::LoadOptions::default())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    if optimize {
        let opts = PassOptions {
            target: TargetRef::ORT,
            explain: false,
        };
        pipeline(TargetRef::ORT, OptLevel::O2, Phase::Float)
            .run(&mut m, &opts)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    m
}

fn clip_map() -> PrecisionMap {
    let src = std::fs::read_to_string(repo_root().join("tests/fixtures/precision_maps/clip.toml"))
        .expect("clip.toml");
    let (map, warnings) = PrecisionMap::parse(&src).unwrap_or_else(|e| panic!("{e:?}"));
    assert!(warnings.is_empty(), "{warnings:?}");
    map
}

/// (op type, modality) -> schemes given, over every node.
fn by_op(m: &Module, optimize_label: &str) -> BTreeMap<(String, Modality), Vec<Scheme>> {
    let g = m.entries[0].graph;
    let labels = modality::analyze(m, g, &[]).unwrap();
    let plan = clip_map().plan(m, g, &labels);
    let mut out: BTreeMap<(String, Modality), Vec<Scheme>> = BTreeMap::new();
    for (n, p) in plan.iter() {
        let key = (m.nodes[n].op.op_type().to_owned(), labels.node(n));
        out.entry(key).or_default().push(p.scheme);
    }
    assert!(
        plan.unused_rules().is_empty(),
        "{optimize_label}: unused rules {:?}",
        plan.unused_rules()
    );
    out
}

#[test]
fn clip_map_resolves_on_the_clip_fixture() {
    for optimize in [false, true] {
        let m = load("clip", optimize);
        let label = if optimize { "-O2" } else { "imported" };
        let ops = by_op(&m, label);
        let all = |op: &str, l: Modality, s: Scheme| {
            let v = ops
                .get(&(op.to_owned(), l))
                .unwrap_or_else(|| panic!("{label}: no {l} {op} in {:?}", ops.keys()));
            assert!(v.iter().all(|&x| x == s), "{label}: {l} {op}: {v:?}");
        };
        all("Conv", Modality::Vision, Scheme::Fp8);
        all("MatMul", Modality::Vision, Scheme::Int4);
        all("MatMul", Modality::Text, Scheme::Int4);
        all("Gather", Modality::Text, Scheme::Int8);
        all("LayerNormalization", Modality::Vision, Scheme::Fp16);
        if optimize {
            // The ORT cost model keeps residual norms unfused (SkipLayerNormalization is
            // slower on the CPU provider), so the text norms are plain LayerNormalization.
            all("LayerNormalization", Modality::Text, Scheme::Fp16);
            all("MultiHeadAttention", Modality::Vision, Scheme::Float);
        } else {
            all("Softmax", Modality::Vision, Scheme::Float);
        }
        for ((op, l), v) in &ops {
            if *l == Modality::Fusion {
                assert!(
                    v.iter().all(|&x| x == Scheme::Float),
                    "{label}: {op}: {v:?}"
                );
            }
        }
    }
}

#[test]
fn clip_map_settings_reach_the_plan() {
    let m = load("clip", false);
    let g = m.entries[0].graph;
    let labels = modality::analyze(&m, g, &[]).unwrap();
    let map = clip_map();
    let plan = map.plan(&m, g, &labels);
    let find = |op: &str, l: Modality| -> Node {
        plan.iter()
            .map(|(n, _)| n)
            .find(|&n| m.nodes[n].op.op_type() == op && labels.node(n) == l)
            .unwrap_or_else(|| panic!("no {l} {op}"))
    };
    let text_mm = plan.get(find("MatMul", Modality::Text)).unwrap();
    assert_eq!(
        text_mm.granularity,
        Some(Granularity::PerGroup { block: 64 })
    );
    assert!(!text_mm.symmetric);
    let vis_mm = plan.get(find("MatMul", Modality::Vision)).unwrap();
    assert_eq!(
        vis_mm.granularity,
        Some(Granularity::PerGroup { block: 32 })
    );
    assert!(vis_mm.symmetric);
    let conv = plan.get(find("Conv", Modality::Vision)).unwrap();
    assert_eq!(conv.granularity, Some(Granularity::PerTensor));
    assert_eq!(
        conv.calibration.map(|o| o.to_string()).as_deref(),
        Some("percentile:99.99")
    );
    let emb = plan.get(find("Gather", Modality::Text)).unwrap();
    assert_eq!(emb.granularity, Some(Granularity::PerChannel));
    // Every scheme pass sees exactly its nodes.
    let int4 = plan.filter(Scheme::Int4);
    let n_int4 = plan.iter().filter(|&(n, _)| int4(&m, n)).count();
    assert_eq!(n_int4, plan.nodes_with(Scheme::Int4).len());
    assert!(n_int4 >= 20, "{n_int4}");
}

#[test]
fn docs_quote_the_clip_map() {
    let map = std::fs::read_to_string(repo_root().join("tests/fixtures/precision_maps/clip.toml"))
        .expect("clip.toml");
    let doc =
        std::fs::read_to_string(repo_root().join("docs/quantization.md")).expect("quantization.md");
    assert!(
        doc.contains(map.trim()),
        "docs/quantization.md must quote tests/fixtures/precision_maps/clip.toml verbatim"
    );
}

#[test]
fn modality_labels_of_the_fixtures() {
    // (fixture, label, lower bound on nodes with it)
    let expect: &[(&str, &[(Modality, usize)])] = &[
        (
            "clip",
            &[
                (Modality::Vision, 50),
                (Modality::Text, 50),
                (Modality::Fusion, 1),
            ],
        ),
        (
            "llava",
            &[
                (Modality::Vision, 1),
                (Modality::Text, 10),
                (Modality::Fusion, 100),
            ],
        ),
        ("vit", &[(Modality::Vision, 50)]),
        ("gpt2_kv", &[(Modality::Text, 100)]),
    ];
    for (name, want) in expect {
        let m = load(name, false);
        let g = m.entries[0].graph;
        let labels = modality::analyze(&m, g, &[]).unwrap();
        let summary: BTreeMap<Modality, _> = labels.summary(&m).into_iter().collect();
        for (l, min) in *want {
            let got = summary.get(l).map_or(0, |s| s.nodes);
            assert!(
                got >= *min,
                "{name}: {got} {l} nodes, expected at least {min}"
            );
        }
        // Single-tower models have no fusion nodes; weights are fully attributed.
        let total: u64 = summary.values().map(|s| s.weight_bytes).sum();
        let used: u64 = labels.weights().map(|(c, _)| m.consts[c].byte_len()).sum();
        assert_eq!(total, used, "{name}");
        if matches!(*name, "vit" | "gpt2_kv") {
            assert!(!summary.contains_key(&Modality::Fusion), "{name}");
        }
    }
    // Overriding an input changes what depends on it.
    let m = load("clip", false);
    let g = m.entries[0].graph;
    let l = modality::analyze(&m, g, &[("pixel_values".into(), Modality::Text)]).unwrap();
    assert!(l.summary(&m).iter().all(|(k, _)| *k != Modality::Vision));
}
