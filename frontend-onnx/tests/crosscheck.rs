//! Cross-checks our prost codec against `onnx-protobuf` (an independent decoder built on
//! rust-protobuf) on every fixture model under the repository's `tests/fixtures/`.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use mmq_onnx::decode_model;
use mmq_onnx::proto::onnx as ours;
use onnx_protobuf as theirs;
use onnx_protobuf::Message as _;

fn fixtures() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "onnx") {
                out.push(p);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let mut out = Vec::new();
    walk(&root, &mut out);
    out.sort();
    out
}

/// A node: op type, domain, inputs, outputs, attribute names.
type NodeSummary = (String, String, Vec<String>, Vec<String>, Vec<String>);

/// What both decoders must agree on for one graph (and, recursively, its subgraphs).
#[derive(Debug, PartialEq)]
struct Summary {
    name: String,
    nodes: Vec<NodeSummary>,
    initializers: Vec<(String, Vec<i64>, i32, usize)>,
    inputs: Vec<String>,
    outputs: Vec<String>,
    subgraphs: Vec<Summary>,
}

/// Bytes of data a tensor carries, whichever field holds it.
fn data_size(
    raw: usize,
    f: usize,
    i32s: usize,
    i64s: usize,
    d: usize,
    u64s: usize,
    s: usize,
) -> usize {
    raw + 4 * f + 4 * i32s + 8 * i64s + 8 * d + 8 * u64s + s
}

fn ours_summary(g: &ours::GraphProto) -> Summary {
    Summary {
        name: g.name().to_owned(),
        nodes: g
            .node
            .iter()
            .map(|n| {
                (
                    n.op_type().to_owned(),
                    n.domain().to_owned(),
                    n.input.clone(),
                    n.output.clone(),
                    n.attribute.iter().map(|a| a.name().to_owned()).collect(),
                )
            })
            .collect(),
        initializers: g
            .initializer
            .iter()
            .map(|t| {
                let size = data_size(
                    t.raw_data.as_ref().map_or(0, |b| b.len()),
                    t.float_data.len(),
                    t.int32_data.len(),
                    t.int64_data.len(),
                    t.double_data.len(),
                    t.uint64_data.len(),
                    t.string_data.iter().map(Vec::len).sum(),
                );
                (t.name().to_owned(), t.dims.clone(), t.data_type(), size)
            })
            .collect(),
        inputs: g.input.iter().map(|v| v.name().to_owned()).collect(),
        outputs: g.output.iter().map(|v| v.name().to_owned()).collect(),
        subgraphs: g
            .node
            .iter()
            .flat_map(|n| &n.attribute)
            .flat_map(|a| a.g.iter().chain(&a.graphs))
            .map(ours_summary)
            .collect(),
    }
}

fn theirs_summary(g: &theirs::GraphProto) -> Summary {
    Summary {
        name: g.name.clone(),
        nodes: g
            .node
            .iter()
            .map(|n| {
                (
                    n.op_type.clone(),
                    n.domain.clone(),
                    n.input.clone(),
                    n.output.clone(),
                    n.attribute.iter().map(|a| a.name.clone()).collect(),
                )
            })
            .collect(),
        initializers: g
            .initializer
            .iter()
            .map(|t| {
                let size = data_size(
                    t.raw_data.len(),
                    t.float_data.len(),
                    t.int32_data.len(),
                    t.int64_data.len(),
                    t.double_data.len(),
                    t.uint64_data.len(),
                    t.string_data.iter().map(Vec::len).sum(),
                );
                (t.name.clone(), t.dims.clone(), t.data_type, size)
            })
            .collect(),
        inputs: g.input.iter().map(|v| v.name.clone()).collect(),
        outputs: g.output.iter().map(|v| v.name.clone()).collect(),
        subgraphs: g
            .node
            .iter()
            .flat_map(|n| &n.attribute)
            .flat_map(|a| a.g.as_ref().into_iter().chain(&a.graphs))
            .map(theirs_summary)
            .collect(),
    }
}

