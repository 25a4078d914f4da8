//! Every committed fixture model: `.mmir` dump snapshots, exact text round trip, and ONNX round
//! trip through export with ONNX Runtime outputs identical to the stored references.

use std::ffi::OsStr;
use std::path::Path;

use mmq_tests::{Fixture, fixtures, oracle, scratch_dir};

fn load(f: &Fixture) -> mmq_ir::Module {
    let paths: Vec<&Path> = f.models.iter().map(|p| p.as_path()).collect();
    mmq_onnx::load_files(&paths, &mmq_onnx::LoadOptions::default())
        .unwrap_or_else(|e| panic!("{}: {e}", f.name))
}

#[test]
fn fixtures_verify() {
    for f in fixtures() {
        let m = load(&f);
        if let Err(errors) = mmq_ir::verify::verify(&m) {
            let errors: Vec<_> = errors
                .iter()
                .filter(|e| e.severity == mmq_ir::Severity::Error)
                .collect();
            assert!(errors.is_empty(), "{}: {errors:#?}", f.name);
        }
    }
}

#[test]
fn fixtures_text_round_trip() {
    for f in fixtures() {
        let m = load(&f);
        let text = mmq_ir::text::print(&m);
        let (parsed, _) = mmq_ir::text::parse(&text)
            .unwrap_or_else(|e| panic!("{}: printed text does not parse: {:?}", f.name, e[0]));
        assert!(
            parsed == mmq_ir::text::canonicalize(&m),
            "{}: parse(print(m)) != canonicalize(m)",
            f.name
        );
        assert_eq!(
            mmq_ir::text::print(&parsed),
            text,
            "{}: print is not stable",
            f.name
        );
    }
}

#[test]
fn fixtures_mmir_snapshots() {
    for f in fixtures() {
        let mut m = load(&f);
        // Snapshots must not depend on where the repository is checked out.
        for entry in &mut m.entries {
            entry.model.source = entry
                .model
                .source
                .as_ref()
                .and_then(|p| p.file_name())
                .map(Into::into);
        }
        let text = mmq_ir::text::print(&m);
        insta::assert_snapshot!(format!("mmir_{}", f.name), text);
    }
}

#[test]
fn fixtures_onnx_round_trip_identical_outputs() {
    let scratch = scratch_dir("fixtures-round-trip");
    for f in fixtures() {
        let m = load(&f);
        for entry in &m.entries {
            let source = entry.model.source.as_ref().expect("loaded from a file");
            let file = source.file_name().expect("file name");
            let out = scratch.join(&f.name).join(file);
            std::fs::create_dir_all(out.parent().expect("dir")).expect("scratch dir");
            mmq_backend_ort::write_model(&m, entry.graph, &out, &Default::default())
                .unwrap_or_else(|e| panic!("{}: export: {e}", f.name));
            let check = oracle(&[OsStr::new("check"), out.as_os_str()]);
            assert!(
                check.status.success(),
                "{}: onnx.checker rejects the export: {}{}",
                f.name,
                String::from_utf8_lossy(&check.stdout),
                String::from_utf8_lossy(&check.stderr)
            );
            // Bitwise against the original file run by the same ONNX Runtime on this machine
            // (the stored outputs.npz can differ in the last bits on another CPU: ONNX
            // Runtime picks its kernels by instruction set).
            let reference = out.with_extension("reference.npz");
            let original = oracle(&[
                OsStr::new("run"),
                source.as_os_str(),
                f.dir.join("inputs.npz").as_os_str(),
                OsStr::new("-o"),
                reference.as_os_str(),
            ]);
            assert!(
                original.status.success(),
                "{}: ONNX Runtime cannot run the original: {}",
                f.name,
                String::from_utf8_lossy(&original.stderr)
            );
            let run = oracle(&[
                OsStr::new("run-compare"),
                out.as_os_str(),
                f.dir.join("inputs.npz").as_os_str(),
                reference.as_os_str(),
                OsStr::new("--exact"),
                OsStr::new("--produced-only"),
            ]);
            assert!(
                run.status.success(),
                "{} ({}): outputs differ from the original's in ONNX Runtime:\n{}{}",
                f.name,
                file.to_string_lossy(),
                String::from_utf8_lossy(&run.stdout),
                String::from_utf8_lossy(&run.stderr)
            );
        }
    }
}
