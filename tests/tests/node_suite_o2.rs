//! The ONNX node test suite through the whole `-O2` pipeline for ONNX Runtime: import →
//! `pipeline(TargetRef::ORT, OptLevel::O2, Phase::Float)` (canonicalize, const-fold, DCE, every rule set) →
//! export → ONNX Runtime against the suite's expected outputs. A case that round-trips without
//! optimization (`tests/node-suite-expectations.txt` does not list it) must also pass after
//! `-O2`, unless `tests/node-suite-o2-expectations.txt` lists it with its reason; the list is
//! checked exactly, so it can only shrink.

#![allow(clippy::print_stderr, reason = "the test reports its pass count")]

use std::collections::BTreeMap;
use std::path::Path;

use mmq_passes::{OptLevel, PassOptions, Phase, TargetRef, pipeline};
use mmq_tests::{
    check_expectations, node_suite_cases, node_suite_eval, read_expectations, scratch_dir,
};
use rayon::prelude::*;

const ROUND_TRIP_EXPECTATIONS: &str = "tests/node-suite-expectations.txt";
const EXPECTATIONS: &str = "tests/node-suite-o2-expectations.txt";

fn compile(src: &Path, dst: &Path) -> Result<(), String> {
    let mut m = mmq_onnx::load_files(&[src], &mmq_onnx::LoadOptions::default())
        .map_err(|e| format!("import: {e}"))?;
    let mut pm = pipeline(TargetRef::ORT, OptLevel::O2, Phase::Float);
    pm.verify = true;
    let opts = PassOptions {
        target: TargetRef::ORT,
        explain: false,
    };
    pm.run(&mut m, &opts).map_err(|e| format!("-O2: {e}"))?;
    let graph = m.entries[0].graph;
    std::fs::create_dir_all(dst.parent().expect("case directory")).map_err(|e| e.to_string())?;
    mmq_backend_ort::write_model(&m, graph, dst, &Default::default())
        .map(|_| ())
        .map_err(|e| format!("export: {e}"))
}

#[test]
fn node_suite_o2() {
    let cases = scratch_dir("node-suite-o2/cases");
    let compiled = scratch_dir("node-suite-o2/compiled");
    let owned = node_suite_cases(&cases);
    let names: Vec<&str> = owned.iter().map(String::as_str).collect();

    let ours: BTreeMap<String, String> = names
        .par_iter()
        .filter_map(|name| {
            let src = cases.join(name).join("model.onnx");
            let dst = compiled.join(name).join("model.onnx");
            compile(&src, &dst).err().map(|e| ((*name).to_owned(), e))
        })
        .collect();

    let result = node_suite_eval(&cases, &compiled);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&result).expect("result.json"))
            .expect("json");

    let round_trip_fails = read_expectations(ROUND_TRIP_EXPECTATIONS);
    let mut failing: BTreeMap<String, String> = BTreeMap::new();
    let mut passing = 0usize;
    for name in &names {
        if round_trip_fails.contains_key(*name) {
            continue;
        }
        let r = &json[*name];
        let conv = r["converted"].as_str().unwrap_or("missing");
        let reason = match ours.get(*name) {
            Some(e) => Some(format!("mmq {e}")),
            None if conv != "pass" => Some(format!("onnxruntime on the -O2 model: {conv}")),
            None => None,
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
        "node suite at -O2: {passing} of the {} cases that round-trip also pass after the -O2 \
         pipeline; actual list in target/node-suite-o2-actual.txt",
        names.len() - round_trip_fails.len(),
    );
    if let Err(e) = check_expectations(EXPECTATIONS, &failing, "target/node-suite-o2-actual.txt") {
        panic!("{e}");
    }
}