#[test]
fn prost_codec_agrees_with_onnx_protobuf_on_fixtures() {
    let files = fixtures();
    assert!(
        !files.is_empty(),
        "no .onnx fixtures under tests/fixtures; generate them with tools/gen_fixtures.py"
    );
    for path in files {
        let bytes = std::fs::read(&path).unwrap();
        let a = decode_model(Bytes::from(bytes.clone()))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let b = theirs::ModelProto::parse_from_bytes(&bytes)
            .unwrap_or_else(|e| panic!("{}: onnx-protobuf: {e}", path.display()));
        assert_eq!(a.ir_version(), b.ir_version, "{}", path.display());
        let opsets_a: Vec<(String, i64)> = a
            .opset_import
            .iter()
            .map(|o| (o.domain().to_owned(), o.version()))
            .collect();
        let opsets_b: Vec<(String, i64)> = b
            .opset_import
            .iter()
            .map(|o| (o.domain.clone(), o.version))
            .collect();
        assert_eq!(opsets_a, opsets_b, "{}", path.display());
        let (Some(ga), Some(gb)) = (a.graph.as_ref(), b.graph.as_ref()) else {
            panic!("{}: a decoder found no graph", path.display())
        };
        let (sa, sb) = (ours_summary(ga), theirs_summary(gb));
        assert!(!sa.nodes.is_empty(), "{}: empty graph", path.display());
        assert_eq!(sa, sb, "{}", path.display());
    }
}

/// Every fixture imports; node and value counts match the protobuf, and symbolic dims survive.
#[test]
fn fixtures_import() {
    let files = fixtures();
    assert!(!files.is_empty(), "no .onnx fixtures under tests/fixtures");
    let opts = mmq_onnx::LoadOptions { infer: false };
    for path in &files {
        let m = mmq_onnx::load_files(&[path], &opts)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let bytes = Bytes::from(std::fs::read(path).unwrap());
        let model = decode_model(bytes).unwrap();
        let g = model.graph.as_ref().unwrap();
        let entry = &m.entries[0];
        let graph = &m.graphs[entry.graph];
        assert_eq!(graph.nodes().len(), g.node.len(), "{}", path.display());
        assert_eq!(graph.outputs.len(), g.output.len(), "{}", path.display());
        let inits = g.initializer.len() + g.sparse_initializer.len();
        assert!(m.consts.len() >= inits, "{}", path.display());
        assert_eq!(
            entry.model.ir_version,
            model.ir_version(),
            "{}",
            path.display()
        );
        // A named dim is a symbol; paddle2onnx's "?" names none (each is its own unknown).
        let dynamic = g.input.iter().any(|i| {
            let Some(ours::type_proto::Value::TensorType(t)) =
                i.r#type.as_ref().and_then(|t| t.value.as_ref())
            else {
                return false;
            };
            t.shape.iter().flat_map(|s| &s.dim).any(|d| {
                matches!(&d.value, Some(ours::tensor_shape_proto::dimension::Value::DimParam(p))
                    if p.chars().any(char::is_alphabetic))
            })
        });
        assert_eq!(!m.symbols.is_empty(), dynamic, "{}", path.display());
        // Exporters' derived sizes (`past_seq + seq`, `((height//8))*((width//8)) + 1`) parse
        // into expressions over plain symbols.
        for (_, s) in m.symbols.iter() {
            assert!(
                s.name
                    .chars()
                    .all(|c| c.is_alphanumeric() || c == '_' || c == '.'),
                "{}: symbol '{}' is an unparsed expression",
                path.display(),
                s.name
            );
        }
    }
    // With inference (the default options) every fixture still loads.
    for path in &files {
        let m = mmq_onnx::load_files(&[path], &mmq_onnx::LoadOptions::default())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(m.entries.len(), 1);
    }
    // A pipeline split over files loads as one module with shared symbols.
    let pipe: Vec<&Path> = files
        .iter()
        .filter(|p| p.parent().is_some_and(|d| d.ends_with("pipeline")))
        .map(PathBuf::as_path)
        .collect();
    if pipe.len() > 1 {
        let m = mmq_onnx::load_files(&pipe, &opts).unwrap();
        assert_eq!(m.entries.len(), pipe.len());
        let names: Vec<&str> = m.symbols.iter().map(|(_, s)| s.name.as_str()).collect();
        let mut dedup = names.clone();
        dedup.sort_unstable();
        dedup.dedup();
        assert_eq!(names.len(), dedup.len(), "symbols are shared by name");
    }
}
