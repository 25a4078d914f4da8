//! The ONNX node test suite (built in memory by the `onnx` package) through import → export →
//! ONNX Runtime, and through `.mmir` text. `tests/node-suite-expectations.txt` lists every case
//! that does not pass yet with its reason; the test fails when a listed case passes (shrink the
//! list) and when an unlisted case fails.

#![allow(clippy::print_stderr, reason = "the test reports its pass count")]

use std::collections::BTreeMap;
use std::path::Path;

use mmq_tests::{check_expectations, node_suite_cases, node_suite_eval, scratch_dir};

const EXPECTATIONS: &str = "tests/node-suite-expectations.txt";

/// Imports, infers, verifies, text-round-trips and exports one case; the error says which step
/// failed. Inference must agree with every type the case declares (its outputs are fully
/// typed): that checks each op's inference rule against the ONNX test data.
fn convert(src: &Path, dst: &Path) -> Result<(), String> {
    let mut m = mmq_onnx::load_files(&[src], &mmq_onnx::LoadOptions { infer: false })
        .map_err(|e| format!("import: {e}"))?;
    if let Some(c) = mmq_ir::infer::infer_module_correcting(&mut m).first() {
        return Err(format!("infer: {}", c.message));
    }
    if let Err(errors) = mmq_ir::verify::verify(&m)
        && let Some(e) = errors
            .iter()
            .find(|e| e.severity == mmq_ir::Severity::Error)
    {
        return Err(format!("verify: {}", e.message));
    }
    let text = mmq_ir::text::print(&m);
    match mmq_ir::text::parse(&text) {
        Ok((parsed, _)) => {
            if parsed != mmq_ir::text::canonicalize(&m) {
                return Err("text: parse(print(m)) != canonicalize(m)".to_owned());
            }
            if mmq_ir::text::print(&parsed) != text {
                return Err("text: print(parse(print(m))) != print(m)".to_owned());
            }
        }
        Err(errors) => return Err(format!("text: {}", errors[0].message)),
    }
    let graph = m.entries[0].graph;
    std::fs::create_dir_all(dst.parent().expect("case directory")).map_err(|e| e.to_string())?;
    mmq_backend_ort::write_model(&m, graph, dst, &Default::default())
        .map_err(|e| format!("export: {e}"))?;
    Ok(())
}

#[test]
fn node_suite_round_trip() {
    let cases = scratch_dir("node-suite/cases");
    let converted = scratch_dir("node-suite/converted");
    let owned = node_suite_cases(&cases);
    let names: Vec<&str> = owned.iter().map(String::as_str).collect();

    let mut ours: BTreeMap<String, String> = BTreeMap::new();
    for name in &names {
        let src = cases.join(name).join("model.onnx");
        let dst = converted.join(name).join("model.onnx");
        if let Err(e) = convert(&src, &dst) {
            ours.insert((*name).to_owned(), e);
        }
    }

    let result = node_suite_eval(&cases, &converted);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&result).expect("result.json"))
            .expect("json");

    // The reason each failing case fails, most fundamental first.
    let mut failing: BTreeMap<String, String> = BTreeMap::new();
    let mut passing = 0usize;
    let mut ort_passes = 0usize;
    for name in &names {
        let r = &json[*name];
        let original = r["original"].as_str().unwrap_or("missing");
        let conv = r["converted"].as_str().unwrap_or("missing");
        let checker = r["checker"].as_str().unwrap_or("missing");
        if original == "pass" {
            ort_passes += 1;
        }
        let reason = if let Some(e) = ours.get(*name) {
            Some(format!("mmq {e}"))
        } else if original != "pass" {
            Some(format!("onnxruntime fails on the original: {original}"))
        } else if conv != "pass" {
            Some(format!("onnxruntime on the converted model: {conv}"))
        } else if checker != "ok" {
            Some(format!("onnx.checker: {checker}"))
        } else {
            None
        };
        match reason {
            Some(r) => {
                let r: String = r.replace('\n', " ").chars().take(160).collect();
                failing.insert((*name).to_owned(), r);
            }
            None => passing += 1,
        }
    }

    eprintln!(
        "node suite: {passing} of {} cases round-trip and pass in onnxruntime \
         (onnxruntime passes {ort_passes} originals); actual list in target/node-suite-actual.txt",
        names.len(),
    );
    if let Err(e) = check_expectations(EXPECTATIONS, &failing, "target/node-suite-actual.txt") {
        panic!("{e}");
    }
}
